"""A task's worker that dies with the process that served the API: on a node the worker is a
detached process of its own (pve-common RESTEnvironment.pm fork_worker, ``POSIX::setsid``) and
runs to its end whatever happens to its client; in the simulator it is a thread of the serving
process, so a server started later takes the task over (:mod:`gputopo.sim.pveapi.workers`)
instead of leaving it ``running`` for ever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gputopo.adapters.credentials import ApiConfig
from gputopo.adapters.proxmox import ProxmoxClient
from gputopo.sim import state
from gputopo.sim.pveapi import PveApiServer, workers
from helpers.simapi import seed_root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a server in a process of its own, killed mid-task (seconds)

CT = "arch: amd64\nhostname: llm\nmemory: 4096\nostype: ubuntu\n"

# serves the API, asks for CT 101's start, and blocks inside the start's effect (the container's
# boot) once it wrote IN: the task is claimed and half done when the parent SIGKILLs it
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gputopo.adapters.credentials import ApiConfig
    from gputopo.adapters.proxmox import ProxmoxClient
    from gputopo.sim.pveapi import PveApiServer

    base, root, marker = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

    class Blocking:
        def on_guest_start(self, kind, vmid):
            marker.write_text("in")
            time.sleep(600)

    s = PveApiServer(base / "pve", base / "run", root, hooks=Blocking(), auth_fail_delay=0.0).start()
    cfg = ApiConfig(host="127.0.0.1", port=s.port, ca_bundle=str(s.ca_cert_path), timeout=10)
    c = ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": s.root_password})
    (base / "upid").write_text(c._call("POST", "/nodes/pve1/lxc/101/status/start"))
    time.sleep(600)
    """
)


def test_a_task_whose_serving_process_was_killed_mid_effect_is_carried_out_by_the_next_server(
    tmp_path, seed_root
):
    PveApiServer(tmp_path / "pve", tmp_path / "run", seed_root).write_conf("lxc", 101, CT)
    marker = tmp_path / "in-effect"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(seed_root), str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child never began the start"
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    upid = (tmp_path / "upid").read_text()
    task = state.read_state(tmp_path / "run", "tasks", {})[upid]
    assert task["status"] == "running" and task["claimed"]["pid"] == child.pid  # half done, its worker dead
    assert workers.orphaned(task)

    s = PveApiServer(tmp_path / "pve", tmp_path / "run", seed_root, auth_fail_delay=0.0).start()
    try:
        cfg = ApiConfig(
            host="127.0.0.1", port=s.port, ca_bundle=str(s.ca_cert_path), timeout=10, poll_interval=0.02
        )
        c = ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": s.root_password})
        assert c.wait_task(upid, 10) == "OK"
        assert c.guest_status("lxc", 101) == "running"
    finally:
        s.stop()


def test_a_claimer_is_known_by_its_pid_and_its_start_time():
    mine = workers.me()
    assert workers.alive(mine)
    assert not workers.alive({**mine, "start": mine["start"] + 1})  # the pid reused by another process
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert not workers.alive({"pid": int(gone.stdout), "start": 1})
    running = {"status": "running", "claimed": {"pid": int(gone.stdout), "start": 1}}
    assert workers.orphaned(running)
    assert not workers.orphaned({**running, "claimed": mine})
    assert not workers.orphaned({**running, "status": "stopped"})


class _Counting:
    def __init__(self):
        self.starts: list[tuple[str, int]] = []

    def on_guest_start(self, kind, vmid):
        self.starts.append((kind, vmid))
        return []


def test_a_dead_workers_task_whose_guest_already_got_there_ends_ok_without_doing_it_again(
    tmp_path, seed_root
):
    """The worker died after its effect (the container booted) and before the task's end was
    written: the next server ends the task OK and does not boot the container a second time."""
    run = tmp_path / "run"
    s = PveApiServer(tmp_path / "pve", run, seed_root, auth_fail_delay=0.0)
    s.write_conf("lxc", 101, CT)
    s.set_latency("vzstart", 3600.0)  # its timer never fires while this server runs
    s.start()
    try:
        cfg = ApiConfig(host="127.0.0.1", port=s.port, ca_bundle=str(s.ca_cert_path), timeout=10)
        c = ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": s.root_password})
        upid = c._call("POST", "/nodes/pve1/lxc/101/status/start")
    finally:
        s.stop()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    with state.locked(run, "tasks"):
        tasks = state.read_state(run, "tasks", {})
        tasks[upid].update(claimed={"pid": int(gone.stdout), "start": 1}, due=time.time())
        state.write_state(run, "tasks", tasks)
    state.set_guest_status(run, "lxc", 101, "running")  # the effect the dead worker carried out

    hooks = _Counting()
    s = PveApiServer(tmp_path / "pve", run, seed_root, hooks=hooks, auth_fail_delay=0.0).start()
    try:
        cfg = ApiConfig(
            host="127.0.0.1", port=s.port, ca_bundle=str(s.ca_cert_path), timeout=10, poll_interval=0.02
        )
        c = ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": s.root_password})
        assert c.wait_task(upid, 10) == "OK"
    finally:
        s.stop()
    assert hooks.starts == []
    assert state.guest_status(run, "lxc", 101) == "running"
