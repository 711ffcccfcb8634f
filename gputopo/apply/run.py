"""Apply a plan to a host: checked first, locked, journaled step by step, rolled back on failure.

:func:`apply` runs, in this order:

a. discover + read the current state + plan; an empty plan returns ``no-changes``;
b. preflight: everything that can be checked before anything stops (IOMMU and vfio-pci, other
   holders of the moving GPUs' device nodes, running VMs outside the plan that use them,
   mapping names, API reachability and privilege, the containers). Every problem is one line
   of a :class:`PreflightFailed` (exit 2) and nothing is changed;
c. the host lock ``<root>/run/lock/gputopo.lock`` (``flock``; a second apply gets LockHeld);
d. facts and state are read again under the lock and planned again: a different plan means the
   host changed since it was checked and confirmed (:class:`HostChanged`);
e. the phases: prepare (files, mappings, the service drop-in: nothing here needs the stop
   window), stop (the service, then the guests whose devices change), switch (every IOMMU
   group in parallel, one worker each, every sysfs write under a timeout and read back), config
   (the container's devN, digest read right before the PUT), start (container, then service,
   waiting until it is active).

Every step is journaled (:mod:`gputopo.apply.journal`) with the state before it, so any failure, or a
later :func:`recover` after a crash, can undo the completed steps in reverse from the journal
alone, then restart what ran before. A sysfs write that hangs is never retried by the apply
that saw it: the rollback leaves that IOMMU group alone, the error names the device (exit 3) and
the journal stays open (a ``needs-human`` record), so the next apply refuses until
:func:`recover`, run once a human fixed the device, retries the undo steps left over.

Every ``do`` and ``undo`` below is idempotent (it checks the state first), so finishing or
rolling back a journal whose last step may or may not have happened is safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn

from pydantic import TypeAdapter

from gputopo.errors import ApplyCancelled, HostChanged, HostFileError, Interrupted, PreflightFailed
from gputopo.adapters.sysfs import Binder, MemberState
from gputopo.facts.current import read_current
from gputopo.facts.discover import discover
from gputopo.facts.procfs import find_holders
from gputopo.errors import (
    ApplyFailed,
    BindError,
    ExecError,
    GputopoError,
    JournalError,
    LockHeld,
    ProxmoxError,
    SysfsTimeout,
)
from gputopo.apply.journal import Journal, find_unfinished
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.planner import DEV_KEY, Action, DeleteMapping, Plan, Rebind, RemoveHostFile, SetMapping, StartGuest, StartService, StopGuest, StopService, UpdateContainer, WriteHostFile, WriteServiceDropin, pick_node, plan as make_plan, resolve_devices
from gputopo.ports import Ports
from gputopo.plan.spec import Spec

LOCK_PATH = "run/lock/gputopo.lock"
MAPPING_ID = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)  # pve-configid
_ACTION = TypeAdapter(Action)


# --- errors ----------------------------------------------------------------------------------


@contextlib.contextmanager
def interruptible():
    """While inside, Ctrl-C, SIGTERM and SIGHUP raise a KeyboardInterrupt (that
    :func:`_as_error` turns into :class:`Interrupted`) in the main thread, so a polite kill
    (systemd, a dropped ssh session) rolls back instead of ending the process between two
    steps. Elsewhere than in the main thread (where no handler can be set) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if _HOLD["depth"]:
            _HOLD["pending"] = signum
            return
        raise _Signalled(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_HOLD: dict[str, Any] = {"depth": 0, "pending": None}  # touched by the main thread only


@contextlib.contextmanager
def _signals_held():
    """A signal of :func:`interruptible` that arrives inside is raised when the block ends."""
    _HOLD["depth"] += 1
    try:
        yield
    finally:
        _HOLD["depth"] -= 1
        if not _HOLD["depth"] and _HOLD["pending"] is not None:
            signum, _HOLD["pending"] = _HOLD["pending"], None
            raise _Signalled(signum)


class _Signalled(KeyboardInterrupt):
    # a KeyboardInterrupt, so that no adapter's "except Exception" turns it into its own error
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _as_error(e: BaseException) -> BaseException:
    """Ctrl-C and the signals of :func:`interruptible` as :class:`Interrupted`; others as they are."""
    if isinstance(e, KeyboardInterrupt):
        return Interrupted(getattr(e, "signum", signal.SIGINT))
    return e


def _failed(where: str, cause: BaseException, complete: bool, stuck: list[str]) -> ApplyFailed:
    err = ApplyFailed(where, cause, complete, stuck)
    if isinstance(cause, Interrupted) and not stuck:
        err.exit_code = cause.exit_code  # a device needing a human (3) still outranks it
    return err


# --- options and results ---------------------------------------------------------------------


@dataclass
class Timeouts:
    """Seconds each kind of operation may take before it counts as failed."""

    sysfs: float = 30.0  # one sysfs write (an unbind that blocks longer needs a human)
    guest: float = 300.0  # a container/VM start or shutdown task
    exec: float = 60.0  # one command in a container (systemctl stop/start)
    service: float = 900.0  # until the service reports active (model loading)
    poll: float = 0.1


@dataclass
class StepResult:
    index: int
    phase: str
    text: str
    status: str  # done | failed
    seconds: float


@dataclass
class ApplyResult:
    """What :func:`apply` or :func:`recover` did. ``status``: no-changes, dry-run, applied,
    rolled-back (verify failed and ``rollback_on_verify_failure``), recovered, finished."""

    status: str
    plan: Plan | None = None
    steps: list[StepResult] = field(default_factory=list)
    wall_s: float = 0.0
    stop_window_s: float | None = None
    journal: str | None = None
    verify: Any = None

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "rolled-back" else 0


class Progress:
    """Receives apply's events; the default shows nothing. The CLI passes a display."""

    def plan(self, p: Plan) -> None: ...

    def step_begin(self, index: int, total: int, action: Any) -> None: ...

    def step_end(self, index: int, total: int, action: Any, status: str, seconds: float) -> None: ...

    def note(self, text: str) -> None: ...

    def summary(self, result: ApplyResult) -> None: ...


class PlainProgress(Progress):
    """One line per event on ``stream`` (for logs and non-terminals)."""

    def __init__(self, stream: Any = None):
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()

    def _w(self, text: str) -> None:
        with self._lock:
            print(text, file=self.stream, flush=True)

    def step_begin(self, index: int, total: int, action: Any) -> None:
        self._w(f"[{index + 1:>2}/{total}] {action.phase:<7} {action.describe()} ...")

    def step_end(self, index: int, total: int, action: Any, status: str, seconds: float) -> None:
        self._w(f"[{index + 1:>2}/{total}] {action.phase:<7} {action.describe()}: {status} ({seconds:.2f} s)")

    def note(self, text: str) -> None:
        self._w(text)

    def summary(self, result: ApplyResult) -> None:
        window = f", stop window {result.stop_window_s:.2f} s" if result.stop_window_s is not None else ""
        self._w(f"{result.status} in {result.wall_s:.2f} s{window}")


class _QuietProgress(Progress):
    """Passes events on, but a display that cannot be written (the terminal of a dropped ssh
    session: EIO, a closed pipe) never stops an apply or its rollback half-way."""

    def __init__(self, inner: Progress):
        self.inner = inner

    def _call(self, name: str, *args: Any) -> None:
        try:
            getattr(self.inner, name)(*args)
        except OSError:
            pass

    def plan(self, p: Plan) -> None:
        self._call("plan", p)

    def step_begin(self, index: int, total: int, action: Any) -> None:
        self._call("step_begin", index, total, action)

    def step_end(self, index: int, total: int, action: Any, status: str, seconds: float) -> None:
        self._call("step_end", index, total, action, status, seconds)

    def note(self, text: str) -> None:
        self._call("note", text)

    def summary(self, result: ApplyResult) -> None:
        self._call("summary", result)


# --- the host lock ---------------------------------------------------------------------------


class HostLock:
    """``flock`` on ``<root>/run/lock/gputopo.lock``; the holder's pid, command and start time
    are written into the file so a refused apply can name it. The file itself is never removed
    (removing a lock file lets two processes lock two different files)."""

    def __init__(self, root: str | os.PathLike):
        self.path = Path(root) / LOCK_PATH
        self.fd: int | None = None

    def acquire(self) -> HostLock:
        """Take the lock or raise LockHeld naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that wrote no details"
            os.close(fd)
            raise LockHeld(str(self.path), holder) from None
        cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)) or "python"
        text = f"pid {os.getpid()} ({cmd}) since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def check(self) -> None:
        """Raise LockHeld when another process holds the lock; creates nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that wrote no details"
            raise LockHeld(str(self.path), holder) from None
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> HostLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


# --- planning ----------------------------------------------------------------------------------


def read_and_plan(spec: Spec, ports: Ports, root: str, node: str | None = None) -> tuple[Facts, CurrentState, Plan]:
    """Discover ``root``, read the current state through ``ports`` and plan.

    Raises what discover, read_current and plan raise (RootError, ProxmoxError, PlanRefused...).
    """
    facts = discover(root)
    current = read_current(spec, facts, proxmox=ports.proxmox, exec=ports.exec, files=ports.files, node=node)
    return facts, current, make_plan(facts, spec, current, node=node)


def _signature(p: Plan) -> list[dict]:
    # digests are re-read right before each write; a changed digest alone is not a changed plan
    return [a.model_dump(exclude={"digest"}) for a in p.actions]


def _diff_text(a: Plan, b: Plan) -> str:
    old = [x.describe() for x in a.actions]
    new = [x.describe() for x in b.actions]
    gone = [x for x in old if x not in new]
    added = [x for x in new if x not in old]
    if added:
        return f"now also: {added[0]}"
    if gone:
        return f"no longer: {gone[0]}"
    return "the actions' details differ"


# --- preflight ---------------------------------------------------------------------------------


def parse_cgroup_container(text: str) -> int | None:
    """The LXC container a process runs in, from ``/proc/<pid>/cgroup`` text (``0::/lxc/101/ns/..``,
    cgroup v1 ``4:devices:/lxc/101``, or the payload cgroup ``/lxc.payload.101/``); None on the host."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = re.search(r"/lxc(?:\.payload)?[./](\d+)(?:/|$)", path)
        if m:
            return int(m.group(1))
    return None


def _moving_gpus(p: Plan, facts: Facts) -> list[tuple[str, int | None]]:
    out = []
    for a in p.actions:
        if isinstance(a, Rebind) and a.to_driver == "vfio-pci":
            for m in a.members:
                g = facts.gpu(m)
                if g is not None and g.driver == "nvidia":
                    out.append((m, g.minor))
    return out


def preflight(p: Plan, facts: Facts, current: CurrentState, spec: Spec, ports: Ports, root: str,
              node: str | None = None) -> list[str]:
    """Every problem that would make the plan fail or harm a workload, one line each ([] = go).

    Changes nothing. Reads ``<root>/proc`` for holders, the API for guests and privileges.
    A container of the spec that does not exist is the only problem reported: the plan was made
    for a host other than this one, so every other finding would follow from that mistake.
    """
    spec_node = pick_node(spec, facts, node)
    missing = [f"container {c.vmid} does not exist on node {spec_node.name}"
               for c in spec_node.containers if c.vmid not in current.containers]
    if missing:
        return missing
    problems: list[str] = []
    rebinds = [a for a in p.actions if isinstance(a, Rebind)]
    to_vfio = [a for a in rebinds if a.to_driver == "vfio-pci"]
    if to_vfio:
        if not facts.host.iommu_enabled:
            problems.append("IOMMU is off (no sys/kernel/iommu_groups); add amd_iommu=on or intel_iommu=on "
                            "to the kernel command line and reboot")
        if not (Path(root) / "sys/bus/pci/drivers/vfio-pci").is_dir():
            problems.append("the vfio-pci driver is not loaded (no sys/bus/pci/drivers/vfio-pci); run: modprobe vfio-pci")
    to_nvidia = [a for a in rebinds if a.to_driver == "nvidia"]
    if to_nvidia and not (Path(root) / "sys/bus/pci/drivers/nvidia").is_dir():
        problems.append(f"the nvidia driver is not loaded (no sys/bus/pci/drivers/nvidia) but "
                        f"{', '.join(a.address for a in to_nvidia)} must go back to it; run: modprobe nvidia")

    stopped_cts = {a.vmid for a in p.actions if isinstance(a, StopGuest) and a.guest == "lxc"}
    moving = _moving_gpus(p, facts)
    if moving:
        nodes = {f"/dev/nvidia{minor}": addr for addr, minor in moving if minor is not None}
        # nvidia_drm gives a GPU /dev/dri nodes; a display server or console on them holds it too
        nodes.update({f"/dev/dri/{name}": addr for addr, _ in moving for name in _drm_nodes(root, addr)})
        # a CUDA context on the host holds the control nodes too, and keeps every GPU busy
        paths = sorted(nodes) + ["/dev/nvidiactl", "/dev/nvidia-uvm"]
        held = find_holders(root, paths)
        for path in paths:
            for pid, comm in held.get(path, []):
                try:
                    cg = (Path(root) / "proc" / str(pid) / "cgroup").read_text()
                except OSError:
                    cg = ""
                ct = parse_cgroup_container(cg)
                if ct is not None and ct in stopped_cts:
                    continue  # it ends when the plan stops its container
                cmdline = _cmdline(root, pid) or comm
                where = f" in CT {ct}, which the plan does not stop" if ct is not None else ""
                gpu = f" (GPU {nodes[path]})" if path in nodes else ""
                if comm == "nvidia-persistenced":
                    problems.append(f"{path}{gpu} is held open by nvidia-persistenced (PID {pid}); it keeps every GPU "
                                    "on nvidia: run 'systemctl stop nvidia-persistenced' before apply (and "
                                    "'systemctl start nvidia-persistenced' after)")
                else:
                    problems.append(f"{path}{gpu} is held open by PID {pid} ({cmdline}){where}; stop it before apply")

    # running VMs outside the plan's stop list that use a moving GPU
    moving_addrs = {m for a in rebinds for m in a.members}
    stopped_vms = {a.vmid for a in p.actions if isinstance(a, StopGuest) and a.guest == "qemu"}
    try:
        ports.proxmox.version()
        api_ok = True
    except ProxmoxError as e:
        problems.append(f"the Proxmox API is not reachable: {e}")
        api_ok = False
    if api_ok and moving_addrs:
        try:
            guests = ports.proxmox.list_guests("qemu")
        except ProxmoxError as e:
            problems.append(f"cannot list VMs: {e}")
            guests = []
        mapping_paths = {mid: {_entry_path(e) for e in m.map} for mid, m in current.mappings.items()}
        for g in guests:
            vmid = int(g["vmid"])
            if vmid in stopped_vms or ports.proxmox.guest_status("qemu", vmid) != "running":
                continue
            try:
                cfg = ports.proxmox.qemu_config(vmid)
            except ProxmoxError:
                continue
            for k, v in cfg.items():
                if not re.fullmatch(r"hostpci\d+", k):
                    continue
                hits = _hostpci_addresses(str(v), mapping_paths) & moving_addrs
                if hits:
                    problems.append(f"VM {vmid} is running with {', '.join(sorted(hits))} ({k}) and the plan does "
                                    f"not stop it; shut it down or list it in the spec's vms.guests")

    for a in p.actions:
        if isinstance(a, (SetMapping, DeleteMapping)) and not MAPPING_ID.match(a.id):
            problems.append(f"mapping name {a.id!r} is not valid for Proxmox (a letter, then letters, digits, - or _)")
    dev_change = any(isinstance(a, UpdateContainer) and (any(k.startswith("dev") for k in a.set)
                                                         or any(k.startswith("dev") for k in a.delete)
                                                         or a.resolve)
                     for a in p.actions)
    if api_ok and dev_change:
        check = getattr(ports.proxmox, "can_change_devices", None)
        if check is not None:
            ok, why = check()
            if not ok:
                problems.append(why)
    for a in p.actions:
        if isinstance(a, UpdateContainer) and (a.lxc_add or a.lxc_remove):
            problems.append(f"CT {a.vmid}: legacy lxc.* device lines cannot be changed through the Proxmox API; "
                            "use device_mode: devN (Proxmox >= 8.1)")
    for a in p.actions:
        if isinstance(a, WriteServiceDropin):
            ct = current.containers.get(a.vmid)
            if ct is not None and ct.status != "running":
                problems.append(f"CT {a.vmid} is stopped; start it so {a.path} can be written (pct push needs it running)")
    return problems


def _drm_nodes(root: str, address: str) -> list[str]:
    """The /dev/dri names (``card1``, ``renderD128``) the kernel's DRM driver made for a device."""
    try:
        names = os.listdir(Path(root) / "sys/bus/pci/devices" / address / "drm")
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(("card", "renderD")))


