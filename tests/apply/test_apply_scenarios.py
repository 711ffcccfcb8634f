"""Apply and recover beyond the seed split, as an operator runs them on simulated hosts.

Each scenario ends either fully applied (verify all clear, a second apply plans nothing) or
refused / rolled back with the host unchanged (``applysim.fingerprint``): the esc8000a host
(GPU + HDMI audio in one IOMMU group), splits by address and by count, the reverse split, a
second container, a running VM whose mapping changes, a vLLM service, PVE 9, a GPU that falls
off the bus mid-switch, a holder of ``/dev/nvidiaN`` that appears after preflight, and an apply
interrupted by Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from gputopo.apply import Progress, Timeouts
from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.errors import ApplyFailed, PreflightFailed
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.container import Container, SimExec, write_unit
from gputopo.sim.files import PMXCFS_MODE
from gputopo.sim.host import SERVICE_COMMANDS, SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.apply import apply
from helpers import REPO, applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

FIXTURES = REPO / "fixtures" / "hosts"
T = applysim.FAST_TIMEOUTS
NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]


@pytest.fixture
def new_host(template):
    """Factory: a private copy of the seed host, or a new simulated host from ``source``."""
    made = []

    def make(source: str | Path | None = None, **kw) -> SimHost:
        base = Path(tempfile.mkdtemp(prefix="gputopo-scn-", dir=applysim.fast_tmp()))
        if source is None and not kw:
            h = applysim.copy_host(template, base / "sim")
        else:
            h = SimHost.create(base / "sim", source=str(source or "seed"), **kw)
            SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
        made.append((h, base))
        return h

    yield make
    for h, base in made:
        SimKernel(h.paths.root).clear_faults()
        h.stop()
        applysim.cleanup(base)


def _spec(text: str, replace: dict[str, str] | None = None):
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    return parse_spec(text)


def _converged(host, spec, unit: str = "sglang.service") -> None:
    """verify all clear and a second apply plans nothing."""
    from gputopo.usecases.verify import verify

    ports = host.ports()
    report = verify(spec, ports, root=str(host.paths.root))
    assert report.ok and {c.status for c in report.checks} <= {"PASS", "WARN"}, report.to_text()
    assert apply(spec, ports, root=str(host.paths.root), timeouts=T).status == "no-changes"


def _driver(host, address: str) -> str | None:
    link = host.paths.root / "sys/bus/pci/devices" / address / "driver"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


# --- esc8000a: the HDMI audio function shares the GPU's IOMMU group ---------------------------


def _esc_with_vfio(tmp: Path) -> Path:
    """The esc8000a host with the vfio modules loaded (the operator ran modprobe vfio-pci)."""
    text = (FIXTURES / "esc8000a.yaml").read_text()
    old = "modules: [nvidia,"
    assert old in text
    out = tmp / "esc8000a-vfio.yaml"
    out.write_text(text.replace(old, "modules: [vfio, vfio_pci, vfio_iommu_type1, nvidia,"))
    return out


def test_esc8000a_refuses_without_vfio_and_changes_nothing(new_host):
    host = new_host("esc8000a")
    spec = parse_spec(applysim.seed_spec_text(host))
    before = applysim.fingerprint(host)
    with pytest.raises(PreflightFailed) as e:
        apply(spec, host.ports(), root=str(host.paths.root), timeouts=T)
    assert e.value.exit_code == 2
    assert any("vfio-pci driver is not loaded" in p and "modprobe vfio-pci" in p for p in e.value.problems)
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_esc8000a_gpu_and_audio_move_together_and_back(new_host, tmp_path):
    host = new_host(_esc_with_vfio(tmp_path))
    root = host.paths.root
    text = applysim.seed_spec_text(host)
    before = applysim.fingerprint(host)
    spec = parse_spec(text)
    res = apply(spec, host.ports(), root=str(root), timeouts=T)
    assert res.status == "applied"
    for gpu in ("0000:c1:00.0", "0000:e1:00.0"):
        audio = gpu[:-1] + "1"
        assert _driver(host, gpu) == _driver(host, audio) == "vfio-pci"
        group = os.path.basename(os.readlink(root / "sys/bus/pci/devices" / gpu / "iommu_group"))
        assert (root / "dev/vfio" / group).exists()
    # the container's cards keep their audio on its own driver
    assert _driver(host, "0000:01:00.1") == "snd_hda_intel"
    _converged(host, spec)

    back = _spec(text, {"numa: [0]": "numa: [0, 1]", "numa: [1]": "rest"})
    assert apply(back, host.ports(), root=str(root), timeouts=T).status == "applied"
    for a in ("0000:c1:00.0", "0000:e1:00.0"):
        assert _driver(host, a) == "nvidia" and _driver(host, a[:-1] + "1") == "snd_hda_intel"
    assert not list((root / "dev/vfio").glob("[0-9]*"))
    _converged(host, back)
    # back where it started, but for the drop-in that now says --tp 4 explicitly, and the
    # container's devN lines of the GPUs that came back: nvidia gave each the lowest free minor
    # as it bound them (in parallel), not the one it had, and _converged checked each reaches its GPU
    conf = f"pve:{host.paths.lxc_conf(101).relative_to(host.paths.pve)}"
    changed = [c for c in applysim.diff(before, applysim.fingerprint(host)) if not c.startswith(f"{conf}:")]
    assert [c.split(":")[0] + ":" + c.split(":")[1] for c in changed] == [
        "ct:system/sglang.service.d/",
        "ct:system/sglang.service.d/gputopo.conf",
    ]


# --- splits by address and by count, a vLLM service -------------------------------------------


def test_split_by_addresses_with_a_running_vm_on_the_mapping(new_host):
    host = new_host("seed", model="Qwen3-30B-A3B-FP8")  # a model two GPUs hold
    ports = host.ports()
    root = str(host.paths.root)
    text = applysim.seed_spec_text(host)
    assert apply(parse_spec(text), ports, root=root, timeouts=T).status == "applied"
    ports.proxmox.guest_action("qemu", 201, "start", 30)
    # two more GPUs for the VM: VM 201 (using pro6000-vm) is stopped and started again
    spec = _spec(text, {"numa: [0]": 'addresses: ["0000:01:00.0", "0000:11:00.0"]', "numa: [1]": "rest"})
    res = apply(spec, ports, root=root, timeouts=T)
    kinds = [(a.kind, getattr(a, "vmid", None)) for a in res.plan.actions]
    assert ("stop_guest", 201) in kinds and ("start_guest", 201) in kinds
    stop_vm = kinds.index(("stop_guest", 201))
    assert stop_vm < min(i for i, (k, _) in enumerate(kinds) if k == "rebind")
    assert ports.proxmox.guest_status("qemu", 201) == "running"
    for a in ("0000:61:00.0", "0000:71:00.0", *NUMA1):
        assert _driver(host, a) == "vfio-pci"
    _converged(host, spec)


def test_running_vm_outside_the_plan_holding_a_moving_gpu_refuses(new_host):
    host = new_host()
    ports = host.ports()
    root = str(host.paths.root)
    text = applysim.seed_spec_text(host)
    assert apply(parse_spec(text), ports, root=root, timeouts=T).status == "applied"
    # VM 202 runs with GPU 91:00.0 by address; the spec names only VM 201 as its guest
    (host.paths.pve / "nodes/pve1/qemu-server/202.conf").write_text(
        "hostpci0: 0000:91:00.0,pcie=1\nmachine: q35\nmemory: 4096\nname: other\n"
    )
    state.set_guest_status(host.paths.run, "qemu", 202, "running")
    back = _spec(text, {"numa: [0]": "numa: [0, 1]", "numa: [1]": "rest", "guests: []": "guests: [201]"})
    before = applysim.fingerprint(host)
    with pytest.raises(PreflightFailed) as e:
        apply(back, ports, root=root, timeouts=T)
    assert [p for p in e.value.problems if p.startswith("VM 202 is running with 0000:91:00.0")]
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_split_by_count_with_vllm(new_host):
    host = new_host("seed", service="vllm", model="Qwen3-30B-A3B-FP8")  # a model two GPUs hold
    text = applysim.seed_spec_text(host).replace("unit: sglang.service", "unit: vllm.service")
    text = text.replace('tp_flag: "--tp"', 'tp_flag: "--tensor-parallel-size"')
    spec = _spec(text, {"numa: [0]": "count: 2", "numa: [1]": "rest"})
    res = apply(spec, host.ports(), root=str(host.paths.root), timeouts=T)
    assert res.status == "applied"
    show = (
        SimExec(host.dir).run(101, ["systemctl", "show", "-p", "ExecStart", "vllm.service"], timeout=5).stdout
    )
    assert "--tensor-parallel-size 2" in show and "--tp " not in show
    on_nvidia = [
        a
        for a in ("0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0", *NUMA1)
        if _driver(host, a) == "nvidia"
    ]
    assert len(on_nvidia) == 2
    _converged(host, spec, unit="vllm.service")


# --- a second container ------------------------------------------------------------------------


def _add_container(host, vmid: int) -> None:
    """A second container with the control nodes, no GPU and a vLLM unit that is not enabled."""
    conf = host.paths.lxc_conf(vmid)
    conf.write_text(
        "arch: amd64\ncores: 16\ndev0: /dev/nvidiactl,mode=0666\ndev1: /dev/nvidia-uvm,mode=0666\n"
        f"hostname: llm2\nmemory: 65536\nostype: ubuntu\nrootfs: local-lvm:vm-{vmid}-disk-0,size=100G\nswap: 0\n"
    )
    conf.chmod(PMXCFS_MODE)  # as every file under /etc/pve reads
    write_unit(
        host.dir,
        vmid,
        "vllm.service",
        "[Unit]\nDescription=vllm\n\n[Service]\nType=simple\nExecStart="
        + SERVICE_COMMANDS["vllm"].format(tp=1)
        + "\n\n[Install]\nWantedBy=multi-user.target\n",
        enable=False,
    )
    state.set_guest_status(host.paths.run, "lxc", vmid, "running")
    Container(host.dir, vmid).boot()


TWO_CONTAINERS = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {numa: [0]}
        service: {unit: sglang.service, tp_flag: "--tp"}
      - vmid: 102
        gpus: {numa: [1]}
        service: {unit: vllm.service, tp_flag: "--tensor-parallel-size"}
"""


