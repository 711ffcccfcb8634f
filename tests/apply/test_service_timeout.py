"""The service timeout an operator sets is the one a start waits: a model that loads for longer
fails its step when that timeout passes, not when a blocking command's exec limit would end it,
and the rollback follows."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from gputopo.apply.journal import Begin, Failed, list_journals, parse_journal
from gputopo.errors import ApplyFailed
from gputopo.sim.container import SimExec, break_container
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)
from helpers.cli import run

pytestmark = pytest.mark.slow  # applies on a simulated host (seconds)

LOAD_S = 30.0  # the new configuration's model load
TIMEOUT_S = 0.6  # the service timeout the operator set


def test_a_start_slower_than_the_service_timeout_fails_at_that_timeout_and_rolls_back(host):
    before = applysim.fingerprint(host)
    # the split's service (--tp 4) loads for 30 s; the old one (--tp 8) starts again at once
    break_container(host.dir, 101, "slow_start", seconds=LOAD_S, tp=4)
    timeouts = dataclasses.replace(applysim.FAST_TIMEOUTS, service=TIMEOUT_S)
    ports = host.ports()
    t0 = time.monotonic()
    try:
        with pytest.raises(ApplyFailed) as err:
            apply(applysim.seed_spec(host), ports, root=str(host.paths.root), timeouts=timeouts)
    finally:
        ports.close()
    took = time.monotonic() - t0
    assert "start sglang.service" in str(err.value)
    assert f"still activating after {TIMEOUT_S:g} s (the service timeout)" in str(err.value)
    assert err.value.exit_code == 1  # rolled back completely
    assert took < LOAD_S / 2  # the apply never waited for the load

    # the step itself waited its timeout, not less and not much more (the journal's clock)
    records = parse_journal(list_journals(str(host.paths.root))[-1].read_text())
    failed = next(r for r in records if isinstance(r, Failed))
    begun = next(r for r in records if isinstance(r, Begin) and r.step == failed.step)
    assert begun.action.kind == "start_service"
    assert TIMEOUT_S <= failed.t - begun.t < TIMEOUT_S + 2.0

    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_a_timed_out_start_of_a_service_that_was_stopped_is_stopped_by_the_rollback(host):
    # the service was not running before: its start's undo must end the load still under way
    SimExec(host.dir).run(101, ["systemctl", "stop", "sglang.service"], timeout=5)
    before = applysim.fingerprint(host)
    break_container(host.dir, 101, "slow_start", seconds=LOAD_S, tp=4)
    timeouts = dataclasses.replace(applysim.FAST_TIMEOUTS, service=TIMEOUT_S)
    ports = host.ports()
    try:
        with pytest.raises(ApplyFailed, match="the service timeout"):
            apply(applysim.seed_spec(host), ports, root=str(host.paths.root), timeouts=timeouts)
    finally:
        ports.close()
    after = applysim.fingerprint(host)
    assert after["service"] == ("inactive", None, [])  # nothing left loading, no GPU held
    assert applysim.diff(before, after) == []


def test_the_command_line_timeout_is_the_one_shown_and_the_one_waited(host, capsys, tmp_path):
    spec = tmp_path / "split.yaml"
    spec.write_text(applysim.seed_spec_text(host))
    break_container(host.dir, 101, "slow_start", seconds=LOAD_S, tp=4)
    t0 = time.monotonic()
    code, out, err = run(
        capsys, "apply", "--sim", str(host.dir), "--spec", str(spec), "--yes", "--no-verify",
        "--timeout", "service=1",
    )  # fmt: skip
    took = time.monotonic() - t0
    assert code == 1, err
    shown = out + err
    assert re.search(r"start sglang\.service \(after systemctl daemon-reload\) \.\.\. \(timeout 1 s\)", shown)
    assert "sglang.service is still activating after 1 s (the service timeout)" in shown
    assert took < LOAD_S / 2
