"""Sockets our hooks connected to a backend that left: where they live (kp_skwhere, netns), how
to reach them, and what is done to them (reconnect, disconnect, destroy)."""
