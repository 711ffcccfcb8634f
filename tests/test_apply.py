"""Apply on the simulated seed host: real HTTPS to the Proxmox simulator, simulated kernel and
container. The NUMA split applies, a second apply plans nothing, --dry-run changes nothing,
preflight refuses foreign holders and an API token, a second concurrent apply is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import applysim
from gputopo.apply import HostChanged, HostLock, PreflightFailed, apply, parse_cgroup_container, read_and_plan
from gputopo.errors import LockHeld
from gputopo.pvefmt import parse_dev_value, parse_lxc_conf, parse_pci_cfg
from gputopo.sim.container import SimExec

NUMA0 = {"0000:01:00.0": 0, "0000:11:00.0": 1, "0000:61:00.0": 3, "0000:71:00.0": 2}
NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]


@pytest.fixture(scope="session")
def template():
    d = applysim.make_template()
    yield d
    applysim.cleanup(d.parent)


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-apply-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    yield h
    h.stop()
    applysim.cleanup(base)


def test_parse_cgroup_container():
    assert parse_cgroup_container("0::/lxc/101/ns/system.slice/sglang.service\n") == 101
    assert parse_cgroup_container("4:devices:/lxc/205\n1:name=systemd:/lxc/205/init.scope\n") == 205
    assert parse_cgroup_container("0::/lxc.payload.300/system.slice\n") == 300
    assert parse_cgroup_container("0::/system.slice/nvidia-persistenced.service\n") is None
    assert parse_cgroup_container("") is None


def test_seed_split_applies_and_converges(host):
    ports = host.ports()
    spec = applysim.seed_spec(host)
    root = str(host.paths.root)
    res = apply(spec, ports, root=root)
    assert res.status == "applied"
    kinds = [s.text for s in res.steps]
    assert len(kinds) == len(res.plan.actions) and all(s.status == "done" for s in res.steps)
    assert res.stop_window_s is not None and 0 < res.stop_window_s < res.wall_s

    # NUMA 1 on vfio-pci with its group device, override kept
    for a in NUMA1:
        dev = host.paths.root / "sys/bus/pci/devices" / a
        assert os.path.basename(os.readlink(dev / "driver")) == "vfio-pci"
        assert (dev / "driver_override").read_text().strip() == "vfio-pci"
        group = os.path.basename(os.readlink(dev / "iommu_group"))
        assert (host.paths.root / "dev/vfio" / group).exists()
    for a in NUMA0:
        assert os.path.basename(os.readlink(host.paths.root / "sys/bus/pci/devices" / a / "driver")) == "nvidia"

    # container 101: exactly the NUMA-0 minors plus the control nodes
    conf = parse_lxc_conf(host.paths.lxc_conf(101).read_text())
    devs = sorted(parse_dev_value(v)["path"] for k, v in conf.options.items() if re.fullmatch(r"dev\d+", k))
    nv = sorted(d for d in devs if re.fullmatch(r"/dev/nvidia\d+", d))
    assert nv == sorted(f"/dev/nvidia{m}" for m in NUMA0.values())
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} <= set(devs)
    assert conf.pending.is_empty()

    # mappings per spec: pro6000 untouched, pro6000-vm with the NUMA-1 GPUs
    maps = {m.id: m for m in parse_pci_cfg((host.paths.pve / "mapping/pci.cfg").read_text())}
    assert sorted(e.path for e in maps["pro6000-vm"].entries()) == NUMA1

    # the drop-in with --tp 4 and the service active on it
    sx = SimExec(host.dir)
    dropin = host.paths.rootfs(101) / "etc/systemd/system/sglang.service.d/gputopo.conf"
    assert "--tp 4" in dropin.read_text()
    assert sx.run(101, ["systemctl", "is-active", "sglang.service"], 5).stdout.strip() == "active"
    show = sx.run(101, ["systemctl", "show", "-p", "ExecStart", "sglang.service"], 5).stdout
    assert "--tp 4 " in show

    # journal: header, begin/done per step, end applied
    from gputopo.journal import Journal, find_unfinished

    j = Journal.load(res.journal)
    assert j.result == "applied" and find_unfinished(root) is None
    assert len(j.header["actions"]) == len(res.plan.actions)
    assert all(s["status"] == "done" for s in j.steps().values())

    again = apply(spec, ports, root=root)
    assert again.status == "no-changes" and again.plan.is_empty


def test_dry_run_changes_nothing(host):
    ports = host.ports()
    before = applysim.fingerprint(host)
    tree = _hash_tree(host.dir)
    res = apply(applysim.seed_spec(host), ports, root=str(host.paths.root), dry_run=True)
    assert res.status == "dry-run" and res.plan.actions
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert _hash_tree(host.dir) == tree


def _hash_tree(d: Path) -> dict[str, str]:
    import hashlib

    out = {}
    for p in sorted(Path(d).rglob("*")):
        rel = str(p.relative_to(d))
        # the API server's runtime records (its URL, TLS) are the simulator's, not the host's
        if rel.startswith(("run/api.json", "run/tls", "run/endpoint")):
            continue
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_preflight_refuses_foreign_holder(host):
    proc = host.paths.root / "proc/4242"
    (proc / "fd").mkdir(parents=True)
    (proc / "comm").write_text("python3\n")
    (proc / "cmdline").write_bytes(b"python3\0train.py\0")
    (proc / "cgroup").write_text("0::/user.slice/user-0.slice/session-1.scope\n")
    os.symlink("/dev/nvidia4", proc / "fd/7")
    # a process inside CT 101 (stopped by the plan) is no obstacle
    inside = host.paths.root / "proc/5151"
    (inside / "fd").mkdir(parents=True)
    (inside / "comm").write_text("python3\n")
    (inside / "cgroup").write_text("0::/lxc/101/ns/system.slice/sglang.service\n")
    os.symlink("/dev/nvidia5", inside / "fd/3")
    before = applysim.fingerprint(host)
    with pytest.raises(PreflightFailed) as e:
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root))
    assert e.value.exit_code == 2
    assert e.value.problems == [
        "/dev/nvidia4 (GPU 0000:81:00.0) is held open by PID 4242 (python3 train.py); stop it before apply"
    ]
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_preflight_names_persistenced_with_the_fix(host):
    proc = host.paths.root / "proc/900"
    (proc / "fd").mkdir(parents=True)
    (proc / "comm").write_text("nvidia-persistenced\n")
    os.symlink("/dev/nvidiactl", proc / "fd/3")
    with pytest.raises(PreflightFailed) as e:
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root))
    (line,) = e.value.problems
    assert "nvidia-persistenced (PID 900)" in line and "systemctl stop nvidia-persistenced" in line


def test_preflight_refuses_api_token_for_devN(host):
    before = applysim.fingerprint(host)
    with pytest.raises(PreflightFailed) as e:
        apply(applysim.seed_spec(host), host.ports(auth="token"), root=str(host.paths.root))
    (line,) = e.value.problems
    assert "root@pam!gputopo" in line and "only root@pam" in line and "GPUTOPO_PVE_PASSWORD" in line
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_preflight_refuses_running_vm_outside_the_plan(host):
    from gputopo.sim import state

    spec = applysim.seed_spec(host)
    ports = host.ports()
    # VM 201 uses pro6000 (all eight GPUs) directly and runs; the spec lists no guests to stop
    conf = host.paths.pve / "nodes/pve1/qemu-server/202.conf"
    conf.write_text("hostpci0: 0000:91:00.0,pcie=1\nmemory: 4096\nname: other\n")
    state.set_guest_status(host.paths.run, "qemu", 202, "running")
    spec = spec.model_copy(deep=True)
    spec.nodes[0].vms.guests = [201]
    with pytest.raises(PreflightFailed) as e:
        apply(spec, ports, root=str(host.paths.root))
    assert any(line.startswith("VM 202 is running with 0000:91:00.0") for line in e.value.problems)


def test_confirm_declined_changes_nothing(host):
    from gputopo.apply import ApplyCancelled

    before = applysim.fingerprint(host)
    seen = []
    with pytest.raises(ApplyCancelled):
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root),
              confirm=lambda p: seen.append(p) or False)
    assert seen and seen[0].actions
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_host_changed_between_confirm_and_lock(host):
    ports = host.ports()
    spec = applysim.seed_spec(host)

    def confirm(p):
        # someone moves a GPU by hand while the operator reads the plan
        ports.sysfs.write("sys/bus/pci/devices/0000:81:00.0/driver_override", "vfio-pci")
        ports.sysfs.write("sys/bus/pci/drivers/nvidia/unbind", "0000:81:00.0")
        ports.sysfs.write("sys/bus/pci/drivers_probe", "0000:81:00.0")
        return True

    with pytest.raises(HostChanged) as e:
        apply(spec, ports, root=str(host.paths.root), confirm=confirm)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    from gputopo.journal import list_journals

    assert list_journals(host.paths.root) == []


def test_lock_refuses_second_holder_naming_it(tmp_path):
    a = HostLock(tmp_path).acquire()
    try:
        with pytest.raises(LockHeld) as e:
            HostLock(tmp_path).acquire()
        assert f"pid {os.getpid()}" in str(e.value) and e.value.exit_code == 4
    finally:
        a.release()
    HostLock(tmp_path).acquire().release()


def test_concurrent_apply_refused_naming_the_first(host):
    """Two real processes: the first is slowed in the stop window, the second is refused."""
    from gputopo.sim import state

    state.write_state(host.paths.run, "latencies", {"service.stop": 1.5})
    spec_file = host.dir / "spec.yaml"
    spec_file.write_text(applysim.seed_spec_text(host))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "gputopo", "apply", "--spec", str(spec_file), "--sim", str(host.dir), "--yes",
           "--no-verify"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lock = host.paths.root / "run/lock/gputopo.lock"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if lock.exists() and lock.read_text().startswith("pid"):
                break
            time.sleep(0.05)
        second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        assert second.returncode == 4, second.stderr
        assert f"pid {first.pid} " in second.stderr and "another apply holds" in second.stderr
    finally:
        out, _ = first.communicate(timeout=60)
    assert first.returncode == 0, out
