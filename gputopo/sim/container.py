"""Simulated LXC containers and their inference service, behind :class:`gputopo.ports.ExecPort`.

A simulated host lives in one directory (docs/ARCHITECTURE.md, "Simulated host"):
``root/`` the host root, ``pve/`` the Proxmox files, ``run/`` runtime state (JSON, atomic),
``ct/<vmid>/rootfs/`` each container's files. :class:`SimExec` answers ``pct exec``/``pct push``
as a real node does:

* a container runs commands only while Proxmox says it runs (``gputopo.sim.state``); otherwise
  ``pct`` exits 255 with ``container '101' not running!``;
* inside, it sees the ``/dev/nvidia*`` nodes its config grants (``devN`` or ``lxc.mount.entry``)
  that existed on the host when it started, and a GPU works only when the host GPU with that
  minor is bound to nvidia (``proc/driver/nvidia/gpus/<bdf>/information`` "Device Minor");
* ``nvidia-smi`` (``--query-gpu`` CSV, ``-L``), ``systemctl`` (show, is-active, start, stop,
  restart, daemon-reload), ``cat``, ``test -e``, ``rm``, ``mkdir`` and ``ls /dev`` are
  implemented; ``pct push`` writes a file but never creates its directory, as pct does;
* systemd units are files in the rootfs; drop-ins in ``<unit>.d/*.conf`` apply in name order,
  an empty ``ExecStart=`` resets the list, and a changed unit needs ``daemon-reload``.

The inference service (SGLang ``sglang.launch_server`` or vLLM ``vllm serve``) checks its
tensor-parallel size at start: more than the usable GPUs, or a size that does not divide the
model's :data:`ATTENTION_HEADS`, makes it fail like a crashing server (``systemctl start`` exits 1,
``is-active`` says ``failed``). While it runs, its first ``tp`` GPUs carry the seed host's
memory load: :data:`SEED_LOAD_MIB` cycled over the GPUs and scaled to each GPU's memory.total
(``round(seed * total / 97887)``); an idle GPU shows :data:`IDLE_MIB`. :class:`EndpointServer`
serves its OpenAI-compatible HTTP API on loopback from the simulator process.

An active service also shows on the host as ``<root>/proc/<pid>`` entries, the way a
container's processes look from a Proxmox node: a main process plus one worker per
tensor-parallel rank, each with ``comm``, ``cmdline`` and ``cgroup`` (``0::/lxc/<vmid>/ns/
system.slice/<unit>``); the workers have ``fd/<n>`` links to ``/dev/nvidiactl``,
``/dev/nvidia-uvm`` and the ``/dev/nvidia<minor>`` of every GPU the service uses. apply's
preflight tells container processes from foreign holders by that cgroup, and the simulated
kernel blocks an unbind while such a link exists. They vanish when the service stops or the
container shuts down.

Faults (``<run>/faults.json``, set with :func:`break_container` / :meth:`SimExec.break_`):
``gpu_missing`` (``address=`` or ``index=``; default the last GPU), ``unbalanced_memory``
(``index=``, ``used_mib=``), ``wrong_answer`` (``answer=``), ``hung_endpoint`` (``seconds=``),
``nvidia_smi_fails`` (``rc=``, ``message=``), ``service_fails`` (``message=``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import threading
import time
import uuid as _uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gputopo.facts.discover import parse_nvidia_information
from gputopo.facts.host import parse_nvidia_version
from gputopo.errors import ExecError
from gputopo.model.facts import normalize_address
from gputopo.formats.nvsmi import UNITS, canonical_field, header_cell
from gputopo.ports import ExecResult
from gputopo.formats.lxcconf import parse_dev_value, parse_lxc_conf
from gputopo.errors import PveFormatError
from gputopo.sim import state

# The seed host's per-GPU load with four GPUs serving (MiB of 97887), from the operator's log.
SEED_LOAD_MIB = (79043, 78369, 78369, 78193)
SEED_TOTAL_MIB = 97887
IDLE_MIB = 1  # what nvidia-smi shows for a GPU with no context (real captures: "1MiB")
ATTENTION_HEADS = 64  # the served model's heads: the tensor-parallel size must divide it

# FB memory (MiB) nvidia-smi reports per device id; others get DEFAULT_TOTAL_MIB.
MEMORY_TOTAL_MIB = {
    "0x2bb5": 97887,  # RTX PRO 6000 Blackwell Server Edition (seed host log)
    "0x2330": 81559,  # H100 80GB HBM3 (thamada capture)
    "0x2235": 46068,  # A40 (thamada capture)
    "0x26b1": 49140,  # RTX 6000 Ada
    "0x1eb8": 15360,  # Tesla T4
}
DEFAULT_TOTAL_MIB = 24576

FAULTS = ("gpu_missing", "unbalanced_memory", "wrong_answer", "hung_endpoint",
          "nvidia_smi_fails", "service_fails")

NOT_RUNNING = "container '{vmid}' not running!\n"
NO_CONFIG = "Configuration file 'nodes/{node}/lxc/{vmid}.conf' does not exist\n"
NVSMI_NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                   "Make sure that the latest NVIDIA driver is installed and running.\n")
NVSMI_NO_DEVICES = "No devices were found\n"
QUERY_FIELDS = ("index", "pci.bus_id", "name", "memory.used", "memory.total", "memory.free",
                "utilization.gpu", "uuid", "minor_number", "driver_version", "count")
# What an LXC container's /dev holds besides the passed-through nodes.
# Host PIDs of simulated container processes start here, clear of a fixture's own proc entries.
HOST_PID_BASE = 200000
# Python's multiprocessing "spawn" start method: how each tensor-parallel worker's cmdline reads.
SPAWN_ARGS = ("-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
              "--multiprocessing-fork")
BASE_DEV = ("console", "core", "fd", "full", "hugepages", "initctl", "log", "lxc", "mqueue", "net",
            "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "tty1",
            "tty2", "urandom", "zero")


# --- layout ------------------------------------------------------------------------------


@dataclass
class SimPaths:
    """The directories of a simulated host."""

    dir: Path

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def pve(self) -> Path:
        return self.dir / "pve"

    @property
    def run(self) -> Path:
        return self.dir / "run"

    def rootfs(self, vmid: int) -> Path:
        return self.dir / "ct" / str(vmid) / "rootfs"

    def node(self) -> str:
        """The node name: recorded in ``run/host.json``, else the only ``pve/nodes/*``."""
        host = state.read_state(self.run, "host", {}) or {}
        if host.get("node"):
            return host["node"]
        nodes = sorted(p.name for p in (self.pve / "nodes").glob("*") if p.is_dir())
        return nodes[0] if nodes else "localhost"

    def lxc_conf(self, vmid: int) -> Path:
        return self.pve / "nodes" / self.node() / "lxc" / f"{vmid}.conf"


def _inside(base: Path, path: str) -> Path:
    """``path`` (absolute, inside the container) under ``base``; ValueError when it escapes."""
    rel = path.lstrip("/")
    if ".." in Path(rel).parts:
        raise ValueError(f"path escapes the container: {path}")
    return base / rel


# --- faults ------------------------------------------------------------------------------


def break_container(sim_dir: str | os.PathLike, vmid: int, what: str, **params: Any) -> None:
    """Break one thing in container ``vmid`` on purpose (see the module docstring for ``what``).

    Raises ValueError for an unknown fault name.
    """
    if what not in FAULTS:
        raise ValueError(f"unknown fault {what!r} (known: {', '.join(FAULTS)})")
    run = SimPaths(Path(sim_dir)).run
    with state.locked(run, "faults"):
        faults = state.read_state(run, "faults", {}) or {}
        faults.setdefault(str(vmid), {})[what] = params
        state.write_state(run, "faults", faults)


def heal_container(sim_dir: str | os.PathLike, vmid: int, what: str | None = None) -> None:
    """Undo fault ``what`` (all faults when None) in container ``vmid``."""
    run = SimPaths(Path(sim_dir)).run
    with state.locked(run, "faults"):
        faults = state.read_state(run, "faults", {}) or {}
        mine = faults.get(str(vmid), {})
        if what is None:
            mine.clear()
        else:
            mine.pop(what, None)
        faults[str(vmid)] = mine
        state.write_state(run, "faults", faults)


def faults_of(sim_dir: str | os.PathLike, vmid: int) -> dict[str, dict]:
    """The active faults of container ``vmid``: {name: params}."""
    faults = state.read_state(SimPaths(Path(sim_dir)).run, "faults", {}) or {}
    return faults.get(str(vmid), {})


# --- devices and GPUs --------------------------------------------------------------------


def _dev_paths(conf) -> list[str]:
    """The paths of the main section's ``devN`` entries in config order; one that does not
    parse is skipped (Proxmox would refuse to start the container with it)."""
    out = []
    for key, value in conf.options.items():
        if re.fullmatch(r"dev\d+", key):
            try:
                out.append(parse_dev_value(value)["path"])
            except PveFormatError:
                continue
    return out


def parse_granted_devices(conf_text: str) -> list[str]:
    """The ``/dev`` paths a container config grants, in config order, without duplicates.

    ``devN: [path=]/dev/x,...`` entries of the main section and the sources of
    ``lxc.mount.entry: /dev/x dev/x none bind,optional,create=file`` lines. A ``devN`` that
    does not parse is skipped (Proxmox would refuse to start; :func:`missing_devices` reports
    only nodes). Pending changes do not count: they apply at the next start.
    """
    conf = parse_lxc_conf(conf_text)
    out: list[str] = []
    for path in _dev_paths(conf):
        if path not in out:
            out.append(path)
    for key, value in conf.lxc:
        if key == "lxc.mount.entry":
            parts = value.split()
            if parts and parts[0].startswith("/dev/") and parts[0] not in out:
                out.append(parts[0])
    return out


@dataclass
class HostGpu:
    address: str
    minor: int | None
    name: str
    uuid: str
    driver: str | None
    device_id: str | None

    @property
    def memory_total(self) -> int:
        return MEMORY_TOTAL_MIB.get(self.device_id or "", DEFAULT_TOTAL_MIB)

    @property
    def nvml_bus_id(self) -> str:
        dom, bus, rest = self.address.split(":")
        return f"{int(dom, 16):08X}:{bus.upper()}:{rest.upper()}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def host_nvidia_gpus(root: Path) -> list[HostGpu]:
    """GPUs the host's nvidia driver knows (``proc/driver/nvidia/gpus/*/information``).

    The driver of each comes from the sysfs ``driver`` link (None when unbound).
    """
    out = []
    for info in sorted((root / "proc/driver/nvidia/gpus").glob("*/information")):
        fields = parse_nvidia_information(info.read_text())
        try:
            address = normalize_address(fields.get("Bus Location") or info.parent.name)
        except Exception:
            continue
        minor = fields.get("Device Minor", "")
        dev = root / "sys/bus/pci/devices" / address
        link = dev / "driver"
        driver = os.path.basename(os.readlink(link)) if link.is_symlink() else None
        device_id = (_read(dev / "device") or "").strip() or None
        out.append(HostGpu(
            address=address,
            minor=int(minor) if minor.isdigit() else None,
            name=fields.get("Model") or "NVIDIA Graphics Device",
            uuid=fields.get("GPU UUID") or f"GPU-{_uuid.uuid5(_uuid.NAMESPACE_URL, address)}",
            driver=driver,
            device_id=device_id,
        ))
    return out


def missing_devices(sim_dir: str | os.PathLike, vmid: int) -> list[str]:
    """Granted ``devN`` nodes that do not exist on the host (Proxmox refuses to start then).

    ``lxc.mount.entry`` lines with ``optional`` are skipped by LXC when the source is missing,
    so only ``devN`` entries count. Returns [] when the config is missing.
    """
    p = SimPaths(Path(sim_dir))
    text = _read(p.lxc_conf(vmid))
    if text is None:
        return []
    return [path for path in _dev_paths(parse_lxc_conf(text)) if not os.path.lexists(_inside(p.root, path))]


def container_cgroup(vmid: int, unit: str) -> str:
    """``/proc/<pid>/cgroup`` of a service's process in a Proxmox container (cgroup v2): PVE puts
    the container's own tree under ``/lxc/<vmid>/ns`` (``lxc.cgroup.dir.container.inner``)."""
    return f"0::/lxc/{vmid}/ns/system.slice/{unit}\n"


