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

# Character device majors as Linux and the nvidia driver assign them (dev/.devices.json).
NVIDIA_MAJOR, NVIDIA_UVM_MAJOR, NVIDIA_CAPS_MAJOR, VFIO_GROUP_MAJOR = 195, 510, 237, 511
