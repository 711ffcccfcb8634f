"""The NVIDIA device nodes of a simulated host: the driver makes none (a bind leaves
``dev/nvidiaN`` absent, an unbind leaves it behind), ``nvidia-modprobe`` makes each one as its
options say (NVIDIA/nvidia-modprobe ``nvidia-modprobe.c``), and the first ``nvidia-smi`` makes
the control node and those of the GPUs on nvidia."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gputopo.errors import HostCommandError
from gputopo.ports import ExecResult
from gputopo.sim.hostcmd import SimHostCommands
from gputopo.sim.hostroot import materialize
from gputopo.sim.kernel import SimKernel


@pytest.fixture(scope="module")
def seed_root(tmp_path_factory) -> Path:
    return materialize("seed", tmp_path_factory.mktemp("seed") / "root")


@pytest.fixture
def sim(seed_root: Path, tmp_path: Path) -> Path:
    """A host directory (``root/`` and ``run/``) whose root has no NVIDIA node at all."""
    shutil.copytree(seed_root, tmp_path / "root", symlinks=True)
    for p in (tmp_path / "root/dev").glob("nvidia*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    (tmp_path / "run").mkdir()
    return tmp_path


def nodes(sim: Path) -> list[str]:
    dev = sim / "root/dev"
    return sorted(str(p.relative_to(dev)) for p in dev.rglob("nvidia*") if p.is_file())


def test_each_option_makes_its_node_and_nothing_else(sim: Path) -> None:
    cmd = SimHostCommands(sim)
    assert cmd.run(["nvidia-modprobe", "-c", "4"], 5).rc == 0
    assert nodes(sim) == ["nvidia4"]
    assert cmd.run(["nvidia-modprobe", "-c", "255"], 5).rc == 0  # NV_CTL_DEVICE_NUM
    assert nodes(sim) == ["nvidia4", "nvidiactl"]
    assert cmd.run(["nvidia-modprobe", "-u", "-c", "0"], 5).rc == 0  # nvidia_uvm_mknod: N and N + 1
    assert nodes(sim) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia4", "nvidiactl"]
    assert cmd.run(["nvidia-modprobe", "-m"], 5).rc == 0
    assert cmd.run(["nvidia-modprobe", "-f", "/proc/driver/nvidia/capabilities/mig/monitor"], 5).rc == 0
    assert nodes(sim) == [
        "nvidia-caps/nvidia-cap2",
        "nvidia-modeset",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia4",
        "nvidiactl",
    ]
    recorded = json.loads((sim / "root/dev/.devices.json").read_text())
    assert recorded["nvidiactl"] == ["c", 195, 255] and recorded["nvidia4"] == ["c", 195, 4]
    assert recorded["nvidia-uvm-tools"][2] == 1
    assert cmd.ran()[0] == ["nvidia-modprobe", "-c", "4"]


def test_a_capability_outside_the_drivers_proc_tree_or_without_nvidia_fails_silently(sim: Path) -> None:
    cmd = SimHostCommands(sim)
    assert cmd.run(["nvidia-modprobe", "-f", "/etc/passwd"], 5).rc == 1
    shutil.rmtree(sim / "root/sys/bus/pci/drivers/nvidia")  # the module is not loaded here
    res = cmd.run(["nvidia-modprobe", "-c", "0"], 5)
    assert (res.rc, res.stdout, res.stderr) == (1, "", "")
    assert nodes(sim) == []


def test_an_uninstalled_command_is_not_found(sim: Path) -> None:
    cmd = SimHostCommands(sim)
    cmd.uninstall("nvidia-modprobe")
    with pytest.raises(HostCommandError, match="not found"):
        cmd.run(["nvidia-modprobe", "-c", "0"], 5)
    assert nodes(sim) == []


def test_first_nvidia_smi_makes_the_nodes_of_the_gpus_on_nvidia(sim: Path) -> None:
    kern = SimKernel(sim / "root", time_scale=0.0)
    kern.write("sys/bus/pci/drivers/nvidia/unbind", "0000:81:00.0")  # minor 4 leaves nvidia
    assert SimHostCommands(sim).run(["nvidia-smi"], 5).rc == 0
    assert nodes(sim) == sorted(["nvidiactl"] + [f"nvidia{m}" for m in (0, 1, 2, 3, 5, 6, 7)])


def test_bind_makes_no_node_and_unbind_leaves_it(sim: Path) -> None:
    kern = SimKernel(sim / "root", time_scale=0.0)
    kern.write("sys/bus/pci/drivers/nvidia/unbind", "0000:81:00.0")
    kern.write("sys/bus/pci/drivers/nvidia/bind", "0000:81:00.0")
    assert nodes(sim) == []
    SimHostCommands(sim).run(["nvidia-modprobe", "-c", "4"], 5)
    kern.write("sys/bus/pci/drivers/nvidia/unbind", "0000:81:00.0")
    assert nodes(sim) == ["nvidia4"]


def test_dynamic_majors_come_from_proc_devices(sim: Path) -> None:
    """nvidia-uvm and nvidia-caps get dynamic majors (alloc_chrdev_region); nvidia-modprobe
    reads them from /proc/devices (nvidia_get_chardev_major) and fails silently without them."""
    from gputopo.sim.kernel.nvidia import chardev_major

    devices = (sim / "root/proc/devices").read_text()
    uvm, caps = chardev_major(devices, "nvidia-uvm"), chardev_major(devices, "nvidia-caps")
    assert chardev_major(devices, "nvidia") == 195 and uvm is not None and caps is not None
    assert len({uvm, caps, 195}) == 3
    cmd = SimHostCommands(sim)
    assert cmd.run(["nvidia-modprobe", "-u", "-c", "0"], 5).rc == 0
    assert cmd.run(["nvidia-modprobe", "-f", "/proc/driver/nvidia/capabilities/mig/config"], 5).rc == 0
    recorded = json.loads((sim / "root/dev/.devices.json").read_text())
    assert recorded["nvidia-uvm"] == ["c", uvm, 0] and recorded["nvidia-caps/nvidia-cap1"] == ["c", caps, 1]
    # a host whose /proc/devices has no nvidia-uvm (the module not loaded): exit 1, no word
    (sim / "root/proc/devices").write_text(devices.replace(f"{uvm} nvidia-uvm\n", ""))
    (sim / "root/dev/nvidia-uvm").unlink()
    assert cmd.run(["nvidia-modprobe", "-u", "-c", "0"], 5) == ExecResult(1, "", "")
    assert not (sim / "root/dev/nvidia-uvm").exists()


def test_with_modify_device_files_off_nvidia_modprobe_makes_nothing_and_exits_1_silently(sim: Path) -> None:
    """NVreg_ModifyDeviceFiles=0: mknod_helper (nvidia-modprobe-utils.c) makes no node and
    succeeds only for one that is already there."""
    params = sim / "root/proc/driver/nvidia/params"
    params.write_text(params.read_text().replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0"))
    cmd = SimHostCommands(sim)
    assert cmd.run(["nvidia-modprobe", "-c", "4"], 5) == ExecResult(1, "", "")
    assert cmd.run(["nvidia-modprobe", "-c", "255"], 5) == ExecResult(1, "", "")
    assert cmd.run(["nvidia-modprobe", "-m"], 5) == ExecResult(1, "", "")
    assert cmd.run(["nvidia-smi"], 5).rc == 0  # NVML goes on without the nodes it may not make
    assert nodes(sim) == []
    (sim / "root/dev/nvidia4").touch()  # made by the distribution's udev rules
    assert cmd.run(["nvidia-modprobe", "-c", "4"], 5).rc == 0
    # nvidia-uvm is made without the driver's params (nvidia_uvm_mknod passes no proc file)
    assert cmd.run(["nvidia-modprobe", "-u", "-c", "0"], 5).rc == 0
    assert nodes(sim) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia4"]
