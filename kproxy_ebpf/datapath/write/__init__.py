"""Applying a desired state to the maps: the plan, the ordered make-before-break writes, the
Ledger of what the kernel holds, and the drift check against it."""
