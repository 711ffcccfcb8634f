"""The simulated kernel: every shared kernel scenario, then the nvidia and fault behaviour only
the simulator has (real-kernel replays of the shared scenarios live in tests/e2e)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gputopo.errors import SysfsWriteError
from gputopo.sim.hostroot import load_host, materialize
from gputopo.sim.kernel import SimKernel
from gputopo.sim.kernel.nvidia import nvidia_information, parse_minor
from gputopo.sim.kernel.parse import parse_id_fields, parse_override
from helpers import kernel_scenarios as ks
from helpers.simkernel import (
    ADA,
    ADA2,
    ADA_AUDIO,
    DUMMY,
    PRO,
    PSP,
    SPARE,
    build_root,
    kern,  # noqa: F401 (fixtures)
    overlap_all,
    root,  # noqa: F401 (fixtures)
    root_port,
)


def backend(k: SimKernel) -> ks.KernelBackend:
    return ks.KernelBackend(
        port=k,
        root=k.root,
        gpu=ADA,
        gpu_driver="nvidia",
        gpu_companion=ADA_AUDIO,
        companion_driver="snd_hda_intel",
        other_gpu=ADA2,
        unbound_device=DUMMY,
    )


def driver(root: Path | str, addr: str) -> str | None:
    try:
        return os.path.basename(os.readlink(Path(root) / f"sys/bus/pci/devices/{addr}/driver"))
    except OSError:
        return None


def err_of(k: SimKernel, path: str, value: str) -> int:
    with pytest.raises(SysfsWriteError) as e:
        k.write(path, value)
    assert "\n" not in str(e.value)
    return e.value.errno


# --- the shared scenarios --------------------------------------------------------------------


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> SimKernel:
    """One simulated machine for all shared scenarios, as on a real kernel: each scenario
    leaves the devices as it found them."""
    return SimKernel(build_root(tmp_path_factory.mktemp("machine")), time_scale=0.0)


@pytest.mark.parametrize("scenario", ks.SCENARIOS, ids=lambda f: f.__name__.removeprefix("scenario_"))
def test_shared_scenario(machine: SimKernel, scenario) -> None:
    scenario(backend(machine))
    assert [driver(machine.root, a) for a in (ADA, ADA_AUDIO, ADA2)] == ["nvidia", "snd_hda_intel", "nvidia"]


def test_conformance_sequence(kern: SimKernel) -> None:
    steps = ks.run_conformance(backend(kern))
    got = {name: (s["result"], s["gpu.driver"], s["gpu.override"]) for name, s in steps}
    assert [n for n, _ in steps] == ["start"] + [n for n, _ in ks.CONFORMANCE_STEPS]
    assert got["override"] == ("ok", "<gpu-native>", "vfio-pci")
    assert got["bind-native-despite-override"] == ("ENODEV", None, "vfio-pci")
    assert got["probe"] == ("ok", "vfio-pci", "vfio-pci")
    assert got["bind-while-bound"][0] == "EBUSY"
    assert got["clear"] == ("ok", None, "(null)")
    assert got["unbind-unbound"][0] == "ENODEV"
    assert got["unbind-unbound-via-driver-link"][0] == "ENOENT"
    assert got["bind-not-loaded-driver"][0] == "ENOENT"
    assert got["bind-nonexistent-address"][0] == "ENODEV"
    assert got["override-nonexistent-address"][0] == "ENOENT"
    assert dict(steps)["probe"]["gpu.group_node"] is True
    assert dict(steps)["clear"]["gpu.group_node"] is False
    assert driver(kern.root, ADA) == "nvidia"


def test_shared_scenarios_on_the_shipped_esc8000a_fixture(tmp_path: Path) -> None:
    spec = load_host("esc8000a")
    spec.modules.append("vfio_pci")  # the scenarios need vfio-pci loaded; the capture has not
    r = materialize(spec, tmp_path / "root")
    k = SimKernel(r, time_scale=0.0)
    gpus = sorted(
        a for a in os.listdir(r / "sys/bus/pci/devices") if driver(r, a) == "nvidia" and a.endswith(".0")
    )
    b = ks.KernelBackend(
        port=k,
        root=str(r),
        gpu=gpus[0],
        gpu_driver="nvidia",
        gpu_companion=gpus[0][:-1] + "1",
        companion_driver="snd_hda_intel",
        other_gpu=gpus[1],
    )
    for scenario in ks.SCENARIOS:
        scenario(b)


def test_without_vfio_pci_loaded_nothing_binds_it(fresh_host) -> None:
    r = fresh_host("esc8000a")
    k = SimKernel(r, time_scale=0.0)
    gpu = sorted(a for a in os.listdir(r / "sys/bus/pci/devices") if driver(r, a) == "nvidia")[0]
    assert err_of(k, "sys/bus/pci/drivers/vfio-pci/bind", gpu) == errno.ENOENT
    k.write(f"sys/bus/pci/devices/{gpu}/driver_override", "vfio-pci")
    k.write("sys/bus/pci/drivers/nvidia/unbind", gpu)
    k.write("sys/bus/pci/drivers_probe", gpu)  # success, and the GPU is left on no driver
    assert driver(r, gpu) is None


SEED_MINORS = {"01": 0, "11": 1, "61": 3, "71": 2, "81": 4, "91": 5, "e1": 7, "f1": 6}


def test_gpus_back_on_nvidia_get_the_lowest_free_minors_not_their_old_ones(fresh_host) -> None:
    """nv_linux_assign_minor_locked (open-gpu-kernel-modules kernel-open/nvidia/nv.c l.5629):
    find_first_zero_bit at each probe, the bit cleared at remove: no memory of the old minor."""
    r = fresh_host("seed")
    k = SimKernel(r, time_scale=0.0)
    b = ks.KernelBackend(
        port=k,
        root=str(r),
        gpu="0000:81:00.0",
        gpu_driver="nvidia",
        gpu_companion="0000:81:00.0",
        companion_driver="nvidia",
        other_gpu="0000:91:00.0",
    )

    def minor(bus: str) -> int | None:
        info = r / f"proc/driver/nvidia/gpus/0000:{bus}:00.0/information"
        return parse_minor(info.read_text()) if info.exists() else None

    assert {bus: minor(bus) for bus in SEED_MINORS} == SEED_MINORS
    vm = ["81", "91", "e1", "f1"]
    threads = [threading.Thread(target=ks.to_vfio, args=(b, f"0000:{bus}:00.0")) for bus in vm]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [driver(r, f"0000:{bus}:00.0") for bus in vm] == ["vfio-pci"] * 4
    # the driver made none of the nodes, so unbinding removes none (nv.c: cdev only): the four
    # stale nodes stay, each to be taken by whichever GPU gets its minor next
    assert sorted(p.name for p in (r / "dev").glob("nvidia[0-9]*")) == [f"nvidia{m}" for m in range(8)]
    for bus in vm:  # bus order: e1 had 7 and f1 6, each now gets the lowest free one
        ks.to_native(b, f"0000:{bus}:00.0", "nvidia")
    assert {bus: minor(bus) for bus in vm} == {"81": 4, "91": 5, "e1": 6, "f1": 7}
    for bus in vm:
        ks.to_vfio(b, f"0000:{bus}:00.0")
    for bus in sorted(vm, key=lambda bus: SEED_MINORS[bus]):  # in the order of the old minors
        ks.to_native(b, f"0000:{bus}:00.0", "nvidia")
    assert {bus: minor(bus) for bus in SEED_MINORS} == SEED_MINORS


# --- parsing -----------------------------------------------------------------------------------


def test_parsers() -> None:
    assert parse_id_fields("10de 2bb5", 7) == [0x10DE, 0x2BB5]
    assert parse_id_fields("0x10de 2bb5 ffffffff ffffffff 030000 ff0000 0", 7)[4] == 0x030000
    assert parse_id_fields("10de zz 1", 7) == [0x10DE]
    assert parse_override("(null)\n") is None
    assert parse_override("vfio-pci\n") == "vfio-pci"
    text = nvidia_information("0000:01:00.0", 3, "NVIDIA RTX PRO 6000 Blackwell Server Edition", "GPU-x")
    assert "Device Minor: \t 3\n" in text and "Bus Location: \t 0000:01:00.0\n" in text
    assert parse_minor(text) == 3
    assert parse_minor("Model: \t\t X\n") is None


# --- nvidia side effects -----------------------------------------------------------------------


def test_nvidia_unbind_and_bind_remove_and_restore_proc_not_dev(kern: SimKernel, root: Path) -> None:
    # nvidia registers a character device region and makes no node (open-gpu-kernel-modules
    # nv.c nv_register_chrdev): the node udev or nvidia-modprobe made stays through an unbind,
    # and a bind makes none
    a = PRO[1]
    info = root / f"proc/driver/nvidia/gpus/{a}/information"
    before = info.read_text()
    kern.write("sys/bus/pci/drivers/nvidia/unbind", a)
    assert not info.exists() and (root / "dev/nvidia1").exists()
    (root / "dev/nvidia1").unlink()
    kern.write("sys/bus/pci/drivers/nvidia/bind", a)
    assert info.read_text() == before
    assert not (root / "dev/nvidia1").exists()


def test_a_taken_minor_is_not_reused(kern: SimKernel, root: Path) -> None:
    kern.write("sys/bus/pci/drivers/nvidia/unbind", PRO[0])  # frees minor 0
    kern.write("sys/bus/pci/drivers_probe", SPARE)  # matched by nvidia's id table
    assert driver(root, SPARE) == "nvidia"
    spare = (root / f"proc/driver/nvidia/gpus/{SPARE}/information").read_text()
    assert parse_minor(spare) == 0 and "Bus Location: \t 0000:e1:00.0" in spare
    kern.write("sys/bus/pci/drivers_probe", PRO[0])
    assert parse_minor((root / f"proc/driver/nvidia/gpus/{PRO[0]}/information").read_text()) == 5
    assert not (root / "dev/nvidia5").exists() and (root / "dev/nvidia0").exists()  # bind makes no node


def test_first_sight_binding_counts_as_a_match(kern: SimKernel, root: Path) -> None:
    kern.write("sys/bus/pci/drivers/ccp/unbind", PSP)
    assert driver(root, PSP) is None
    kern.write("sys/bus/pci/drivers_probe", PSP)
    assert driver(root, PSP) == "ccp"
    # a second process sees the same first sight, not the changed tree
    kern.write("sys/bus/pci/drivers/ccp/unbind", PSP)
    SimKernel(root).write("sys/bus/pci/drivers/ccp/bind", PSP)
    assert driver(root, PSP) == "ccp"


def test_group_viability(kern: SimKernel) -> None:
    g = kern.group_of(ADA)
    assert kern.group_viable(g) is False
    b = backend(kern)
    ks.to_vfio(b, ADA)
    assert kern.group_viable(g) is False  # the audio function is still on snd_hda_intel
    ks.unbind(b, ADA_AUDIO)
    assert kern.group_viable(g) is True  # unbound members do not break viability
    ks.to_vfio(b, ADA_AUDIO)
    assert kern.group_viable(g) is True
    with pytest.raises(KeyError):
        kern.group_viable(999)


def test_vfio_refuses_a_bridge(kern: SimKernel, root: Path) -> None:
    port = root_port(PRO[0])
    kern.write(f"sys/bus/pci/devices/{port}/driver_override", "vfio-pci")
    kern.write("sys/bus/pci/drivers/pcieport/unbind", port)
    assert err_of(kern, "sys/bus/pci/drivers/vfio-pci/bind", port) == errno.EINVAL
    kern.write("sys/bus/pci/drivers_probe", port)  # the probe error is swallowed
    assert driver(root, port) is None


def test_new_id_edge_cases(kern: SimKernel) -> None:
    # the id the fake device is matched with carries the written class (0 when left out)
    assert (
        err_of(kern, "sys/bus/pci/drivers/nvidia/new_id", "10de 2bb5 ffffffff ffffffff 030200 ff0000")
        == errno.EEXIST
    )
    assert (
        err_of(kern, "sys/bus/pci/drivers/vfio-pci/new_id", "10de 2bb5 ffffffff ffffffff 0 0 1")
        == errno.EINVAL
    )
    assert err_of(kern, "sys/bus/pci/drivers/vfio-pci/remove_id", "10de") == errno.EINVAL


def test_unsimulated_attribute_is_refused(kern: SimKernel) -> None:
    assert err_of(kern, f"sys/bus/pci/devices/{PRO[0]}/reset_method", "flr") == errno.EOPNOTSUPP
    assert err_of(kern, f"sys/bus/pci/devices/{PRO[0]}/no_such_attr", "1") == errno.ENOENT


def test_remove_attribute_unbinds_and_removes(kern: SimKernel, root: Path) -> None:
    kern.write(f"sys/bus/pci/devices/{PRO[2]}/remove", "1")
    assert not os.path.lexists(root / f"sys/bus/pci/devices/{PRO[2]}")
    assert (root / "dev/nvidia2").exists()  # the driver never made it, so its remove leaves it
    assert not os.path.lexists(root / f"sys/bus/pci/drivers/nvidia/{PRO[2]}")


# --- latency, holders, faults ------------------------------------------------------------------


def test_latencies_overlap_across_devices(root: Path) -> None:
    k = SimKernel(root, time_scale=1.0, latency={"nvidia.unbind": 0.3})
    threads = [threading.Thread(target=k.write, args=("sys/bus/pci/drivers/nvidia/unbind", a)) for a in PRO]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(driver(root, a) is None for a in PRO)
    unbinds = k.events()
    assert sorted((e.op, e.driver, e.address) for e in unbinds) == [("unbind", "nvidia", a) for a in PRO]
    assert all(e.delay == 0.3 and e.end - e.start >= 0.3 for e in unbinds)
    assert overlap_all(unbinds)


def test_per_address_latency_and_time_scale(root: Path) -> None:
    k = SimKernel(root, time_scale=0.5, latency={"nvidia.unbind": 0.02})
    k.configure(address_latency={PRO[0]: {"unbind": 0.3}})
    k.write("sys/bus/pci/drivers/nvidia/unbind", PRO[0])
    k.write("sys/bus/pci/drivers/nvidia/unbind", PRO[1])
    slow, other = k.events()
    assert (slow.op, slow.address, slow.delay) == ("unbind", PRO[0], 0.15)
    assert slow.end - slow.start >= 0.15
    assert (other.address, other.delay) == (PRO[1], 0.01)


def test_parallel_moves_of_every_gpu(kern: SimKernel, root: Path) -> None:
    b = backend(kern)
    threads = [threading.Thread(target=ks.to_vfio, args=(b, a)) for a in PRO]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [driver(root, a) for a in PRO] == ["vfio-pci"] * 3
    assert all((root / f"dev/vfio/{kern.group_of(a)}").exists() for a in PRO)


def test_unbind_blocks_while_the_node_is_held(kern: SimKernel, root: Path) -> None:
    fd = root / "proc/4242/fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/nvidia1", fd / "7")
    t = threading.Thread(target=kern.write, args=("sys/bus/pci/drivers/nvidia/unbind", PRO[1]), daemon=True)
    t.start()
    t.join(0.15)
    assert t.is_alive() and driver(root, PRO[1]) == "nvidia"
    assert kern.holders(["/dev/nvidia1"]) == [4242]
    os.unlink(fd / "7")
    t.join(2)
    assert not t.is_alive() and driver(root, PRO[1]) is None


def test_vfio_unbind_blocks_while_the_group_is_open(kern: SimKernel, root: Path) -> None:
    b = backend(kern)
    ks.to_vfio(b, PRO[0])
    fd = root / "proc/777/fd"
    fd.mkdir(parents=True)
    os.symlink(f"/dev/vfio/{kern.group_of(PRO[0])}", fd / "30")
    t = threading.Thread(target=kern.write, args=("sys/bus/pci/drivers/vfio-pci/unbind", PRO[0]), daemon=True)
    t.start()
    t.join(0.15)
    assert t.is_alive()
    os.unlink(fd / "30")
    t.join(2)
    assert driver(root, PRO[0]) is None


def test_injected_errno_hits_only_its_address_and_count(kern: SimKernel, root: Path) -> None:
    kern.inject(PRO[0], "unbind", "errno", errno.EBUSY, times=1)
    assert err_of(kern, "sys/bus/pci/drivers/nvidia/unbind", PRO[0]) == errno.EBUSY
    assert driver(root, PRO[0]) == "nvidia"
    kern.write("sys/bus/pci/drivers/nvidia/unbind", PRO[1])
    kern.write("sys/bus/pci/drivers/nvidia/unbind", PRO[0])  # the one shot is used up
    assert driver(root, PRO[0]) is None


def test_hang_blocks_until_released(kern: SimKernel, root: Path) -> None:
    kern.inject(PRO[0], "unbind", "hang")
    t = threading.Thread(target=kern.write, args=("sys/bus/pci/drivers/nvidia/unbind", PRO[0]), daemon=True)
    t.start()
    t.join(0.15)
    assert t.is_alive() and driver(root, PRO[0]) == "nvidia"
    kern.write("sys/bus/pci/drivers/nvidia/unbind", PRO[1])  # other devices are not blocked
    SimKernel(root).release(PRO[0])  # from another instance, as a test or CLI would
    t.join(2)
    assert not t.is_alive() and driver(root, PRO[0]) is None


def test_noop_bind_reports_success_and_binds_nothing(kern: SimKernel, root: Path) -> None:
    kern.write(f"sys/bus/pci/devices/{PRO[0]}/driver_override", "vfio-pci")
    kern.write("sys/bus/pci/drivers/nvidia/unbind", PRO[0])
    kern.inject(PRO[0], "bind", "noop")
    kern.write("sys/bus/pci/drivers_probe", PRO[0])
    assert driver(root, PRO[0]) is None
    kern.clear_faults(PRO[0])
    kern.write("sys/bus/pci/drivers_probe", PRO[0])
    assert driver(root, PRO[0]) == "vfio-pci"


def test_fall_off_removes_device_and_links(kern: SimKernel, root: Path) -> None:
    group = kern.group_of(PRO[1])
    kern.inject(PRO[1], "unbind", "fall_off")
    assert err_of(kern, "sys/bus/pci/drivers/nvidia/unbind", PRO[1]) == errno.ENODEV
    assert not os.path.lexists(root / f"sys/bus/pci/devices/{PRO[1]}")
    assert not os.path.lexists(root / f"sys/bus/pci/drivers/nvidia/{PRO[1]}")
    assert not os.path.lexists(root / f"sys/kernel/iommu_groups/{group}/devices/{PRO[1]}")
    assert (root / "dev/nvidia1").exists()  # left behind, as by a real device's removal
    assert err_of(kern, f"sys/bus/pci/devices/{PRO[1]}/driver_override", "vfio-pci") == errno.ENOENT
    assert err_of(kern, "sys/bus/pci/drivers_probe", PRO[1]) == errno.ENODEV
    assert PRO[1] in kern._read_state()["removed"]


def test_a_rescan_brings_back_a_device_that_fell_off_or_was_removed(kern: SimKernel, root: Path) -> None:
    """rescan_store (drivers/pci/pci-sysfs.c): the device is found again, a new pci_dev (no
    driver_override), and probed: on the driver that matches it, its links as before."""
    group = kern.group_of(PRO[1])
    kern.write(f"sys/bus/pci/devices/{PRO[1]}/driver_override", "vfio-pci")
    kern.inject(PRO[1], "unbind", "fall_off")
    assert err_of(kern, "sys/bus/pci/drivers/nvidia/unbind", PRO[1]) == errno.ENODEV
    kern.write(f"sys/bus/pci/devices/{PRO[2]}/remove", "1")
    assert err_of(kern, "sys/bus/pci/rescan", "x") == errno.EINVAL
    kern.write("sys/bus/pci/rescan", "0")  # does nothing
    assert not os.path.lexists(root / f"sys/bus/pci/devices/{PRO[1]}")
    kern.write("sys/bus/pci/rescan", "1")
    for addr in PRO[1:3]:
        assert driver(root, addr) == "nvidia"
        assert (root / f"sys/bus/pci/drivers/nvidia/{addr}").resolve() == (
            root / f"sys/bus/pci/devices/{addr}"
        ).resolve()
        assert parse_override((root / f"sys/bus/pci/devices/{addr}/driver_override").read_text()) is None
    assert os.path.lexists(root / f"sys/kernel/iommu_groups/{group}/devices/{PRO[1]}")
    assert kern._read_state()["removed"] == []
    kern.write("sys/bus/pci/rescan", "1")  # nothing left to find: nothing changes
    assert driver(root, PRO[1]) == "nvidia"


def test_dead_device_reads_ff(kern: SimKernel, root: Path) -> None:
    kern.kill_device(PRO[2])
    dev = root / f"sys/bus/pci/devices/{PRO[2]}"
    assert set((dev / "config").read_bytes()) == {0xFF}
    assert (dev / "vendor").read_text() == "0xffff\n"
    assert driver(root, PRO[2]) == "nvidia"  # still bound, as after Xid 79
    kern.write("sys/bus/pci/drivers/nvidia/unbind", PRO[2])
    kern.write("sys/bus/pci/drivers_probe", PRO[2])
    assert driver(root, PRO[2]) is None  # nvidia's probe refuses a device that reads 0xffff


def test_faults_are_seen_by_another_process(kern: SimKernel, root: Path) -> None:
    kern.inject(PRO[0], "unbind", "errno", errno.EIO)
    code = (
        "import sys; from gputopo.sim.kernel import SimKernel\n"
        "from gputopo.errors import SysfsWriteError\n"
        f"k = SimKernel({str(root)!r})\n"
        "try:\n"
        f"    k.write('sys/bus/pci/drivers/nvidia/unbind', {PRO[0]!r})\n"
        "except SysfsWriteError as e:\n"
        "    print(e.errno)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert out.stdout.strip() == str(errno.EIO), out.stderr


def test_inject_rejects_unknown_kinds(kern: SimKernel) -> None:
    with pytest.raises(ValueError):
        kern.inject(PRO[0], "unbind", "explode")
    with pytest.raises(ValueError):
        kern.inject(PRO[0], "reset", "hang")
