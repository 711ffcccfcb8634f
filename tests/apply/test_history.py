"""``gputopo history``: past applies read from their journals (when, spec hash, outcome, stop
window, rolled back or not), one apply with its steps and timings; an apply whose journal is
still open is shown as such, and plan, diff and verify warn about it."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from gputopo.apply.history import find, history, last_measured
from gputopo.apply.journal import JOURNAL_DIR, Header, Journal
from gputopo.errors import HistoryError
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import copy_host, seed_spec, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only


@pytest.fixture(scope="module")
def applied(template, tmp_path_factory):
    """A seed host split once, then a second apply whose verification failed and was rolled back
    (the reverse split), then an apply that was killed after its header (journal left open)."""
    host = copy_host(template, tmp_path_factory.mktemp("hist") / "sim")
    ports = host.ports()
    try:
        spec = seed_spec(host)
        first = apply(spec, ports, root=host.paths.root, spec_path=None)
        assert first.status == "applied"
        time.sleep(1.1)  # journals are named by the second they began (an apply may take less)
        text = applysim.reverse(seed_spec_text(host))
        from gputopo.model.documents import Check, VerifyReport
        from gputopo.plan.spec import parse_spec

        second = apply(
            parse_spec(text),
            ports,
            root=host.paths.root,
            verify=lambda: VerifyReport(
                checks=[Check(name="converged", status="FAIL", summary="a step left")]
            ),
            rollback_on_verify_failure=True,
        )
        assert second.status == "rolled-back"
    finally:
        ports.close()
    time.sleep(1.1)  # journals are named by the second they began
    Journal.create(
        host.paths.root, Header(pid=os.getpid(), started=time.time(), node="pve1", spec_sha256="ab" * 32)
    )
    return host


def test_history_lists_every_apply_with_its_outcome(capsys, applied):
    recs = history(applied.paths.root)
    assert [r.outcome for r in recs] == ["applied", "rolled-back", "unfinished"]
    first, second, third = recs
    # the seed split keeps its container running (its devN change live): 12 steps, no CT stop/start
    assert not first.rolled_back and first.steps_done == first.steps_total == 12
    assert second.rolled_back and second.reason == "verify" and second.steps_done == second.steps_total
    assert first.stop_window_s is not None and 0 < first.stop_window_s < first.wall_s
    assert third.steps_total == 0 and third.stop_window_s is None
    code, out, err = run(capsys, "history", "--sim", str(applied.dir))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STARTED", "SPEC", "OUTCOME", "STEPS", "STOP", "WINDOW"]
    assert lines[1].startswith(first.id) and " applied " in lines[1] and "12/12" in lines[1]
    assert " rolled-back " in lines[2] and " unfinished " in lines[3] and "abababababab" in lines[3]
    assert f"{first.stop_window_s:.1f} s" in lines[1]


def test_history_show_prints_the_steps_with_their_times(capsys, applied):
    second = history(applied.paths.root)[1]
    code, out, err = run(capsys, "history", "--sim", str(applied.dir), "show", second.id[:-2])
    assert code == 0, err
    assert out.startswith(f"apply {second.id}  node pve1  started ")
    assert "outcome rolled-back (verify)" in out
    steps = [ln for ln in out.splitlines() if re.match(r"^ +\d+\. \[", ln)]
    assert len(steps) == second.steps_total
    assert all(": undo-done" in ln or ": done" in ln for ln in steps)
    assert any(
        ln.strip().startswith("undo: rebound 0000:81:00.0 back to vfio-pci") for ln in out.splitlines()
    )
    code, out, _ = run(capsys, "history", "show", "last", "--sim", str(applied.dir), "--json")
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["outcome"] == "unfinished" and doc["steps"] == []


def test_an_id_that_names_no_apply_or_several_is_refused(capsys, applied):
    code, _, err = run(capsys, "history", "--sim", str(applied.dir), "show", "1999")
    assert (
        code == 2 and one_line(err) == "gputopo: error: 1999: no apply with this id (see 'gputopo history')"
    )
    with pytest.raises(HistoryError, match="names 3 applies"):
        find(applied.paths.root, "2")


def test_the_last_applied_times_feed_the_plan_summary(applied):
    times = last_measured(applied.paths.root)
    assert len(times) == 12 and {k for k, _, _ in times} >= {"rebind", "update_container", "start_service"}
    assert "stop_guest" not in {
        k for k, _, _ in times
    }  # the rolled-back second apply's are not the last applied
    assert all(s >= 0 for _, _, s in times)


def test_plan_diff_and_verify_warn_while_an_apply_is_unfinished(capsys, applied, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(seed_spec_text(applied))
    for argv in (["plan"], ["diff"], ["verify"]):
        code, _, err = run(capsys, *argv, "--sim", str(applied.dir), "--spec", str(spec))
        warning = [
            ln for ln in err.splitlines() if ln.startswith("gputopo: warning: an apply did not finish: ")
        ]
        assert len(warning) == 1, (argv, err)
        assert "run 'gputopo recover'" in warning[0], argv


def test_which_journal_a_recover_settles_and_the_node_it_acts_on(tmp_path):
    from gputopo.apply.history import recover_node, settled_journal, unfinished_warning
    from gputopo.apply.journal import End, Recover

    assert recover_node(tmp_path, "pve1") == "pve1" and settled_journal(tmp_path) is None
    assert unfinished_warning(tmp_path) is None
    j = Journal.create(tmp_path, Header(pid=1, started=1.0e9, node="pve2"))
    assert recover_node(tmp_path, "pve1") == "pve2"  # the node the open journal's apply changed
    assert settled_journal(tmp_path) == str(j.path)  # open: the one a recover is to settle
    assert unfinished_warning(tmp_path).startswith(f"an apply did not finish: {j.path} (pid 1, ")
    j.append(Recover(mode="rollback", pid=os.getpid()))
    j.append(End(result="rolled-back"))
    assert settled_journal(tmp_path) == str(j.path)  # closed, by this process's recover
    assert settled_journal(tmp_path, pid=os.getpid() + 1) is None
    assert recover_node(tmp_path, "pve1") == "pve1" and unfinished_warning(tmp_path) is None
    (tmp_path / JOURNAL_DIR / "29990101T000000Z-1.jsonl").write_bytes(b"\xff\n")
    assert unfinished_warning(tmp_path).startswith(f"cannot read the apply journals under {tmp_path} (")
