"""Binder against the simulated kernel, and RealSysfs against plain files."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from gputopo.adapters.sysfs import Binder, RealSysfs
from gputopo.errors import BindError, SysfsTimeout, SysfsWriteError
from gputopo.ports import MemberState, SysfsPort
from gputopo.sim.kernel import SimKernel
from gputopo.sim.kernel.nvidia import parse_minor
from helpers.simkernel import ADA, ADA_AUDIO, DUMMY, PRO, kern, overlap_all, root  # noqa: F401 (fixtures)


class Recorder:
    """A SysfsPort that remembers every write before passing it on."""

    def __init__(self, inner: SysfsPort):
        self.inner = inner
        self.root = inner.root
        self.writes: list[tuple[str, str]] = []

    def write(self, path: str, value: str) -> None:
        self.writes.append((path, value))
        self.inner.write(path, value)


@pytest.fixture
def rec(kern: SimKernel) -> Recorder:
    return Recorder(kern)


@pytest.fixture
def binder(rec: Recorder) -> Binder:
    return Binder(rec, timeout=2.0)


def one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text
    return text


def test_ports_are_sysfs_ports(kern: SimKernel) -> None:
    assert isinstance(kern, SysfsPort) and isinstance(RealSysfs("/"), SysfsPort)


def test_move_to_vfio_and_back(binder: Binder, kern: SimKernel, root: Path) -> None:
    a = PRO[0]
    g = binder.iommu_group_of(a)
    binder.move(a, "vfio-pci", keep_override=False)
    assert binder.driver_of(a) == "vfio-pci"
    assert binder.override_of(a) is None
    assert binder.vfio_group_present(g)
    # the nvidia driver neither makes nor removes /dev/nvidiaN (nv.c nv_register_chrdev): the
    # seed root's node stays behind while its GPU is on vfio-pci
    assert (root / "dev/nvidia0").exists()
    binder.move(a, "nvidia", keep_override=False)
    assert binder.driver_of(a) == "nvidia"
    assert not binder.vfio_group_present(g)
    info = (root / f"proc/driver/nvidia/gpus/{a}/information").read_text()
    assert parse_minor(info) == 0


def test_keep_override_pins_the_device(binder: Binder) -> None:
    binder.move(PRO[1], "vfio-pci", keep_override=True)
    assert binder.override_of(PRO[1]) == "vfio-pci"
    binder.move(PRO[1], None)
    assert binder.driver_of(PRO[1]) == "nvidia"
    assert binder.override_of(PRO[1]) is None


def test_native_pin_with_keep_override(binder: Binder) -> None:
    binder.move(PRO[1], "vfio-pci")
    binder.move(PRO[1], "nvidia", keep_override=True)
    assert (binder.driver_of(PRO[1]), binder.override_of(PRO[1])) == ("nvidia", "nvidia")


def test_a_converged_move_writes_nothing(binder: Binder, rec: Recorder) -> None:
    binder.move(PRO[2], "nvidia")
    binder.move(PRO[2], None)
    assert rec.writes == []
    binder.move(PRO[2], "vfio-pci")
    n = len(rec.writes)
    binder.move(PRO[2], "vfio-pci")
    assert len(rec.writes) == n


def test_group_move_unbinds_all_before_binding_any(binder: Binder, rec: Recorder, kern: SimKernel) -> None:
    g = binder.iommu_group_of(ADA)
    previous = binder.move_group([ADA, ADA_AUDIO], "vfio-pci", keep_override=False)
    assert previous == {ADA: MemberState("nvidia", None), ADA_AUDIO: MemberState("snd_hda_intel", None)}
    assert binder.group_state(g) == {ADA: "vfio-pci", ADA_AUDIO: "vfio-pci"}
    assert binder.vfio_group_present(g) and kern.group_viable(g)
    kinds = [p.rsplit("/", 1)[1] for p, _ in rec.writes]
    last_unbind = max(i for i, k in enumerate(kinds) if k == "unbind")
    first_probe = min(i for i, k in enumerate(kinds) if k == "drivers_probe")
    assert last_unbind < first_probe
    binder.restore(previous)
    assert binder.group_state(g) == {ADA: "nvidia", ADA_AUDIO: "snd_hda_intel"}
    assert not binder.vfio_group_present(g)


def test_restore_from_plain_driver_names(binder: Binder) -> None:
    binder.move_group([ADA, ADA_AUDIO], "vfio-pci", keep_override=True)
    binder.restore({ADA: "nvidia", ADA_AUDIO: None})
    assert (binder.driver_of(ADA), binder.override_of(ADA)) == ("nvidia", None)
    assert (binder.driver_of(ADA_AUDIO), binder.override_of(ADA_AUDIO)) == (None, None)


def test_group_move_back_to_native_drivers(binder: Binder) -> None:
    binder.move_group([ADA, ADA_AUDIO], "vfio-pci", keep_override=True)
    binder.move_group([ADA, ADA_AUDIO], None, keep_override=False)
    assert [binder.driver_of(ADA), binder.driver_of(ADA_AUDIO)] == ["nvidia", "snd_hda_intel"]
    assert [binder.override_of(ADA), binder.override_of(ADA_AUDIO)] == [None, None]


def test_restore_puts_back_the_previous_override(binder: Binder, kern: SimKernel) -> None:
    kern.write(f"sys/bus/pci/devices/{PRO[0]}/driver_override", "vfio-pci")
    kern.write("sys/bus/pci/drivers/nvidia/unbind", PRO[0])
    kern.write("sys/bus/pci/drivers_probe", PRO[0])
    previous = binder.move_group([PRO[0]], "nvidia")
    assert previous[PRO[0]] == MemberState("vfio-pci", "vfio-pci")
    binder.restore(previous)
    assert (binder.driver_of(PRO[0]), binder.override_of(PRO[0])) == ("vfio-pci", "vfio-pci")


def test_bind_that_binds_nothing_is_a_bind_error(binder: Binder, kern: SimKernel) -> None:
    kern.inject(PRO[0], "bind", "noop")
    with pytest.raises(BindError) as e:
        binder.move(PRO[0], "vfio-pci")
    assert PRO[0] in one_line(e.value) and "vfio-pci" in str(e.value)
    assert e.value.got is None
    assert e.value.previous[PRO[0]] == MemberState("nvidia", None)
    kern.clear_faults()
    binder.restore(e.value.previous)
    assert binder.driver_of(PRO[0]) == "nvidia"


def test_no_native_driver_is_a_bind_error(binder: Binder) -> None:
    with pytest.raises(BindError) as e:
        binder.move(DUMMY, None)
    assert DUMMY in one_line(e.value)


def test_ebusy_surfaces_with_the_errno(binder: Binder, kern: SimKernel) -> None:
    kern.inject(PRO[1], "unbind", "errno", errno.EBUSY)
    with pytest.raises(SysfsWriteError) as e:
        binder.move(PRO[1], "vfio-pci")
    assert e.value.errno == errno.EBUSY
    assert "EBUSY" in one_line(e.value) and PRO[1] in str(e.value)


def test_hang_times_out_naming_the_device(root: Path, kern: SimKernel) -> None:
    binder = Binder(kern, timeout=0.2)
    kern.inject(PRO[2], "unbind", "hang")
    start = time.monotonic()
    try:
        with pytest.raises(SysfsTimeout) as e:
            binder.move(PRO[2], "vfio-pci")
        assert time.monotonic() - start < 1.0
        assert e.value.address == PRO[2] and e.value.exit_code == 3
        assert "needs a human" in one_line(e.value)
        assert binder.stuck == [PRO[2]]
    finally:
        kern.release()


def test_held_open_device_times_out(root: Path, kern: SimKernel) -> None:
    fd = root / "proc/31337/fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/nvidia1", fd / "5")
    binder = Binder(kern, timeout=0.2)
    try:
        with pytest.raises(SysfsTimeout) as e:
            binder.move(PRO[1], "vfio-pci")
        assert e.value.address == PRO[1]
        assert binder.driver_of(PRO[1]) == "nvidia"
    finally:
        os.unlink(fd / "5")


def test_device_falling_off_the_bus(binder: Binder, kern: SimKernel, root: Path) -> None:
    kern.inject(PRO[0], "bind", "fall_off")
    with pytest.raises(SysfsWriteError) as e:
        binder.move(PRO[0], "vfio-pci")
    assert e.value.errno == errno.ENODEV
    assert binder.driver_of(PRO[0]) is None
    assert not os.path.lexists(root / f"sys/bus/pci/devices/{PRO[0]}")
    n = len(binder.port.writes)
    with pytest.raises(BindError) as e2:
        binder.move(PRO[0], "nvidia")
    assert PRO[0] in one_line(e2.value) and "gone" in str(e2.value)
    assert len(binder.port.writes) == n


def test_group_moves_overlap_in_threads(root: Path) -> None:
    import threading

    kern = SimKernel(root, time_scale=1.0, latency={"nvidia.unbind": 0.3, "vfio-pci.bind": 0.0})
    binder = Binder(kern, timeout=5.0)
    threads = [threading.Thread(target=binder.move_group, args=([a], "vfio-pci")) for a in PRO]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [binder.driver_of(a) for a in PRO] == ["vfio-pci"] * 3
    unbinds = [e for e in kern.events() if e.op == "unbind"]
    assert sorted(e.address for e in unbinds) == sorted(PRO)
    assert all(e.end - e.start >= 0.3 for e in unbinds)
    assert overlap_all(unbinds)  # the binder did not make one move wait for another
    binds = [e for e in kern.events() if e.op == "bind"]
    assert sorted((e.driver, e.address) for e in binds) == [("vfio-pci", a) for a in sorted(PRO)]


# --- RealSysfs -------------------------------------------------------------------------------


def test_real_sysfs_writes_one_value(tmp_path: Path) -> None:
    attr = tmp_path / "sys/bus/pci/devices/0000:01:00.0/driver_override"
    attr.parent.mkdir(parents=True)
    attr.write_text("(null)\n")
    RealSysfs(tmp_path).write("sys/bus/pci/devices/0000:01:00.0/driver_override", "vfio-pci")
    assert attr.read_text() == "vfio-pci"


def test_real_sysfs_missing_driver_is_enoent(tmp_path: Path) -> None:
    with pytest.raises(SysfsWriteError) as e:
        RealSysfs(tmp_path).write("sys/bus/pci/drivers/nvidia/bind", "0000:01:00.0")
    assert e.value.errno == errno.ENOENT
    assert "ENOENT" in one_line(e.value) and "sys/bus/pci/drivers/nvidia/bind" in str(e.value)


def test_real_sysfs_directory_is_eisdir(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    with pytest.raises(SysfsWriteError) as e:
        RealSysfs(tmp_path).write("sys", "x")
    assert e.value.errno == errno.EISDIR


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_real_sysfs_maps_errors_of_the_write_itself() -> None:
    with pytest.raises(SysfsWriteError) as e:
        RealSysfs("/").write("dev/full", "x")
    assert e.value.errno == errno.ENOSPC


def test_binder_reads_back_a_plain_tree(root: Path) -> None:
    binder = Binder(RealSysfs(root))
    assert binder.driver_of(PRO[0]) == "nvidia"
    assert binder.override_of(PRO[0]) is None
    assert binder.group_state(binder.iommu_group_of(ADA)) == {ADA: "nvidia", ADA_AUDIO: "snd_hda_intel"}
    assert binder.group_state(9999) == {}


def test_native_driver_is_read_from_the_kernels_modules_alias(materialized) -> None:
    """What a bind back to "its native driver" pins: the module modules.alias names for the
    device's modalias, and that module's driver directory (the esc8000a GPU and its HDMI audio)."""
    from gputopo.facts.modalias import native_driver, read_aliases

    root = str(materialized("esc8000a"))
    assert read_aliases(root)
    assert native_driver(root, "0000:01:00.0") == "nvidia"
    assert native_driver(root, "0000:01:00.1") == "snd_hda_intel"
