"""A new agent on old pins: adopting what the kernel holds, resizing maps, carrying rows, and the
copies a downgrade needs."""
