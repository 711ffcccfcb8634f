"""Long steps show progress: a step that waits (a guest's shutdown or start task, a service until it
is active, a sysfs write) shows its timeout when it begins and, while it waits, the seconds it has
waited against that timeout; steps that do not wait show neither."""

from __future__ import annotations

import io
import re

import pytest

from gputopo.actions import Timeouts
from gputopo.cli.progress import Plain
from gputopo.usecases.apply import apply
from helpers.applysim import copy_host, seed_spec, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only


@pytest.fixture
def sim(template, tmp_path):
    return copy_host(template, tmp_path / "sim")


def test_waiting_steps_show_elapsed_seconds_against_their_timeout(sim):
    sim.set_latencies(scale=0.1)  # container stop 0.4 s, start 0.6 s, service start 2 s
    out = io.StringIO()
    t = Timeouts(guest=120.0, service=240.0)
    ports = sim.ports()
    try:
        spec = seed_spec(sim)
        spec.policy.container_restart = "always"  # the container's stop and start wait too
        res = apply(spec, ports, root=sim.paths.root, progress=Plain(out, t, every=0.15), timeouts=t)
    finally:
        ports.close()
    assert res.status == "applied"
    text = out.getvalue()
    assert re.search(r"^\[ 7/14\] stop    stop CT 101 \.\.\. \(timeout 120 s\)$", text, re.M), text
    ticks = re.findall(
        r"^\[14/14\] start   CT 101: start sglang.service \(after systemctl daemon-reload\): "
        r"(\d+\.\d) s of 240 s$",
        text,
        re.M,
    )
    assert len(ticks) >= 3 and [float(x) for x in ticks] == sorted(float(x) for x in ticks), text
    assert float(ticks[-1]) <= 3.0
    assert re.search(r"^\[ 7/14\] stop    stop CT 101: \d\.\d s of 120 s$", text, re.M), text
    # steps that do not wait: no timeout, no ticks
    assert re.search(r"^\[ 1/14\] prepare write host file \S+ \(\d+ lines\) \.\.\.$", text, re.M), text
    assert not re.search(r"^\[ 1/14\] .* s of ", text, re.M)
    # the lines come in order: a step's ticks between its begin and its end
    begin = text.index("[14/14] start   CT 101: start sglang.service (after systemctl daemon-reload) ...")
    end = text.index("[14/14] start   CT 101: start sglang.service (after systemctl daemon-reload): done")
    first_tick = text.index(f"{ticks[0]} s of 240 s")
    assert begin < first_tick < end
