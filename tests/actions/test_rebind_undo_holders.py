"""Rebind's undo never unbinds a GPU that a process holds (nvidia's unbind would block until the
holder lets go): a service of the plan that holds it is stopped first, anything else leaves the
group on nvidia, named, for a human. On the seed host CT 101's ``--tp 8`` server holds all eight
GPUs; the undo of a move to nvidia takes 0000:81:00.0 back to vfio-pci."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gputopo.actions import Rebind
from gputopo.actions.rebind import MemberBefore, RebindBefore
from gputopo.apply import Progress
from gputopo.apply.runner import step_context
from gputopo.facts.discover import discover
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a copy of the simulated seed host each

GPU = "0000:81:00.0"


@pytest.fixture
def seed(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-undo-held-", dir=applysim.fast_tmp()))
    host = applysim.copy_host(template, base / "sim")
    yield host
    host.stop()
    applysim.cleanup(base)


def _undo(host, services: set[tuple[int, str]]):
    root = str(host.paths.root)
    g = discover(root).gpu(GPU)
    members = sorted({GPU, *(m.address for m in g.iommu_members)})
    step = Rebind(
        address=GPU, members=members, from_drivers=dict.fromkeys(members, "vfio-pci"), to_driver="nvidia"
    )
    before = RebindBefore({m: MemberBefore(driver="vfio-pci", override="vfio-pci") for m in members})
    # a short sysfs limit: an unbind that blocked would fail the undo rather than wait
    ctx = step_context(host.ports(), root, applysim.FAST_TIMEOUTS.with_({"sysfs": 1.0}), Progress())
    ctx.services = services
    return step.undo(before, ctx), ctx, members, g.minor


def test_a_service_of_the_plan_that_holds_the_gpu_is_stopped_first(seed):
    assert (
        f"/dev/nvidia{discover(str(seed.paths.root)).gpu(GPU).minor}"
        in applysim.fingerprint(seed)["service"][2]
    )
    what, ctx, members, _ = _undo(seed, {(101, "sglang.service")})
    assert what == f"CT 101: stopped sglang.service (it held {GPU}); rebound {GPU} back to vfio-pci"
    after = applysim.fingerprint(seed)
    assert after["service"][0] == "inactive" and after["service"][2] == []
    assert all(after[f"pci:{m}"][0] == "vfio-pci" for m in members) and not ctx.stuck


def test_a_holder_that_is_not_the_plans_leaves_the_group_on_nvidia(seed):
    what, ctx, members, minor = _undo(seed, set())
    after = applysim.fingerprint(seed)
    assert what.startswith(f"left IOMMU group of {GPU} on nvidia"), what
    # the server's processes, named once by their PIDs, command line and unit
    assert f"of sglang.service in CT 101 hold /dev/nvidia{minor}" in what and what.count("PIDs") == 1, what
    assert what.endswith("stop it, then run 'gputopo recover'"), what
    assert after[f"pci:{GPU}"][0] == "nvidia" and after["service"][0] == "active"
    assert set(members) <= ctx.stuck