def test_second_container_takes_half_and_both_serve(new_host):
    host = new_host()
    _add_container(host, 102)
    spec = parse_spec(TWO_CONTAINERS)
    res = apply(spec, host.ports(), root=str(host.paths.root), timeouts=T)
    assert res.status == "applied"
    sx = SimExec(host.dir)
    seen = sx.run(102, ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], timeout=5).stdout
    assert sorted(line.strip()[-12:].lower() for line in seen.splitlines()) == NUMA1
    assert sx.run(102, ["systemctl", "is-active", "vllm.service"], timeout=5).stdout.strip() == "active"
    _converged(host, spec)


def test_second_container_failing_to_serve_rolls_both_back(new_host):
    from gputopo.sim.container import break_container

    host = new_host()
    _add_container(host, 102)
    before = applysim.fingerprint(host)
    before_102 = host.paths.lxc_conf(102).read_text()
    break_container(host.dir, 102, "service_fails", message="torch.OutOfMemoryError")
    with pytest.raises(ApplyFailed) as e:
        apply(parse_spec(TWO_CONTAINERS), host.ports(), root=str(host.paths.root), timeouts=T)
    assert e.value.rolled_back and "CT 102" in str(e.value)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert host.paths.lxc_conf(102).read_text() == before_102
    assert state.guest_status(host.paths.run, "lxc", 102) == "running"


