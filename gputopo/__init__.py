"""gputopo: move GPUs between an LXC container and VM passthrough on a Proxmox VE host."""

__version__ = "0.1.0"
