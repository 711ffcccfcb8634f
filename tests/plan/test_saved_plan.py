"""Saved plans (``plan -o FILE`` then ``apply FILE``): the plan is applied exactly while the host is
the one it was made from, and refused (exit 2, nothing changed, naming what moved) once anything
it was made from changed; the plan's summary line and the step timeouts per kind."""

from __future__ import annotations

import json
import re

import pytest

from gputopo.errors import SavedPlanEdited, SpecError
from gputopo.facts.discover import discover
from gputopo.model.state import ContainerState, CurrentState, MappingState
from gputopo.plan.saved import SavedPlan, changes, parse_saved_plan, state_items
from gputopo.plan.saved import fingerprint as fp
from gputopo.sim.kernel import SimKernel
from helpers import applysim
from helpers.applysim import copy_host, fingerprint, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only


@pytest.fixture
def sim(template, tmp_path):
    return copy_host(template, tmp_path / "sim")


@pytest.fixture
def spec(sim):
    p = sim.dir / "s.yaml"
    p.write_text(seed_spec_text(sim))
    return p


@pytest.fixture
def restarting_spec(sim):
    """The seed split with ``container_restart: always``: the container's stop and start join the plan."""
    p = sim.dir / "always.yaml"
    p.write_text(applysim.restarting(seed_spec_text(sim)))
    return p


def _save(capsys, sim, spec, out, *extra):
    code, stdout, err = run(
        capsys, "plan", "--sim", str(sim.dir), "--spec", str(spec), "-o", str(out), *extra
    )
    assert code == 0, err
    return stdout, err


def test_a_saved_plan_applies_exactly_its_steps(capsys, sim, spec, tmp_path):
    out = tmp_path / "plan.json"
    stdout, err = _save(capsys, sim, spec, out)
    # the hint names the simulated host the plan was made on: pasted, it applies there
    assert f"wrote {out}: apply it with 'gputopo apply {out} --sim {sim.dir}'" in err
    saved = parse_saved_plan(out.read_text(), str(out))
    assert saved.schema_version == 2 and saved.source == f"sim {sim.dir}" and saved.plan.actions
    assert saved.fingerprint == fp(saved.state)
    code, _, err = run(capsys, "apply", str(out), "--sim", str(sim.dir), "--yes", "--no-verify")
    assert code == 0, err
    j = sorted((sim.paths.root / "var/lib/gputopo/journal").glob("*.jsonl"))[-1]
    header = json.loads(j.read_text().splitlines()[0])
    # the journal holds the saved plan's steps, one for one, and the spec's hash from the plan
    assert [a["kind"] for a in header["actions"]] == [a.kind for a in saved.plan.actions]
    assert header["spec_sha256"] == saved.spec_sha256 and header["spec"] == str(out)
    code, stdout, _ = run(capsys, "plan", "--sim", str(sim.dir), "--spec", str(spec))
    assert code == 0 and "No changes" in stdout


def test_a_host_that_moved_since_the_plan_is_refused_naming_what_moved(capsys, sim, spec, tmp_path):
    out = tmp_path / "plan.json"
    _save(capsys, sim, spec, out)
    SimKernel(str(sim.paths.root)).write("sys/bus/pci/devices/0000:81:00.0/driver_override", "vfio-pci")
    before = fingerprint(sim)
    code, _, err = run(capsys, "apply", str(out), "--sim", str(sim.dir), "--yes")
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"gputopo: error: {out}: the host changed since this plan was made: ")
    assert "gpu/0000:81:00.0/override: none -> vfio-pci" in line and "nothing was changed" in line
    assert fingerprint(sim) == before


