"""One simulated container at run time: its ``/dev`` view, its GPUs and its services.

A container runs only while Proxmox says it runs (:mod:`gputopo.sim.state`). At boot its view
is fixed: the ``/dev/nvidia*`` nodes its config grants (``devN`` or ``lxc.mount.entry``) that
exist on the host; a GPU works only when the host GPU with that minor is bound to nvidia
(``proc/driver/nvidia/gpus/<bdf>/information`` "Device Minor").

The inference service (SGLang ``sglang.launch_server`` or vLLM ``vllm serve``) checks its
tensor-parallel size at start: more than the usable GPUs, or a size that does not divide the
model's :data:`ATTENTION_HEADS`, makes it fail like a crashing server (``systemctl start`` exits 1,
``is-active`` says ``failed``). It then loads the model its command names by the model
directory's footprint (:mod:`gputopo.sim.container.footprint`): weights that do not fit its GPUs
fail the start in the engine's words, and the memory used and KV tokens it reports come from the
engine's formulas. While it runs it holds its first ``tp`` GPUs (a model directory the simulator
cannot read shows the seed log's load, :mod:`gputopo.sim.container.gpus`) and its processes
show on the host (:mod:`gputopo.sim.container.processes`).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from gputopo.model.facts import normalize_address
from gputopo.sim import state
from gputopo.sim.container import journal
from gputopo.sim.container.devices import parse_granted_devices
from gputopo.sim.container.faults import break_container, faults_of, heal_container
from gputopo.sim.container.footprint import Load, model_of, read_footprint
from gputopo.sim.container.footprint import start as start_engine
from gputopo.sim.container.gpus import IDLE_MIB, SEED_LOAD_MIB, SEED_TOTAL_MIB, HostGpu, host_nvidia_gpus
from gputopo.sim.container.paths import SimPaths, inside, read_text
from gputopo.sim.container.processes import HOST_PID_BASE, reap, spawn
from gputopo.sim.container.server_args import parse_tp, service_flavor
from gputopo.sim.container.units import Unit, load_unit

ATTENTION_HEADS = 64  # the served model's heads: the tensor-parallel size must divide it


def service_latency(sim_dir: str | os.PathLike, op: str) -> float:
    """Seconds ``systemctl start|stop`` of a service blocks (``service.<op>`` in the run dir's
    ``latencies`` state; 0 when unset): a Type=notify server returns from start only once ready."""
    lat = state.read_state(SimPaths(Path(sim_dir)).run, "latencies", {}) or {}
    return float(lat.get(f"service.{op}", 0.0))


class Container:
    """One simulated container: its device view, GPUs, services. All state lives in files."""

    def __init__(self, sim_dir: str | os.PathLike, vmid: int):
        self.paths = SimPaths(Path(sim_dir))
        self.sim_dir = Path(sim_dir)
        self.vmid = int(vmid)
        self.rootfs = self.paths.rootfs(self.vmid)
        self.state_name = f"ct-{self.vmid}"

    # runtime state: {"devices": [...] (view fixed at start), "booted": time, "loaded": {unit: fingerprint},
    #                 "services": {unit: {...}}, "jobs": the last job id}
    def _state(self) -> dict:
        return state.read_state(self.paths.run, self.state_name, {}) or {}

    def _save(self, data: dict) -> None:
        state.write_state(self.paths.run, self.state_name, data)

    def running(self) -> bool:
        return state.guest_status(self.paths.run, "lxc", self.vmid) == "running"

    def conf_text(self) -> str | None:
        return read_text(self.paths.lxc_conf(self.vmid))

    def _current_view(self) -> list[str]:
        text = self.conf_text() or ""
        return [d for d in parse_granted_devices(text) if os.path.lexists(inside(self.paths.root, d))]

    def boot(self) -> None:
        """Record the container as started: fix its /dev view, clear services, start enabled ones.

        Call after Proxmox marks it running. Enabled services that fail stay ``failed``.
        """
        with state.locked(self.paths.run, self.state_name):
            self._reap_all()
            self._save({"devices": self._current_view(), "loaded": {}, "services": {}, "booted": time.time()})
        for unit in self.enabled_units():
            self.start_service(unit)

    def booted_at(self) -> float | None:
        """When the container last started (time.time()); None while it is stopped. A change
        that kept it running leaves this as it was."""
        return self._state().get("booted")

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

    def _reap_all(self) -> None:
        for svc in self._state().get("services", {}).values():
            reap(self.paths.root, svc.get("host_pids", []))

    def hotplug(self, path: str) -> None:
        """Add host node ``path`` to a running container's view (PVE 9 devN hot-plug); a node
        the host lacks or a container never booted is left as it is."""
        with state.locked(self.paths.run, self.state_name):
            st = self._state()
            if (
                "devices" in st
                and path not in st["devices"]
                and os.path.lexists(inside(self.paths.root, path))
            ):
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
        gpus = [
            g
            for g in host_nvidia_gpus(self.paths.root)
            if g.driver == "nvidia" and g.minor is not None and f"/dev/nvidia{g.minor}" in view
        ]
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

    def start_service(
        self, name: str, verb: str = "start", block: bool = True, after: float = 0.0
    ) -> tuple[int, str]:
        """Start unit ``name``; return (exit status, stderr) as ``systemctl <verb>`` gives them.

        Without ``block`` (``--no-block``) only what systemd checks before it queues the job
        fails the command (a unit not found, a bad setting); a server that crashes at start
        ends ``failed`` while the command exits 0. ``after``: seconds before the start begins
        (a restart's stop, which then happens in the job, not in the command)."""
        unit, stale = self.effective_unit(name)
        if unit is None:
            return 5, f"Failed to {verb} {name}: Unit {name} not found.\n"
        warn = (
            (
                f"Warning: The unit file, source configuration file or drop-ins of {name} changed on "
                f"disk. Run 'systemctl daemon-reload' to reload units.\n"
            )
            if stale
            else ""
        )
        problem = unit.problem()
        if problem:
            return 1, warn + f"Failed to {verb} {name}: Unit {name} has a bad unit file setting.\n"
        cur = self.service(name)
        if cur.get("state") == "active":
            return 0, warn
        reason = self._start_problem(unit)
        argv = unit.argv
        load = None if reason else self._load(argv)
        if load is not None and load.error:
            reason = load.error
        svc = {
            "state": "active",
            "pid": 0,
            "argv": argv,
            "result": "success",
            "message": "",
            "started": time.time(),
        }
        if reason:
            return self._failed_start(name, unit, svc, reason, load, block, warn)
        self._running(name, unit, svc, load, after)
        return 0, warn

    def _failed_start(
        self, name: str, unit: Unit, svc: dict, reason: str, load: Load | None, block: bool, warn: str
    ) -> tuple[int, str]:
        """The server died at its start (``reason``): its journal, the unit ``failed``, and what
        ``systemctl start`` says (nothing with ``--no-block``)."""
        printed = load.journal if load is not None else [reason]
        pid = HOST_PID_BASE + self.vmid * 100  # the server that died: its pid is gone with it
        journal.log(self.paths.run, self.vmid, name, journal.start_lines(name, pid, printed, True))
        svc.update(state="failed", result="exit-code", message=reason, code=1)
        self._set_service(name, svc, unit)
        if not block:
            return 0, warn
        return 1, warn + (
            f"Job for {name} failed because the control process exited with error code.\n"
            f'See "systemctl status {name}" and "journalctl -xeu {name}" for details.\n'
        )

    def _running(self, name: str, unit: Unit, svc: dict, load: Load | None, after: float) -> None:
        """The server started: its processes on its first ``tp`` GPUs, ready after its latency,
        the memory and KV cache its model's load gives (else the seed's pattern), its journal."""
        argv = svc["argv"]
        svc["ready_at"] = time.time() + after + self._start_latency(argv)
        svc["job"] = self._next_job()
        svc["tp"] = parse_tp(argv)
        gpus = self.gpus()[: svc["tp"]]
        svc["gpus"] = [g.address for g in gpus]
        if load is not None:  # what the engine's start gives (footprint.start); else the seed's pattern
            svc.update(used_mib=dict(zip(svc["gpus"], load.used_mib)), kv_tokens=load.kv_tokens)
        svc["host_pids"] = spawn(
            self.paths.root, self.vmid, name, argv, svc["tp"], [f"/dev/nvidia{g.minor}" for g in gpus]
        )
        svc["pid"] = svc["host_pids"][0]  # MainPID: the server's main process
        printed = load.journal if load is not None else []
        journal.log(self.paths.run, self.vmid, name, journal.start_lines(name, svc["pid"], printed, False))
        self._set_service(name, svc, unit)

    def _load(self, argv: list[str]) -> Load | None:
        """The model load of a server started as ``argv`` on its first ``tp`` GPUs, from the
        model directory it names (:mod:`gputopo.sim.container.footprint`); None when the
        command is no inference server or its model directory cannot be read."""
        path = model_of(argv) if service_flavor(argv) else None
        fp = read_footprint(self.rootfs, path) if path else None
        if fp is None:
            return None
        return start_engine(argv, [g.memory_total for g in self.gpus()[: parse_tp(argv)]], fp)

    def _start_latency(self, argv: list[str]) -> float:
        """Seconds until the server is ready: the ``slow_start`` fault's (for its tensor-parallel
        size only when it names one), else the configured ``service.start`` latency."""
        fault = faults_of(self.sim_dir, self.vmid).get("slow_start")
        if fault is not None and (fault.get("tp") is None or _tp_of(argv) == int(fault["tp"])):
            return float(fault.get("seconds", 60.0))
        return service_latency(self.sim_dir, "start")

    def _next_job(self) -> int:
        """A new job id (systemd numbers the jobs it queues, counting up)."""
        with state.locked(self.paths.run, self.state_name):
            st = self._state()
            st["jobs"] = int(st.get("jobs", 0)) + 1
            self._save(st)
            return st["jobs"]

    def _start_problem(self, unit: Unit) -> str | None:
        argv = unit.argv
        fault = faults_of(self.sim_dir, self.vmid).get("service_fails")
        if fault is not None and fault.get("tp") is not None and _tp_of(argv) != int(fault["tp"]):
            fault = None  # it fails only a start with that tensor-parallel size (a new configuration)
        if fault is not None:
            if fault.get("count") is not None:  # fails only the next ``count`` starts
                if int(fault["count"]) <= 1:
                    heal_container(self.sim_dir, self.vmid, "service_fails")
                else:
                    break_container(
                        self.sim_dir,
                        self.vmid,
                        "service_fails",
                        **{**fault, "count": int(fault["count"]) - 1},
                    )
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
            return (
                f"ValueError: Total number of attention heads ({ATTENTION_HEADS}) must be "
                f"divisible by tensor parallel size ({tp})."
            )
        return None

    def stop_service(self, name: str) -> tuple[int, str]:
        if self.unit(name) is None and name not in self._state().get("services", {}):
            return 5, f"Failed to stop {name}: Unit {name} not loaded.\n"
        if self.service(name).get("state") == "active":
            journal.log(self.paths.run, self.vmid, name, journal.stop_lines(name))
        reap(self.paths.root, self.service(name).get("host_pids", []))
        self._set_service(name, {"state": "inactive", "pid": 0})
        return 0, ""

    def gpu_memory_used(self) -> dict[str, int]:
        """MiB used per GPU address: the serving pattern on the GPUs services hold, else idle."""
        used = {g.address: IDLE_MIB for g in self.gpus()}
        totals = {g.address: g.memory_total for g in self.gpus()}
        for svc in self._state().get("services", {}).values():
            if svc.get("state") != "active":
                continue
            loaded = svc.get("used_mib") or {}
            for i, addr in enumerate(svc.get("gpus", [])):
                if addr in used and addr in loaded:
                    used[addr] = int(loaded[addr])
                elif addr in used:  # a model the simulator cannot read: the seed log's pattern, scaled
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


def _tp_of(argv: list[str]) -> int | None:
    try:
        return parse_tp(argv)
    except ValueError:
        return None
