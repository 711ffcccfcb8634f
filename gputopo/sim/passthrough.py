"""What Proxmox VE does with a VM's PCI passthrough when the VM starts, on the simulated host.

This follows qemu-server (``PVE/QemuServer/PCI.pm``: ``parse_hostpci``,
``choose_hostpci_devices``, ``prepare_pci_device``) and pve-common (``PVE/SysFSTools.pm``:
``pci_dev_group_bind_to_vfio``, ``pci_dev_bind_to_vfio``):

1. every ``hostpciN: mapping=<id>`` is checked against the hardware, ALL of the mapping's
   entries for this node (``assert_valid``); a mismatch fails the start;
2. each entry gets a device: for a mapping with several entries the first one none of whose
   devices is used by another running VM; a ``host=`` address or a mapping's one entry is taken
   as it is, and the start fails if another running VM holds it (:meth:`Passthrough._reserve`);
3. every non-bridge device in each chosen device's IOMMU group is put on vfio-pci through sysfs,
   exactly as Proxmox writes it: ``vendor device`` to ``vfio-pci/new_id`` FIRST (which makes
   vfio-pci grab every unbound device with that id: the pitfall gputopo avoids by pre-binding
   per address), then ``<bdf>`` to the device's ``driver/unbind`` (the kernel blocks while the
   device node is held), then ``<bdf>`` to ``vfio-pci/bind``. Proxmox ignores the result of each
   write and only checks at the end that the device is on vfio-pci.

The writes go through :class:`gputopo.sim.kernel.SimKernel`, so the kernel's semantics (new_id's
driver_attach, a blocking unbind) apply. Which devices a running VM uses is kept in the run
directory (``pci-reserved.json``: address -> vmid), like Proxmox's reservation file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from gputopo.errors import PveFormatError, SysfsWriteError
from gputopo.formats.hostpci import hostpci_number, parse_hostpci
from gputopo.formats.pcicfg import PciMapping
from gputopo.sim import state

RESERVED = "pci-reserved"
_HOSTID_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$")


class PassthroughError(Exception):
    """Proxmox's reason a VM start failed; ``str()`` is the task's exit status (one line)."""


def hostpci_props(value: str) -> dict[str, str]:
    """A ``hostpciN`` value's properties as qemu-server's start reads them: Proxmox's own
    parser (:func:`gputopo.formats.hostpci.parse_hostpci`), its refusal as the task's exit status.

    Raises PassthroughError for a value Proxmox refuses (neither or both of ``host`` and
    ``mapping``, a value without a key after the first, an unknown key).
    """
    try:
        return parse_hostpci(value)
    except PveFormatError as e:
        raise PassthroughError(f"unable to parse value of 'hostpci': {e.reason}") from None


def parse_host_ids(text: str) -> list[tuple[str, bool]]:
    """The ``host`` property's ids: ``'81:00.0;0000:82:00'`` ->
    ``[('0000:81:00.0', False), ('0000:82:00', True)]``; True means "every function of the slot".

    Raises PassthroughError for an id that is not ``[dddd:]bb:dd[.f]``.
    """
    out = []
    for raw in text.split(";"):
        m = _HOSTID_RE.match(raw.strip())
        if not m:
            raise PassthroughError(f"unable to parse value of 'hostpci': invalid PCI ID {raw!r}")
        dom, bus, dev, fn = m.groups()
        base = f"{(dom or '0000').lower()}:{bus.lower()}:{dev.lower()}"
        out.append((f"{base}.{fn}", False) if fn is not None else (base, True))
    return out


def parse_map_entry(text: str) -> dict[str, str]:
    """A mapping's ``map`` string as its properties (``id=10de:2bb5,node=pve1,...``)."""
    return dict(x.split("=", 1) for x in text.split(",") if "=" in x)