def process_comm(argv: list[str]) -> str:
    """The kernel's ``comm`` of a process started as ``argv``: the executable's name, 15 chars."""
    return os.path.basename(argv[0])[:15] if argv else "?"


def host_process_plan(vmid: int, unit: str, argv: list[str], tp: int, nodes: list[str]) -> list[dict]:
    """The host-visible processes of a service: ``[{comm, cmdline, cgroup, fds}]``.

    The main process holds no device; each of the ``tp`` workers holds the control nodes and
    every GPU node in ``nodes``, because CUDA opens every device it can see when it initialises.
    """
    cgroup = container_cgroup(vmid, unit)
    comm = process_comm(argv)
    gpu_fds = ["/dev/nvidiactl", "/dev/nvidia-uvm"] + list(nodes)
    procs = [{"comm": comm, "cmdline": list(argv), "cgroup": cgroup, "fds": []}]
    for _ in range(tp):
        procs.append({"comm": comm, "cmdline": [argv[0] if argv else "python3", *SPAWN_ARGS],
                      "cgroup": cgroup, "fds": gpu_fds})
    return procs


# --- systemd units -----------------------------------------------------------------------


@dataclass
class Unit:
    """The effective configuration of a unit: its file plus drop-ins, as systemd merges them."""

    name: str
    exec_start: list[str] = field(default_factory=list)
    service_type: str = "simple"
    wanted_by: list[str] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    fingerprint: str = ""

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.exec_start[-1].lstrip("-@:+!")) if self.exec_start else []

    def problem(self) -> str | None:
        """Why systemd would refuse the unit (``bad-setting``), or None."""
        if not self.exec_start:
            return f"Service {self.name} has no ExecStart=, ExecStop=, or SuccessAction=. Refusing."
        if len(self.exec_start) > 1 and self.service_type != "oneshot":
            return ("Service has more than one ExecStart= setting, which is only allowed for "
                    "Type=oneshot services. Refusing.")
        return None


