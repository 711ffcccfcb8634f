"""NVIDIA device nodes on a host where nothing made them: the nvidia driver makes none (a bind
leaves ``/dev/nvidiaN`` absent), and Proxmox refuses a ``devN`` whose node is missing
(pve-container LXC/Tools.pm get_device_mode_and_rdev). A split on a host made without ``/dev``
nodes used to stop the container, rebind, and only then fail at the ``devN`` step and roll back.
Now apply makes the nodes with ``nvidia-modprobe`` before anything stops, or refuses with
nothing stopped when it cannot; a GPU that comes back to nvidia gets its node before its
``devN``, and a node that cannot be made fails that step and rolls back. Judged by what runs
(``applysim.fingerprint``) and by what ran on the host, in order."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from gputopo.apply import Progress
from gputopo.errors import ApplyFailed, PreflightFailed
from gputopo.facts.discover import discover
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import init_spec
from gputopo.sim.host import SimHost
from gputopo.sim.hostcmd import SimHostCommands
from gputopo.sim.hostroot import materialize
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # applies on a simulated host, seconds each

NUMA1 = {"0000:81:00.0": 4, "0000:91:00.0": 5, "0000:e1:00.0": 6, "0000:f1:00.0": 7}


class Events(Progress):
    """Every step start and note, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def step_begin(self, index: int, total: int, action) -> None:
        self.events.append(f"step {action.kind}")

    def note(self, text: str) -> None:
        self.events.append(f"note {text}")


def _gpu_nodes(held: list[str]) -> list[str]:
    """The /dev/nvidiaN of ``held`` (not the control nodes), by minor."""
    return sorted((n for n in held if n.removeprefix("/dev/nvidia").isdigit()), key=lambda n: int(n[11:]))


