"""gputopo against a real Linux kernel (QEMU guest): discovery, rebinding, kernel errors, snapshot.

All tests share one guest boot (the ``guest`` fixture in conftest.py); each reads the
observations one guest check recorded and judges them here.
"""

from __future__ import annotations

import errno
import json
import sys

import pytest

pytestmark = pytest.mark.e2e

GPU_MATCH = [("0x1234", "0x03")]


def _slot(address: str) -> str:
    return address.rsplit(".", 1)[0]


def _cpus(cpulist: str | None) -> set[int]:
    out: set[int] = set()
    for part in (cpulist or "").split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            out.add(int(part))
    return out


# --- boot ------------------------------------------------------------------------------


def test_guest_runs_this_interpreter_on_the_image_kernel(guest):
    meta = guest.results["_meta"]
    assert meta["kernel"] == guest.image.kver
    assert meta["python"] == sys.version.split()[0]
    assert guest.run.rc == 0, guest.run.output


# --- discover ----------------------------------------------------------------------------


def test_discover_reports_what_the_kernel_shows(guest):
    d = guest.data("discover")
    assert d["rc"] == 0, d["stderr"]
    facts = json.loads(d["stdout"])
    table, groups, nodes = d["table"], d["groups"], d["nodes"]

    want_gpus = sorted(
        a for a, t in table.items() if t["vendor"] == "0x1234" and t["class"].startswith("0x03")
    )
    assert len(want_gpus) == 3  # VGA on the root bus + two bochs-display cards
    assert [g["address"] for g in facts["gpus"]] == want_gpus

    for g in facts["gpus"]:
        a = g["address"]
        t = table[a]
        where = f"GPU {a}"
        assert (g["vendor"], g["device"], g["class"]) == (t["vendor"], t["device"], t["class"]), where
        assert g["subsystem_vendor"] == t["subsystem_vendor"], where
        assert g["driver"] == t["driver"], where
        assert t["driver"] is not None, f"{where}: the guest left it unbound"
        assert g["iommu_group"] == int(t["iommu_group"]), where

        numa = int(t["numa_node"])
        if numa >= 0:
            assert g["numa_node"] == numa and g["numa_source"] == "sysfs", where
        elif g["numa_node"] is not None:
            # sysfs says -1: a node is only acceptable when the device's CPUs sit in that node
            assert g["numa_source"] == "cpulist", where
            assert _cpus(t["local_cpulist"]) <= _cpus(nodes[str(g["numa_node"])]), where

        members = {m["address"]: m for m in g["iommu_members"]}
        assert sorted(members) == sorted(m for m in groups[t["iommu_group"]] if m != a), where
        for m, info in members.items():
            mt = table[m]
            role = (
                "function"
                if _slot(m) == _slot(a)
                else "bridge"
                if mt["class"].startswith("0x0604")
                else "foreign"
            )
            assert info["role"] == role, f"{where} member {m}"
            assert info["driver"] == mt["driver"], f"{where} member {m}"
            assert (info["vendor"], info["device"], info["class"]) == (
                mt["vendor"],
                mt["device"],
                mt["class"],
            ), f"{where} member {m}"
        assert sorted(g["functions"]) == sorted(x for x in table if _slot(x) == _slot(a) and x != a), where

    # the stand-in GPU pairs: display + HD audio in one group, on the NUMA node of their bridge
    pairs = {g["address"]: g for g in facts["gpus"] if g["class"] == "0x038000"}
    assert sorted(g["numa_node"] for g in pairs.values()) == [0, 1]
    for a, g in pairs.items():
        audio = a[:-1] + "1"
        assert [(m["address"], m["role"]) for m in g["iommu_members"]] == [(audio, "function")]
        assert table[audio]["driver"] == "snd_hda_intel" and g["driver"] == "bochs-drm"

    host = facts["host"]
    assert host["iommu_enabled"] is True
    assert host["iommu_group_count"] == len(groups)
    assert host["iommu_mode"] == "pt"
    assert {n["id"]: n["cpulist"] for n in host["numa_nodes"]} == {int(k): v for k, v in nodes.items()}
    assert host["modules"]["vfio_pci"] is True and host["modules"]["nvidia"] is False
    assert host["vfio_groups"] == sorted(int(x) for x in d["vfio"] if x.isdigit())
    assert host["kernel"] == guest.image.kver