def _logical_lines(text: str) -> list[str]:
    lines, buf = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not buf and (not s or s[0] in "#;"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        lines.append(buf + s)
        buf = ""
    if buf:
        lines.append(buf)
    return lines


def load_unit(rootfs: Path, name: str) -> Unit | None:
    """Read ``etc/systemd/system/<name>`` and its drop-ins; None when the unit file is missing.

    Drop-ins ``<name>.d/*.conf`` apply in file-name order after the unit file. For list
    settings (``ExecStart=``, ``Environment=``) an empty assignment resets the list.
    """
    base = rootfs / "etc/systemd/system"
    main = base / name
    text = _read(main)
    if text is None:
        return None
    unit = Unit(name=name)
    sources = [(str(main), text)]
    for drop in sorted((base / f"{name}.d").glob("*.conf")):
        sources.append((str(drop), drop.read_text()))
    for path, body in sources:
        unit.files.append(path)
        section = ""
        for line in _logical_lines(body):
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, value = line.partition("=")
            if not sep:
                continue
            key, value = key.strip(), value.strip()
            if section == "Service" and key in ("ExecStart", "Environment"):
                target = unit.exec_start if key == "ExecStart" else unit.environment
                if value == "":
                    target.clear()
                else:
                    target.append(value)
            elif section == "Service" and key == "Type":
                unit.service_type = value
            elif section == "Install" and key == "WantedBy":
                unit.wanted_by.extend(value.split())
    unit.fingerprint = json.dumps(sources)
    return unit


def service_flavor(argv: list[str]) -> str | None:
    """``"sglang"`` for ``python -m sglang.launch_server``, ``"vllm"`` for ``vllm serve``."""
    joined = " ".join(argv)
    if "sglang.launch_server" in joined:
        return "sglang"
    if re.search(r"(^|[/\s])vllm(\s+serve\b|\.entrypoints)", joined):
        return "vllm"
    return None


# the servers' own defaults: sglang ServerArgs.port, vllm's --port
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}


def listening_port(argv: list[str]) -> int | None:
    """The port the server of ``argv`` listens on: ``--port``, else its flavour's default."""
    value = _flag(argv, ("--port",))
    if value is not None and value.isdigit():
        return int(value)
    return DEFAULT_PORTS.get(service_flavor(argv) or "")


def _flag(argv: list[str], names: tuple[str, ...]) -> str | None:
    value = None
    for i, tok in enumerate(argv):
        for n in names:
            if tok == n and i + 1 < len(argv):
                value = argv[i + 1]
            elif tok.startswith(n + "="):
                value = tok.split("=", 1)[1]
    return value


def parse_tp(argv: list[str]) -> int:
    """The tensor-parallel size in a server command line (``--tp N``, ``--tp=N``, ``--tp-size``,
    ``--tensor-parallel-size``, vLLM's ``-tp``); 1 when absent.

    Raises ValueError when the value is not a positive integer.
    """
    raw = _flag(argv, ("--tp", "--tp-size", "--tensor-parallel-size", "-tp"))
    if raw is None:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"invalid tensor-parallel size {raw!r}")
    return int(raw)


def served_model(argv: list[str]) -> str:
    """The model name clients use: ``--served-model-name``, else the model path or id."""
    name = _flag(argv, ("--served-model-name",))
    if name:
        return name
    path = _flag(argv, ("--model-path", "--model"))
    if path:
        return path
    if "serve" in argv:
        i = argv.index("serve")
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return "default"


# --- the container -----------------------------------------------------------------------


