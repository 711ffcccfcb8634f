"""What the drivers of a host description need: the module of each driver, the modules each module
loads, module sizes and the character device majors."""

from __future__ import annotations

# driver name -> the module that provides it (None: built into the kernel, always present).
DRIVER_MODULE: dict[str, str | None] = {
    "nvidia": "nvidia",
    "vfio-pci": "vfio_pci",
    "snd_hda_intel": "snd_hda_intel",
    "ast": "ast",
    "nvme": "nvme",
    "mlx5_core": "mlx5_core",
    "i40e": "i40e",
    "igb": "igb",
    "ccp": "ccp",
    "piix4_smbus": "i2c_piix4",
    "vmd": "vmd",
    "pcieport": None,
    "xhci_hcd": None,
}

# module -> modules it depends on (they are loaded too, and "used by" it in proc/modules).
MODULE_DEPS: dict[str, list[str]] = {
    "nvidia_uvm": ["nvidia"],
    "nvidia_modeset": ["nvidia"],
    "nvidia_drm": ["nvidia_modeset"],
    "vfio_pci": ["vfio_pci_core"],
    "vfio_pci_core": ["vfio"],
    "vfio_iommu_type1": ["vfio"],
    "kvm_amd": ["kvm"],
    "kvm_intel": ["kvm"],
    "mlx5_ib": ["mlx5_core"],
}

MODULE_SIZES = {
    "nvidia": 104_071_168,
    "nvidia_uvm": 6_578_176,
    "nvidia_modeset": 1_593_344,
    "nvidia_drm": 126_976,
    "vfio_pci": 16_384,
    "vfio_pci_core": 86_016,
    "vfio": 65_536,
    "vfio_iommu_type1": 49_152,
    "kvm_amd": 208_896,
    "kvm_intel": 413_696,
    "kvm": 1_409_024,
    "mlx5_core": 2_473_984,
    "snd_hda_intel": 61_440,
    "ast": 81_920,
    "nvme": 61_440,
}

# nvidia's character major is fixed (NV_MAJOR_DEVICE_NUMBER, open-gpu-kernel-modules
# kernel-open/nvidia/nv.c nv_register_chrdev l.809-819: register_chrdev_region at 195).
NVIDIA_MAJOR = 195
# The others are dynamic: alloc_chrdev_region (nvidia-uvm: kernel-open/nvidia-uvm/uvm.c l.1136;
# nvidia-caps: kernel-open/nvidia/nv-caps.c l.823; vfio's group device) takes the major Linux's
# find_dynamic_major (fs/char_dev.c) hands out: the highest free one from 254 down to 234, then
# from 511 down to 384. What registered before (the kernel's own dynamic regions, then each
# module as it loads) decides the number, so it differs between hosts: read it from /proc/devices.
BUILTIN_DYNAMIC = ("gpiochip", "tpm", "ndctl", "dimmctl", "dax", "dma_heap", "rtc", "cec", "pps", "ptp")
MODULE_CHARDEVS = {
    "ipmi_devintf": ("ipmidev",),
    "nvme": ("nvme-generic", "nvme"),
    "vfio": ("vfio",),
    "nvidia": ("nvidia-caps",),
    "nvidia_uvm": ("nvidia-uvm",),
}


def char_majors(modules: list[str]) -> dict[str, int]:
    """name -> major of every dynamic character region on a host whose modules loaded in the
    order of ``modules``, as ``/proc/devices`` lists them."""
    names = list(BUILTIN_DYNAMIC) + [n for m in modules for n in MODULE_CHARDEVS.get(m, ())]
    free = [*range(254, 233, -1), *range(511, 383, -1)]
    return dict(zip(names, free, strict=False))


def proc_devices(modules: list[str]) -> str:
    """``/proc/devices`` (fs/char_dev.c chrdev_show, then the block section) of such a host."""
    majors = {"mem": 1, "tty": 4, "misc": 10, "input": 13, "sg": 21, "fb": 29, "usb": 180, "drm": 226}
    if "nvidia" in modules:
        majors["nvidia"] = NVIDIA_MAJOR
    majors.update(char_majors(modules))
    chars = "".join(f"{m:3d} {n}\n" for n, m in sorted(majors.items(), key=lambda kv: kv[1]))
    return f"Character devices:\n{chars}\nBlock devices:\n  8 sd\n259 blkext\n"
