"""Apply on the simulated seed host when Proxmox's tasks behave as a real node's do: a container
start that ends ``WARNINGS: 1`` is a success whose warning is shown (output, ``--json``,
journal), a container slower to shut down than its timeout is stopped by force only where the
spec allows it, and a task that never ends is a timeout naming the guest and the limit."""

from __future__ import annotations

import json
import re

import pytest

from gputopo.apply import Timeouts
from gputopo.apply.journal import Done, Journal
from gputopo.errors import ApplyFailed, TaskTimeout
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.container.distro import lsb_release
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)
from helpers.cli import run

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

UBUNTU_WARNING = (
    "The container's Ubuntu version '27.04' is not in the known version list. As it's newer than "
    "the minimum supported version it's likely to work OK, but full compatibility cannot be "
    "guaranteed. Please check for PVE system updates."
)


def _restarting(text: str) -> str:
    """The seed spec with ``policy.container_restart: always``: by default the seed split keeps the
    container running (its GPUs only leave for vfio-pci), so its stop and start tasks would not run."""
    return applysim.restarting(text)


def _latencies(host, **lat) -> None:
    cur = state.read_state(host.paths.run, "latencies", {}) or {}
    state.write_state(host.paths.run, "latencies", {**cur, **lat})


def test_a_container_start_that_warns_is_applied_and_its_warning_shown(capsys, host):
    (host.paths.rootfs(101) / "etc/lsb-release").write_text(lsb_release("27.04"))
    spec = host.dir / "spec.yaml"
    spec.write_text(_restarting(applysim.seed_spec_text(host)))
    code, out, err = run(
        capsys, "apply", "--sim", str(host.dir), "--spec", str(spec), "--yes", "--json", "--no-verify"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "applied"
    (start,) = [s for s in result["steps"] if s["description"] == "start CT 101"]
    assert start["status"] == "done" and start["warnings"] == [f"CT 101 start: {UBUNTU_WARNING}"]
    assert result["warnings"] == [f"step {start['step']}: CT 101 start: {UBUNTU_WARNING}"]
    # the progress (on stderr with --json) shows it after the step
    assert f"step {start['step']}: warning: CT 101 start: {UBUNTU_WARNING}" in err.splitlines()
    done = [r for r in Journal.load(result["journal"]).records if isinstance(r, Done) and r.warnings]
    assert [(r.step + 1, r.warnings) for r in done] == [(start["step"], start["warnings"])]
    assert applysim.fingerprint(host)["service"][0] == "active"


def test_a_container_slow_to_shut_down_is_stopped_by_force_where_the_spec_allows_it(host):
    _latencies(host, **{"vzshutdown:101": 30.0})  # it would take 30 s to go down
    text = _restarting(applysim.seed_spec_text(host)).replace("shutdown_timeout: 60", "shutdown_timeout: 1")
    spec = parse_spec(text.replace("force_stop: false", "force_stop: true"))
    res = apply(spec, host.ports(), root=str(host.paths.root))
    assert res.status == "applied"
    (stop,) = [s for s in res.steps if s.text.startswith("stop CT 101")]
    assert stop.text == "stop CT 101 (force-stop after 1 s)" and 1.0 <= stop.seconds < 10
    assert stop.warnings == [
        "CT 101 did not shut down within 1 s; Proxmox stopped it by force (policy.force_stop)"
    ]
    assert applysim.fingerprint(host)["service"][0] == "active"


def test_without_force_a_container_that_does_not_shut_down_fails_the_step_and_rolls_back(host):
    # Proxmox's clock ten times faster: the 1 s timeout and the 1 + 5 s of polling after it
    _latencies(host, **{"vzshutdown:101": 30.0, "second": 0.1})
    before = applysim.fingerprint(host)
    spec = parse_spec(
        _restarting(applysim.seed_spec_text(host)).replace("shutdown_timeout: 60", "shutdown_timeout: 1")
    )
    with pytest.raises(ApplyFailed) as ei:
        apply(spec, host.ports(), root=str(host.paths.root))
    e = ei.value
    assert e.rolled_back and e.exit_code == 1
    assert re.fullmatch(
        r"apply failed at step \d+ \(stop CT 101\): CT 101 shutdown: failed: container did not stop "
        r"\(task UPID:pve1:[0-9A-F:]+:vzshutdown:101:root@pam:\); rolled back",
        str(e),
    ), str(e)
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_a_start_task_that_never_finishes_is_a_timeout_naming_the_guest_and_the_limit(host):
    _latencies(host, vzstart=3600.0)
    spec = parse_spec(_restarting(applysim.seed_spec_text(host)))
    with pytest.raises(ApplyFailed) as ei:
        apply(spec, host.ports(), root=str(host.paths.root), timeouts=Timeouts(guest=1.0))
    cause = ei.value.cause
    assert isinstance(cause, TaskTimeout) and cause.limit == 1.0 and cause.what == "CT 101 start"
    assert re.search(
        r"\(start CT 101\): CT 101 start: task UPID:pve1:\S+:vzstart:101:root@pam: did not finish "
        r"within 1 s \(the step's limit\)",
        str(ei.value),
    ), str(ei.value)
    assert "None" not in str(ei.value)