class Container:
    """One simulated container: its device view, GPUs, services. All state lives in files."""

    def __init__(self, sim_dir: str | os.PathLike, vmid: int):
        self.paths = SimPaths(Path(sim_dir))
        self.sim_dir = Path(sim_dir)
        self.vmid = int(vmid)
        self.rootfs = self.paths.rootfs(self.vmid)
        self.state_name = f"ct-{self.vmid}"

    # runtime state: {"devices": [...] (view fixed at start), "loaded": {unit: fingerprint},
    #                 "services": {unit: {...}}}
    def _state(self) -> dict:
        return state.read_state(self.paths.run, self.state_name, {}) or {}

    def _save(self, data: dict) -> None:
        state.write_state(self.paths.run, self.state_name, data)

    def running(self) -> bool:
        return state.guest_status(self.paths.run, "lxc", self.vmid) == "running"

    def conf_text(self) -> str | None:
        return _read(self.paths.lxc_conf(self.vmid))

    def _current_view(self) -> list[str]:
        text = self.conf_text() or ""
        return [d for d in parse_granted_devices(text) if os.path.lexists(_inside(self.paths.root, d))]

    def boot(self) -> None:
        """Record the container as started: fix its /dev view, clear services, start enabled ones.

        Call after Proxmox marks it running. Enabled services that fail stay ``failed``.
        """
        with state.locked(self.paths.run, self.state_name):
            self._reap_all()
            self._save({"devices": self._current_view(), "loaded": {}, "services": {}})
        for unit in self.enabled_units():
            self.start_service(unit)

    def shutdown(self) -> None:
        """Record the container as stopped: every service ends, the /dev view is gone."""
        with state.locked(self.paths.run, self.state_name):
            self._reap_all()
            self._save({})

    # processes as the host sees them (<root>/proc/<pid>)
    def host_pids(self) -> list[int]:
        """Host PIDs of this container's simulated service processes, sorted."""
        pids: list[int] = []
        for svc in self._state().get("services", {}).values():
            pids += svc.get("host_pids", [])
        return sorted(pids)

    def _spawn(self, unit: str, argv: list[str], tp: int, nodes: list[str]) -> list[int]:
        proc = self.paths.root / "proc"
        taken = {int(p.name) for p in proc.glob("[0-9]*") if p.name.isdigit()} if proc.is_dir() else set()
        pids, pid = [], HOST_PID_BASE + self.vmid * 100
        for spec in host_process_plan(self.vmid, unit, argv, tp, nodes):
            while pid in taken:
                pid += 1
            taken.add(pid)
            d = proc / str(pid)
            (d / "fd").mkdir(parents=True, exist_ok=True)
            (d / "comm").write_text(spec["comm"] + "\n")
            (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in spec["cmdline"]))
            (d / "cgroup").write_text(spec["cgroup"])
            for n, target in enumerate(["/dev/null"] * 3 + spec["fds"]):
                os.symlink(target, d / "fd" / str(n))
            pids.append(pid)
        return pids

    def _reap(self, pids: list[int]) -> None:
        for pid in pids:
            shutil.rmtree(self.paths.root / "proc" / str(pid), ignore_errors=True)

    def _reap_all(self) -> None:
        for svc in self._state().get("services", {}).values():
            self._reap(svc.get("host_pids", []))

    def hotplug(self, path: str) -> None:
        """Add host node ``path`` to a running container's view (PVE 9 devN hot-plug); a node
        the host lacks or a container never booted is left as it is."""
        with state.locked(self.paths.run, self.state_name):
            st = self._state()
            if "devices" in st and path not in st["devices"] and os.path.lexists(_inside(self.paths.root, path)):
                st["devices"].append(path)
                self._save(st)

    def devices(self) -> list[str]:
        """``/dev`` nodes visible inside (fixed when it started; live config when never booted)."""
        st = self._state()
        return list(st["devices"]) if "devices" in st else self._current_view()

    def gpus(self) -> list[HostGpu]:
        """Usable GPUs in nvidia-smi index order (PCI bus order).

        A GPU is usable when its ``/dev/nvidia<minor>`` is in the view and the host GPU with
        that minor is bound to nvidia; the ``gpu_missing`` fault hides one more.
        """
        view = set(self.devices())
        gpus = [g for g in host_nvidia_gpus(self.paths.root)
                if g.driver == "nvidia" and g.minor is not None and f"/dev/nvidia{g.minor}" in view]
        gpus.sort(key=lambda g: tuple(int(x, 16) for x in re.split(r"[:.]", g.address)))
        fault = faults_of(self.sim_dir, self.vmid).get("gpu_missing")
        if fault is not None and gpus:
            if fault.get("address"):
                gone = normalize_address(fault["address"])
                gpus = [g for g in gpus if g.address != gone]
            else:
                gpus.pop(int(fault.get("index", len(gpus) - 1)))
        return gpus

    def has_control(self) -> bool:
        return "/dev/nvidiactl" in self.devices()

    # units and services
    def enabled_units(self) -> list[str]:
        wants = self.rootfs / "etc/systemd/system/multi-user.target.wants"
        return sorted(p.name for p in wants.glob("*.service")) if wants.is_dir() else []

    def unit(self, name: str) -> Unit | None:
        return load_unit(self.rootfs, name)

    def effective_unit(self, name: str) -> tuple[Unit | None, bool]:
        """The unit systemd would run and whether its files changed since it was loaded."""
        disk = self.unit(name)
        st = self._state()
        loaded = st.get("loaded", {}).get(name)
        if disk is None or loaded is None:
            return disk, False
        if loaded["fingerprint"] == disk.fingerprint:
            return disk, False
        return Unit(**loaded), True

    def daemon_reload(self) -> None:
        with state.locked(self.paths.run, self.state_name):
            st = self._state()
            st["loaded"] = {}
            self._save(st)

    def service(self, name: str) -> dict:
        return self._state().get("services", {}).get(name, {"state": "inactive", "pid": 0})

    def _set_service(self, name: str, svc: dict, unit: Unit | None = None) -> None:
        with state.locked(self.paths.run, self.state_name):
            st = self._state()
            st.setdefault("services", {})[name] = svc
            if unit is not None:
                st.setdefault("loaded", {})[name] = unit.__dict__
            self._save(st)

    def start_service(self, name: str, verb: str = "start") -> tuple[int, str]:
        """Start unit ``name``; return (exit status, stderr) as ``systemctl <verb>`` gives them."""
        unit, stale = self.effective_unit(name)
        if unit is None:
            return 5, f"Failed to {verb} {name}: Unit {name} not found.\n"
        warn = (f"Warning: The unit file, source configuration file or drop-ins of {name} changed on "
                f"disk. Run 'systemctl daemon-reload' to reload units.\n") if stale else ""
        problem = unit.problem()
        if problem:
            return 1, warn + f"Failed to {verb} {name}: Unit {name} has a bad unit file setting.\n"
        cur = self.service(name)
        if cur.get("state") == "active":
            return 0, warn
        reason = self._start_problem(unit)
        argv = unit.argv
        svc = {"state": "active", "pid": 0, "argv": argv, "result": "success", "message": "",
               "started": time.time()}
        if reason:
            svc.update(state="failed", result="exit-code", message=reason, code=1)
            self._set_service(name, svc, unit)
            return 1, warn + (
                f"Job for {name} failed because the control process exited with error code.\n"
                f"See \"systemctl status {name}\" and \"journalctl -xeu {name}\" for details.\n")
        svc["pid"] = 1000 + (abs(hash((name, time.time()))) % 60000)
        svc["ready_at"] = time.time() + service_latency(self.sim_dir, "start")
        svc["tp"] = parse_tp(argv)
        gpus = self.gpus()[: svc["tp"]]
        svc["gpus"] = [g.address for g in gpus]
        svc["host_pids"] = self._spawn(name, argv, svc["tp"], [f"/dev/nvidia{g.minor}" for g in gpus])
        self._set_service(name, svc, unit)
        return 0, warn

    def _start_problem(self, unit: Unit) -> str | None:
        argv = unit.argv
        fault = faults_of(self.sim_dir, self.vmid).get("service_fails")
        if fault is not None:
            if fault.get("count") is not None:  # fails only the next ``count`` starts
                if int(fault["count"]) <= 1:
                    heal_container(self.sim_dir, self.vmid, "service_fails")
                else:
                    break_container(self.sim_dir, self.vmid, "service_fails", **{**fault, "count": int(fault["count"]) - 1})
            return fault.get("message", "RuntimeError: server crashed during startup")
        if service_flavor(argv) is None:
            return None
        try:
            tp = parse_tp(argv)
        except ValueError as e:
            return f"error: argument --tp: {e}"
        if not self.has_control() or "/dev/nvidia-uvm" not in self.devices():
            return "RuntimeError: CUDA driver initialization failed, no CUDA-capable device"
        n = len(self.gpus())
        if tp > n:
            return f"RuntimeError: tensor parallel size {tp} needs {tp} GPUs, {n} available"
        if ATTENTION_HEADS % tp:
            return (f"ValueError: Total number of attention heads ({ATTENTION_HEADS}) must be "
                    f"divisible by tensor parallel size ({tp}).")
        return None

    def stop_service(self, name: str) -> tuple[int, str]:
        if self.unit(name) is None and name not in self._state().get("services", {}):
            return 5, f"Failed to stop {name}: Unit {name} not loaded.\n"
        self._reap(self.service(name).get("host_pids", []))
        self._set_service(name, {"state": "inactive", "pid": 0})
        return 0, ""

    def gpu_memory_used(self) -> dict[str, int]:
        """MiB used per GPU address: the serving pattern on the GPUs services hold, else idle."""
        used = {g.address: IDLE_MIB for g in self.gpus()}
        totals = {g.address: g.memory_total for g in self.gpus()}
        for svc in self._state().get("services", {}).values():
            if svc.get("state") != "active":
                continue
            for i, addr in enumerate(svc.get("gpus", [])):
                if addr in used:
                    used[addr] = round(SEED_LOAD_MIB[i % len(SEED_LOAD_MIB)] * totals[addr] / SEED_TOTAL_MIB)
        fault = faults_of(self.sim_dir, self.vmid).get("unbalanced_memory")
        gpus = self.gpus()
        if fault is not None and gpus:
            g = gpus[int(fault.get("index", len(gpus) - 1))]
            used[g.address] = int(fault.get("used_mib", totals[g.address] // 3))
        return used

    def active_server(self) -> tuple[str, dict] | None:
        """(unit, service state) of the running inference service, if one is active."""
        if not self.running():
            return None
        for name, svc in self._state().get("services", {}).items():
            if svc.get("state") == "active" and service_flavor(svc.get("argv", [])):
                return name, svc
        return None


# --- commands ----------------------------------------------------------------------------


def _res(rc: int, out: str = "", err: str = "") -> ExecResult:
    return ExecResult(rc=rc, stdout=out, stderr=err)


def _nvidia_smi(ct: Container, args: list[str]) -> ExecResult:
    fault = faults_of(ct.sim_dir, ct.vmid).get("nvidia_smi_fails")
    if fault is not None:
        return _res(int(fault.get("rc", 9)), fault.get("message", NVSMI_NO_DRIVER))
    if not ct.has_control():
        return _res(9, NVSMI_NO_DRIVER)
    gpus = ct.gpus()
    if not gpus:
        return _res(6, NVSMI_NO_DEVICES)
    if args in (["-L"], ["--list-gpus"]):
        return _res(0, "".join(f"GPU {i}: {g.name} (UUID: {g.uuid})\n" for i, g in enumerate(gpus)))
    query = fmt = None
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--query-gpu="):
            query = a.split("=", 1)[1]
        elif a == "--query-gpu" and i + 1 < len(args):
            i += 1
            query = args[i]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format" and i + 1 < len(args):
            i += 1
            fmt = args[i]
        else:
            return _res(2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
        i += 1
    if query is None:
        return _res(2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
    opts = (fmt or "").split(",")
    if not fmt or opts[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in opts):
        return _res(2, f'"{fmt}" is not a valid format. Please run \'nvidia-smi -h\' for help.\n')
    fields = [f.strip() for f in query.split(",")]
    for f in fields:
        if canonical_field(f) not in QUERY_FIELDS:
            return _res(2, f'Field "{f}" is not a valid field to query.\n\n')
    used = ct.gpu_memory_used()
    driver = parse_nvidia_version(_read(ct.paths.root / "proc/driver/nvidia/version")) or "[N/A]"
    units = "nounits" not in opts
    lines = [] if "noheader" in opts else [", ".join(header_cell(f) for f in fields)]
    for idx, g in enumerate(gpus):
        values = {
            "index": idx, "pci.bus_id": g.nvml_bus_id, "name": g.name,
            "memory.used": used[g.address], "memory.total": g.memory_total,
            "memory.free": g.memory_total - used[g.address], "utilization.gpu": 0,
            "uuid": g.uuid, "minor_number": g.minor, "driver_version": driver, "count": len(gpus),
        }
        cells = []
        for f in fields:
            name = canonical_field(f)
            v = values[name]
            unit = UNITS.get(name)
            cells.append(f"{v} {unit}" if unit and units else str(v))
        lines.append(", ".join(cells))
    return _res(0, "".join(line + "\n" for line in lines))


def _exec_start_prop(svc: dict, unit: Unit) -> str:
    argv = unit.argv
    path = argv[0] if argv and argv[0].startswith("/") else f"/usr/bin/{argv[0] if argv else ''}"
    started = svc.get("state") in ("active", "failed")
    start_time = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(svc["started"])) if started else "n/a"
    if svc.get("state") == "failed":
        code, status = "exited", f"{svc.get('code', 1)}/FAILURE"
    else:
        code, status = "(null)", "0/0"
    return (f"{{ path={path} ; argv[]={' '.join(argv)} ; ignore_errors=no ; start_time=[{start_time}] ; "
            f"stop_time=[n/a] ; pid={svc.get('pid', 0)} ; code={code} ; status={status} }}")


_UNIT_SUFFIX = re.compile(r"\.(service|socket|target|timer|mount|automount|path|slice|scope|device|swap)$")


def unit_name(name: str) -> str:
    """systemd's ``unit_name_mangle``: a name without a unit type suffix means ``NAME.service``."""
    return name if _UNIT_SUFFIX.search(name) else name + ".service"


def _systemctl(ct: Container, args: list[str]) -> ExecResult:
    if not args:
        return _res(1, err="Too few arguments.\n")
    verb, rest = args[0], []
    for i, a in enumerate(args[1:]):
        after_p = i > 0 and args[i] in ("-p", "--property")
        rest.append(a if a.startswith("-") or after_p else unit_name(a))
    if verb == "daemon-reload":
        ct.daemon_reload()
        return _res(0)
    if verb == "show":
        props: list[str] = []
        units: list[str] = []
        i = 0
        while i < len(rest):
            if rest[i] == "-p" and i + 1 < len(rest):
                props.extend(rest[i + 1].split(","))
                i += 2
                continue
            if rest[i].startswith("--property="):
                props.extend(rest[i].split("=", 1)[1].split(","))
            else:
                units.append(rest[i])
            i += 1
        out = []
        for name in units:
            unit, _ = ct.effective_unit(name)
            svc = ct.service(name)
            # systemd prints service properties (MainPID, ExecStart) before unit ones (ActiveState)
            order = ["MainPID", "ExecStart", "LoadState", "ActiveState", "SubState", "Result"]
            sub = {"active": "running", "failed": "failed"}.get(svc["state"], "dead")
            values = {
                "MainPID": str(svc.get("pid", 0)),
                "ExecStart": _exec_start_prop(svc, unit) if unit and unit.exec_start else "",
                "LoadState": "loaded" if unit else "not-found",
                "ActiveState": svc["state"],
                "SubState": sub,
                "Result": svc.get("result", "success"),
                # systemd joins every Environment= assignment of the unit and its drop-ins
                "Environment": " ".join(unit.environment) if unit else "",
            }
            for p in [p for p in order if p in props] + [p for p in props if p not in order]:
                if p in values:
                    out.append(f"{p}={values[p]}")
            if len(units) > 1:
                out.append("")
        return _res(0, "".join(line + "\n" for line in out))
    if verb == "is-active":
        states = [_ready_state(ct.service(u)) for u in rest]
        rc = 0 if states and all(s == "active" for s in states) else 3
        return _res(rc, "".join(s + "\n" for s in states))
    if verb in ("start", "stop", "restart"):
        err = ""
        for name in rest:
            if verb in ("stop", "restart"):
                if ct.service(name).get("state") == "active":
                    time.sleep(service_latency(ct.sim_dir, "stop"))
                rc, e = ct.stop_service(name)
                if rc and verb == "stop":
                    return _res(rc, err=err + e)
            if verb in ("start", "restart"):
                rc, e = ct.start_service(name, verb)
                err += e
                if rc:
                    return _res(rc, err=err)
                # like a Type=notify unit: start returns once the server says it is ready
                time.sleep(max(0.0, float(ct.service(name).get("ready_at", 0.0)) - time.time()))
        return _res(0, err=err)
    return _res(1, err=f"Unknown command verb {verb}.\n")


def _ready_state(svc: dict) -> str:
    if svc.get("state") == "active" and float(svc.get("ready_at", 0.0)) > time.time():
        return "activating"
    return svc["state"]


def _ls_dev(ct: Container) -> ExecResult:
    names = set(BASE_DEV)
    for d in ct.devices():
        names.add(d[len("/dev/"):].split("/", 1)[0])
    return _res(0, "".join(n + "\n" for n in sorted(names)))


def _container_file(ct: Container, path: str) -> Path:
    # the host's /proc/driver/nvidia shows through: lxcfs does not virtualise it
    if path.startswith("/proc/driver/nvidia/"):
        return _inside(ct.paths.root, path)
    return _inside(ct.rootfs, path)


def _cat(ct: Container, args: list[str]) -> ExecResult:
    out, err, rc = "", "", 0
    for path in args:
        try:
            p = _container_file(ct, path)
        except ValueError:
            p = None
        if p is not None and p.is_dir():
            err += f"cat: {path}: Is a directory\n"
            rc = 1
            continue
        text = _read(p) if p is not None else None
        if text is None:
            err += f"cat: {path}: No such file or directory\n"
            rc = 1
        else:
            out += text
    return _res(rc, out, err)


def _test(ct: Container, args: list[str]) -> ExecResult:
    if len(args) != 2 or args[0] not in ("-e", "-f", "-d", "-c"):
        return _res(2, err="test: unsupported expression\n")
    op, path = args
    if path.startswith("/dev/"):
        view = ct.devices()
        exists = path in view or any(v.startswith(path.rstrip("/") + "/") for v in view)
        if op == "-c":
            exists = path in view
        elif op in ("-f", "-d"):
            exists = exists and (op == "-d") == (path not in view)
        return _res(0 if exists else 1)
    try:
        p = _container_file(ct, path)
    except ValueError:
        return _res(1)
    ok = {"-e": p.exists(), "-f": p.is_file(), "-d": p.is_dir(), "-c": False}[op]
    return _res(0 if ok else 1)


def _rm(ct: Container, args: list[str]) -> ExecResult:
    """``rm [-f] FILE...`` for regular files inside the container (what apply's undo needs)."""
    force = "-f" in args
    err, rc = "", 0
    for path in (a for a in args if not a.startswith("-")):
        try:
            p = _inside(ct.rootfs, path)
        except ValueError:
            err, rc = err + f"rm: cannot remove '{path}': Permission denied\n", 1
            continue
        if p.is_dir():
            err, rc = err + f"rm: cannot remove '{path}': Is a directory\n", 1
        elif p.is_file() or p.is_symlink():
            p.unlink()
        elif not force:
            err, rc = err + f"rm: cannot remove '{path}': No such file or directory\n", 1
    return _res(rc, err=err)


def _mkdir(ct: Container, args: list[str]) -> ExecResult:
    """``mkdir [-p] DIR...`` inside the container, with coreutils' messages: without ``-p`` a
    missing parent or an existing path is an error; with ``-p`` only a file in the way is."""
    parents = "-p" in args or "--parents" in args
    paths = [a for a in args if not a.startswith("-")]
    if not paths:
        return _res(1, err="mkdir: missing operand\nTry 'mkdir --help' for more information.\n")
    err, rc = "", 0
    for path in paths:
        try:
            p = _inside(ct.rootfs, path)
        except ValueError:
            err, rc = err + f"mkdir: cannot create directory '{path}': Permission denied\n", 1
            continue
        if parents:
            blocker = next((q for q in [p, *p.parents] if q.exists() and not q.is_dir()), None)
            if blocker is not None:
                err, rc = err + f"mkdir: cannot create directory '{path}': Not a directory\n", 1
            else:
                p.mkdir(parents=True, exist_ok=True)
        elif p.exists():
            err, rc = err + f"mkdir: cannot create directory '{path}': File exists\n", 1
        elif not p.parent.is_dir():
            err, rc = err + f"mkdir: cannot create directory '{path}': No such file or directory\n", 1
        else:
            p.mkdir()
    return _res(rc, err=err)


def service_latency(sim_dir: str | os.PathLike, op: str) -> float:
    """Seconds ``systemctl start|stop`` of a service blocks (``service.<op>`` in the run dir's
    ``latencies`` state; 0 when unset): a Type=notify server returns from start only once ready."""
    lat = state.read_state(SimPaths(Path(sim_dir)).run, "latencies", {}) or {}
    return float(lat.get(f"service.{op}", 0.0))


class SimExec:
    """ExecPort over the simulated containers of the simulated host in ``sim_dir``."""

    def __init__(self, sim_dir: str | os.PathLike):
        self.sim_dir = Path(sim_dir)
        self.paths = SimPaths(self.sim_dir)

    def container(self, vmid: int) -> Container:
        return Container(self.sim_dir, vmid)

    def break_(self, vmid: int, what: str, **params: Any) -> None:
        """Break ``what`` in container ``vmid`` (see :func:`break_container`)."""
        break_container(self.sim_dir, vmid, what, **params)

    def heal(self, vmid: int, what: str | None = None) -> None:
        """Undo a fault (all when ``what`` is None)."""
        heal_container(self.sim_dir, vmid, what)

    def _pct_problem(self, vmid: int) -> str | None:
        if not self.paths.lxc_conf(vmid).is_file():
            return NO_CONFIG.format(node=self.paths.node(), vmid=vmid)
        if state.guest_status(self.paths.run, "lxc", vmid) != "running":
            return NOT_RUNNING.format(vmid=vmid)
        return None

    def run(self, vmid: int, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """Run ``argv`` in container ``vmid`` as ``pct exec`` would; return its result.

        pct's own failures (no config, container not running) come back as exit 255 with
        pct's message on stderr; an unknown command as exit 127. Never blocks.
        """
        problem = self._pct_problem(vmid)
        if problem:
            return _res(255, err=problem)
        if not argv:
            return _res(255, err="missing command\n")
        ct = self.container(vmid)
        cmd, args = os.path.basename(argv[0]), list(argv[1:])
        if cmd == "nvidia-smi":
            return _nvidia_smi(ct, args)
        if cmd == "systemctl":
            return _systemctl(ct, args)
        if cmd == "cat":
            return _cat(ct, args)
        if cmd in ("test", "["):
            return _test(ct, [a for a in args if a != "]"])
        if cmd == "ls" and args == ["/dev"]:
            return _ls_dev(ct)
        if cmd == "true":
            return _res(0)
        if cmd == "rm":
            return _rm(ct, args)
        if cmd == "mkdir":
            return _mkdir(ct, args)
        return _res(127, err=f"lxc-attach: {vmid}: Failed to exec \"{argv[0]}\": No such file or directory\n")

    def push(self, vmid: int, path: str, content: str, mode: int = 0o644) -> None:
        """Write ``path`` inside container ``vmid`` as ``pct push --perms`` would.

        Raises :class:`ExecError` (rc 255, pct's message) when the container has no config or
        is not running, when ``path`` escapes the container, and when its directory does not
        exist there: pct creates the file only (``create_file``), never its parents.
        """
        argv = ["pct", "push", str(vmid), path]
        if not self.paths.lxc_conf(vmid).is_file():
            raise ExecError(vmid, argv, 255, NO_CONFIG.format(node=self.paths.node(), vmid=vmid))
        if state.guest_status(self.paths.run, "lxc", vmid) != "running":
            raise ExecError(vmid, argv, 255, "can only push files to a running CT\n")
        try:
            target = _inside(self.paths.rootfs(vmid), path)
        except ValueError as e:
            raise ExecError(vmid, argv, 255, str(e)) from None
        if not target.parent.is_dir():
            raise ExecError(vmid, argv, 255, f"failed to create file: {path}: No such file or directory\n")
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, target)


def write_unit(sim_dir: str | os.PathLike, vmid: int, name: str, text: str, enable: bool = True) -> Path:
    """Install unit ``name`` in container ``vmid``'s rootfs (as a package would), enabled or not.

    Returns the unit file's path.
    """
    base = SimPaths(Path(sim_dir)).rootfs(vmid) / "etc/systemd/system"
    base.mkdir(parents=True, exist_ok=True)
    path = base / name
    path.write_text(text)
    if enable:
        wants = base / "multi-user.target.wants"
        wants.mkdir(exist_ok=True)
        link = wants / name
        if not link.is_symlink():
            link.symlink_to(f"/etc/systemd/system/{name}")
    return path


# --- the inference endpoint --------------------------------------------------------------

_ARITH_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*(x|\*|×|times|multiplied by|\+|plus|-|minus|/|divided by)\s*(-?\d+(?:\.\d+)?)",
                       re.IGNORECASE)


def answer_arithmetic(question: str) -> str | None:
    """The result of the first ``a <op> b`` in ``question`` ("What is 7 x 13?" -> "91"), or None."""
    m = _ARITH_RE.search(question)
    if not m:
        return None
    a, op, b = float(m.group(1)), m.group(2).lower(), float(m.group(3))
    if op in ("x", "*", "×", "times", "multiplied by"):
        r = a * b
    elif op in ("+", "plus"):
        r = a + b
    elif op in ("-", "minus"):
        r = a - b
    else:
        if b == 0:
            return "undefined"
        r = a / b
    return str(int(r)) if r == int(r) else f"{r:g}"


class EndpointServer:
    """The container's OpenAI-compatible HTTP endpoint, served on loopback by the simulator.

    Every request reads the container's state from files: with no active inference service
    (container stopped, service inactive or failed) the connection is closed without a reply,
    like a server that is not listening. The URL is recorded in ``<run>/endpoint-<vmid>.json``.
    """

    def __init__(self, sim_dir: str | os.PathLike, vmid: int, host: str = "127.0.0.1", port: int = 0):
        self.sim_dir = Path(sim_dir)
        self.vmid = int(vmid)
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # keep test and serve output clean
                pass

            def do_GET(self):
                outer._handle(self, "GET")

            def do_POST(self):
                outer._handle(self, "POST")

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> EndpointServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        state.write_state(SimPaths(self.sim_dir).run, f"endpoint-{self.vmid}", {"url": self.url, "vmid": self.vmid})
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        ct = Container(self.sim_dir, self.vmid)
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        active = ct.active_server()
        if active is None:
            req.close_connection = True
            return
        hang = faults_of(self.sim_dir, self.vmid).get("hung_endpoint")
        if hang is not None:
            deadline = time.monotonic() + float(hang.get("seconds", 3600))
            while time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.05)
            req.close_connection = True
            return
        unit, svc = active
        argv = svc.get("argv", [])
        flavor = service_flavor(argv)
        model = served_model(argv)
        path = req.path.split("?", 1)[0]
        if method == "GET" and path == "/health":
            return self._send(req, 200, b"", None)
        if method == "GET" and path == "/v1/models":
            return self._json(req, 200, {"object": "list", "data": [{
                "id": model, "object": "model", "created": int(svc.get("started", 0)),
                "owned_by": flavor, "root": model}]})
        if method == "POST" and path == "/v1/chat/completions":
            return self._chat(req, body, model)
        if flavor == "sglang" and method == "GET" and path == "/get_server_info":
            return self._json(req, 200, {
                "model_path": model, "tp_size": svc.get("tp", 1),
                "max_total_num_tokens": self._kv_tokens(ct, svc), "version": "0.4.6"})
        if flavor == "vllm" and method == "GET" and path == "/metrics":
            blocks = self._kv_tokens(ct, svc) // 16
            text = (
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                "# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",gpu_memory_utilization="0.9",'
                f'num_cpu_blocks="0",num_gpu_blocks="{blocks}"}} 1.0\n'
                "# HELP vllm:num_gpu_blocks Number of GPU KV-cache blocks\n"
                "# TYPE vllm:num_gpu_blocks gauge\n"
                f'vllm:num_gpu_blocks{{model_name="{model}"}} {float(blocks)}\n'
                "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n')
            return self._send(req, 200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        return self._json(req, 404, {"detail": "Not Found"})

    @staticmethod
    def _kv_tokens(ct: Container, svc: dict) -> int:
        # KV cache: 30% of the memory the server holds, 128 KiB per token (a simulator constant)
        used = ct.gpu_memory_used()
        kv_mib = sum(used.get(a, 0) for a in svc.get("gpus", [])) * 0.3
        return int(kv_mib * 1024 // 128)

    def _chat(self, req, body: bytes, model: str) -> None:
        try:
            payload = json.loads(body or b"{}")
            messages = payload["messages"]
            question = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
        except (ValueError, KeyError, TypeError, StopIteration):
            return self._json(req, 400, {"object": "error", "message": "messages with a user turn are required",
                                         "type": "BadRequestError", "code": 400})
        answer = answer_arithmetic(str(question))
        wrong = faults_of(self.sim_dir, self.vmid).get("wrong_answer")
        if wrong is not None:
            answer = str(wrong.get("answer", int(answer) + 1 if answer and answer.lstrip("-").isdigit() else "42"))
        content = f"The answer is {answer}." if answer is not None else "I can only do arithmetic."
        now = int(time.time())
        return self._json(req, 200, {
            "id": f"chatcmpl-{_uuid.uuid4().hex}", "object": "chat.completion", "created": now,
            "model": payload.get("model") or model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(str(question).split()), "completion_tokens": len(content.split()),
                      "total_tokens": len(str(question).split()) + len(content.split())},
        })

    def _json(self, req, status: int, data: Any) -> None:
        self._send(req, status, json.dumps(data).encode(), "application/json")

    @staticmethod
    def _send(req, status: int, body: bytes, ctype: str | None) -> None:
        req.send_response(status)
        if ctype:
            req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
