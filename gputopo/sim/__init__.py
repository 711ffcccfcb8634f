"""A simulated Proxmox VE host behind gputopo's ports (kernel sysfs, Proxmox API, containers)."""
