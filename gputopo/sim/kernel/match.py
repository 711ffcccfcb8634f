"""Which driver matches a PCI device, as pci_match_device and the drivers' probes decide.

Matching uses a built-in table of well-known drivers' id rules plus one rule that makes a
snapshot of any host work: a device matches the driver it was bound to when the simulator first
saw the tree (``original`` in the state file). While ``driver_override`` is set only the named
driver matches, whatever the id tables say.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

ANY = 0xFFFFFFFF


@dataclass(frozen=True)
class IdRule:
    """One pci_device_id: ``None`` fields match anything (PCI_ANY_ID)."""

    vendor: int | None = None
    device: int | None = None
    cls: int = 0
    class_mask: int = 0

    def matches(self, dev: DevIds) -> bool:
        return (
            (self.vendor is None or self.vendor == dev.vendor)
            and (self.device is None or self.device == dev.device)
            and not ((self.cls ^ dev.cls) & self.class_mask)
        )


# Well-known drivers' static id tables, reduced to the rules that decide real hosts. vfio-pci
# and pci-stub have none: they bind only through driver_override or new_id (or ids=, which is
# new_id at module load).
DRIVER_TABLE: dict[str, list[IdRule]] = {
    "nvidia": [IdRule(vendor=0x10DE, cls=0x030000, class_mask=0xFF0000)],
    "nouveau": [IdRule(vendor=0x10DE, cls=0x030000, class_mask=0xFF0000)],
    "snd_hda_intel": [IdRule(cls=0x040300, class_mask=0xFFFF00)],
    "nvme": [IdRule(cls=0x010802, class_mask=0xFFFFFF)],
    "pcieport": [IdRule(cls=0x060400, class_mask=0xFFFF00)],
    "ahci": [IdRule(cls=0x010601, class_mask=0xFFFFFF)],
    "xhci_hcd": [IdRule(cls=0x0C0330, class_mask=0xFFFFFF)],
    "ast": [IdRule(vendor=0x1A03, device=0x2000)],
    "bochs-drm": [IdRule(vendor=0x1234, device=0x1111), IdRule(vendor=0x4321, device=0x1111)],
    "e1000e": [IdRule(vendor=0x8086, device=d) for d in (0x10D3, 0x15B8, 0x15BB, 0x1502)],
    "igb": [IdRule(vendor=0x8086, device=d) for d in (0x1533, 0x1521, 0x10C9)],
    "virtio-pci": [IdRule(vendor=0x1AF4, device=d) for d in range(0x1000, 0x1080)],
    "mlx5_core": [IdRule(vendor=0x15B3, device=d) for d in (0x1017, 0x1019, 0x101B, 0x101D, 0x1021)],
    "vfio-pci": [],
    "pci-stub": [],
}
# Drivers whose probe accepts any device they are forced onto (override or new_id).
ACCEPTS_ANY = {"vfio-pci", "pci-stub"}
PROBE_ORDER = list(DRIVER_TABLE)


@dataclass(frozen=True)
class DevIds:
    vendor: int
    device: int
    subvendor: int
    subdevice: int
    cls: int


class Matching:
    """Driver matching of :class:`gputopo.sim.kernel.SimKernel` (a mixin over its tree reader)."""

    @staticmethod
    def _dynid_match(st: dict, drv: str, ids: DevIds) -> bool:
        for v, d, sv, sd, c, cm in st["dynids"].get(drv, []):
            if (
                (v == ANY or v == ids.vendor)
                and (d == ANY or d == ids.device)
                and (sv == ANY or sv == ids.subvendor)
                and (sd == ANY or sd == ids.subdevice)
                and not ((c ^ ids.cls) & cm)
            ):
                return True
        return False

    def _id_match(self, st: dict, drv: str, addr: str | None, ids: DevIds) -> bool:
        """pci_match_device without the override check: dynamic ids, static table, first sight."""
        if self._dynid_match(st, drv, ids):
            return True
        if any(r.matches(ids) for r in DRIVER_TABLE.get(drv, [])):
            return True
        return addr is not None and st["original"].get(addr) == drv

    def _matches(self, st: dict, drv: str, addr: str) -> bool:
        override = self._override(addr)
        if override is not None:
            return override == drv
        return self._id_match(st, drv, addr, self._ids(addr))

    def _probe_error(self, st: dict, drv: str, addr: str) -> int | None:
        """The errno the driver's probe would fail with, or None when it binds."""
        ids = self._ids(addr)
        if drv in ACCEPTS_ANY:
            if drv == "vfio-pci":
                # vfio_pci_probe: only normal (type 0) headers, and only inside an IOMMU group
                if ids.cls >> 8 == 0x0604 or self.group_of(addr) is None:
                    return errno.EINVAL
            return None
        if ids.vendor == 0xFFFF:
            return errno.ENODEV
        if not self._id_match(st, drv, addr, ids):
            # forced by override onto a driver that does not know the hardware
            return errno.ENODEV
        return None