def _drop_nvidia_nodes(root: Path) -> None:
    for p in (root / "dev").glob("nvidia*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()


@pytest.fixture(scope="module")
def bare_template():
    """A simulated host made from a root without any NVIDIA node (a snapshot taken before
    anything opened a GPU): container 101 has no devN yet, its service runs on no GPU."""
    base = Path(tempfile.mkdtemp(prefix="gputopo-bare-", dir=applysim.fast_tmp()))
    root = materialize("seed", base / "root")
    _drop_nvidia_nodes(root)
    SimHost.create(base / "sim", root=root)
    SimKernel(base / "sim/root").configure(time_scale=applysim.SCALE)
    yield base / "sim"
    applysim.cleanup(base)


@pytest.fixture
def bare(bare_template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-host-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(bare_template, base / "sim")
    yield h
    h.stop()
    applysim.cleanup(base)


def _split(h: SimHost):
    return parse_spec(applysim.restarting(init_spec(discover(str(h.paths.root)))))


def test_split_on_a_host_without_nodes_makes_them_before_anything_stops(bare):
    root = bare.paths.root
    ev = Events()
    res = apply(_split(bare), bare.ports(), root=str(root), progress=ev)
    assert res.status == "applied"
    first_step = next(i for i, e in enumerate(ev.events) if e.startswith("step "))
    made = [e for e in ev.events[:first_step] if e.startswith("note made /dev/")]
    assert "note made /dev/nvidiactl for CT 101 dev4 (nvidia-modprobe -c 255)" in made
    assert len(made) == 10  # the four NUMA-0 GPUs and the six control nodes, all before any step
    ran = SimHostCommands(bare.dir).ran()
    assert ["nvidia-modprobe", "-u", "-c", "0"] in ran
    fp = applysim.fingerprint(bare)
    assert fp["dev/nvidia"] == [
        "nvidia-caps",
        "nvidia-modeset",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia0",
        "nvidia1",
        "nvidia2",
        "nvidia3",
        "nvidiactl",
    ]
    # what runs: the container, its service on the four NUMA-0 GPUs it now sees
    assert fp["guests"]["lxc"]["101"] == "running"
    assert fp["service"][0] == "active"
    assert _gpu_nodes(fp["service"][2]) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]
    assert {"nvidiactl", "nvidia0", "nvidia3"} <= set(fp["ct:/dev"])


def test_without_nvidia_modprobe_the_split_is_refused_before_anything_stops(bare):
    SimHostCommands(bare.dir).uninstall("nvidia-modprobe")
    before = applysim.fingerprint(bare)
    with pytest.raises(PreflightFailed) as e:
        apply(_split(bare), bare.ports(), root=str(bare.paths.root))
    lines = e.value.problems
    assert any(
        line.startswith(
            "/dev/nvidiactl does not exist and 'nvidia-modprobe -c 255' did not make it (not found"
        )
        and "install nvidia-modprobe" in line
        for line in lines
    ), lines
    assert any(line.startswith("/dev/nvidia0 does not exist") for line in lines), lines
    assert applysim.fingerprint(bare) == before  # nothing stopped, nothing rebound


def _split_then_lose_numa1_nodes(h: SimHost):
    root = h.paths.root
    split = applysim.restarting(init_spec(discover(str(root))))
    assert apply(parse_spec(split), h.ports(), root=str(root)).status == "applied"
    for m in NUMA1.values():
        (root / f"dev/nvidia{m}").unlink()  # as after a reboot with no udev rule for them
    return parse_spec(applysim.reverse(split))


def test_gpus_back_on_nvidia_get_their_nodes_before_their_devn(host):
    back = _split_then_lose_numa1_nodes(host)
    ev = Events()
    res = apply(back, host.ports(), root=str(host.paths.root), progress=ev)
    assert res.status == "applied"
    config = ev.events.index("step update_container")
    last_rebind = max(i for i, e in enumerate(ev.events) if e == "step rebind")
    for m in NUMA1.values():
        made = next(
            i for i, e in enumerate(ev.events) if e.startswith(f"note made /dev/nvidia{m} for CT 101")
        )
        assert last_rebind < made and config < made  # inside the config step, before its PUT
        assert ["nvidia-modprobe", "-c", str(m)] in SimHostCommands(host.dir).ran()
    fp = applysim.fingerprint(host)
    assert [f"nvidia{m}" for m in range(8)] == [n for n in fp["dev/nvidia"] if n[6:].isdigit()]
    assert fp["service"][0] == "active"
    assert _gpu_nodes(fp["service"][2]) == [f"/dev/nvidia{m}" for m in range(8)]


def test_a_returning_gpus_node_that_cannot_be_made_fails_its_step_and_rolls_back(host):
    back = _split_then_lose_numa1_nodes(host)
    SimHostCommands(host.dir).uninstall("nvidia-modprobe")
    before = applysim.fingerprint(host)
    with pytest.raises(ApplyFailed) as e:
        apply(back, host.ports(), root=str(host.paths.root))
    assert e.value.rolled_back
    assert "/dev/nvidia4 does not exist and 'nvidia-modprobe -c 4' did not make it" in str(e.value)
    assert applysim.fingerprint(host) == before  # the GPUs are back on vfio-pci, VM and CT as they were


def _lose_every_node(h: SimHost) -> dict[str, object]:
    """The seed host with CT 101 running on its eight GPUs, then every /dev/nvidia* gone (as
    after a reboot with no udev rule: nothing made them again). Returns its fingerprint."""
    _drop_nvidia_nodes(h.paths.root)
    return applysim.fingerprint(h)


@pytest.mark.parametrize("fault", ["service", "switch"])
def test_a_rollback_after_the_container_stopped_can_start_it_with_its_old_devn(host, fault):
    """Every config an undo may restore has its nodes made before the stop window: CT 101's
    dev4..dev7 of the NUMA-1 GPUs too, not only the nodes of the planned dev0..dev3."""
    from gputopo.sim.container import break_container

    before = _lose_every_node(host)
    if fault == "service":  # the new service fails once the container runs again
        break_container(host.dir, 101, "service_fails", message="CUDA error", tp=4)
    else:  # a GPU's move to vfio-pci fails, the container stopped
        SimKernel(host.paths.root).inject("0000:f1:00.0", "bind", "errno", times=1)
    ev = Events()
    with pytest.raises(ApplyFailed) as e:
        apply(
            _split(host),
            host.ports(),
            root=str(host.paths.root),
            progress=ev,
            timeouts=applysim.FAST_TIMEOUTS,
        )
    SimKernel(host.paths.root).clear_faults()
    assert e.value.rolled_back and e.value.exit_code == 1, str(e.value)
    first_step = next(i for i, x in enumerate(ev.events) if x.startswith("step "))
    made = {x.split()[2] for x in ev.events[:first_step] if x.startswith("note made /dev/")}
    assert {f"/dev/nvidia{m}" for m in range(8)} <= made  # all before anything stopped
    after = applysim.fingerprint(host)
    # what runs is as before: CT 101 running, its service on its eight GPUs, its devN unchanged
    assert after["guests"]["lxc"]["101"] == "running"
    conf = f"pve:{host.paths.lxc_conf(101).relative_to(host.paths.pve)}"
    for k in ("service", conf, "ct:/dev"):
        assert after[k] == before[k], k
    assert _gpu_nodes(after["service"][2]) == [f"/dev/nvidia{m}" for m in range(8)]
    # what differs: the nodes made on the way (the host had none)
    assert [k for k in applysim.diff(before, after) if not k.startswith("dev/nvidia:")] == []


def test_with_modify_device_files_off_the_split_is_refused_naming_the_parameter(bare):
    """NVreg_ModifyDeviceFiles=0: nvidia-modprobe exits 1 without a word and makes nothing
    (nvidia-modprobe-utils.c mknod_helper); the refusal says why, nothing stopped."""
    params = bare.paths.root / "proc/driver/nvidia/params"
    params.write_text(params.read_text().replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0"))
    for cap in (bare.paths.root / "proc/driver/nvidia/capabilities").rglob("*"):
        if cap.is_file():  # each capability takes the module's value (nv-caps.c l.671)
            cap.write_text(cap.read_text().replace("DeviceFileModify: 1", "DeviceFileModify: 0"))
    before = applysim.fingerprint(bare)
    with pytest.raises(PreflightFailed) as e:
        apply(_split(bare), bare.ports(), root=str(bare.paths.root))
    (line,) = [p for p in e.value.problems if p.startswith("/dev/nvidia0 ")]
    assert line.startswith("/dev/nvidia0 does not exist and 'nvidia-modprobe -c 0' did not make it (exit 1; ")
    assert "ModifyDeviceFiles: 0" in line and "udev rules" in line
    after = applysim.fingerprint(bare)
    # nothing stopped or rebound; only nvidia-uvm's nodes were made (nvidia_uvm_mknod reads no params)
    assert applysim.diff(before, after) == ["dev/nvidia: [] -> ['nvidia-uvm', 'nvidia-uvm-tools']"]
