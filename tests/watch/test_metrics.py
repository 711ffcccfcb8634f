"""The metrics of a watch pass in each state (built from results, no host): which series exist,
their values, the textfile written in one step, and promtool's verdict on every form of it."""

from __future__ import annotations

import os
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputopo.errors import OutputError
from gputopo.model.documents import FAIL, PASS, SKIP, WARN, Check
from gputopo.watch.metrics import OUTCOMES, TEXTFILE, exposition, text, textfile_path, write_textfile
from gputopo.watch.run import LastApply, WatchResult
from helpers import REPO, promtool

T = 1_800_000_000.0


def _check(name: str, status: str) -> Check:
    return Check(name=name, status=status, summary=f"{name} {status}")


CLEAN = WatchResult(
    time=T,
    seconds=0.8,
    node="pve1",
    drift={"spec": False, "driver_bindings": False, "mappings": False},
    checks={
        "converged": _check("converged", PASS),
        "vm": _check("vm", WARN),
        "memory": _check("memory", SKIP),
    },
    owners={"0000:01:00.0": "container:101", "0000:81:00.0": "vm:pro6000-vm"},
    last_apply=LastApply(id="20261202T000000Z-1", outcome="rolled-back", ended=T - 60),
)
DRIFTED = CLEAN.model_copy(
    update={
        "drift": {"spec": False, "driver_bindings": True, "mappings": False},
        "checks": {"vm": _check("vm", FAIL)},
    }
)
LOCKED = WatchResult(time=T, apply_in_progress=True, lock_holder="pid 7 (gputopo apply)", last_apply=None)
DOWN = WatchResult(time=T, up=False, error="/etc/gputopo/spec.yaml: cannot read: No such file", error_code=2)
CAPACITY = CLEAN.model_copy(
    update={
        "checks": {
            "capacity": Check(
                name="capacity",
                status=PASS,
                summary="CT 101: qwen3 at tp 4",
                details={
                    "tolerance_pct": 20.0,
                    "101": {
                        "model": "qwen3",
                        "tp": 4,
                        "predicted_weights_gib": 55.0,
                        "predicted_kv_tokens": 1200000,
                        "reported_kv_tokens": None,
                        "kv_diff_pct": None,
                        "predicted_used_mib": 84070,
                        "reported_used_mib": 79043,
                        "used_diff_pct": -6.0,
                    },
                },
            )
        }
    }
)
STATES = {"clean": CLEAN, "drifted": DRIFTED, "locked": LOCKED, "down": DOWN, "capacity": CAPACITY}


def series(result: WatchResult) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(exposition(result)):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.values()))] = s.value
    return out


def test_a_clean_pass():
    m = series(CLEAN)
    assert m["gputopo_watch_up"] == {(): 1} and m["gputopo_apply_in_progress"] == {(): 0}
    assert m["gputopo_watch_last_run_timestamp_seconds"] == {(): T}
    assert m["gputopo_drift"] == {("spec",): 0, ("driver_bindings",): 0, ("mappings",): 0}
    # WARN passes (as verify's exit code has it without --strict); a check that did not run has no series
    assert m["gputopo_check"] == {("converged",): 1, ("vm",): 1}
    assert m["gputopo_gpu_owner"] == {
        ("0000:01:00.0", "container:101"): 1,
        ("0000:81:00.0", "vm:pro6000-vm"): 1,
    }
    assert m["gputopo_gpus"] == {(): 2}
    assert m["gputopo_last_apply_timestamp_seconds"] == {(): T - 60}
    outcome = m["gputopo_last_apply_outcome"]
    assert (
        set(outcome) == {(o,) for o in OUTCOMES}
        and outcome[("rolled-back",)] == 1
        and sum(outcome.values()) == 1
    )


def test_drift_and_a_failing_check_are_1_and_0():
    m = series(DRIFTED)
    assert m["gputopo_drift"][("driver_bindings",)] == 1 and m["gputopo_check"] == {("vm",): 0}


