"""``gputopo watch`` on a simulated node that was split by its spec and then changed behind
gputopo's back in each of four ways: every change is read back from the node_exporter textfile
the command writes (parsed by prometheus_client's own parser, checked by promtool), the host is
left as it was, and an apply holding the lock is reported as such instead of as drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputopo.apply.lock import HostLock
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.readplan import read_for_checks
from gputopo.watch import QUICK_CHECKS, watch_once
from gputopo.watch.run import DRIFT_AREAS, SPEC_AREA
from helpers import promtool
from helpers.applysim import cleanup, copy_host, fast_tmp, fingerprint, seed_spec_text, template  # noqa: F401
from helpers.cli import one_line, run

pytestmark = pytest.mark.slow

CT = 101
CT_GPU = "0000:11:00.0"  # one of the container's four (NUMA node 0)
VM_GPU = "0000:81:00.0"  # one of the VM mapping's four (NUMA node 1)
VM_MAPPING = "pro6000-vm"


@pytest.fixture(scope="module")
def split(template, tmp_path_factory):
    """The seed host after 'gputopo apply' of its NUMA split (the container keeps NUMA node 0's
    GPUs, the VM mapping gets node 1's), and the spec file it was applied from."""
    d = tmp_path_factory.mktemp("watch")
    host = copy_host(template, d / "sim")
    spec = d / "spec.yaml"
    spec.write_text(seed_spec_text(host))
    try:
        code = subprocess.run(
            [sys.executable, "-m", "gputopo", "apply", "--sim", str(host.dir), "--spec", str(spec), "--yes"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=d,  # the installed gputopo, not a checkout's in the working directory
        )
        assert code.returncode == 0, code.stderr
    finally:
        host.stop()
    return host.dir, spec


@pytest.fixture
def node(split, tmp_path):
    """A private copy of the split host, its spec and a textfile directory."""
    src, spec = split
    host = copy_host(src, tmp_path / "sim")
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()
    yield host, spec, textfiles
    host.stop()


def watch(capsys, host: SimHost, spec: Path, textfiles: Path, *more: str) -> tuple[int, str, str]:
    argv = ["watch", "--sim", str(host.dir), "--spec", str(spec), "--format", "prometheus"]
    return run(capsys, *argv, "--textfile-dir", str(textfiles), *more)


def metrics(textfiles: Path) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted labels: value} of the textfile, read by prometheus_client's parser."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families((textfiles / "gputopo.prom").read_text()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by(m: dict, name: str, label: str) -> dict[str, float]:
    """The series of ``name`` keyed by the value of its ``label``."""
    return {dict(labels)[label]: v for labels, v in m.get(name, {}).items()}


def drifted(m: dict) -> set[str]:
    return {a for a, v in by(m, "gputopo_drift", "area").items() if v == 1}


def promtool_passes(textfiles: Path) -> None:
    got = promtool.check_metrics((textfiles / "gputopo.prom").read_text())
    assert got.returncode == 0, got.stdout + got.stderr


def test_a_clean_node_shows_no_drift_every_check_passing_and_each_gpus_owner(capsys, node):
    host, spec, textfiles = node
    code, out, err = watch(capsys, host, spec, textfiles)
    assert (code, out, err) == (0, "", "")
    m = metrics(textfiles)
    assert by(m, "gputopo_drift", "area") == {a: 0 for a in (SPEC_AREA, *DRIFT_AREAS)}
    assert by(m, "gputopo_check", "check") == {c: 1 for c in (*QUICK_CHECKS, "capacity")}
    owners = {dict(k)["address"]: dict(k)["owner"] for k in m["gputopo_gpu_owner"]}
    assert owners[CT_GPU] == f"container:{CT}" and owners[VM_GPU].startswith("vm:")
    assert sum(1 for o in owners.values() if o == f"container:{CT}") == 4
    assert m["gputopo_gpus"][()] == 8
    assert m["gputopo_watch_up"][()] == 1 and m["gputopo_apply_in_progress"][()] == 0
    assert by(m, "gputopo_last_apply_outcome", "outcome")["applied"] == 1
    assert sum(by(m, "gputopo_last_apply_outcome", "outcome").values()) == 1
    assert m["gputopo_last_apply_timestamp_seconds"][()] <= m["gputopo_watch_last_run_timestamp_seconds"][()]
    assert sorted(p.name for p in textfiles.iterdir()) == ["gputopo.prom"]  # no temporary file left
    promtool_passes(textfiles)


def _lose_binding(host: SimHost) -> None:
    """What a reboot does to a GPU whose persistence did not hold: driver_override lives in
    memory only (drivers/pci/pci-sysfs.c, driver_override_store), so after the boot the GPU is
    probed like any other and nvidia takes it."""
    k = SimKernel(host.paths.root)
    k.write("sys/bus/pci/drivers/vfio-pci/unbind", VM_GPU)
    k.write(f"sys/bus/pci/devices/{VM_GPU}/driver_override", "\n")
    k.write("sys/bus/pci/drivers_probe", VM_GPU)


def _edit_mapping(host: SimHost) -> None:
    """An operator edits /etc/pve/mapping/pci.cfg by hand: the VM mapping loses one GPU."""
    cfg = host.paths.pve / "mapping" / "pci.cfg"
    lines, section = [], None
    for line in cfg.read_text().splitlines(keepends=True):
        if line.strip() and not line[0].isspace():
            section = line.strip()
        if section == VM_MAPPING and f"path={VM_GPU}," in line:
            continue
        lines.append(line)
    assert len(lines) < len(cfg.read_text().splitlines(keepends=True))
    cfg.write_text("".join(lines))


def _restart_with_fewer_gpus(host: SimHost) -> None:
    """'pct set 101 --delete dev3' and a restart, through the API: the container starts with
    three of its four GPUs."""
    ports = host.ports()
    try:
        config = ports.proxmox.lxc_config(CT)
        dev = next(k for k, v in config.items() if k.startswith("dev") and str(v).startswith("/dev/nvidia3"))
        ports.proxmox.lxc_update(CT, {}, [dev], config["digest"])
        ports.proxmox.guest_action("lxc", CT, "shutdown", 60)
        ports.proxmox.guest_action("lxc", CT, "start", 60)
    finally:
        ports.close()


def _fall_off(host: SimHost) -> None:
    """One of the container's GPUs falls off the bus (surprise removal)."""
    SimKernel(host.paths.root).fall_off(CT_GPU)


@pytest.mark.parametrize(
    "change, areas, failing",
    [
        (_lose_binding, {"driver_bindings"}, {"converged", "vm"}),
        (_edit_mapping, {"mappings"}, {"converged"}),
        (_restart_with_fewer_gpus, {"container_devices", "guests_and_services"}, {"converged", "container"}),
        (_fall_off, {SPEC_AREA}, {"converged"}),
    ],
    ids=["binding-lost", "mapping-edited", "container-fewer-gpus", "gpu-off-the-bus"],
)
def test_each_drift_is_read_from_the_textfile(capsys, node, change, areas, failing):
    host, spec, textfiles = node
    change(host)
    before = fingerprint(host)
    code, _, err = watch(capsys, host, spec, textfiles)
    assert (code, err) == (0, "")
    assert fingerprint(host) == before  # a watch changes nothing
    m = metrics(textfiles)
    assert drifted(m) == areas
    checks = by(m, "gputopo_check", "check")
    assert failing <= {c for c, v in checks.items() if v == 0}
    assert m["gputopo_watch_up"][()] == 1 and m["gputopo_apply_in_progress"][()] == 0
    promtool_passes(textfiles)


def test_a_gpu_off_the_bus_leaves_the_owner_series_and_the_count(capsys, node):
    host, spec, textfiles = node
    _fall_off(host)
    assert watch(capsys, host, spec, textfiles)[0] == 0
    m = metrics(textfiles)
    assert CT_GPU not in by(m, "gputopo_gpu_owner", "address")
    assert m["gputopo_gpus"][()] == 7
    # the diff's areas cannot be read while the spec cannot be planned: no series, not 0
    assert set(by(m, "gputopo_drift", "area")) == {SPEC_AREA}


def test_a_lost_binding_shows_the_gpu_free_and_the_text_names_it(capsys, node):
    host, spec, textfiles = node
    _lose_binding(host)
    assert watch(capsys, host, spec, textfiles)[0] == 0
    assert by(metrics(textfiles), "gputopo_gpu_owner", "address")[VM_GPU] == 1
    assert {
        dict(k)["owner"] for k in metrics(textfiles)["gputopo_gpu_owner"] if dict(k)["address"] == VM_GPU
    } == {"free"}
    code, out, _ = run(capsys, "watch", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 0
    assert "drift in driver_bindings" in out.splitlines()[0]
    assert f"driver_bindings: {VM_GPU}: nvidia -> vfio-pci" in out


def test_an_apply_holding_the_lock_is_reported_not_its_drift(capsys, node):
    host, spec, textfiles = node
    _lose_binding(host)  # what a half-done apply looks like from outside
    with HostLock(host.paths.root):
        code, _, err = watch(capsys, host, spec, textfiles)
    assert (code, err) == (0, "")
    m = metrics(textfiles)
    assert m["gputopo_apply_in_progress"][()] == 1 and m["gputopo_watch_up"][()] == 1
    assert "gputopo_drift" not in m and "gputopo_check" not in m and "gputopo_gpu_owner" not in m
    promtool_passes(textfiles)
    # the lock released, the next pass reads the drift
    assert watch(capsys, host, spec, textfiles)[0] == 0
    assert drifted(metrics(textfiles)) == {"driver_bindings"}


def test_an_apply_beginning_during_the_pass_turns_it_into_in_progress(node):
    host, spec, _ = node
    ports = host.ports()
    lock = HostLock(host.paths.root)
    real_run = ports.exec.run

    def run_then_lock(*args, **kwargs):
        if lock.fd is None:
            lock.acquire()  # an apply starts while the pass reads the container
        return real_run(*args, **kwargs)

    ports.exec.run = run_then_lock
    try:
        result = watch_once(spec, ports, root=host.paths.root, read=read_for_checks)
    finally:
        lock.release()
        ports.close()
    assert lock.fd is None and result.apply_in_progress
    assert result.drift == {} and result.checks == {} and result.up


def test_a_missing_spec_writes_watch_up_0_and_exits_2(capsys, node, tmp_path):
    host, _, textfiles = node
    missing = tmp_path / "nope.yaml"
    code, out, err = watch(capsys, host, missing, textfiles)
    assert code == 2 and out == ""
    assert str(missing) in one_line(err)
    m = metrics(textfiles)
    assert m["gputopo_watch_up"][()] == 0 and "gputopo_drift" not in m
    promtool_passes(textfiles)


def test_bad_output_options_exit_2_naming_them_and_write_nothing(capsys, node, tmp_path):
    host, spec, textfiles = node
    gone = tmp_path / "no-such-dir"
    code, _, err = watch(capsys, host, spec, gone)
    assert code == 2 and str(gone) in one_line(err)
    assert not gone.exists()
    code, _, err = run(
        capsys, "watch", "--sim", str(host.dir), "--spec", str(spec), "--textfile-dir", str(textfiles)
    )
    assert code == 2 and "--format prometheus" in one_line(err)
    code, _, err = run(capsys, "watch", "--sim", str(host.dir), "--spec", str(spec), "--interval", "5")
    assert code == 2 and "--interval applies to --follow only" in one_line(err)
    assert list(textfiles.iterdir()) == []


def test_follow_on_a_simulated_host_says_it_has_no_udev_and_passes_every_interval(node):
    """The real command, stopped by SIGTERM as systemd stops it: one line on stderr about udev,
    a textfile rewritten by later passes (a drift made while it runs shows up), exit 0."""
    import signal
    import time

    host, spec, textfiles = node
    argv = [sys.executable, "-m", "gputopo", "watch", "--follow", "--interval", "0.2"]
    argv += [
        "--sim",
        str(host.dir),
        "--spec",
        str(spec),
        "--format",
        "prometheus",
        "--textfile-dir",
        str(textfiles),
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=textfiles.parent
    )
    try:
        # waits for what the process writes, bounded; nothing here measures time
        deadline = time.monotonic() + 60
        while not (textfiles / "gputopo.prom").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drifted(metrics(textfiles)) == set()
        _lose_binding(host)
        while drifted(metrics(textfiles)) != {"driver_bindings"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drifted(metrics(textfiles)) == {"driver_bindings"}
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == ""
    warning, *passes = err.splitlines()
    assert warning.startswith("gputopo: warning: ") and "udev" in warning and "every 0.2 s" in warning
    # one line per pass for the service's journal: why it ran and what it found
    assert passes[0] == "gputopo watch: pass after start: no drift; quick checks pass"
    assert all(p.startswith("gputopo watch: pass after interval: ") for p in passes[1:]), passes
    assert any("drift in driver_bindings" in p for p in passes[1:]), passes
