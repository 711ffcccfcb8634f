"""The node's own command line tools on a simulated host: ``pct``, ``qm``, ``pvesh`` and
``update-initramfs``, with the real tools' argument syntax, so that what ``gputopo plan
--commands`` prints can be pasted into a shell on the simulated node.

:func:`install_tools` writes one small executable per tool into a directory to put first on
``PATH``; each runs ``python -m gputopo.sim.nodecli TOOL ARGS`` against the simulated host in
``GPUTOPO_SIM_DIR``. What each tool does is what the real one does, on the simulator's parts:

* ``pvesh`` is :class:`gputopo.sim.pveapi.PveshSim` (pve-manager ``PVE/CLI/pvesh.pm``);
* ``pct set|start|stop|shutdown`` and ``qm set|start|stop|shutdown`` call the same API methods as
  ``pvesh`` on the guest's path: pve-container ``src/PVE/CLI/pct.pm`` and qemu-server
  ``PVE/CLI/qm.pm`` map them in ``$cmddef`` to ``update_vm`` (the config's PUT; qm's is the
  synchronous one) and to the status endpoints' ``vm_start``, ``vm_stop`` and ``vm_shutdown``,
  whose task runs in the foreground; a task that failed exits non-zero (``$upid_exit``:
  ``exit(upid_status_is_error ? -1 : 0)``), its message on stderr;
* ``pct exec VMID -- CMD...`` and ``pct push VMID FILE DEST [--perms MODE]`` are
  :class:`gputopo.sim.container.SimExec` (pct.pm ``exec``: lxc-attach; ``push``: the file
  opened on the host, created in the container with its permissions);
* ``update-initramfs`` and ``nvidia-modprobe`` are :class:`gputopo.sim.hostcmd.SimHostCommands`.

Nothing here models the kernel's sysfs: a write to an attribute is the simulated kernel's
(:class:`gputopo.sim.kernel.SimKernel`), and a shell's ``echo > file`` cannot reach it by
itself: :class:`gputopo.sim.hostshell.HostShell` (``gputopo sim shell``) hands each write to it.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from gputopo.errors import GputopoError
from gputopo.sim import state

TOOLS = ("pct", "qm", "pvesh", "update-initramfs", "nvidia-modprobe")
ENV = "GPUTOPO_SIM_DIR"
TIMEOUT = 600.0
GUEST_VERBS = {"start": "status/start", "stop": "status/stop", "shutdown": "status/shutdown"}


def install_tools(bin_dir: str | os.PathLike, sim_dir: str | os.PathLike) -> Path:
    """Write ``pct``, ``qm``, ``pvesh``, ``update-initramfs`` and ``nvidia-modprobe`` for the simulated host in
    ``sim_dir`` into ``bin_dir`` (made if missing); returns ``bin_dir``."""
    out = Path(bin_dir)
    out.mkdir(parents=True, exist_ok=True)
    package = Path(__file__).resolve().parents[2]
    for tool in TOOLS:
        p = out / tool
        p.write_text(
            "#!/bin/sh\n"
            f"{ENV}={shlex.quote(str(Path(sim_dir).resolve()))} "
            f"PYTHONPATH={shlex.quote(str(package))}${{PYTHONPATH:+:$PYTHONPATH}} exec "
            f'{shlex.quote(sys.executable)} -m gputopo.sim.nodecli {tool} "$@"\n'
        )
        p.chmod(0o755)
    return out


def _pvesh(sim_dir: Path):
    from gputopo.sim.host import SimHost
    from gputopo.sim.pveapi import PveApiServer, PveshSim

    host = SimHost.open(sim_dir)
    server = PveApiServer(
        host.paths.pve, host.paths.run, host.paths.root, host.node, host.version, tls=False, hooks=host.hooks
    )
    return host, PveshSim(server)


def _emit(out: str, err: str, rc: int) -> int:
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


def _guest(tool: str, argv: list[str], sim_dir: Path) -> int:
    """``pct``/``qm`` ``set|start|stop|shutdown VMID [OPTIONS]`` through the API's handlers."""
    usage = f"USAGE: {tool} <COMMAND> [ARGS] [OPTIONS]\n"
    if len(argv) < 2 or not argv[1].isdigit() or (argv[0] != "set" and argv[0] not in GUEST_VERBS):
        return _emit("", usage, 255)
    verb, vmid, options = argv[0], argv[1], argv[2:]
    host, pvesh = _pvesh(sim_dir)
    kind = "lxc" if tool == "pct" else "qemu"
    base = f"/nodes/{host.node}/{kind}/{vmid}"
    if verb == "set":
        out, err, rc = pvesh(["pvesh", "set", f"{base}/config", *options], TIMEOUT)
        return _emit("", err, rc)
    out, err, rc = pvesh(["pvesh", "create", f"{base}/{GUEST_VERBS[verb]}", *options], TIMEOUT)
    if rc != 0:
        return _emit("", err, rc)
    upid = json.loads(out.strip().splitlines()[-1])
    task = state.read_state(host.paths.run, "tasks", {})[upid]
    ok = task["exitstatus"] == "OK" or str(task["exitstatus"]).startswith("WARNINGS")
    log = "".join(ln + "\n" for ln in task.get("log") or [] if not ln.startswith("TASK "))
    return _emit(log, err, 0 if ok else 255)


def _pct(argv: list[str], sim_dir: Path) -> int:
    from gputopo.sim.container import SimExec

    if argv[:1] == ["exec"]:
        if len(argv) < 4 or not argv[1].isdigit() or argv[2] != "--":
            return _emit("", "USAGE: pct exec <vmid> [<extra-args>] [OPTIONS]\n", 255)
        res = SimExec(sim_dir).run(int(argv[1]), argv[3:], TIMEOUT)
        return _emit(res.stdout, res.stderr, res.rc)
    if argv[:1] == ["push"]:
        if len(argv) not in (4, 6) or not argv[1].isdigit() or (len(argv) == 6 and argv[4] != "--perms"):
            return _emit("", "USAGE: pct push <vmid> <file> <destination> [OPTIONS]\n", 255)
        mode = int(argv[5], 8) if len(argv) == 6 else 0o644
        try:
            content = Path(argv[2]).read_text()
        except OSError:
            return _emit("", f"failed to open {argv[2]} for reading\n", 255)
        try:
            SimExec(sim_dir).push(int(argv[1]), argv[3], content, mode)
        except GputopoError as e:
            return _emit("", f"{e}\n", 255)
        return 0
    return _guest("pct", argv, sim_dir)


def main(argv: list[str] | None = None) -> int:
    """Run ``argv`` (``TOOL ARGS...``) on the simulated host in ``$GPUTOPO_SIM_DIR``; returns
    the tool's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sim_dir = Path(os.environ[ENV])
    tool, rest = argv[0], argv[1:]
    if tool == "pvesh":
        _, pvesh = _pvesh(sim_dir)
        return _emit(*pvesh(["pvesh", *rest], TIMEOUT))
    if tool == "pct":
        return _pct(rest, sim_dir)
    if tool == "qm":
        return _guest("qm", rest, sim_dir)
    if tool in ("update-initramfs", "nvidia-modprobe"):
        from gputopo.sim.hostcmd import SimHostCommands

        res = SimHostCommands(sim_dir).run([tool, *rest], TIMEOUT)
        return _emit(res.stdout, res.stderr, res.rc)
    return _emit("", f"{tool}: not a tool of the simulated node\n", 127)


if __name__ == "__main__":
    sys.exit(main())