class Passthrough:
    """Proxmox's VM-start PCI handling over a simulated host root.

    ``write`` is the sysfs port (``SimKernel.write``); ``assert_valid(name, entry)`` returns the
    mapping check's message for one map entry or None (the same check as ``check-node``).
    """

    def __init__(
        self,
        root: Path,
        run_dir: Path,
        node: str,
        write: Callable[[str, str], None],
        assert_valid: Callable[[str, dict[str, str]], str | None],
    ):
        self.root = Path(root)
        self.run_dir = Path(run_dir)
        self.node = node
        self.write = write
        self.assert_valid = assert_valid
        self.by_key: list[tuple[str, list[str]]] = []  # what the last start gave each hostpciN

    def start(self, vmid: int, options: dict[str, str], mappings: list[PciMapping]) -> list[str]:
        """Prepare VM ``vmid``'s passthrough devices; return the addresses it now uses (sorted).

        Raises PassthroughError with Proxmox's message: a mapping that is missing or fails its
        check, no free device, a device used by another VM, no IOMMU, a device not on vfio-pci
        at the end. May block while a device's node is held (as the kernel's unbind does).
        """
        entries = sorted((n, k, v) for k, v in options.items() if (n := hostpci_number(k)) is not None)
        if not entries:
            return []
        by_id = {m.id: m for m in mappings}
        wanted: list[tuple[str, list[list[str]], bool]] = []  # (key, alternatives, is a mapping)
        for _, key, value in entries:
            props = hostpci_props(value)
            if "mapping" in props:
                wanted.append((key, self._alternatives(props["mapping"], by_id.get(props["mapping"])), True))
            else:
                wanted.append((key, [self._expand(parse_host_ids(props["host"]))], False))
        picks = self._reserve(vmid, wanted)
        self.by_key = picks
        chosen = [a for _, pick in picks for a in pick]
        try:
            if not self._iommu_present():
                raise PassthroughError("cannot prepare PCI pass-through, IOMMU not present")
            for addr in chosen:
                self._group_bind_to_vfio(addr)
        except BaseException:
            self.release(vmid)
            raise
        return sorted(chosen)

    def release(self, vmid: int) -> None:
        """Forget what VM ``vmid`` used (it stopped); the devices stay on vfio-pci, as in Proxmox."""
        with state.locked(self.run_dir, RESERVED):
            res = state.read_state(self.run_dir, RESERVED, {}) or {}
            state.write_state(self.run_dir, RESERVED, {a: v for a, v in res.items() if v != vmid})

    def used(self) -> dict[str, int]:
        """address -> vmid of every device a running VM uses."""
        res = state.read_state(self.run_dir, RESERVED, {}) or {}
        return {a: v for a, v in res.items() if state.guest_status(self.run_dir, "qemu", v) == "running"}

    # --- steps -----------------------------------------------------------------------------

    def _alternatives(self, name: str, mp: PciMapping | None) -> list[list[str]]:
        cfgs = [
            e for e in (parse_map_entry(m) for m in (mp.maps if mp else [])) if e.get("node") == self.node
        ]
        if not cfgs:
            raise PassthroughError(f"PCI device mapping not found for '{name}'")
        out = []
        for cfg in cfgs:
            err = self.assert_valid(name, cfg)
            if err:
                raise PassthroughError(f"PCI device mapping invalid (hardware probably changed): {err}")
            out.append([p if re.search(r"\.[0-7]$", p) else f"{p}.0" for p in cfg.get("path", "").split(";")])
        return out

    def _expand(self, ids: list[tuple[str, bool]]) -> list[str]:
        devices = self.root / "sys/bus/pci/devices"
        out = []
        for addr, whole_slot in ids:
            if whole_slot:
                fns = sorted(p.name for p in devices.glob(f"{addr}.*"))
                if not fns:
                    raise PassthroughError(f"no PCI device found for '{addr}'")
                out += fns
            else:
                out.append(addr)
        return out

    def _reserve(
        self, vmid: int, wanted: list[tuple[str, list[list[str]], bool]]
    ) -> list[tuple[str, list[str]]]:
        """(hostpciN, the devices it got) for each entry, in order. Raises PassthroughError.

        As qemu-server 9.2.6 does it: ``choose_hostpci_devices`` (``PCI.pm`` line 547) walks the
        lines in order; a line with one alternative (a ``host=`` or a mapping with one entry on this
        node) takes it unchecked, dying ``device '<id>' assigned more than once`` (line 556) when an
        earlier line of the same VM took it; a line with several tries each in turn and reserves
        the first no earlier line took and no running VM holds, else ``could not find a free
        device for 'hostpciN'`` (line 613). Only then ``vm_start_nolock`` (``QemuServer.pm`` line
        5706) reserves every chosen device, and ``reserve_pci_usage`` (``PCI.pm`` line 832) dies
        ``PCI device '<id>' already in use by VMID '<vmid>'`` for one a running VM holds.
        """
        with state.locked(self.run_dir, RESERVED):
            res = state.read_state(self.run_dir, RESERVED, {}) or {}
            used = {
                a: v
                for a, v in res.items()
                if v != vmid and state.guest_status(self.run_dir, "qemu", v) == "running"
            }
            mine: list[str] = []
            picks: list[tuple[str, list[str]]] = []
            for key, alternatives, _ in wanted:
                if len(alternatives) == 1:
                    pick = alternatives[0]
                    twice = next((a for a in pick if a in mine), None)
                    if twice is not None:
                        raise PassthroughError(f"device '{twice}' assigned more than once")
                else:
                    pick = next(
                        (alt for alt in alternatives if not any(a in used or a in mine for a in alt)), None
                    )
                    if pick is None:
                        raise PassthroughError(f"could not find a free device for '{key}'")
                mine += pick
                picks.append((key, pick))
            taken = next((a for a in mine if a in used), None)
            if taken is not None:
                raise PassthroughError(f"PCI device '{taken}' already in use by VMID '{used[taken]}'")
            res = {a: v for a, v in res.items() if v != vmid}
            res.update({a: vmid for a in mine})
            state.write_state(self.run_dir, RESERVED, res)
        return picks

    def _iommu_present(self) -> bool:
        groups = self.root / "sys/kernel/iommu_groups"
        return groups.is_dir() and any(groups.iterdir())

    def _group_bind_to_vfio(self, addr: str) -> None:
        """SysFSTools::pci_dev_group_bind_to_vfio for the group of ``addr``."""
        pci = self.root / "sys/bus/pci"
        if not (pci / "drivers/vfio-pci").is_dir():
            raise PassthroughError("vfio-pci module not loaded")
        group = pci / "devices" / addr / "iommu_group/devices"
        try:
            members = sorted(os.listdir(group))
        except OSError as e:
            raise PassthroughError(f"Cannot open iommu_group: {e.strerror}") from None
        for dev in members:
            devdir = pci / "devices" / dev
            # bridges, switches and root ports have a pci_bus directory (class 0x0604) and stay
            if (devdir / "pci_bus").exists() or _read(devdir / "class").startswith("0x0604"):
                continue
            if not self._bind_to_vfio(dev):
                raise PassthroughError(f"Cannot bind {dev} to vfio")

    def _bind_to_vfio(self, dev: str) -> bool:
        """SysFSTools::pci_dev_bind_to_vfio: True when ``dev`` ends up on vfio-pci."""
        pci = self.root / "sys/bus/pci"
        bound = pci / "drivers/vfio-pci" / dev
        if bound.exists():
            return True
        devdir = pci / "devices" / dev
        ids = f"{_read(devdir / 'vendor').removeprefix('0x')} {_read(devdir / 'device').removeprefix('0x')}"
        # Proxmox's file_write ignores what the write returned (the error shows only at close,
        # which it does not check): EEXIST from a second new_id of the same id is normal
        self._quiet_write("sys/bus/pci/drivers/vfio-pci/new_id", ids)
        if (devdir / "driver").exists():
            self._quiet_write(f"sys/bus/pci/devices/{dev}/driver/unbind", dev)
        if not bound.exists():
            self._quiet_write("sys/bus/pci/drivers/vfio-pci/bind", dev)
        return bound.exists()

    def _quiet_write(self, path: str, value: str) -> None:
        try:
            self.write(path, value)
        except SysfsWriteError:
            pass


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
