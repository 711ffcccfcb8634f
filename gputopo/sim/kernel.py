"""A simulated Linux kernel behind :class:`gputopo.ports.SysfsPort`: PCI bind semantics on a tree.

:class:`SimKernel` changes a materialised fixture or snapshot root the way the kernel changes
``/sys`` when userspace writes the PCI driver attributes. The rules follow
Documentation/ABI/testing/sysfs-bus-pci, drivers/base/bus.c, drivers/base/driver.c,
drivers/pci/pci-driver.c and fs/sysfs/file.c:

* ``driver_override`` (driver_set_override): a name sets it and reads back ``name\\n``; ``"\\n"``
  clears it (reads back ``(null)\\n``); a zero-length write never reaches the attribute
  (sysfs_kf_write returns 0 for ``count == 0``) so it changes nothing. While set, only the named
  driver matches the device (pci_match_device), whatever the id tables say.
* ``drivers/<drv>/unbind``: ENODEV unless the address is bound to ``<drv>``.
* ``drivers/<drv>/bind``: ENODEV for an unknown address or a driver that does not match,
  EBUSY when the device already has a driver, the probe's error when the probe fails.
* ``drivers_probe``: ENODEV for an unknown address; otherwise success, even when no driver
  matched or the device was already bound (drivers_probe_store).
* ``new_id``/``remove_id``: dynamic ids; ``new_id`` makes the driver probe every unbound device
  that now matches (pci_add_dynid -> driver_attach); EEXIST when the id already matches.
* ``remove`` (remove_store): ``kstrtoul(buf, 0)`` or EINVAL; a non-zero number unbinds the
  driver and removes the device, ``0`` does nothing.
* Writing below a driver directory that does not exist (a driver that is not loaded) fails
  with ENOENT, as opening a missing file does.

Matching uses a built-in table of well-known drivers' id rules plus one rule that makes a
snapshot of any host work: a device matches the driver it was bound to when the simulator first
saw the tree. Side effects appear and vanish as on a real host: nvidia creates
``proc/driver/nvidia/gpus/<bdf>/information`` and ``dev/nvidia<minor>``; vfio-pci creates
``dev/vfio/<group>`` while any member of the group is bound to it. Unbinding a device whose
node is held open (a ``proc/<pid>/fd/*`` link to it) blocks until the holder goes away.

Latencies, a global ``time_scale`` and injected faults live with the rest of the simulator's
state in ``<root>/.gputopo-sim/kernel.json`` so every process using the same root sees them.
Each instance also keeps, in memory, the driver operations it carried out (:meth:`SimKernel.events`),
so a test can check what happened and when instead of timing a whole run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid as _uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from gputopo.errors import SysfsWriteError

STATE_DIR = ".gputopo-sim"
STATE_FILE = "kernel.json"
ANY = 0xFFFFFFFF

# Seconds per operation before time_scale; "<driver>.<op>" wins over "<op>". The nvidia numbers
# are what an unbind/bind of one large GPU costs on a real host (teardown of the GSP firmware).
DEFAULT_LATENCY: dict[str, float] = {
    "nvidia.unbind": 2.0,
    "nvidia.bind": 0.5,
    "vfio-pci.unbind": 0.05,
    "vfio-pci.bind": 0.1,
}

FAULT_KINDS = ("errno", "hang", "noop", "fall_off", "dead")
FAULT_OPS = ("override", "unbind", "bind", "probe", "new_id", "remove_id", "*")


@dataclass(frozen=True)
class IdRule:
    """One pci_device_id: ``None`` fields match anything (PCI_ANY_ID)."""

    vendor: int | None = None
    device: int | None = None
    cls: int = 0
    class_mask: int = 0

    def matches(self, dev: "DevIds") -> bool:
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


@dataclass(frozen=True)
class KernelEvent:
    """One driver operation the simulated kernel carried out on a device.

    ``start``: ``time.monotonic()`` once the device was this write's to change (its lock held,
    faults passed); ``end``: when the tree showed the result. ``delay``: the latency it was given
    (seconds, ``time_scale`` applied).
    """

    op: str  # "unbind" or "bind" (a bind through bind, drivers_probe or new_id)
    driver: str
    address: str
    delay: float
    start: float
    end: float


def parse_hex_attr(text: str) -> int | None:
    """``"0x10de\\n"`` -> 0x10de; None for text that is not a hex number."""
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def parse_id_fields(text: str, limit: int) -> list[int]:
    """The leading hex fields of a new_id/remove_id write, as the kernel's sscanf("%x ...")
    reads them: parsing stops at the first field that is not hex; at most ``limit`` fields."""
    out: list[int] = []
    for tok in text.split():
        if len(out) == limit:
            break
        try:
            out.append(int(tok, 16))
        except ValueError:
            break
    return out


def parse_kstrtoul(text: str) -> int | None:
    """The kernel's ``kstrtoul(s, 0, &v)``: one optional trailing newline, an optional ``+``, a
    ``0x`` (hex) or ``0`` (octal) prefix, no spaces; None where the kernel returns -EINVAL."""
    body = text[:-1] if text.endswith("\n") else text
    body = body[1:] if body.startswith("+") else body
    digits, allowed, base = body, "0123456789", 10
    if body[:2].lower() == "0x":
        digits, allowed, base = body[2:], "0123456789abcdefABCDEF", 16
    elif body.startswith("0") and len(body) > 1:
        digits, allowed, base = body[1:], "01234567", 8
    if not digits or any(c not in allowed for c in digits):
        return None
    return int(digits, base)


def parse_override(text: str) -> str | None:
    """The value of a ``driver_override`` attribute as read back; None for ``(null)``."""
    value = text.strip()
    return None if value in ("", "(null)") else value


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


def _set_minor_line(text: str, minor: int) -> str:
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


class _Fail(Exception):
    """Internal: carries an errno out of the locked section."""

    def __init__(self, err: int, detail: str = ""):
        self.err = err
        self.detail = detail


class SimKernel:
    """Simulated kernel sysfs semantics over the tree at ``root`` (implements SysfsPort).

    ``write`` raises :class:`gputopo.errors.SysfsWriteError` with the errno the kernel would
    return; like the kernel it may block (latency, a held device node, an injected hang).
    ``time_scale`` (if given) and ``latency`` overrides are stored in the shared state file.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        time_scale: float | None = None,
        latency: dict[str, float] | None = None,
        poll: float = 0.02,
    ):
        self.root = str(root)
        self._root = Path(self.root)
        self.poll = poll
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._dev_locks: dict[str, threading.Lock] = {}
        self._events: list[KernelEvent] = []
        with self._state() as st:
            if time_scale is not None:
                st["time_scale"] = time_scale
            if latency:
                st["latency"].update(latency)

    # --- state file ------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self._root / STATE_DIR / STATE_FILE

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The simulator's state, locked against other threads and processes; saved on exit
        (also when an error leaves the block: tree changes made so far must stay recorded).
        Re-entrant within one thread."""
        held = getattr(self._tls, "state", None)
        if held is not None:
            yield held
            return
        d = self._root / STATE_DIR
        d.mkdir(exist_ok=True)
        with self._lock:
            with open(d / "kernel.lock", "a+") as lk:
                fcntl.flock(lk, fcntl.LOCK_EX)
                try:
                    try:
                        st = json.loads(self.state_path.read_text())
                    except FileNotFoundError:
                        st = self._first_sight()
                    before = json.dumps(st, sort_keys=True)
                    self._tls.state = st
                    try:
                        yield st
                    finally:
                        self._tls.state = None
                        if json.dumps(st, sort_keys=True) != before or not self.state_path.exists():
                            fd, tmp = tempfile.mkstemp(dir=d, prefix=".kernel.")
                            with os.fdopen(fd, "w") as f:
                                json.dump(st, f, indent=1, sort_keys=True)
                            os.replace(tmp, self.state_path)
                finally:
                    fcntl.flock(lk, fcntl.LOCK_UN)

    def _read_state(self) -> dict[str, Any]:
        with self._state() as st:
            return json.loads(json.dumps(st))

    def _first_sight(self) -> dict[str, Any]:
        """Record how the tree looked the first time: the bindings, nvidia minors and texts."""
        original: dict[str, str | None] = {}
        minors: dict[str, int] = {}
        info: dict[str, str] = {}
        for addr in self._addresses():
            drv = self._driver(addr)
            original[addr] = drv
            text = self._read(f"proc/driver/nvidia/gpus/{addr}/information")
            if text is not None:
                info[addr] = text
                m = parse_minor(text)
                if m is not None:
                    minors[addr] = m
        return {
            "version": 1,
            "original": original,
            "minors": minors,  # nvidia minor per bound GPU (or the last one it had)
            "nv_info": info,
            "dynids": {},
            "removed": [],
            "time_scale": 1.0,
            "latency": dict(DEFAULT_LATENCY),
            "address_latency": {},
            "faults": [],
            "next_fault": 1,
        }

    # --- configuration (tests, demo, rehearsal) -------------------------------------------

    def configure(
        self,
        *,
        time_scale: float | None = None,
        latency: dict[str, float] | None = None,
        address_latency: dict[str, dict[str, float]] | None = None,
    ) -> None:
        """Set the global time scale and per-op (``"nvidia.unbind"``, ``"bind"``) or
        per-address (``{"0000:01:00.0": {"unbind": 3.0}}``) latencies in seconds."""
        with self._state() as st:
            if time_scale is not None:
                st["time_scale"] = float(time_scale)
            if latency:
                st["latency"].update(latency)
            if address_latency:
                for a, ops in address_latency.items():
                    st["address_latency"].setdefault(a, {}).update(ops)

    def inject(self, address: str, op: str, kind: str, err: int | None = None, times: int | None = None) -> int:
        """Add a fault for ``address`` (or ``"*"``) on ``op`` and return its id.

        ``op``: override, unbind, bind (any attach: bind, drivers_probe, new_id), probe
        (drivers_probe itself), new_id, remove_id or ``"*"``. ``kind``: ``errno`` (the write
        fails with ``err``, default EBUSY), ``hang`` (the write blocks until :meth:`release`),
        ``noop`` (reports success, changes nothing), ``fall_off`` (the device leaves the bus
        during the write, which fails with ENODEV), ``dead`` (config space reads 0xff from then
        on; the write goes ahead). ``times``: how many writes it hits (None: every one).
        Raises ValueError for an unknown op or kind.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (one of {', '.join(FAULT_KINDS)})")
        if op not in FAULT_OPS:
            raise ValueError(f"unknown fault op {op!r} (one of {', '.join(FAULT_OPS)})")
        with self._state() as st:
            fid = st["next_fault"]
            st["next_fault"] = fid + 1
            st["faults"].append(
                {"id": fid, "address": address, "op": op, "kind": kind,
                 "errno": err if err is not None else errno.EBUSY, "times": times}
            )
            return fid

    def release(self, address: str | None = None) -> None:
        """Let hung writes for ``address`` (all addresses when None) return; they then act."""
        with self._state() as st:
            st["faults"] = [
                f for f in st["faults"]
                if not (f["kind"] == "hang" and (address is None or f["address"] in (address, "*")))
            ]

    def clear_faults(self, address: str | None = None) -> None:
        """Remove every fault (for ``address`` only, when given), hangs included."""
        with self._state() as st:
            st["faults"] = [f for f in st["faults"] if address is not None and f["address"] != address]

    def events(self) -> list[KernelEvent]:
        """The driver operations this instance carried out, oldest first (a copy)."""
        with self._lock:
            return list(self._events)

    def _record(self, op: str, drv: str, addr: str, delay: float, start: float) -> None:
        with self._lock:
            self._events.append(KernelEvent(op, drv, addr, delay, start, time.monotonic()))

    def fall_off(self, address: str) -> None:
        """The device leaves the bus now (surprise removal): its directory, its links and its
        driver's side effects disappear. Raises KeyError for an unknown address."""
        with self._state() as st:
            if address not in self._addresses():
                raise KeyError(address)
            self._remove_device(st, address)

    def kill_device(self, address: str) -> None:
        """The device stops answering (config space reads 0xff); it stays bound and listed."""
        with self._state():
            self._make_dead(address)

    # --- reading the tree -----------------------------------------------------------------

    def _p(self, rel: str) -> Path:
        return self._root / rel

    def _read(self, rel: str) -> str | None:
        try:
            return self._p(rel).read_text()
        except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
            return None

    def _addresses(self) -> list[str]:
        d = self._p("sys/bus/pci/devices")
        try:
            return sorted(e.name for e in os.scandir(d) if os.path.isdir(e.path))
        except FileNotFoundError:
            return []

    def _devdir(self, addr: str) -> Path:
        return Path(os.path.realpath(self._p(f"sys/bus/pci/devices/{addr}")))

    def _exists(self, addr: str) -> bool:
        link = self._p(f"sys/bus/pci/devices/{addr}")
        return os.path.lexists(link) and link.is_dir()

    def _driver(self, addr: str) -> str | None:
        try:
            return os.path.basename(os.readlink(self._p(f"sys/bus/pci/devices/{addr}/driver")))
        except OSError:
            return None

    def _override(self, addr: str) -> str | None:
        text = self._read(f"sys/bus/pci/devices/{addr}/driver_override")
        return parse_override(text) if text is not None else None

    def _ids(self, addr: str) -> DevIds:
        def attr(name: str, default: int) -> int:
            text = self._read(f"sys/bus/pci/devices/{addr}/{name}")
            v = parse_hex_attr(text) if text is not None else None
            return default if v is None else v

        return DevIds(attr("vendor", 0xFFFF), attr("device", 0xFFFF), attr("subsystem_vendor", ANY),
                      attr("subsystem_device", ANY), attr("class", 0xFFFFFF))

    def _loaded(self, drv: str) -> bool:
        return self._p(f"sys/bus/pci/drivers/{drv}").is_dir()

    def _loaded_drivers(self) -> list[str]:
        d = self._p("sys/bus/pci/drivers")
        try:
            names = sorted(e.name for e in os.scandir(d) if e.is_dir())
        except FileNotFoundError:
            return []
        order = {n: i for i, n in enumerate(PROBE_ORDER)}
        return sorted(names, key=lambda n: (order.get(n, len(order)), n))

    def group_of(self, addr: str) -> str | None:
        """The IOMMU group number of ``addr`` (as text), or None without one."""
        try:
            return os.path.basename(os.readlink(self._p(f"sys/bus/pci/devices/{addr}/iommu_group")))
        except OSError:
            return None

    def group_members(self, group: str | int) -> list[str]:
        d = self._p(f"sys/kernel/iommu_groups/{group}/devices")
        try:
            return sorted(os.listdir(d))
        except FileNotFoundError:
            return []

    def group_viable(self, group: str | int) -> bool:
        """vfio's viability rule: every member is a bridge, unbound, or on vfio-pci/pci-stub.

        Raises KeyError for a group that does not exist.
        """
        members = self.group_members(group)
        if not members:
            raise KeyError(f"no IOMMU group {group}")
        for m in members:
            if self._ids(m).cls >> 8 == 0x0604:
                continue
            if self._driver(m) not in (None, "vfio-pci", "pci-stub"):
                return False
        return True

    # --- matching ---------------------------------------------------------------------------

    @staticmethod
    def _dynid_match(st: dict, drv: str, ids: DevIds) -> bool:
        for v, d, sv, sd, c, cm in st["dynids"].get(drv, []):
            if ((v == ANY or v == ids.vendor) and (d == ANY or d == ids.device)
                    and (sv == ANY or sv == ids.subvendor) and (sd == ANY or sd == ids.subdevice)
                    and not ((c ^ ids.cls) & cm)):
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

    # --- faults and latency ------------------------------------------------------------------

    def _take_fault(self, st: dict, addr: str, op: str) -> dict | None:
        for f in st["faults"]:
            if f["address"] in (addr, "*") and f["op"] in (op, "*"):
                if f["kind"] != "hang" and f["times"] is not None:
                    f["times"] -= 1
                    if f["times"] <= 0:
                        st["faults"].remove(f)
                return dict(f)
        return None

    def _wait_released(self, fault_id: int) -> None:
        while True:
            st = self._read_state()
            if not any(f["id"] == fault_id for f in st["faults"]):
                return
            time.sleep(self.poll)

    def _fault(self, addr: str, op: str) -> str | None:
        """Apply an injected fault; returns ``"noop"`` when the write must do nothing."""
        with self._state() as st:
            f = self._take_fault(st, addr, op)
            if f is None:
                return None
            if f["kind"] == "fall_off":
                self._remove_device(st, addr)
            elif f["kind"] == "dead":
                self._make_dead(addr)
        if f["kind"] == "fall_off":
            raise _Fail(errno.ENODEV, f"{addr} fell off the bus")
        if f["kind"] == "errno":
            raise _Fail(f["errno"], "injected")
        if f["kind"] == "hang":
            self._wait_released(f["id"])
        return "noop" if f["kind"] == "noop" else None

    def _sleep(self, addr: str, drv: str, op: str) -> float:
        """Wait the operation's latency; returns it in seconds."""
        st = self._read_state()
        per = st["address_latency"].get(addr, {})
        lat = st["latency"]
        seconds = per.get(op, lat.get(f"{drv}.{op}", lat.get(op, 0.0)))
        delay = float(seconds) * float(st["time_scale"])
        if delay > 0:
            time.sleep(delay)
        return delay

    def _dev_lock(self, addr: str) -> threading.Lock:
        with self._lock:
            return self._dev_locks.setdefault(addr, threading.Lock())

    # --- holders ----------------------------------------------------------------------------

    def _nodes_of(self, st: dict, addr: str, drv: str) -> list[str]:
        if drv == "nvidia" and addr in st["minors"]:
            return [f"/dev/nvidia{st['minors'][addr]}"]
        if drv == "vfio-pci":
            g = self.group_of(addr)
            return [f"/dev/vfio/{g}"] if g is not None else []
        return []

    def holders(self, nodes: list[str]) -> list[int]:
        """PIDs with a ``proc/<pid>/fd/*`` link to one of ``nodes`` (``/dev/...`` paths)."""
        want = set(nodes)
        found = []
        proc = self._p("proc")
        try:
            pids = [e.name for e in os.scandir(proc) if e.name.isdigit()]
        except FileNotFoundError:
            return []
        for pid in pids:
            try:
                fds = os.scandir(proc / pid / "fd")
                for fd in fds:
                    try:
                        target = os.readlink(fd.path)
                    except OSError:
                        continue
                    if target.startswith(self.root.rstrip("/") + "/"):
                        target = target[len(self.root.rstrip("/")):]
                    if target in want:
                        found.append(int(pid))
                        break
            except (FileNotFoundError, NotADirectoryError):
                continue
        return sorted(found)

    def _wait_unheld(self, nodes: list[str]) -> None:
        # The real drivers wait in their remove callback for the last user; so do we.
        while nodes and self.holders(nodes):
            time.sleep(self.poll)

    # --- tree changes (called with the state lock held) --------------------------------------

    def _link(self, link: Path, target: Path) -> None:
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(os.path.relpath(target, link.parent), link)

    def _unlink(self, p: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)

    def _attach(self, st: dict, addr: str, drv: str) -> None:
        dev = self._devdir(addr)
        drvdir = self._p(f"sys/bus/pci/drivers/{drv}")
        self._link(dev / "driver", drvdir)
        self._link(drvdir / addr, dev)
        if drv == "nvidia":
            self._nvidia_up(st, addr)
        elif drv == "vfio-pci":
            g = self.group_of(addr)
            (self._p("dev/vfio")).mkdir(parents=True, exist_ok=True)
            self._p("dev/vfio/vfio").touch()
            if g is not None:
                self._p(f"dev/vfio/{g}").touch()

    def _detach(self, st: dict, addr: str, drv: str) -> None:
        self._unlink(self._p(f"sys/bus/pci/devices/{addr}/driver"))
        self._unlink(self._p(f"sys/bus/pci/drivers/{drv}/{addr}"))
        if drv == "nvidia":
            shutil.rmtree(self._p(f"proc/driver/nvidia/gpus/{addr}"), ignore_errors=True)
            m = st["minors"].get(addr)
            if m is not None:
                self._unlink(self._p(f"dev/nvidia{m}"))
        elif drv == "vfio-pci":
            g = self.group_of(addr)
            if g is not None and not any(
                self._driver(m) == "vfio-pci" for m in self.group_members(g) if m != addr
            ):
                self._unlink(self._p(f"dev/vfio/{g}"))

    def _nvidia_up(self, st: dict, addr: str) -> None:
        # nvidia keeps a GPU's minor when it is free again, else hands out the lowest free one
        in_use = {m for a, m in st["minors"].items() if a != addr and self._driver(a) == "nvidia"}
        previous = st["minors"].get(addr)
        minor = previous if previous is not None and previous not in in_use else next(
            i for i in range(len(in_use) + 1) if i not in in_use
        )
        st["minors"][addr] = minor
        text = st["nv_info"].get(addr)
        if text is None:
            ids = self._ids(addr)
            seed = hashlib.sha256(addr.encode()).digest()[:16]
            text = nvidia_information(
                addr, minor, f"NVIDIA Device {ids.device:04x}", f"GPU-{_uuid.UUID(bytes=seed)}"
            )
            st["nv_info"][addr] = text
        d = self._p(f"proc/driver/nvidia/gpus/{addr}")
        d.mkdir(parents=True, exist_ok=True)
        _atomic_write(d / "information", _set_minor_line(text, minor))
        self._p("dev").mkdir(exist_ok=True)
        self._p(f"dev/nvidia{minor}").touch()

    def _remove_device(self, st: dict, addr: str) -> None:
        if not self._exists(addr):
            return
        drv = self._driver(addr)
        if drv is not None:
            self._detach(st, addr, drv)
        dev = self._devdir(addr)
        g = self.group_of(addr)
        if g is not None:
            self._unlink(self._p(f"sys/kernel/iommu_groups/{g}/devices/{addr}"))
        self._unlink(self._p(f"sys/bus/pci/devices/{addr}"))
        shutil.rmtree(dev, ignore_errors=True)
        if addr not in st["removed"]:
            st["removed"].append(addr)

    def _make_dead(self, addr: str) -> None:
        base = self._devdir(addr)
        cfg = base / "config"
        size = cfg.stat().st_size if cfg.exists() else 256
        cfg.write_bytes(b"\xff" * max(size, 64))
        for name, value in (("vendor", "0xffff"), ("device", "0xffff"), ("subsystem_vendor", "0xffff"),
                            ("subsystem_device", "0xffff"), ("class", "0xffffff")):
            if (base / name).exists():
                (base / name).write_text(value + "\n")

    # --- the port ---------------------------------------------------------------------------

    def write(self, path: str, value: str) -> None:
        """Write ``value`` to ``<root>/<path>`` with the kernel's semantics.

        Raises SysfsWriteError with the kernel's errno (ENOENT for a path that does not exist).
        May block as the kernel would.
        """
        rel = path.lstrip("/")
        try:
            self._dispatch(rel, value)
        except _Fail as e:
            raise SysfsWriteError(rel, value, e.err, e.detail) from None

    def _dispatch(self, rel: str, value: str) -> None:
        full = self._p(rel)
        parent = Path(os.path.realpath(full.parent))
        name = full.name
        root = Path(os.path.realpath(self._root))
        if not parent.is_dir():
            raise _Fail(errno.ENOENT)
        try:
            prel = parent.relative_to(root).as_posix()
        except ValueError:
            raise _Fail(errno.EACCES, "outside the root") from None
        if not value:
            # sysfs_kf_write: a zero-length write never reaches the attribute's store()
            if not full.exists():
                raise _Fail(errno.ENOENT)
            return
        drivers = "sys/bus/pci/drivers/"
        if prel.startswith(drivers) and "/" not in prel[len(drivers):]:
            drv = prel[len(drivers):]
            if name == "bind":
                return self._bind(drv, _name(value))
            if name == "unbind":
                return self._unbind(drv, _name(value))
            if name == "new_id":
                return self._new_id(drv, value)
            if name == "remove_id":
                return self._remove_id(drv, value)
        elif prel == "sys/bus/pci" and name == "drivers_probe":
            return self._drivers_probe(_name(value))
        elif name in ("driver_override", "remove") and (parent / "vendor").exists():
            addr = parent.name
            if name == "driver_override":
                return self._set_override(addr, parent / name, value)
            # remove_store: kstrtoul(buf, 0, &val) or EINVAL; only a non-zero value removes
            val = parse_kstrtoul(value)
            if val is None:
                raise _Fail(errno.EINVAL)
            if val:
                self._remove(addr)
            return None
        if not full.exists():
            raise _Fail(errno.ENOENT)
        raise _Fail(errno.EOPNOTSUPP, "attribute not simulated")

    def _set_override(self, addr: str, attr: Path, value: str) -> None:
        # driver_set_override: PAGE_SIZE - 1 limit; text up to the first newline; "\n" clears
        if len(value) >= 4095:
            raise _Fail(errno.EINVAL)
        with self._dev_lock(addr):
            if self._fault(addr, "override") == "noop":
                return
            text = value.split("\0", 1)[0].split("\n", 1)[0]
            with self._state():
                if not attr.parent.is_dir():
                    raise _Fail(errno.ENOENT)
                _atomic_write(attr, f"{text}\n" if text else "(null)\n")

    def _unbind(self, drv: str, addr: str) -> None:
        with self._state():
            if not self._exists(addr) or self._driver(addr) != drv:
                raise _Fail(errno.ENODEV)
        with self._dev_lock(addr):
            if self._fault(addr, "unbind") == "noop":
                return
            with self._state() as st:
                if self._driver(addr) != drv:
                    raise _Fail(errno.ENODEV)
                nodes = self._nodes_of(st, addr, drv)
            start = time.monotonic()
            delay = self._sleep(addr, drv, "unbind")
            self._wait_unheld(nodes)
            with self._state() as st:
                if self._exists(addr) and self._driver(addr) == drv:
                    self._detach(st, addr, drv)
                    self._record("unbind", drv, addr, delay, start)

    def _try_attach(self, drv: str, addr: str, explicit: bool) -> None:
        """Probe ``drv`` on ``addr`` (device lock held by the caller). With ``explicit`` (the
        bind file) every refusal is an error; otherwise refusals are silent (probe, new_id)."""
        with self._state() as st:
            if not self._exists(addr):
                raise _Fail(errno.ENODEV)
            if not self._matches(st, drv, addr):
                if explicit:
                    raise _Fail(errno.ENODEV)
                return
            if self._driver(addr) is not None:
                if explicit:
                    raise _Fail(errno.EBUSY)
                return
            err = self._probe_error(st, drv, addr)
            if err is not None:
                if explicit:
                    raise _Fail(err, f"{drv} probe failed")
                return
        if self._fault(addr, "bind") == "noop":
            return
        start = time.monotonic()
        delay = self._sleep(addr, drv, "bind")
        with self._state() as st:
            if not self._exists(addr):
                raise _Fail(errno.ENODEV)
            if self._driver(addr) is not None:
                if explicit:
                    raise _Fail(errno.EBUSY)
                return
            self._attach(st, addr, drv)
            self._record("bind", drv, addr, delay, start)

    def _bind(self, drv: str, addr: str) -> None:
        with self._state():
            if not self._exists(addr):
                raise _Fail(errno.ENODEV)
        with self._dev_lock(addr):
            self._try_attach(drv, addr, explicit=True)

    def _drivers_probe(self, addr: str) -> None:
        with self._state():
            if not self._exists(addr):
                raise _Fail(errno.ENODEV)
        with self._dev_lock(addr):
            if self._fault(addr, "probe") == "noop":
                return
            with self._state() as st:
                if self._driver(addr) is not None:
                    return
                ids = self._ids(addr)
                candidates = [d for d in self._loaded_drivers() if self._matches(st, d, addr)]
                # dynamic ids are what the user asked for; among static matches the driver the
                # device had at first sight stands in for the real module load order
                candidates.sort(key=lambda d: (not self._dynid_match(st, d, ids),
                                               st["original"].get(addr) != d))
                chosen = next((d for d in candidates if self._probe_error(st, d, addr) is None), None)
            if chosen is not None:
                self._try_attach(chosen, addr, explicit=False)

    def _new_id(self, drv: str, value: str) -> None:
        fields = parse_id_fields(value, 7)
        v, d, sv, sd, c, cm = _id_rule(fields)
        data = fields[6] if len(fields) > 6 else 0
        with self._state() as st:
            if len(fields) != 7 and self._id_match(st, drv, None, DevIds(v, d, sv, sd, c)):
                raise _Fail(errno.EEXIST)
            if data != 0:
                # only driver_data values of an existing id_table entry are accepted (all 0 here)
                raise _Fail(errno.EINVAL)
        if self._fault("*", "new_id") == "noop":
            return
        with self._state() as st:
            st["dynids"].setdefault(drv, []).append([v, d, sv, sd, c, cm])
            targets = [a for a in self._addresses() if self._driver(a) is None]
        # driver_attach: every unbound device that now matches is probed, one after another
        for addr in targets:
            with self._dev_lock(addr):
                with contextlib.suppress(_Fail):
                    self._try_attach(drv, addr, explicit=False)

    def _remove_id(self, drv: str, value: str) -> None:
        v, d, sv, sd, c, cm = _id_rule(parse_id_fields(value, 6))
        with self._state() as st:
            ids = st["dynids"].get(drv, [])
            for rule in ids:
                if (rule[0] == v and rule[1] == d and (sv == ANY or rule[2] == sv)
                        and (sd == ANY or rule[3] == sd) and not ((rule[4] ^ c) & cm)):
                    ids.remove(rule)
                    return
        raise _Fail(errno.ENODEV)

    def _remove(self, addr: str) -> None:
        # pci_stop_and_remove_bus_device: the driver is unbound first (and may block), then
        # the device is gone
        drv = self._driver(addr)
        if drv is not None:
            self._unbind(drv, addr)
        with self._state() as st:
            self._remove_device(st, addr)


def _id_rule(fields: list[int]) -> tuple[int, int, int, int, int, int]:
    """(vendor, device, subvendor, subdevice, class, class_mask) of a new_id/remove_id write with
    the kernel's defaults for fields left out (PCI_ANY_ID, 0); EINVAL without vendor and device."""
    if len(fields) < 2:
        raise _Fail(errno.EINVAL)
    padded = fields[:6] + [ANY, ANY, 0, 0][max(0, len(fields) - 2):]
    return tuple(padded[:6])  # type: ignore[return-value]


def _name(value: str) -> str:
    # bus_find_device_by_name uses sysfs_streq: one trailing newline is ignored, nothing else
    return value[:-1] if value.endswith("\n") else value


def _atomic_write(path: Path, text: str) -> None:
    """Replace a file's content in one step: a kernel attribute never reads half-written, even
    when the simulating process is killed mid-write."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
