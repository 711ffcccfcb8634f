"""udev on a real kernel (QEMU guest, Debian's systemd-udevd; guest/udevwait.py says how): what
pyudev.Monitor hears of a driver change, gputopo's wait ending on udev's event for the device,
and model names from udev's database through pyudev's public API.

The guest moves its NUMA-0 stand-in GPU and audio function to vfio-pci and back with a test
rule that runs a program of ``rule_s`` seconds on the GPU's bind and on the vfio group's add
(and sets the group node's mode): the kind of rule that makes ``/dev/nvidiaN`` or sets the
permissions of ``/dev/vfio/N`` on a real host. Timestamps are the guest's CLOCK_BOOTTIME.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.e2e


def _data(guest) -> dict:
    d = guest.data("udev")
    if "unavailable" in d:
        guest.unavailable(d["unavailable"])
    assert d["no_udev"] is None, d["no_udev"]  # udevd ran: gputopo hears it
    return d


def _of(events: list[dict], name: str, action: str | None = None) -> list[dict]:
    return [e for e in events if e["name"] == name and (action is None or e["action"] == action)]


def _timeline(step: dict, names: list[str]) -> list[str]:
    t0 = step["started"]
    rows = [f"{0.0:8.3f}  move_group({step['to'] or 'natives'}) called"]
    for src in ("kernel", "udev"):
        for e in step[src]:
            if e["name"] in names:
                rows.append(
                    f"{e['t'] - t0:8.3f}  {src:6} seq {e['seqnum']} {e['action']} {e['subsystem']} {e['name']}"
                    + (f" DRIVER={e['driver']}" if e["driver"] else "")
                )
    for e in step.get("waited") or []:
        if e["name"] in names:
            rows.append(
                f"{e['t'] - t0:8.3f}  wait   seq {e['seqnum']} {e['action']} {e['subsystem']} {e['name']}"
            )
    for what, t in step["stamps"].items():
        if t is not None:
            rows.append(f"{t - t0:8.3f}  rule program ended ({what})")
    rows.append(f"{step['returned'] - t0:8.3f}  move_group returned")
    return sorted(rows, key=lambda r: float(r.split()[0]))


def test_monitor_hears_the_kernels_unbind_and_bind_and_udevs_after_its_rules(guest):
    d = _data(guest)
    gpu, group = d["gpu"], d["group"]
    step = d["steps"]["wait_to_vfio"]
    print("\n".join(_timeline(step, [gpu, group])))
    kernel, udev = step["kernel"], step["udev"]
    # the kernel's own events, as pyudev's kernel monitor heard them: unbind from the native
    # driver, then bind to vfio-pci, numbered in that order; the group's node added on the way
    k = _of(kernel, gpu)
    assert [e["action"] for e in k] == ["unbind", "bind"], k
    assert k[1]["driver"] == "vfio-pci" and k[0]["seqnum"] < k[1]["seqnum"]
    assert _of(kernel, group, "add"), kernel
    # udev broadcast the same events (same SEQNUM) once it had processed them, in their order
    # (each monitor's times are its own thread's: only gaps far above a thread switch count)
    u = {e["seqnum"]: e for e in _of(udev, gpu)}
    assert [e["seqnum"] for e in k] == sorted(u), (k, u)
    # the bind's broadcast came after the rule's program ended, rule_s after the kernel's event
    bind_u = u[k[1]["seqnum"]]
    ended = step["stamps_after_settle"]["gpu_bind"]
    assert ended is not None and bind_u["t"] >= ended - 0.01  # /proc/uptime counts in 10 ms
    assert bind_u["t"] - k[1]["t"] >= d["rule_s"] * 0.9


@pytest.mark.parametrize("name", ["wait_to_vfio", "wait_back"])
def test_the_wait_ends_on_udevs_event_for_the_device_not_before_nor_at_the_timeout(guest, name):
    d = _data(guest)
    gpu, group = d["gpu"], d["group"]
    step = d["steps"][name]
    print(f"{name}:\n" + "\n".join(_timeline(step, [gpu, group])))
    assert step["error"] is None, step["error"]
    want = "vfio-pci" if name == "wait_to_vfio" else d["natives"][gpu]
    assert step["drivers"][gpu] == want
    # what the wait itself received: events after the kernel's seqnum at its start only
    waited = step["waited"]
    assert waited and all(e["seqnum"] > e["after"] for e in waited), waited
    binds = [e for e in _of(waited, gpu, "bind") if e["driver"] == want]
    assert len(binds) == 1, waited
    awaited = [binds[0]]
    if name == "wait_to_vfio":
        adds = _of(waited, group, "add")
        assert adds, waited
        awaited.append(adds[0])
        assert step["vfio_modes"][group] == "0o666", "udev's mode for the group node was not in place"
        assert step["stamps"]["group_add"] is not None
        assert adds[0]["t"] >= step["stamps"]["group_add"] - 0.01  # /proc/uptime counts in 10 ms
    # udev broadcast the bind after its rule's program ended, and the move returned after that
    ended = step["stamps"]["gpu_bind"]
    assert ended is not None, "the move returned before the bind rule's program ended"
    assert binds[0]["t"] >= ended - 0.01
    last = max(e["t"] for e in awaited)
    assert step["returned"] >= last
    took = step["returned"] - step["started"]
    assert took >= d["rule_s"] * 0.9, took
    assert step["returned"] - last < 0.5, "the wait did not end on udev's event"
    assert took < d["timeout"] / 2, f"waited {took:.2f} s of the {d['timeout']} s timeout"


def test_without_the_wait_the_move_returns_before_udevs_rules_ran(guest):
    d = _data(guest)
    step = d["steps"]["plain_to_vfio"]
    assert step["error"] is None and step["drivers"][d["gpu"]] == "vfio-pci"
    assert step["stamps"]["gpu_bind"] is None, "the race the wait closes did not show"
    assert step["stamps_after_settle"]["gpu_bind"] is not None
    assert d["after"] == {d["gpu"]: d["natives"][d["gpu"]], d["audio"]: d["natives"][d["audio"]]}


def _hwdb(modalias: str) -> str | None:
    exe = shutil.which("systemd-hwdb")
    if not exe:
        return None
    out = subprocess.run([exe, "query", modalias], capture_output=True, text=True, timeout=30).stdout
    return next(
        (l.split("=", 1)[1] for l in out.splitlines() if l.startswith("ID_MODEL_FROM_DATABASE=")), None
    )


def test_names_come_from_each_devices_udev_entry_through_the_public_api(guest):
    d = _data(guest)
    names, udevadm = d["names"], d["udevadm_names"]
    print(json.dumps(names, indent=1))
    assert names and names == udevadm
    table = guest.data("discover")["table"]
    e1000 = [a for a, t in table.items() if (t["vendor"], t["device"]) == ("0x8086", "0x100e")]
    assert len(e1000) == 2
    # the device's own entry: the hwdb's name for its ids, refined by its subsystem's where the
    # hwdb has one ("... (QEMU Virtual Machine)")
    want = _hwdb("pci:v00008086d0000100E") or "82540EM Gigabit Ethernet Controller"
    assert len({names.get(a) for a in e1000}) == 1 and names[e1000[0]].startswith(want), names
    # a device udev had never processed has no entry, so no name, before the coldplug
    fresh = [a for a in names if a not in d["entries_before_udev"]]
    assert fresh and not set(fresh) & set(d["names_before_udev"])
    assert set(d["names_before_udev"]) <= set(d["entries_before_udev"])
