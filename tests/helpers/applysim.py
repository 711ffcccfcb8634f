"""Helpers for the apply tests: copies of one simulated seed host, and a fingerprint of a host.

Creating the seed host takes seconds, so one template is made per session and every test works
on a copy (on /dev/shm when there is one: the copies and the journal's fsyncs are then cheap).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gputopo.actions import Timeouts
from gputopo.facts.discover import discover
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import init_spec
from gputopo.sim import state
from gputopo.sim.container import SimExec
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel

SCALE = 0.01  # kernel latencies: nvidia unbind 2 s -> 20 ms


def fast_tmp() -> str:
    return (
        "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    )


def make_template() -> Path:
    d = Path(tempfile.mkdtemp(prefix="gputopo-apply-tpl-", dir=fast_tmp())) / "sim"
    SimHost.create(d)
    SimKernel(d / "root").configure(time_scale=SCALE)
    return d


@pytest.fixture(scope="session")
def template():
    """The seed simulated host every test copies (import this fixture into a test module)."""
    d = make_template()
    yield d
    cleanup(d.parent)


def copy_host(template: Path, dest: Path) -> SimHost:
    subprocess.run(["cp", "-a", str(template), str(dest)], check=True)
    return SimHost.open(dest)


def _own_copy(template: Path, with_spec: bool):
    base = Path(tempfile.mkdtemp(prefix="gputopo-host-", dir=fast_tmp()))
    h = copy_host(template, base / "sim")
    if with_spec:
        (h.dir / "spec.yaml").write_text(seed_spec_text(h))
    yield h
    h.stop()
    cleanup(base)


@pytest.fixture
def host(template):
    """A copy of the seed host of its own, removed afterwards (import it with ``template``)."""
    yield from _own_copy(template, False)


@pytest.fixture
def spec_host(template):
    """:func:`host` with the seed spec as ``DIR/spec.yaml`` (import it with ``template``)."""
    yield from _own_copy(template, True)


# the step timeouts of the scenario tests: short, so that a fault fails fast
FAST_TIMEOUTS = Timeouts(sysfs=5.0, guest=30.0, exec=10.0, service=20.0, poll=0.02)


def restarting(text: str) -> str:
    """Spec ``text`` with ``policy.container_restart: always``: by default a split keeps its
    container running (only the service restarts), so its stop and start steps would not run."""
    return text.replace("policy:\n", "policy:\n  container_restart: always\n", 1)


def reverse(text: str) -> str:
    """The seed split's spec turned around: the container takes every GPU again."""
    return text.replace("numa: [0]", "numa: [0, 1]").replace("numa: [1]", "rest")


def seed_spec_text(host: SimHost) -> str:
    return init_spec(discover(str(host.paths.root)))


def seed_spec(host: SimHost):
    return parse_spec(seed_spec_text(host))


def running_service(root: Path, vmid: int, unit: str) -> tuple[str | None, list[str]]:
    """What runs, as the host's /proc shows it: the service's main process's command line and the
    /dev/nvidia nodes its processes hold open (from the processes in the container's cgroup for
    ``unit``, never from the unit files)."""
    cgroup = f"/lxc/{vmid}/ns/system.slice/{unit}"
    main, held = None, set()
    for d in sorted((root / "proc").glob("[0-9]*"), key=lambda q: int(q.name)):
        try:
            if cgroup not in (d / "cgroup").read_text():
                continue
            words = [w for w in (d / "cmdline").read_bytes().decode().split("\0") if w]
        except OSError:
            continue
        if main is None and "--multiprocessing-fork" not in words:
            main = " ".join(words)
        for fd in (d / "fd").iterdir() if (d / "fd").is_dir() else []:
            target = os.readlink(fd)
            if target.startswith("/dev/nvidia"):
                held.add(target)
    return main, sorted(held)