# --- snapshot ----------------------------------------------------------------------------


def test_snapshot_rediscovers_identically_on_the_host(guest, tmp_path):
    from gputopo.facts.discover import discover

    snap = guest.data("snapshot")
    assert snap["rc"] == 0, snap["stderr"]
    root = _snapshot_root(guest, "snap.tar.gz", tmp_path / "root")
    here = json.loads(discover(root, gpu_match=GPU_MATCH).to_json())
    there = json.loads(guest.data("discover")["stdout"])
    here.pop("root")
    there.pop("root")
    assert here == there


# --- rebinding through gputopo.adapters.sysfs --------------------------------------------------------


def _not_viable(v: dict) -> bool:
    return v.get("open_errno") is not None or v.get("viable") is False


def test_pair_moves_to_vfio_as_one_group_and_back(guest):
    d = guest.data("bind_pair")
    gpu, audio, group = d["gpu"], d["audio"], d["group"]
    assert sorted(d["members"]) == [gpu, audio]
    assert d["before"][gpu][0] == "bochs-drm" and d["before"][audio][0] == "snd_hda_intel"

    assert "ok" in d["to_vfio"], d["to_vfio"]
    on = d["on_vfio"]
    assert on["links"] == {gpu: "vfio-pci", audio: "vfio-pci"}
    assert on["overrides"] == {gpu: "vfio-pci", audio: "vfio-pci"}  # keep_override=True
    assert on["driver_of"] == {gpu: {"ok": "vfio-pci"}, audio: {"ok": "vfio-pci"}}
    assert on["group_state"] == {"ok": {gpu: "vfio-pci", audio: "vfio-pci"}}, f"group {group}"
    assert on["dev_vfio"] is True and on["vfio_group_present"] == {"ok": True}
    assert on["vfio"]["viable"] is True and on["vfio"]["set_container"] == "ok", on["vfio"]

    assert "ok" in d["back_gpu"], d["back_gpu"]
    assert "ok" in d["back_audio"], d["back_audio"]
    nat = d["native"]
    assert nat["links"] == {gpu: "bochs-drm", audio: "snd_hda_intel"}
    assert nat["dev_vfio"] is False and nat["vfio_group_present"] == {"ok": False}
    assert d["after"] == d["before"]


def test_half_moved_group_is_not_viable(guest):
    d = guest.data("bind_pair")
    gpu, audio = d["gpu"], d["audio"]
    half = d["half"]
    assert "ok" in half["move"], half["move"]
    assert half["links"] == {gpu: "vfio-pci", audio: "snd_hda_intel"}
    assert half["group_state"] == {"ok": half["links"]}
    assert half["vfio_group_present"] == {"ok": True}  # the node exists ...
    assert _not_viable(half["vfio"]), half["vfio"]  # ... but the kernel will not hand it out
    assert "ok" in d["half_back"], d["half_back"]


# --- kernel errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, want",
    [
        ("bind_unloaded", "ENOENT"),
        ("bind_ghost", "ENODEV"),
        ("override_ghost", "ENOENT"),
        ("probe_ghost", "ENODEV"),
        ("unbind_unbound", "ENODEV"),
        ("unbind_other", "ENODEV"),
        ("bind_unclaimed", "ENODEV"),
    ],
)
def test_failed_writes_raise_sysfs_write_error_with_the_kernels_errno(guest, case, want):
    d = guest.data("failures")[case]
    assert d["kernel_errno"] == want, f"{case}: the kernel itself gave {d['kernel_errno']}"
    port = d["port"]
    assert "raised" in port, f"{case}: RealSysfs.write returned {port}"
    assert "SysfsWriteError" in port["raised"] and "GputopoError" in port["raised"], port
    assert errno.errorcode[port["errno"]] == want, port
    assert "\n" not in port["message"] and d["path"].split("/")[-1] in port["message"], port