def test_the_capacity_checks_figures_are_series_per_container():
    m = series(CAPACITY)
    assert m["gputopo_capacity_weights_bytes"] == {("101", "qwen3"): 55.0 * (1 << 30)}
    assert m["gputopo_capacity_kv_tokens"] == {("101", "qwen3"): 1200000}
    assert m["gputopo_capacity_memory_diff_ratio"] == {("101", "qwen3"): -0.06}
    assert "gputopo_capacity_kv_tokens" not in series(CLEAN)  # no capacity check: no series


def test_an_apply_in_progress_has_no_drift_check_or_owner_series():
    m = series(LOCKED)
    assert m["gputopo_apply_in_progress"] == {(): 1} and m["gputopo_watch_up"] == {(): 1}
    assert not {"gputopo_drift", "gputopo_check", "gputopo_gpu_owner", "gputopo_gpus"} & set(m)
    assert "gputopo_last_apply_outcome" not in m  # no apply recorded


def test_a_pass_that_could_not_read_says_up_0_and_nothing_else_about_the_host():
    m = series(DOWN)
    assert m["gputopo_watch_up"] == {(): 0}
    assert not {"gputopo_drift", "gputopo_check", "gputopo_gpu_owner"} & set(m)
    assert "not checked: /etc/gputopo/spec.yaml" in text(DOWN)


@pytest.mark.parametrize("state", sorted(STATES))
def test_promtool_accepts_each_form(state):
    got = promtool.check_metrics(exposition(STATES[state]))
    assert got.returncode == 0, got.stdout + got.stderr


def test_promtool_does_reject_a_metric_against_the_conventions():
    """The check above can fail: a counter without _total is what promtool reports."""
    got = promtool.check_metrics("# HELP gputopo_x x\n# TYPE gputopo_x counter\ngputopo_x 1\n")
    assert got.returncode != 0 and "_total" in got.stdout + got.stderr


def test_the_textfile_is_replaced_in_one_step(tmp_path, monkeypatch):
    path = textfile_path("/", str(tmp_path))
    assert path == tmp_path / TEXTFILE
    path.write_text("old\n")
    replaced = []
    for name in ("rename", "replace"):  # either moves the finished file into place
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda a, b, real=real: (replaced.append((a, b)), real(a, b)))
    write_textfile(CLEAN, path)
    ((tmp, dest),) = replaced
    assert dest == str(path) and os.path.dirname(tmp) == str(tmp_path) and not tmp.endswith(".prom")
    assert path.read_text() == exposition(CLEAN)
    assert sorted(p.name for p in tmp_path.iterdir()) == [TEXTFILE]


def test_the_default_directory_is_node_exporters_under_the_root(tmp_path):
    d = tmp_path / "var/lib/prometheus/node-exporter"
    with pytest.raises(OutputError, match="is prometheus-node-exporter installed"):
        textfile_path(tmp_path)
    d.mkdir(parents=True)
    assert textfile_path(tmp_path) == d / TEXTFILE
    assert textfile_path(tmp_path, file=str(tmp_path / "x.prom")) == tmp_path / "x.prom"


def test_the_docs_metric_table_names_every_drift_area_and_check_the_watch_emits():
    """docs/watch.md's table lists every ``area`` of gputopo_drift (diff's areas, and ``spec``)
    and every ``check`` of gputopo_check, as the code emits them."""
    from gputopo.plan.diff import AREAS
    from gputopo.watch.run import QUICK_CHECKS, SPEC_AREA

    rows = {}
    for line in (REPO / "docs" / "watch.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`gputopo_"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([\w-]+)`", cells[1]))
    areas = {a.replace(" ", "_") for a in AREAS} | {SPEC_AREA}
    assert areas - rows["gputopo_drift"] == set()
    assert set(QUICK_CHECKS) - rows["gputopo_check"] == set()