# --- PVE 9: devN of a running container are hot-plugged -------------------------------------


def test_pve9_split_reverse_and_rollback(new_host):
    host = new_host("seed", pve_version="9.1.2")
    assert host.ports().proxmox.version()["version"].startswith("9.")
    text = applysim.seed_spec_text(host)
    spec = parse_spec(text)
    before = applysim.fingerprint(host)
    # a failing start on PVE 9 rolls back to the byte, the container's devN included
    from gputopo.sim.container import break_container, heal_container

    break_container(host.dir, 101, "service_fails", message="CUDA error", tp=4)
    with pytest.raises(ApplyFailed):
        apply(spec, host.ports(), root=str(host.paths.root), timeouts=T)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    heal_container(host.dir, 101)
    assert apply(spec, host.ports(), root=str(host.paths.root), timeouts=T).status == "applied"
    _converged(host, spec)
    back = _spec(text, {"numa: [0]": "numa: [0, 1]", "numa: [1]": "rest"})
    assert apply(back, host.ports(), root=str(host.paths.root), timeouts=T).status == "applied"
    _converged(host, back)


# --- a GPU falls off the bus during the switch -------------------------------------------------


def test_gpu_falling_off_the_bus_is_named_for_a_human_and_the_rest_rolled_back(new_host, capsys):
    host = new_host()
    gone = "0000:91:00.0"
    before = applysim.fingerprint(host)
    conf = host.paths.lxc_conf(101)
    conf_before = conf.read_text().splitlines()
    SimKernel(host.paths.root).inject(gone, "unbind", "fall_off")
    with pytest.raises(ApplyFailed) as e:
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root), timeouts=T)
    err = e.value
    assert err.exit_code == 3 and err.needs_human == [gone], str(err)
    assert "\n" not in str(err) and f"needs a human: {gone}" in str(err)
    after = applysim.fingerprint(host)
    # every other GPU is back on nvidia with its override as before, the files and mappings too
    for a in ("0000:81:00.0", "0000:e1:00.0", "0000:f1:00.0"):
        assert after[f"pci:{a}"] == before[f"pci:{a}"]
    assert f"pci:{gone}" not in after
    for k in before:
        if k.startswith(("etc:", "pve:")) and k != "pve:nodes/pve1/lxc/101.conf":
            assert after.get(k) == before[k], k
    # CT 101's config never changed (the switch failed before its step); its bytes are compared
    # here: the fingerprint names a node by the GPU holding its minor, and the gone GPU holds none
    assert conf.read_text().splitlines() == conf_before
    assert not [k for k in after if k.startswith("etc:") and k not in before]
    journal = list_journals(host.paths.root)[-1]
    recs = parse_journal(journal.read_text())
    assert recs[-1].type == "needs-human" and recs[-1].needs_human == [gone]
    assert [r for r in recs if r.type == "undo-incomplete" and r.devices == [gone]]
    # no undo blamed the missing device with a raw errno: it was recognised as gone
    assert not [r for r in recs if r.type == "undo-failed" and "drivers_probe" in r.error]

    # while the device stays gone, recover keeps the journal open and names it (exit 3)
    from gputopo.cli import main

    with pytest.raises(SystemExit) as rec:
        main(["recover", "--sim", str(host.dir)])
    assert rec.value.code == 3
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gputopo: error:")]
    assert len(err_lines) == 1 and f"needs a human: {gone}" in err_lines[0] and str(journal) in err_lines[0]
    recs = parse_journal(journal.read_text())
    assert recs[-1].type == "needs-human" and recs[-1].needs_human == [gone]
    assert find_unfinished(host.paths.root).path == journal
    assert applysim.fingerprint(host) == after  # retrying changed nothing else
    # half of it is undone: finishing forward from there is refused, the journal untouched
    from gputopo.apply import recover
    from gputopo.errors import JournalError

    n = len(recs)
    with pytest.raises(JournalError, match="without --finish"):
        recover(host.ports(), root=str(host.paths.root), finish=True, timeouts=T)
    assert len(parse_journal(journal.read_text())) == n
    with pytest.raises(SystemExit) as refused:
        spec_file = host.dir / "spec.yaml"
        spec_file.write_text(applysim.seed_spec_text(host))
        main(["apply", "--sim", str(host.dir), "--spec", str(spec_file), "--yes", "--no-verify"])
    assert refused.value.code == 2


