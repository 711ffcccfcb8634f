"""Apply on the simulated seed host with a udev beside its kernel (helpers.udevfake): the steps
after a rebind start only once udev processed the rebind's events, and a udev that never does
fails the rebind step by name and rolls back."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from gputopo.actions.rebind import Rebind
from gputopo.errors import ApplyFailed
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)
from helpers.udevfake import FakeUdev

pytestmark = pytest.mark.slow  # applies on a simulated host (seconds each)


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-udev-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    yield h
    h.stop()
    applysim.cleanup(base)


def with_udev(h, u: FakeUdev):
    ports = h.ports()
    return dataclasses.replace(ports, sysfs=u.sysfs(ports.sysfs), udev=u)


def test_steps_after_a_rebind_start_once_udev_processed_its_bind(host):
    u = FakeUdev(host.paths.root, delay=0.3)
    res = apply(
        applysim.seed_spec(host),
        with_udev(host, u),
        root=str(host.paths.root),
        timeouts=applysim.FAST_TIMEOUTS,
    )
    assert res.status == "applied"
    rebinds = [i for i, a in enumerate(res.plan.actions) if isinstance(a, Rebind)]
    assert rebinds
    by_index = {s.index: s for s in res.steps}
    last = 0.0
    for i in rebinds:
        step = by_index[i]
        for m in res.plan.actions[i].members:
            # the first bind of m udev broadcast after the step began: the one the step caused
            at = min(
                (at for at, e in u.broadcast if (e.action, e.name) == ("bind", m) and at >= step.started),
                default=None,
            )
            assert at is not None, f"udev never broadcast the bind of {m}"
            assert step.ended >= at, f"step {i + 1} ended before udev processed the bind of {m}"
            last = max(last, at)
    after = min(s.started for s in res.steps if s.index > max(rebinds))
    assert after >= last


def test_udev_late_with_a_gpus_bind_fails_its_rebind_by_name_and_rolls_back(host):
    from gputopo.usecases.readplan import read_and_plan

    before = applysim.fingerprint(host)
    _, _, plan = read_and_plan(applysim.seed_spec(host), host.ports(), str(host.paths.root))
    first = next(a for a in plan.actions if isinstance(a, Rebind))
    u = FakeUdev(host.paths.root)
    # a rule's program runs 0.8 s on the first rebind's bind: past the 0.5 s the step waits, and
    # done before the rollback's own bind of the GPU, which udev processes after it
    u.slow[("bind", first.address)] = 0.8
    timeouts = dataclasses.replace(applysim.FAST_TIMEOUTS, sysfs=0.5)
    with pytest.raises(ApplyFailed) as e:
        apply(applysim.seed_spec(host), with_udev(host, u), root=str(host.paths.root), timeouts=timeouts)
    text = str(e.value)
    assert "\n" not in text and f"bind of {first.address}" in text and "udev did not process" in text, text
    assert e.value.rolled_back and e.value.exit_code == 1, text
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_on_a_host_without_udev_apply_says_so_once_under_debug(host, tmp_path, capsys):
    from gputopo.adapters import udev
    from helpers.cli import run

    udev._said.clear()
    spec = tmp_path / "spec.yaml"
    spec.write_text(applysim.seed_spec_text(host))
    argv = ["--debug", "apply", "--sim", str(host.dir), "--spec", str(spec), "--yes", "--no-verify"]
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    said = [l for l in err.splitlines() if l.startswith("gputopo: debug: ")]
    assert said == [
        "gputopo: debug: no udev events port (a simulated host, or a root that is not /): "
        "moves do not wait for udev"
    ], err
