"""The nvidia driver's ``proc/driver/nvidia/gpus/<bdf>/information`` file."""

from __future__ import annotations


def nvidia_information(address: str, minor: int, model: str, uuid: str, vbios: str = "98.02.2e.00.06") -> str:
    """``proc/driver/nvidia/gpus/<bdf>/information`` as nv-procfs.c prints it."""
    domain, bus, rest = address.split(":")
    return (
        f"Model: \t\t {model}\n"
        f"IRQ:   \t\t {128 + minor}\n"
        f"GPU UUID: \t {uuid}\n"
        f"Video BIOS: \t {vbios}\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        f"Bus Location: \t {address}\n"
        f"Device Minor: \t {minor}\n"
        "GPU Excluded:\t No\n"
    )


def set_minor_line(text: str, minor: int) -> str:
    """``text`` (an information file) with its ``Device Minor:`` line set to ``minor``."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("Device Minor:"):
            lines[i] = f"Device Minor: \t {minor}\n"
    return "".join(lines)


def parse_minor(text: str) -> int | None:
    """The ``Device Minor:`` of an nvidia information file, or None."""
    for line in text.splitlines():
        if line.startswith("Device Minor:"):
            try:
                return int(line.split(":", 1)[1].strip())
            except ValueError:
                return None
    return None


def chardev_major(devices_text: str | None, name: str) -> int | None:
    """The major of character device ``name`` in ``/proc/devices`` text, as nvidia-modprobe
    finds it (NVIDIA/nvidia-modprobe ``modprobe-utils/nvidia-modprobe-utils.c``
    nvidia_get_chardev_major l.657-720: the "Character devices:" section, a whole-name match);
    None when it is not there."""
    section = False
    for line in (devices_text or "").splitlines():
        if line == "Character devices:":
            section = True
        elif section and not line.strip():
            break
        elif section:
            parts = line.split()
            if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
                return int(parts[0])
    return None


def modification_allowed(params_text: str | None) -> bool:
    """Whether nvidia-modprobe may make a node, from ``/proc/driver/nvidia/params`` (or a
    capability file): its ``ModifyDeviceFiles`` (``DeviceFileModify``) value, 1 when absent
    (nvidia-modprobe-utils.c init_device_file_parameters l.370-411)."""
    allowed = True
    for line in (params_text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("ModifyDeviceFiles", "DeviceFileModify") and value.strip().isdigit():
            allowed = int(value) == 1
    return allowed
