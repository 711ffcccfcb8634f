"""The reverse change rolled back, as an operator meets it: GPUs going back to CT 101 while VM 201
runs as a consumer of the VM mapping (``when_gpus_leave: remove``, or ``repoint`` to another
mapping), and the new service fails to start. The rollback starts VM 201 again only once its
mapping, its hostpci lines and its GPUs are back, so it ends ``rolled back`` (exit 1) with the
host as before -- judged on what runs: drivers and overrides, the container's /dev, the
service's real command line and GPUs, VM 201 running on its mapping's GPUs -- and the next apply
runs. The same after a SIGKILL in the switch phase or in the rollback, then ``gputopo recover``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputopo.apply.journal import Journal, find_unfinished, list_journals
from gputopo.facts.discover import discover
from gputopo.formats.qemuconf import parse_qemu_conf
from gputopo.plan.starter import init_spec
from gputopo.sim import state
from gputopo.sim.container import break_container, heal_container
from helpers import TESTS, applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)
from helpers.cli import run

pytestmark = pytest.mark.slow  # applies on a simulated host, seconds each

NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
DRIVER = TESTS / "helpers" / "crashdriver.py"


def split_text(h) -> str:
    """``gputopo demo``'s spec: CT 101 on NUMA node 0 (mapping pro6000), VM 201 consuming
    pro6000-vm (NUMA node 1) with ``when_gpus_leave: remove``, started; the container restarts
    (``container_restart: always``), so the split leaves no change pending in its config."""
    return applysim.restarting(init_spec(discover(str(h.paths.root)), container_mapping="pro6000", vm=201))


def back_text(split: str, leave: str) -> str:
    """The change back: ``remove``: every GPU to CT 101 (pro6000-vm loses them all and is
    deleted, VM 201's lines removed); ``repoint``: CT 101 takes two of VM 201's GPUs, VM 201's
    lines name a new mapping pro6000-spare, pro6000-vm keeps one GPU."""
    if leave == "remove":
        return applysim.reverse(split)
    ct = ", ".join(f"'0000:{b}:00.0'" for b in ("01", "11", "61", "71", "81", "91"))
    text = split.replace("          numa: [0]\n", f"          addresses: [{ct}]\n", 1)
    text = text.replace(
        "          gpus:\n            numa: [1]\n",
        "          gpus:\n            addresses: ['0000:e1:00.0']\n        - name: pro6000-spare\n          gpus: rest\n",
        1,
    )
    text = text.replace(
        "when_gpus_leave: remove", "when_gpus_leave: repoint\n          repoint_to: pro6000-spare"
    )
    return text.replace("tp_check: error", "tp_check: warn")  # 6 GPUs: tensor parallel 6


def tp_of(leave: str) -> int:
    return 8 if leave == "remove" else 6


def apply_args(h, spec: Path) -> list[str]:
    return [
        "apply",
        "--sim",
        str(h.dir),
        "--spec",
        str(spec),
        "--yes",
        "--no-verify",
        "--timeout",
        "service=20",
    ]


def split_applied(h, capsys) -> None:
    (h.dir / "split.yaml").write_text(split_text(h))
    code, _, err = run(capsys, *apply_args(h, h.dir / "split.yaml"))
    assert code == 0, err
    assert state.read_state(h.paths.run, "guests", {})["qemu"]["201"] == "running"


def vm_201_runs_on_its_mapping(h) -> None:
    """VM 201 runs, its hostpci lines name pro6000-vm, the mapping lists its four GPUs, and its
    QEMU holds them (Proxmox's reservation), each on vfio-pci with its override."""
    assert state.read_state(h.paths.run, "guests", {})["qemu"]["201"] == "running"
    conf = parse_qemu_conf((h.paths.pve / "nodes/pve1/qemu-server/201.conf").read_text()).options
    assert (
        sorted(v for k, v in conf.items() if k.startswith("hostpci")) == ["mapping=pro6000-vm,pcie=1"] * 4
    ), conf
    cfg = (h.paths.pve / "mapping/pci.cfg").read_text()
    section = cfg.split("pro6000-vm\n", 1)[1].split("\n\n", 1)[0]
    assert sorted(a for a in NUMA1 if f"path={a}" in section) == NUMA1, cfg
    reserved = state.read_state(h.paths.run, "pci-reserved", {})
    assert sorted(a for a, vmid in reserved.items() if str(vmid) == "201") == NUMA1, reserved
    for a in NUMA1:
        dev = h.paths.root / "sys/bus/pci/devices" / a
        assert os.path.basename(os.readlink(dev / "driver")) == "vfio-pci"
        assert (dev / "driver_override").read_text() == "vfio-pci\n"


def next_apply_runs(h, capsys, back: Path | None) -> None:
    """Nothing refuses the next apply: the split's spec finds nothing to change (the host is
    what the split left), and with the service healed the change back applies (``back``)."""
    code, out, err = run(capsys, *apply_args(h, h.dir / "split.yaml"))
    assert code == 0 and "No changes" in out + err, out + err
    if back is None:
        return
    heal_container(h.dir, 101)
    code, out, err = run(capsys, *apply_args(h, back))
    assert code == 0, err
    assert applysim.running_service(h.paths.root, 101, "sglang.service")[0].endswith("--tp 8")


@pytest.mark.parametrize("leave", ["remove"])
def test_a_failed_service_start_of_the_reverse_change_rolls_back_with_vm_201_running(host, capsys, leave):
    split_applied(host, capsys)
    break_container(host.dir, 101, "service_fails", tp=tp_of(leave))
    back = host.dir / "back.yaml"
    back.write_text(back_text(split_text(host), leave))
    before = applysim.fingerprint(host)
    assert before["service"][0] == "active" and before["service"][1].endswith("--tp 4")
    assert [n for n in before["service"][2] if n[len("/dev/nvidia") :].isdigit()] == [
        f"/dev/nvidia{i}" for i in range(4)
    ]

    code, out, err = run(capsys, *apply_args(host, back))

    assert code == 1, err
    assert err.rstrip().endswith("; rolled back"), err
    assert "failed" not in "\n".join(line for line in out.splitlines() if line.startswith("undo")), out
    assert find_unfinished(host.paths.root) is None
    diff = applysim.diff(before, applysim.fingerprint(host))
    assert diff == [], "\n".join(diff) + "\n" + out
    vm_201_runs_on_its_mapping(host)
    next_apply_runs(host, capsys, back)


def test_a_reverse_that_repoints_vm_201_to_tp_6_is_refused_before_anything_stops(host, capsys):
    """Repointing VM 201 gives CT 101 six GPUs: tensor parallel 6, which the served model's 64
    attention heads refuse (SGLang and vLLM do not start), so the plan refuses it (capacity)
    instead of finding out at the service's start, after the stop window. The rollback of a
    repointing reverse is the crash matrix's (reverse-vm-repoint, a model two GPUs hold)."""
    split_applied(host, capsys)
    back = host.dir / "back.yaml"
    back.write_text(back_text(split_text(host), "repoint"))
    before = applysim.fingerprint(host)

    code, out, err = run(capsys, *apply_args(host, back))

    assert code == 2, err
    assert "refused: container 101: tp 6 does not divide qwen3's 64 attention heads" in err, err
    assert applysim.diff(before, applysim.fingerprint(host)) == []


# --- SIGKILL, then gputopo recover -------------------------------------------------------------


def drive(h, *args: str, at: str | None = None, count: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUTOPO_CRASH")}
    env["PYTHONUNBUFFERED"] = "1"
    if at:
        env["GPUTOPO_CRASH_AT"] = at
    if count:
        env["GPUTOPO_CRASH_COUNT"] = str(count)
    cmd = [sys.executable, str(DRIVER), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def kill_points(h, back: Path) -> dict[str, str]:
    """Where to kill the reverse apply whose service fails, from a counted run on this host
    (rolled back afterwards, so the host is as before again): right after the first sysfs
    write of the switch phase, and in the rollback right after the first GPU is back on
    vfio-pci (VM 201's mapping and the container still to come)."""
    count = h.dir.parent / "count.json"
    earlier = set(list_journals(h.paths.root))
    res = drive(h, *apply_args(h, back), count=count)
    assert res.returncode == 1 and res.stderr.rstrip().endswith("; rolled back"), res.stderr
    trace = json.loads(count.read_text())["trace"]
    # this run's journal (names order by the second they were made in: the split's journal may
    # share that second and sort after it)
    (made,) = set(list_journals(h.paths.root)) - earlier
    records = Journal.load(made).records
    rebinds = {r.step for r in records if r.type == "begin" and r.action.kind == "rebind"}
    first_begin = next(i for i, r in enumerate(records) if r.type == "begin" and r.step in rebinds)
    calls = next(c for what, n, c in trace if what == "SimKernel" and n >= first_begin + 1)
    undone = next(i for i, r in enumerate(records) if r.type == "undo-done" and r.step in rebinds)
    return {"switch": f"call:{calls}", "rollback": f"record:{undone + 1}"}


def test_a_sigkill_in_the_reverse_change_then_recover_leaves_the_host_as_before(host, capsys):
    split_applied(host, capsys)
    break_container(host.dir, 101, "service_fails", tp=8)
    back = host.dir / "back.yaml"
    back.write_text(back_text(split_text(host), "remove"))
    host.stop()
    before = applysim.fingerprint(host)
    points = kill_points(host, back)
    assert applysim.diff(before, applysim.fingerprint(host)) == []  # the counted run rolled back
    for where, at in points.items():
        res = drive(host, *apply_args(host, back), at=at)
        assert res.returncode == -9, (where, res.stderr)
        assert find_unfinished(host.paths.root) is not None, where
        rec = drive(host, "recover", "--sim", str(host.dir))
        assert rec.returncode == 0, (where, rec.stderr)
        assert find_unfinished(host.paths.root) is None, where
        assert applysim.diff(before, applysim.fingerprint(host)) == [], where
        vm_201_runs_on_its_mapping(host)
    next_apply_runs(host, capsys, back)