# --- a holder of /dev/nvidiaN outside the container -------------------------------------------


def _hold(host, pid: int, node: str) -> None:
    applysim.fake_process(
        host.paths.root,
        pid,
        node,
        argv=("python3", "bench.py"),
        cgroup="0::/user.slice/user-0.slice/session-3.scope",
    )


def test_holder_appearing_while_the_plan_is_read_is_refused_under_the_lock(new_host):
    host = new_host()
    before = applysim.fingerprint(host)

    def confirm(p):  # a benchmark starts on the host while the operator reads the plan
        _hold(host, 7777, "/dev/nvidia5")
        return True

    with pytest.raises(PreflightFailed) as e:
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root), confirm=confirm, timeouts=T)
    assert e.value.exit_code == 2
    assert e.value.problems == [
        "/dev/nvidia5 (GPU 0000:91:00.0) is held open by PID 7777 (python3 bench.py); stop it before apply"
    ]
    fp = applysim.fingerprint(host)
    assert applysim.diff(before, fp) == []
    assert list_journals(host.paths.root) == []


class _HoldAtSwitch(Progress):
    """Starts a holder of ``node`` the moment the first switch step begins."""

    def __init__(self, host, node: str):
        self.host, self.node, self.done = host, node, False

    def step_begin(self, index, total, action) -> None:
        if action.phase == "switch" and not self.done:
            self.done = True
            _hold(self.host, 7778, self.node)