def _cmdline(root: str, pid: int) -> str | None:
    try:
        raw = (Path(root) / "proc" / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text or None


def _entry_path(entry: str) -> str:
    for part in entry.split(","):
        if part.startswith("path="):
            return part[5:]
    return ""


def _hostpci_addresses(value: str, mapping_paths: dict[str, set[str]]) -> set[str]:
    first = value.split(",", 1)[0]
    if first.startswith("mapping="):
        return set(mapping_paths.get(first[8:], set()))
    host = first[5:] if first.startswith("host=") else first
    out = set()
    for h in host.split(";"):
        h = h if h.count(":") >= 2 else f"0000:{h}"
        out.add(h)
        if "." not in h.rsplit(":", 1)[-1]:  # a whole slot: every function
            out.update(f"{h}.{f}" for f in range(8))
    return out


# --- steps: before, do, undo ---------------------------------------------------------------------


class Steps:
    """How each action kind reads its before-state, is carried out and is undone, over ports.

    ``do`` and ``undo`` are idempotent. Raises the ports' errors (ProxmoxError, TaskFailed,
    ExecError, SysfsWriteError, SysfsTimeout, BindError).
    """

    def __init__(self, ports: Ports, root: str, timeouts: Timeouts):
        self.ports = ports
        self.root = root
        self.t = timeouts
        self.binder = Binder(ports.sysfs, root, timeouts.sysfs)
        self.service_changed: set[int] = set()  # containers whose drop-in a rollback restored
        self.gone: set[str] = set()  # devices a rollback found gone from the bus

    # -- helpers
    def _exec(self, vmid: int, argv: list[str], check: bool = True):
        res = self.ports.exec.run(vmid, argv, self.t.exec)
        if check and res.rc != 0:
            raise ExecError(vmid, argv, res.rc, res.stderr)
        return res

    def _running(self, kind: str, vmid: int) -> bool:
        return self.ports.proxmox.guest_status(kind, vmid) == "running"

    def _service_active(self, vmid: int, unit: str) -> bool:
        if not self._running("lxc", vmid):
            return False
        return self._exec(vmid, ["systemctl", "is-active", unit], check=False).stdout.strip() == "active"

    def _mapping(self, id: str) -> dict | None:
        for m in self.ports.proxmox.mappings():
            if m["id"] == id:
                return m
        return None

    def _read_dropin(self, vmid: int, path: str) -> str | None:
        res = self._exec(vmid, ["cat", path], check=False)
        if res.rc == 0:
            return res.stdout
        if "No such file" in res.stderr:
            return None
        raise ExecError(vmid, ["cat", path], res.rc, res.stderr)

    def _wait_active(self, vmid: int, unit: str) -> None:
        deadline = time.monotonic() + self.t.service
        while True:
            res = self._exec(vmid, ["systemctl", "is-active", unit], check=False)
            state = res.stdout.strip()
            if state == "active":
                return
            if state in ("failed", "inactive") or time.monotonic() >= deadline:
                raise ExecError(vmid, ["systemctl", "is-active", unit], None if state not in ("failed", "inactive") else res.rc,
                                f"{unit} is {state or 'unknown'}")
            time.sleep(self.t.poll)

    def start_service(self, vmid: int, unit: str) -> None:
        """daemon-reload, start ``unit`` and wait until it is active. Raises ExecError."""
        self._exec(vmid, ["systemctl", "daemon-reload"])
        self._exec(vmid, ["systemctl", "start", unit])
        self._wait_active(vmid, unit)

    # -- before
    def before(self, a: Any) -> dict[str, Any]:
        """The state ``a`` changes, as JSON data, enough to undo it later from the journal."""
        px = self.ports.proxmox
        if isinstance(a, (WriteHostFile, RemoveHostFile)):
            return {"content": self.ports.files.read(a.path)}
        if isinstance(a, (SetMapping, DeleteMapping)):
            m = self._mapping(a.id)
            return {"exists": m is not None, "map": list(m.get("map") or []) if m else [],
                    "description": m.get("description") if m else None}
        if isinstance(a, WriteServiceDropin):
            return {"content": self._read_dropin(a.vmid, a.path)}
        if isinstance(a, (StopService, StartService)):
            return {"active": self._service_active(a.vmid, a.unit)}
        if isinstance(a, (StopGuest, StartGuest)):
            return {"status": px.guest_status(a.guest, a.vmid)}
        if isinstance(a, Rebind):
            return {m: {"driver": s.driver, "override": s.override}
                    for m, s in ((m, self.binder.state_of(m)) for m in a.members)}
        if isinstance(a, UpdateContainer):
            cfg = px.lxc_config(a.vmid)
            return {"config": {k: v for k, v in cfg.items() if k != "digest"}}
        raise TypeError(f"no before-state for action {a.kind}")

    # -- do
    def do(self, a: Any) -> None:
        try:
            self._do(a)
        except OSError as e:  # host files: the only steps that touch this host's filesystem
            raise HostFileError(getattr(a, "path", "?"), e) from e

    def _do(self, a: Any) -> None:
        px, t = self.ports.proxmox, self.t
        if isinstance(a, WriteHostFile):
            if self.ports.files.read(a.path) != a.content:
                self.ports.files.write(a.path, a.content, a.mode)
        elif isinstance(a, RemoveHostFile):
            self.ports.files.remove(a.path)
        elif isinstance(a, SetMapping):
            cur = self._mapping(a.id)
            if cur is None:
                px.mapping_create(a.id, a.map, a.description)
            else:  # the digest read right now, not at plan time
                px.mapping_update(a.id, a.map, a.description, cur.get("digest") or "")
        elif isinstance(a, DeleteMapping):
            if self._mapping(a.id) is not None:
                px.mapping_delete(a.id)
        elif isinstance(a, WriteServiceDropin):
            if self._read_dropin(a.vmid, a.path) != a.content:
                # pct push creates the file only; a unit's .d directory rarely exists yet
                self._exec(a.vmid, ["mkdir", "-p", a.path.rsplit("/", 1)[0] or "/"])
                self.ports.exec.push(a.vmid, a.path, a.content, 0o644)
        elif isinstance(a, StopService):
            if self._running("lxc", a.vmid):
                self._exec(a.vmid, ["systemctl", "stop", a.unit])
        elif isinstance(a, StopGuest):
            if self._running(a.guest, a.vmid):
                px.guest_action(a.guest, a.vmid, "shutdown", t.guest)
        elif isinstance(a, Rebind):
            if a.to_driver == "vfio-pci":
                self.binder.move_group(a.members, "vfio-pci", a.keep_override)
            else:
                self.binder.move_group(a.members, None, False)
                got = self.binder.driver_of(a.address)
                if got != "nvidia":
                    raise BindError(a.address, "nvidia", got)
        elif isinstance(a, UpdateContainer):
            cfg = px.lxc_config(a.vmid)  # the digest right before the PUT
            sets = {k: v for k, v in a.set.items() if str(cfg.get(k)) != v}
            sets.update(self._resolved(a, cfg))
            deletes = [k for k in a.delete if k in cfg]
            if sets or deletes:
                px.lxc_update(a.vmid, sets, deletes, cfg["digest"])
        elif isinstance(a, StartGuest):
            if not self._running(a.guest, a.vmid):
                px.guest_action(a.guest, a.vmid, "start", t.guest)
        elif isinstance(a, StartService):
            self.start_service(a.vmid, a.unit)
        else:
            raise TypeError(f"no way to carry out action {a.kind}")

    def _resolved(self, a: UpdateContainer, cfg: dict[str, Any]) -> dict[str, str]:
        """devN entries of GPUs that came back to nvidia in the switch phase, from their minors
        read now (nvidia numbers them as it binds them). Raises BindError for a GPU without one."""
        if not a.resolve:
            return {}
        facts = discover(self.root)
        minors = {g.address: g.minor for g in facts.gpus}
        try:
            return resolve_devices(cfg, a, minors)
        except KeyError as e:
            address = e.args[0]
            g = facts.gpu(address)
            raise BindError(address, "nvidia", g.driver if g else None,
                            f"no /dev/nvidia minor for CT {a.vmid} (proc/driver/nvidia/gpus/{address} missing)") from None

    # -- undo
    def undo(self, a: Any, before: dict[str, Any], stuck: set[str]) -> str:
        """Put back what ``a`` changed; returns what was done (one line, '' for nothing)."""
        try:
            return self._undo(a, before, stuck)
        except OSError as e:
            raise HostFileError(getattr(a, "path", "?"), e) from e

    def _undo(self, a: Any, before: dict[str, Any], stuck: set[str]) -> str:
        px, t = self.ports.proxmox, self.t
        if isinstance(a, (WriteHostFile, RemoveHostFile)):
            old = before["content"]
            now = self.ports.files.read(a.path)
            if now == old:
                return ""
            if old is None:
                self.ports.files.remove(a.path)
                return f"removed /{a.path}"
            self.ports.files.write(a.path, old)
            return f"restored /{a.path}"
        if isinstance(a, (SetMapping, DeleteMapping)):
            cur = self._mapping(a.id)
            if not before["exists"]:
                if cur is not None:
                    px.mapping_delete(a.id)
                    return f"deleted mapping {a.id}"
                return ""
            if cur is None:
                px.mapping_create(a.id, before["map"], before["description"])
                return f"re-created mapping {a.id}"
            if list(cur.get("map") or []) != before["map"] or cur.get("description") != before["description"]:
                px.mapping_update(a.id, before["map"], before["description"], cur.get("digest") or "")
                return f"restored mapping {a.id}"
            return ""
        if isinstance(a, WriteServiceDropin):
            if not self._running("lxc", a.vmid):
                raise ExecError(a.vmid, ["cat", a.path], 255, f"CT {a.vmid} is not running; cannot restore {a.path}")
            now = self._read_dropin(a.vmid, a.path)
            if now == before["content"]:
                return ""
            self.service_changed.add(a.vmid)
            if before["content"] is None:
                self._exec(a.vmid, ["rm", "-f", a.path])
                return f"CT {a.vmid}: removed {a.path}"
            self.ports.exec.push(a.vmid, a.path, before["content"], 0o644)
            return f"CT {a.vmid}: restored {a.path}"
        if isinstance(a, StopService):
            return ""  # the final restart brings back every service that was active
        if isinstance(a, StopGuest):
            if before["status"] == "running" and not self._running(a.guest, a.vmid):
                px.guest_action(a.guest, a.vmid, "start", t.guest)
                return f"started {a.guest} {a.vmid}"
            return ""
        if isinstance(a, Rebind):
            if stuck & set(a.members):
                return f"left IOMMU group of {a.address} alone (a write hung there)"
            prev = {m: MemberState(s["driver"], s["override"]) for m, s in before.items()}
            # a device that fell off the bus cannot be rebound: it is a human's (rescan or
            # reboot), the rest of its group still goes back
            gone = sorted(m for m in prev if not (Path(self.root) / "sys/bus/pci/devices" / m).exists())
            self.gone.update(gone)
            prev = {m: s for m, s in prev.items() if m not in gone}
            if all(self.binder.state_of(m) == s for m, s in prev.items()):
                return f"left {', '.join(gone)} alone: gone from the bus" if gone else ""
            self.binder.restore(prev)
            back = (f"rebound {a.address} back to {prev[a.address].driver or 'none'}" if a.address in prev
                    else f"rebound {', '.join(prev)} back")
            return back + (f"; left {', '.join(gone)} alone: gone from the bus" if gone else "")
        if isinstance(a, UpdateContainer):
            old = before["config"]
            cfg = px.lxc_config(a.vmid)
            # every devN key: entries resolved at apply time are not in the journaled action
            keys = set(a.set) | set(a.delete) | {k for k in (*old, *cfg) if DEV_KEY.match(k)}
            sets = {k: str(old[k]) for k in keys if k in old and str(cfg.get(k)) != str(old[k])}
            deletes = sorted(k for k in keys if k not in old and k in cfg)
            if not sets and not deletes:
                return ""
            px.lxc_update(a.vmid, sets, deletes, cfg["digest"])
            return f"CT {a.vmid}: restored its configuration"
        if isinstance(a, StartGuest):
            if before["status"] != "running" and self._running(a.guest, a.vmid):
                px.guest_action(a.guest, a.vmid, "shutdown", t.guest)
                return f"stopped {a.guest} {a.vmid}"
            return ""
        if isinstance(a, StartService):
            return ""  # stopping it again would only be undone by the final restart
        raise TypeError(f"no undo for action {a.kind}")


# --- running a plan ------------------------------------------------------------------------------


def _running_before(p: Plan, current: CurrentState) -> dict[str, Any]:
    """What ran before the apply and must run again after a rollback."""
    guests: dict[str, str] = {}
    services: dict[str, str] = {}
    for a in p.actions:
        if isinstance(a, (StopGuest, StartGuest)):
            if a.guest == "lxc":
                ct = current.containers.get(a.vmid)
                guests[f"lxc/{a.vmid}"] = ct.status if ct else "stopped"
            else:
                g = current.guests.get(a.vmid)
                guests[f"qemu/{a.vmid}"] = g.status if g else "stopped"
        if isinstance(a, (StopService, StartService, WriteServiceDropin)):
            ct = current.containers.get(a.vmid)
            active = bool(ct and ct.service and ct.service.active)
            services[f"{a.vmid}/{a.unit}"] = "active" if active else "inactive"
    return {"guests": guests, "services": services}


class Runner:
    """Runs a journal's steps forward and backward through :class:`Steps`."""

    def __init__(self, steps: Steps, journal: Journal, progress: Progress):
        self.s = steps
        self.j = journal
        self.progress = progress
        self.results: list[StepResult] = []
        self.times: dict[int, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def _one(self, i: int, a: Any, total: int) -> None:
        try:
            before = self.s.before(a)
        except BaseException as e:  # nothing changed yet, but the error belongs to this step
            self.j.append("failed", step=i, error=str(_as_error(e)), error_type=type(e).__name__, begun=False)
            raise
        self.j.append("begin", step=i, kind=a.kind, phase=a.phase, action=a.model_dump(), before=before)
        self.progress.step_begin(i, total, a)
        t0 = time.monotonic()
        try:
            self.s.do(a)
        except BaseException as e:
            dt = time.monotonic() - t0
            self.j.append("failed", step=i, error=str(_as_error(e)), error_type=type(e).__name__)
            with self._lock:
                self.times[i] = (t0, t0 + dt)
                self.results.append(StepResult(i, a.phase, a.describe(), "failed", dt))
            self.progress.step_end(i, total, a, "FAILED", dt)
            raise
        t1 = time.monotonic()
        self.j.append("done", step=i, seconds=round(t1 - t0, 4))
        with self._lock:
            self.times[i] = (t0, t1)
            self.results.append(StepResult(i, a.phase, a.describe(), "done", t1 - t0))
        self.progress.step_end(i, total, a, "done", t1 - t0)

    def forward(self, actions: list[Any], skip: set[int] = frozenset()) -> None:
        """Run ``actions`` (index = position) except ``skip``; Rebinds of one phase run in
        parallel, one worker per IOMMU group. Raises the first failure after every worker ended."""
        total = len(actions)
        i = 0
        while i < total:
            a = actions[i]
            if isinstance(a, Rebind):
                j = i
                while j < total and isinstance(actions[j], Rebind):
                    j += 1
                todo = [k for k in range(i, j) if k not in skip]
                if todo:
                    with ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="rebind") as pool:
                        # an interrupt between starting a worker thread and the pool recording it
                        # would let the pool's exit skip waiting for it, and the rollback race it
                        with _signals_held():
                            futures = [pool.submit(self._one, k, actions[k], total) for k in todo]
                        errors = [f.exception() for f in futures]
                    failures = [e for e in errors if e is not None]
                    if failures:
                        # a hung device outranks the others: it decides the exit code
                        hung = [e for e in failures if isinstance(e, SysfsTimeout)]
                        raise (hung or failures)[0]
                i = j
                continue
            if i not in skip:
                self._one(i, a, total)
            i += 1

    def backward(self, running_before: dict[str, Any], retry: bool = False) -> tuple[bool, list[str]]:
        """Undo every begun step whose undo has not completed (newest first), then restart what
        ran before. ``retry`` (a recover after a human fixed the host) tries the devices on which
        an earlier write hung again instead of leaving them alone.

        Returns (complete, needs_human): ``complete`` is False when an undo failed or had to leave
        a device alone.
        """
        steps = self.j.steps()
        # Newest first, except that GPUs go back to their drivers before a container's devN
        # entries are restored: Proxmox refuses a devN whose /dev node does not exist, and the
        # nodes of GPUs coming back from vfio-pci appear only once nvidia has them again.
        rank = {"start": 0, "switch": 1, "config": 2, "stop": 3, "prepare": 4}
        order = sorted(dict.fromkeys(reversed(self.j.begun())),
                       key=lambda i: rank.get(steps[i]["action"].get("phase", ""), 5))
        stuck = set(self.s.binder.stuck) | self.s.gone
        if not retry:
            # a worker of this process may still be blocked in that write: never race it
            stuck |= set(self.j.header.get("stuck", []))
            for r in self.j.records:
                if r["type"] == "failed" and r.get("error_type") == "SysfsTimeout":
                    stuck.update(r.get("devices") or [])
        complete = True
        for i in order:
            st = steps[i]
            if st["status"] == "undo-done":
                continue
            a = _ACTION.validate_python(st["action"])
            self.j.append("undo-begin", step=i)
            try:
                what = self.s.undo(a, st["before"], stuck)
            except GputopoError as e:
                complete = False
                self.j.append("undo-failed", step=i, error=str(e))
                self.progress.note(f"undo of step {i + 1} ({a.describe()}) failed: {e}")
                continue
            left = stuck | self.s.gone | set(self.s.binder.stuck)
            if isinstance(a, Rebind) and left & set(a.members):
                # recorded as not undone, so that a later recover tries this group again
                complete = False
                self.j.append("undo-incomplete", step=i, what=what, devices=sorted(left & set(a.members)))
            else:
                self.j.append("undo-done", step=i, what=what)
            if what:
                self.progress.note(f"undo {i + 1}: {what}")
        # what ran before runs again: guests first, then their services
        for key, status in running_before.get("guests", {}).items():
            kind, vmid = key.split("/")
            try:
                if status == "running" and not self.s._running(kind, int(vmid)):
                    self.s.ports.proxmox.guest_action(kind, int(vmid), "start", self.s.t.guest)
                    self.progress.note(f"started {kind} {vmid}")
            except GputopoError as e:
                complete = False
                self.j.append("restart-failed", what=key, error=str(e))
        touched = self.s.service_changed
        for key, status in running_before.get("services", {}).items():
            vmid_s, unit = key.split("/", 1)
            vmid = int(vmid_s)
            if status != "active":
                continue
            try:
                if vmid in touched and self.s._service_active(vmid, unit):
                    self.s._exec(vmid, ["systemctl", "daemon-reload"])
                    self.s._exec(vmid, ["systemctl", "restart", unit])
                    self.s._wait_active(vmid, unit)
                    self.progress.note(f"CT {vmid}: restarted {unit} with its previous configuration")
                elif not self.s._service_active(vmid, unit):
                    self.s.start_service(vmid, unit)
                    self.progress.note(f"CT {vmid}: started {unit}")
            except GputopoError as e:
                complete = False
                self.j.append("restart-failed", what=key, error=str(e))
        return complete, sorted(stuck | self.s.gone | set(self.s.binder.stuck))

    def stop_window(self, actions: list[Any]) -> float | None:
        stops = [self.times[i][0] for i, a in enumerate(actions) if a.phase == "stop" and i in self.times]
        starts = [self.times[i][1] for i, a in enumerate(actions) if a.phase == "start" and i in self.times]
        if not stops or not starts:
            return None
        return max(starts) - min(stops)


def _spec_hash(spec: Spec, spec_path: str | None) -> str:
    if spec_path and os.path.isfile(spec_path):
        return hashlib.sha256(Path(spec_path).read_bytes()).hexdigest()
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def _facts_summary(facts: Facts) -> dict[str, Any]:
    return {
        "gpus": {g.address: {"driver": g.driver, "override": g.driver_override, "numa": g.numa_node,
                             "minor": g.minor, "group": g.iommu_group} for g in facts.gpus},
        "iommu": facts.host.iommu_enabled,
        "nvidia": facts.host.nvidia_driver_version,
    }


def _fail_step(j: Journal, e: BaseException) -> str:
    """The step that failed, or (interrupted between two steps) the last one that began."""
    actions = j.header.get("actions") or []
    picks = [r["step"] for r in j.records if r["type"] == "failed"] or j.begun()
    if picks and 0 <= picks[-1] < len(actions):
        a = _ACTION.validate_python(actions[picks[-1]])
        return f"step {picks[-1] + 1} ({a.describe()})"
    return "a step"


def _close_or_keep_open(j: Journal, complete: bool, stuck: list[str], **fields: Any) -> bool:
    """End ``j`` as rolled-back when the rollback completed; otherwise append a ``needs-human``
    record naming the devices and the steps still to undo, and leave the journal open so that
    the next apply refuses and ``gputopo recover`` can retry. Returns True when it was closed."""
    if complete and not stuck:
        j.append("end", result="rolled-back", **fields)
        return True
    j.append("needs-human", needs_human=list(stuck), pending=j.pending_undo(), **fields)
    return False


def _roll_back_and_raise(runner: "Runner", j: Journal, exc: BaseException, running_before: dict[str, Any],
                         progress: Progress | None = None) -> NoReturn:
    """Undo what ``runner`` did after ``exc`` stopped it, close the journal, raise the outcome.

    Raises ApplyFailed (exit 3 naming the devices a human must look at, when the rollback could
    not complete or a write hung), or ``exc`` itself when it is not one of gputopo's errors.
    """
    e = _as_error(exc)
    where = _fail_step(j, e)
    if progress is not None:
        progress.note(f"{where} {'was ' if isinstance(e, Interrupted) else ''}"
                      f"{e if isinstance(e, Interrupted) else f'failed: {e}'}; rolling back")
    complete, stuck = runner.backward(running_before)
    if isinstance(e, SysfsTimeout) and e.address:
        stuck = sorted(set(stuck) | {e.address})
    _close_or_keep_open(j, complete, stuck)
    if not isinstance(e, GputopoError):
        raise exc
    raise _failed(where, e, complete, stuck) from exc


def apply(
    spec: Spec,
    ports: Ports,
    *,
    root: str | os.PathLike,
    dry_run: bool = False,
    confirm: Callable[[Plan], bool] | None = None,
    progress: Progress | None = None,
    timeouts: Timeouts | None = None,
    verify: Callable[[], Any] | None = None,
    rollback_on_verify_failure: bool = False,
    spec_path: str | None = None,
    node: str | None = None,
) -> ApplyResult:
    """Bring the host to what ``spec`` asks (see the module docstring for the order).

    ``confirm(plan)`` is asked before anything changes (False cancels); ``verify()`` runs after
    a successful apply and returns a report with ``.ok``. Returns an :class:`ApplyResult`.
    Raises UnfinishedApply (an earlier apply's journal is open), PlanRefused, PreflightFailed,
    ApplyCancelled, LockHeld, HostChanged (all: nothing changed), ApplyFailed (rolled back, or
    exit 3 naming the device that needs a human).
    """
    root = str(root)
    t = timeouts or Timeouts()
    progress = progress or Progress()
    t_start = time.monotonic()
    HostLock(root).check()  # a running apply is named before its journal is blamed
    j0 = find_unfinished(root)
    if j0 is not None:
        raise j0.unfinished_error()
    facts, current, p = read_and_plan(spec, ports, root, node)
    progress.plan(p)
    if p.is_empty:
        return ApplyResult("no-changes", plan=p, wall_s=time.monotonic() - t_start)
    if dry_run:
        return ApplyResult("dry-run", plan=p, wall_s=time.monotonic() - t_start)
    problems = preflight(p, facts, current, spec, ports, root, node)
    if problems:
        raise PreflightFailed(problems)
    if confirm is not None and not confirm(p):
        raise ApplyCancelled()
    progress = _QuietProgress(progress)
    with HostLock(root), interruptible():
        j0 = find_unfinished(root)
        if j0 is not None:
            raise j0.unfinished_error()
        facts, current, p2 = read_and_plan(spec, ports, root, node)
        if _signature(p2) != _signature(p):
            raise HostChanged(_diff_text(p, p2))
        p = p2
        # again under the lock: the operator may have read the plan for minutes, long enough
        # for a job to open a GPU that is about to move (its unbind would then hang)
        problems = preflight(p, facts, current, spec, ports, root, node)
        if problems:
            raise PreflightFailed(problems)
        running_before = _running_before(p, current)
        j = Journal.create(root, {
            "spec": os.path.abspath(spec_path) if spec_path else None,
            "spec_sha256": _spec_hash(spec, spec_path),
            "node": p.node,
            "actions": [a.model_dump() for a in p.actions],
            "facts": _facts_summary(facts),
            "running_before": running_before,
            "argv": sys.argv,
        })
        steps = Steps(ports, root, t)
        runner = Runner(steps, j, progress)
        try:
            runner.forward(list(p.actions))
        except BaseException as exc:
            _roll_back_and_raise(runner, j, exc, running_before, progress)
        window = runner.stop_window(list(p.actions))
        report = None
        if verify is not None:
            try:
                report = verify()
            except BaseException:
                # every step is done: an error or Ctrl-C while checking must not leave the
                # journal open, or the next apply would send the operator to recover
                j.append("end", result="applied", verify="did not finish")
                raise
            if not getattr(report, "ok", True) and rollback_on_verify_failure:
                progress.note("verification failed; rolling back")
                complete, stuck = runner.backward(running_before)
                _close_or_keep_open(j, complete, stuck, reason="verify")
                res = ApplyResult("rolled-back", plan=p, steps=runner.results, wall_s=time.monotonic() - t_start,
                                  stop_window_s=window, journal=str(j.path), verify=report)
                progress.summary(res)
                return res
        j.append("end", result="applied")
    res = ApplyResult("applied", plan=p, steps=sorted(runner.results, key=lambda r: r.index),
                      wall_s=time.monotonic() - t_start, stop_window_s=window, journal=str(j.path), verify=report)
    progress.summary(res)
    return res


def recover(
    ports: Ports,
    *,
    root: str | os.PathLike,
    finish: bool = False,
    progress: Progress | None = None,
    timeouts: Timeouts | None = None,
) -> ApplyResult:
    """Settle the journal an interrupted apply left under ``root``.

    By default it rolls back: every begun step is undone from its journaled before-state, then
    what ran before is started again. Rolling back is the default because the before-state is a
    host that was known to work, recorded in full; finishing forward depends on every remaining
    step working on a host in an unknown middle state. ``finish`` instead runs the steps that
    did not complete (each step is idempotent); if one fails, everything is rolled back.
    A journal left open by a rollback that needed a human is retried the same way: every undo
    that did not complete runs again from its before-state (devices on which a write hung are
    tried again, under the timeout); when all succeed the journal ends ``rolled-back``, else a
    new ``needs-human`` record keeps it open.
    Returns an ApplyResult (``nothing-to-recover``, ``recovered`` or ``finished``). Raises
    LockHeld, JournalError (``finish`` on a journal whose rollback began), ApplyFailed (exit 3
    naming the devices still stuck; the journal stays open).
    """
    root = str(root)
    t = timeouts or Timeouts()
    progress = progress or Progress()
    t0 = time.monotonic()
    progress = _QuietProgress(progress)
    with HostLock(root), interruptible():
        j = find_unfinished(root)
        if j is None:
            return ApplyResult("nothing-to-recover")
        progress.note(f"recovering {j.describe()}")
        steps = Steps(ports, root, t)
        runner = Runner(steps, j, progress)
        running_before = j.header.get("running_before", {})
        if finish and any(r["type"].startswith("undo-") for r in j.records):
            # half of it is already undone: finishing forward would build on an unknown middle
            raise JournalError(f"{j.path}: its rollback already began; run 'gputopo recover' without --finish")
        j.append("recover", mode="finish" if finish else "rollback", pid=os.getpid())
        if finish:
            actions = [_ACTION.validate_python(a) for a in j.header["actions"]]
            done = {i for i, s in j.steps().items() if s["status"] == "done"}
            try:
                runner.forward(actions, skip=done)
            except BaseException as exc:
                _roll_back_and_raise(runner, j, exc, running_before)
            j.append("end", result="applied")
            return ApplyResult("finished", steps=runner.results, wall_s=time.monotonic() - t0, journal=str(j.path))
        complete, stuck = runner.backward(running_before, retry=True)
        if not _close_or_keep_open(j, complete, stuck):
            pending = ", ".join(str(i + 1) for i in j.pending_undo()) or "none"
            raise ApplyFailed("recover", JournalError(
                f"{j.path} stays open: undo of step(s) {pending} not complete"), complete, stuck)
        return ApplyResult("recovered", steps=runner.results, wall_s=time.monotonic() - t0, journal=str(j.path))