def test_move_to_a_driver_that_is_not_loaded_fails_and_is_repairable(guest):
    d = guest.data("failures")
    r = d["move_unloaded"]
    assert "raised" in r, f"move to nvidia returned {r}"
    assert {"BindError", "SysfsWriteError"} & set(r["raised"]), r
    assert "GputopoError" in r["raised"] and "\n" not in r["message"], r
    assert d["nic"] in r["message"] or "nvidia" in r["message"], r
    assert "ok" in d["move_unloaded_restore"], d["move_unloaded_restore"]
    assert d["after"][d["nic"]][0] == "e1000e"


def test_move_of_a_missing_address_is_an_error_naming_it(guest):
    d = guest.data("failures")
    r = d["move_ghost"]
    assert "raised" in r and "GputopoError" in r["raised"], r
    assert d["ghost"] in r["message"], r


def test_failure_paths_leave_every_device_as_it_was(guest):
    d = guest.data("failures")
    assert d["after_writes"] == d["before"]
    assert d["after"] == d["before"]


def test_rollback_of_move_group_restores_the_start_state(guest):
    d = guest.data("rollback")
    assert "ok" in d["move_group"], d["move_group"]
    assert d["moved"][d["gpu"]][0] == "vfio-pci" and d["moved"][d["audio"]][0] == "vfio-pci"
    assert "ok" in d["undo"], d["undo"]
    assert d["after"] == d["before"]


# --- the simulated kernel against the real one -------------------------------------------


def _snapshot_root(guest, name: str, dest) -> str:
    """Extract a snapshot the guest took and return the host root inside it."""
    from gputopo.facts.snapshot import extract

    tar = guest.out_dir / name
    assert tar.is_file(), f"the guest wrote no {name}"
    return str(extract(tar, dest))


def _errno_name(fn, *args) -> str:
    from gputopo.errors import SysfsWriteError

    try:
        fn(*args)
    except SysfsWriteError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    return "ok"


def test_sim_kernel_replays_raw_writes_like_the_real_one(guest, guest_checks, tmp_path):
    from gputopo.sim.kernel import SimKernel

    d = guest.data("replay")
    assert d["before"] == guest.data("discover")["before"], "the guest left its start state"
    root = _snapshot_root(guest, "snap.tar.gz", tmp_path)
    sim = SimKernel(root)
    diffs, compared = [], []
    for real in d["steps"]:
        got = {
            "path": real["path"],
            "value": real["value"],
            "result": _errno_name(sim.write, real["path"], real["value"]),
            **guest_checks.replay_observe(root, d["roles"], sim.group_viable),
        }
        compared.append(f"{real['path']} <- {real['value']!r}: {real['result']}")
        if got != real:
            diffs.append(
                f"after writing {real['value']!r} to {real['path']}:\n    real: {real}\n    sim:  {got}"
            )
    print("compared raw writes:\n  " + "\n  ".join(compared))
    assert not diffs, "simulated kernel differs from the real one:\n" + "\n".join(diffs)


def test_conformance_steps_match_the_simulated_kernel(guest, tmp_path):
    from gputopo.sim.kernel import SimKernel
    from helpers import kernel_scenarios as ks

    d = guest.data("conformance")
    assert d["before"] == guest.data("discover")["before"], "the guest left its start state"
    assert d["after"] == d["before"], "run_conformance did not put the guest back"
    root = _snapshot_root(guest, "snap.tar.gz", tmp_path)
    backend = ks.KernelBackend(port=SimKernel(root), root=root, **d["roles"])
    sim_steps = [[name, state] for name, state in ks.run_conformance(backend)]
    real_steps = d["steps"]
    assert [s[0] for s in sim_steps] == [s[0] for s in real_steps]
    print("compared conformance steps: " + ", ".join(s[0] for s in real_steps))
    diffs = [
        f"step {r[0]}:\n    real: {r[1]}\n    sim:  {s[1]}"
        for r, s in zip(real_steps, sim_steps)
        if r[1] != s[1]
    ]
    assert not diffs, "simulated kernel differs from the real one:\n" + "\n".join(diffs)


def test_kernel_scenarios_hold_on_the_real_kernel(guest):
    d = guest.data("scenarios")
    assert d, "no scenarios ran"
    failed = {name: tb for name, tb in d.items() if tb is not None}
    assert not failed, "\n".join(f"{n}:\n{tb}" for n, tb in failed.items())