def test_holder_appearing_after_preflight_times_out_naming_the_device(new_host):
    host = new_host()
    before = applysim.fingerprint(host)
    with pytest.raises(ApplyFailed) as e:
        apply(
            applysim.seed_spec(host),
            host.ports(),
            root=str(host.paths.root),
            progress=_HoldAtSwitch(host, "/dev/nvidia5"),
            timeouts=Timeouts(sysfs=0.5, guest=30, exec=10, service=20, poll=0.02),
        )
    err = e.value
    assert err.exit_code == 3 and err.needs_human == ["0000:91:00.0"]
    assert "device 0000:91:00.0 needs a human" in str(err) and "\n" not in str(err)
    after = applysim.fingerprint(host)
    for a in ("0000:81:00.0", "0000:e1:00.0", "0000:f1:00.0"):
        assert after[f"pci:{a}"] == before[f"pci:{a}"]
    assert (host.paths.root / "proc/7778").is_dir()  # the holder is still there


# --- interrupted: Ctrl-C and SIGTERM in the middle -------------------------------------------


class _InterruptAt(Progress):
    def __init__(self, phase: str):
        self.phase, self.fired = phase, False

    def step_end(self, index, total, action, status, seconds) -> None:
        if action.phase == self.phase and not self.fired:
            self.fired = True
            raise KeyboardInterrupt

    def note(self, text: str) -> None:  # the terminal is gone (a dropped ssh session)
        raise OSError(5, "Input/output error")


def test_ctrl_c_mid_apply_rolls_back_and_says_where_even_without_a_terminal(new_host):
    host = new_host()
    before = applysim.fingerprint(host)
    with pytest.raises(ApplyFailed) as e:
        apply(
            applysim.seed_spec(host),
            host.ports(),
            root=str(host.paths.root),
            progress=_InterruptAt("switch"),
            timeouts=T,
        )
    err = e.value
    assert err.rolled_back and err.exit_code == 130
    assert "interrupted" in str(err) and "rebind" in str(err) and "\n" not in str(err)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert find_unfinished(host.paths.root) is None


def _journal_has_begun(root: Path, phase: str) -> bool:
    for p in list_journals(root):
        try:
            recs = parse_journal(p.read_text())
        except Exception:
            continue
        if any(r.type == "begin" and r.action.phase == phase for r in recs):
            return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_mid_switch_through_the_cli_rolls_back(new_host, sig):
    """The apply is held in its switch phase by an unbind that blocks until the test releases it
    (no timing window): the signal arrives while a worker is inside a sysfs write, the rollback
    waits for that write to end and undoes everything."""
    host = new_host()
    host.ports()
    before = applysim.fingerprint(host)
    kernel, proc = applysim.held_apply(host)
    try:
        deadline = time.monotonic() + 120  # a bound on a broken test, not a measured window
        while time.monotonic() < deadline and proc.poll() is None:
            if _journal_has_begun(host.paths.root, "switch"):
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        kernel.release()
        out, err = proc.communicate(timeout=120)
    finally:
        kernel.release()
        if proc.poll() is None:
            proc.kill()
    SimKernel(host.paths.root).configure(time_scale=applysim.SCALE)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, (out, err)
    lines = [ln for ln in err.splitlines() if ln.startswith("gputopo: error:")]
    assert len(lines) == 1 and f"interrupted ({name})" in lines[0] and "rolled back" in lines[0], err
    assert find_unfinished(host.paths.root) is None
    host.stop()
    assert applysim.diff(before, applysim.fingerprint(host)) == [], out + err