def test_stale_names_each_item_and_checked_returns_the_saved_plan(sim):
    facts = discover(str(sim.paths.root))
    current = CurrentState(
        containers={101: ContainerState(config={"dev0": "/dev/nvidia0", "digest": "a"}, status="running")},
        mappings={"m": MappingState(map=["id=10de:2bb5,node=pve1,path=0000:81:00.0"], digest="x")},
        files={"etc/modprobe.d/gputopo-vfio.conf": None},
    )
    items = state_items(facts, current)
    assert items["ct/101/config/dev0"] == "/dev/nvidia0" and "ct/101/config/digest" not in items
    assert items["file/etc/modprobe.d/gputopo-vfio.conf"] == "absent"
    assert all(" " not in k for k in items)
    moved = current.model_copy(deep=True)
    moved.containers[101].config["digest"] = "b"  # a digest alone is not a change
    moved.mappings["m"].digest = "y"
    assert fp(state_items(facts, moved)) == fp(items)
    moved.containers[101].status = "stopped"
    moved.files["etc/modprobe.d/gputopo-vfio.conf"] = "options vfio-pci\n"
    got = changes(items, state_items(facts, moved))
    assert got[0] == "ct/101/status: running -> stopped"
    assert got[1].startswith("file/etc/modprobe.d/gputopo-vfio.conf: absent -> ") and len(got) == 2


def test_plan_o_refuses_an_existing_file_and_a_source_apply_cannot_read(capsys, sim, spec, tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("mine\n")
    code, _, err = run(capsys, "plan", "--sim", str(sim.dir), "--spec", str(spec), "-o", str(out))
    assert code == 2 and one_line(err) == f"gputopo: error: {out}: exists; pass --force to replace it"
    assert out.read_text() == "mine\n"
    _save(capsys, sim, spec, out, "--force")
    assert parse_saved_plan(out.read_text(), str(out)).plan.actions
    code, _, err = run(
        capsys,
        "plan",
        "--root",
        str(sim.paths.root),
        "--pve-root",
        str(sim.paths.pve),
        "--spec",
        str(spec),
        "-o",
        str(tmp_path / "other.json"),
    )
    assert code == 2 and "not from --pve-root" in one_line(err)


@pytest.mark.parametrize(
    "text, field",
    [
        ("not json", ""),
        ('{"kind": "something"}', "kind"),
        ('{"kind": "gputopo-saved-plan", "schema_version": 9}', "schema_version"),
        ('{"kind": "gputopo-saved-plan", "schema_version": 1}', "schema_version"),  # made before the seal
        ('{"kind": "gputopo-saved-plan", "schema_version": 2}', "gputopo_version"),
    ],
)
def test_a_file_that_is_not_a_saved_plan_is_refused_by_name(text, field):
    with pytest.raises(SpecError) as e:
        parse_saved_plan(text, "p.json")
    assert e.value.file == "p.json" and e.value.field == field and e.value.exit_code == 2


def _edit(path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


def test_a_hand_edited_step_is_refused_by_apply_and_show_naming_it(capsys, sim, spec, tmp_path):
    """``--tp 4`` -> ``--tp 6`` in the saved drop-in: apply refuses before it reads the host (exit
    2, one line naming the step), show refuses the same way, and nothing changed."""
    out = tmp_path / "plan.json"
    _save(capsys, sim, spec, out)
    step = next(
        i
        for i, a in enumerate(json.loads(out.read_text())["plan"]["actions"])
        if a["kind"] == "write_service_dropin"
    )

    def tp6(data):
        action = data["plan"]["actions"][step]
        assert "--tp 4\n" in action["content"]
        action["content"] = action["content"].replace("--tp 4\n", "--tp 6\n")

    _edit(out, tp6)
    before = fingerprint(sim)
    described = SavedPlan.model_validate_json(out.read_text()).plan.actions[step].describe()
    want = (
        f"gputopo: error: {out}: edited since 'gputopo plan -o' wrote it: step {step + 1} ({described}) "
        "was edited; nothing was changed, make a new plan"
    )
    code, _, err = run(capsys, "apply", str(out), "--sim", str(sim.dir), "--yes", "--no-verify")
    assert code == 2 and one_line(err) == want
    code, stdout, err = run(capsys, "show", str(out))
    assert code == 2 and one_line(err) == want and stdout == ""
    assert fingerprint(sim) == before
    assert not (sim.paths.root / "var/lib/gputopo/journal").exists()


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda d: d["spec"]["policy"].update(shutdown_timeout=5), "its spec changed"),
        (
            lambda d: d["state"].update({"gpu/0000:81:00.0/driver": "vfio-pci"}),
            "the host state it was made from changed",
        ),
        (lambda d: d.update(node="pve2"), "its own fields (node, source, fingerprint, summary) changed"),
        (
            lambda d: d["plan"]["target"][4].update(driver="nvidia"),
            "its target (GPUs, containers, mappings, VMs) changed",
        ),
        (lambda d: d["plan"]["actions"].pop(0), "it has 11 step(s), 12 when it was written"),
        (lambda d: d["seal"].update(digest="0" * 64), "its seal does not match itself"),
    ],
    ids=["spec", "state", "node", "target", "a step less", "seal"],
)
def test_an_edit_of_any_part_is_refused_naming_the_part(capsys, sim, spec, tmp_path, change, said):
    out = tmp_path / "plan.json"
    _save(capsys, sim, spec, out)
    assert parse_saved_plan(out.read_text(), str(out)).seal.digest  # as written: whole
    _edit(out, change)
    with pytest.raises(SavedPlanEdited) as e:
        parse_saved_plan(out.read_text(), str(out))
    assert e.value.edits == [said] and e.value.exit_code == 2


