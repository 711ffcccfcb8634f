"""A live change on PVE 8 that fails and rolls back leaves no pending change in the container's
config, judged from what the API answers at ``GET .../lxc/{vmid}/pending``. On PVE 8 gputopo
changes a running container only by removing devN (a new one would wait in [pve:pending] until a
restart, so a grow restarts the container instead); the rollback sets them back, and Proxmox's
``cleanup_pending`` drops both the pending value that equals the current one and the pending
delete it replaces, so no ``revert`` is needed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from proxmoxer import ProxmoxAPI

from gputopo.errors import ApplyFailed
from gputopo.plan.spec import parse_spec
from gputopo.sim.container import Container, break_container
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.apply import apply
from helpers import applysim

pytestmark = pytest.mark.slow  # applies on a simulated host (seconds)


@pytest.fixture
def pve8():
    base = Path(tempfile.mkdtemp(prefix="gputopo-pve8-", dir=applysim.fast_tmp()))
    h = SimHost.create(base / "sim", pve_version="8.4.1")
    SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
    yield h
    h.stop()
    applysim.cleanup(base)


def pending(h: SimHost) -> list[dict]:
    c = h.credentials()
    api = ProxmoxAPI(
        "127.0.0.1",
        port=h.api.port,
        user=c["user"],
        password=c["password"],
        verify_ssl=str(h.api.ca_cert_path),
    )
    return api.nodes("pve1").lxc(101).pending.get()


def test_a_failed_live_shrink_on_pve8_leaves_nothing_pending(pve8):
    ports = pve8.ports()  # starts the simulated API
    ct = Container(pve8.dir, 101)
    booted = ct.booted_at()
    before = applysim.fingerprint(pve8)
    assert [i for i in pending(pve8) if "pending" in i or "delete" in i] == []
    break_container(pve8.dir, 101, "service_fails", message="CUDA error", tp=4)
    with pytest.raises(ApplyFailed) as e:
        apply(
            parse_spec(applysim.seed_spec_text(pve8)),
            ports,
            root=str(pve8.paths.root),
            timeouts=applysim.FAST_TIMEOUTS,
        )
    assert e.value.rolled_back, str(e.value)
    assert "start sglang.service" in str(e.value)  # it failed after the live config step
    assert ct.booted_at() == booted  # the change was live: the container never restarted
    items = {i["key"]: i for i in pending(pve8)}
    assert [i for i in items.values() if "pending" in i or "delete" in i] == []
    assert {f"dev{n}" for n in range(8)} <= set(items)
    assert applysim.diff(before, applysim.fingerprint(pve8)) == []
