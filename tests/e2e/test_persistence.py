"""Boot persistence on a real kernel: gputopo's modprobe.d hook and udev rule, installed in the
guest's /etc and run by real kmod and real systemd-udevd (guest/persistence.py says how).

The pinned card must sit on vfio-pci and its identical twin on the native driver after a boot's
coldplug, after the driver's first ``modprobe``, and after a PCI rescan (also when udev runs only
after the kernel probed the re-added card). What the real kernel and kmod showed earlier versions
of the files to miss, and the rendered files now handle: kmod ignores an ``install`` command of a
module that also has a ``softdep`` (modprobe.d(5)); setting ``driver_override`` probes nothing by
itself while vfio-pci is already loaded; the kernel sends a device's add event before it probes it
and does not wait for udev, so the native driver can win a rescan.
"""

from __future__ import annotations

import json

import pytest

from gputopo.plan.render import MODPROBE_PATH, persistence_files, render_modprobe

STAND_IN = "e1000"
NULL = "(null)"  # driver_override of a device that has none, as sysfs reads it


def _data(guest) -> dict:
    d = guest.data("persistence")
    if "unavailable" in d:
        guest.unavailable(d["unavailable"])
    return d


def _want(d: dict) -> dict:
    return {d["pinned"]: ["vfio-pci", "vfio-pci"], d["twin"]: [STAND_IN, NULL]}


def test_driver_variable_changes_only_the_module_name():
    addrs = ["0000:c1:00.0", "0000:81:00.0"]
    nvidia = render_modprobe(addrs)
    other = render_modprobe(addrs, driver=STAND_IN)
    assert "install nvidia for d in 0000:81:00.0 0000:c1:00.0;" in nvidia
    assert "--ignore-install nvidia $CMDLINE_OPTS" in nvidia
    assert not [l for l in other.splitlines() if "nvidia" in l and not l.startswith("#")]
    assert other.replace(STAND_IN, "nvidia") == nvidia
    assert persistence_files(addrs) == persistence_files(addrs, driver="nvidia")


@pytest.mark.e2e
def test_guest_ran_the_rendered_files_through_real_kmod_and_udevd(guest):
    d = _data(guest)
    pinned, twin = d["pinned"], d["twin"]
    print(json.dumps({k: d[k] for k in ("boot", "steps", "steps_s")}, indent=1))
    assert d["boot"] == {pinned: [STAND_IN, NULL], twin: [STAND_IN, NULL]}, "init's coldplug"
    assert d["files"] == persistence_files([pinned], driver=STAND_IN)
    hook = [l for l in d["files"][MODPROBE_PATH].splitlines() if l.split()[:1] in (["install"], ["softdep"])]
    assert any(l.startswith(f"install {STAND_IN} ") for l in hook), hook
    assert sorted(d["kmod_config"]) == sorted(hook), "kmod did not read the rendered modprobe.d file"
    assert d["udevd"] == 0, d["log"]
    steps = d["steps"]
    late = steps["rescan_udev_late"]
    assert late["kernel"][pinned][1] == NULL, "udev ran before the kernel probed: the queue was not held"
    for name, st in [
        ("coldplug", steps["coldplug"]),
        ("rescan", steps["rescan"]["after"]),
        ("rescan_udev_late", late["after"]),
    ]:
        assert st[pinned][1] == "vfio-pci", f"{name}: udevd did not apply the rendered rule"
    for name, st in [
        ("coldplug", steps["coldplug"]),
        ("modprobe", steps["modprobe"]),
        ("rescan", steps["rescan"]["after"]),
        ("rescan_udev_late", late["after"]),
    ]:
        assert st[twin] == [STAND_IN, NULL], f"{name}: the twin left its native driver"


@pytest.mark.e2e
def test_boot_coldplug_puts_the_pinned_card_on_vfio_pci(guest):
    d = _data(guest)
    assert d["steps"]["coldplug"] == _want(d)


@pytest.mark.e2e
def test_first_modprobe_of_the_driver_puts_the_pinned_card_on_vfio_pci(guest):
    d = _data(guest)
    assert d["modprobe_rc"] == 0, d["log"]
    assert d["steps"]["modprobe"] == _want(d)


@pytest.mark.e2e
def test_pci_rescan_puts_the_pinned_card_back_on_vfio_pci(guest):
    d = _data(guest)
    steps = d["steps"]
    assert steps["rescan"]["after"] == _want(d)
    assert steps["rescan_udev_late"]["after"] == _want(d)