def test_show_prints_the_saved_plan_as_plan_printed_it(capsys, sim, spec, tmp_path):
    out = tmp_path / "plan.json"
    printed, _ = _save(capsys, sim, spec, out)
    assert printed.splitlines()[-1].startswith("Summary: 4 rebinds, 1 mapping change")
    code, shown, err = run(capsys, "show", str(out))
    assert code == 0 and err == "" and shown == printed


def test_apply_takes_a_plan_or_a_spec_not_both(capsys, sim, spec, tmp_path):
    code, _, err = run(capsys, "apply", str(tmp_path / "p.json"), "--spec", str(spec), "--sim", str(sim.dir))
    assert code == 2 and "not both" in one_line(err)
    code, _, err = run(capsys, "apply", "--sim", str(sim.dir))
    assert code == 2 and "plan -o FILE" in one_line(err)


# --- the summary line and the step timeouts ---------------------------------------------------------


def test_the_summary_counts_what_changes_and_bounds_the_stop_window_by_the_timeouts(
    sim, spec, restarting_spec
):
    from gputopo.actions import Timeouts
    from gputopo.plan.spec import load_spec
    from gputopo.plan.summary import Measured, summarize
    from gputopo.usecases.readplan import read_and_plan

    ports = sim.ports()
    try:
        _, _, live = read_and_plan(load_spec(spec), ports, str(sim.paths.root))
        _, _, p = read_and_plan(load_spec(restarting_spec), ports, str(sim.paths.root))
    finally:
        ports.close()
    # by default the container keeps running (its devN change live): service stop (exec 60) + the
    # rebinds at once (sysfs 30) + service start (service 900)
    s = summarize(live, Timeouts())
    assert s.counts == {"rebind": 4, "mapping change": 1, "service restart": 1, "boot file": 3}
    assert s.bound_s == 60 + 30 + 900
    s = summarize(p, Timeouts())
    assert s.counts == {
        "rebind": 4,
        "mapping change": 1,
        "guest restart": 1,
        "service restart": 1,
        "boot file": 3,
    }
    # service stop (exec 60) + CT stop (guest 300) + the rebinds at once (sysfs 30) + CT start (300)
    # + service start (service 900); the devN update in between does not wait
    assert s.bound_s == 60 + 300 + 30 + 300 + 900 and s.expected_s is None
    assert s.to_text().startswith(
        "4 rebinds, 1 mapping change, 1 guest restart, 1 service restart, 3 boot files; "
    )
    assert summarize(p, Timeouts(guest=10)).bound_s == 60 + 10 + 30 + 10 + 900
    # the last apply's times: the same step by its text, else its kind's mean; parallel steps once
    rebinds = [a for a in p.actions if a.kind == "rebind"]
    measured = Measured.of(
        [(a.kind, a.describe(), 1.0 + i) for i, a in enumerate(rebinds)]
        + [
            ("stop_guest", "x", 4.0),
            ("start_guest", "y", 6.0),
            ("stop_service", "z", 3.0),
            ("start_service", "w", 20.0),
            ("update_container", "v", 0.5),
        ]
    )
    assert summarize(p, Timeouts(), measured).expected_s == 3.0 + 4.0 + 4.0 + 0.5 + 6.0 + 20.0