def fingerprint(host: SimHost, vmid: int = 101, unit: str = "sglang.service") -> dict[str, object]:
    """Everything an apply may change, as comparable data, what RUNS as well as what describes it:
    every PCI device's driver and driver_override, /dev/vfio and the nvidia nodes, the Proxmox
    files, the host's etc/ and the container's systemd tree (every file with its mode, every
    directory), guest states, the service's state, the command line its main process really runs
    and the GPU nodes its processes hold, and the container's own view of /dev."""
    root = host.paths.root
    out: dict[str, object] = {}
    devs = root / "sys/bus/pci/devices"
    for d in sorted(devs.iterdir()):
        drv = os.path.basename(os.readlink(d / "driver")) if (d / "driver").is_symlink() else None
        ov = (d / "driver_override").read_text() if (d / "driver_override").exists() else None
        out[f"pci:{d.name}"] = (drv, ov)
    vfio = root / "dev/vfio"
    out["dev/vfio"] = sorted(p.name for p in vfio.iterdir()) if vfio.is_dir() else []
    out["dev/nvidia"] = sorted(p.name for p in (root / "dev").iterdir() if p.name.startswith("nvidia"))
    minors = _gpu_of_minor(root)
    for base, label in (
        (host.paths.pve, "pve"),
        (root / "etc", "etc"),
        (host.paths.rootfs(vmid) / "etc/systemd", "ct"),
    ):
        if not base.exists():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_dir() and not p.is_symlink():
                out[f"{label}:{p.relative_to(base)}/"] = "dir"
            elif p.is_file() and not p.is_symlink():
                mode = oct(p.stat().st_mode & 0o7777)
                data = p.read_bytes()
                if label == "pve" and p.relative_to(base) == PCI_CFG:
                    data = _sections_by_id(data)
                elif label == "pve" and p.parent.name == "lxc":
                    data = _nodes_by_address(data, minors)
                out[f"{label}:{p.relative_to(base)}"] = (hashlib.sha256(data).hexdigest(), mode)
    out["guests"] = state.read_state(host.paths.run, "guests", {})
    sx = SimExec(host.dir)
    active = sx.run(vmid, ["systemctl", "is-active", unit], timeout=5).stdout.strip()
    out["service"] = (active, *running_service(root, vmid, unit))
    view = sx.run(vmid, ["ls", "/dev"], timeout=5)
    out["ct:/dev"] = sorted(view.stdout.split()) if view.rc == 0 else None
    return out


# The order of the mappings in mapping/pci.cfg is the order they were created in (pve-common
# SectionConfig.pm: parse_config numbers the sections as read, ``$order->{$sectionId} = $pri++``, and
# write_config writes them by that number, a new id after the others). Proxmox looks a mapping up
# by its id only, and its API cannot reorder them, so a rollback that creates a deleted mapping
# again puts it last: the fingerprint compares the sections, whatever their order.
PCI_CFG = Path("mapping/pci.cfg")


# nvidia hands a GPU bound to it the lowest free minor with no memory of its old one
# (open-gpu-kernel-modules kernel-open/nvidia/nv.c nv_linux_assign_minor_locked), so GPUs bound
# back at once (in parallel) may swap minors from one run to the next: what a container's config
# must say is which GPU each devN reaches. The fingerprint names a /dev/nvidiaN of a container's
# config by the GPU that holds minor N now (/proc/driver/nvidia/gpus/<address>/information), and
# keeps a minor no GPU holds as it is.
_DEVICE_MINOR = re.compile(rb"^Device Minor:\s*(\d+)", re.M)


def _gpu_of_minor(root: Path) -> dict[bytes, bytes]:
    out = {}
    gpus = root / "proc/driver/nvidia/gpus"
    for d in sorted(gpus.iterdir()) if gpus.is_dir() else []:
        m = _DEVICE_MINOR.search((d / "information").read_bytes()) if (d / "information").exists() else None
        if m:
            out[m.group(1)] = d.name.encode()
    return out


def _nodes_by_address(data: bytes, minors: dict[bytes, bytes]) -> bytes:
    return re.sub(
        rb"/dev/nvidia(\d+)(?![\w-])", lambda m: b"/dev/nvidia@" + minors.get(m.group(1), m.group(1)), data
    )


def _sections_by_id(data: bytes) -> bytes:
    sections = [s.strip() for s in data.decode().split("\n\n") if s.strip()]
    return "\n\n".join(sorted(sections)).encode()


def diff(a: dict, b: dict) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def fake_process(
    root: Path,
    pid: int,
    node: str,
    comm: str = "python3",
    argv: tuple[str, ...] = (),
    cgroup: str | None = None,
    fd: int = 5,
) -> None:
    """A host process in ``<root>/proc/<pid>`` holding ``node`` (e.g. /dev/nvidia4) open, the
    way the kernel shows one: comm, cmdline (NUL-separated), cgroup and an fd link."""
    proc = Path(root) / "proc" / str(pid)
    (proc / "fd").mkdir(parents=True)
    (proc / "comm").write_text(comm + "\n")
    if argv:
        (proc / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    if cgroup is not None:
        (proc / "cgroup").write_text(cgroup + "\n")
    os.symlink(node, proc / "fd" / str(fd))


def held_apply(host: SimHost, stderr=subprocess.PIPE) -> tuple[SimKernel, subprocess.Popen]:
    """``gputopo apply`` of the seed spec in its own process, held in its switch phase: the
    unbind of 0000:81:00.0 blocks until the test calls ``kernel.release()``. Returns (kernel,
    process); ``stderr=subprocess.STDOUT`` joins the two streams."""
    kernel = SimKernel(host.paths.root)
    kernel.inject("0000:81:00.0", "unbind", "hang", times=1)
    spec_file = host.dir / "spec.yaml"
    spec_file.write_text(seed_spec_text(host))
    argv = ["apply", "--spec", str(spec_file), "--sim", str(host.dir), "--yes", "--no-verify"]
    # --timeout 600: the held write must outlast whatever the test does meanwhile
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputopo", *argv, "--timeout", "600"],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return kernel, proc