def test_plan_prints_the_summary_with_the_last_apply_times(capsys, sim, restarting_spec):
    from gputopo.apply.history import last_measured

    spec = restarting_spec

    code, out, err = run(capsys, "plan", "--sim", str(sim.dir), "--spec", str(spec))
    assert code == 0, err
    assert (
        "length unknown (no apply measured yet), at most 1590 s (the step timeouts)" in out.splitlines()[-1]
    )
    code, _, err = run(capsys, "apply", "--sim", str(sim.dir), "--spec", str(spec), "--yes", "--no-verify")
    assert code == 0, err
    reverse = spec.parent / "r.yaml"
    reverse.write_text(applysim.reverse(spec.read_text()))
    code, out, err = run(capsys, "plan", "--sim", str(sim.dir), "--spec", str(reverse), "--json")
    assert code == 0, err
    summary = json.loads(out)["summary"]
    assert summary["counts"]["rebind"] == 4 and summary["expected_stop_window_s"] is not None
    times = {kind: t for kind, _, t in last_measured(str(sim.paths.root))}
    assert summary["expected_stop_window_s"] >= times["stop_guest"] + times["start_guest"]
    assert "stop window about" in summary["text"]


def test_step_timeouts_come_from_the_spec_and_the_command_line(capsys, sim, restarting_spec, tmp_path):
    spec = restarting_spec
    from gputopo.actions import Timeouts
    from gputopo.apply.estimate import step_timeouts
    from gputopo.cli.params import TIMEOUT_KINDS
    from gputopo.plan.spec import parse_spec

    assert TIMEOUT_KINDS == Timeouts.KINDS
    text = spec.read_text().replace("policy:\n", "policy:\n  timeouts: {service: 100, guest: 50}\n")
    s = parse_spec(text)
    t = step_timeouts(s, (("guest", 5.0), ("sysfs", 7.0)))
    assert (t.guest, t.service, t.sysfs, t.exec) == (5.0, 100.0, 7.0, 60.0)
    code, _, err = run(capsys, "apply", "--sim", str(sim.dir), "--spec", str(spec), "--timeout", "bogus=3")
    assert code == 2 and "'bogus' is not a kind of step" in one_line(err)
    # the values reach the steps: each waiting step shows its own when it begins
    spec.write_text(text)
    code, out, err = run(
        capsys,
        "apply",
        "--sim",
        str(sim.dir),
        "--spec",
        str(spec),
        "--yes",
        "--no-verify",
        "--timeout",
        "service=456",
    )
    assert code == 0, err
    assert re.search(r"^\[ 7/14\] stop    stop CT 101 \.\.\. \(timeout 50 s\)$", out, re.M), out
    assert re.search(r"^\[14/14\] start   CT 101: start sglang.service .* \(timeout 456 s\)$", out, re.M), out
    assert re.search(r"^\[ 8/14\] switch  rebind 0000:81:00.0: .* \(timeout 30 s\)$", out, re.M), out
