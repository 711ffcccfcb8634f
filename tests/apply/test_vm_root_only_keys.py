"""An apply through an API token that would set a VM key only root@pam may set (qemu-server's
``only root can set '<key>' config``) is refused when it is planned, before anything stops or
moves, instead of failing at the VM's config step with the switch done and rolling back."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gputopo.errors import PlanRefused
from gputopo.facts.discover import discover
from gputopo.formats.qemuconf import parse_qemu_conf
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import init_spec
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # applies on a simulated host (seconds)

T = applysim.FAST_TIMEOUTS


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-rootonly-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    yield h
    h.stop()
    applysim.cleanup(base)


def spec_text(h, extra: str = "") -> str:
    text = init_spec(discover(str(h.paths.root)), container_mapping="pro6000", vm=201)
    return text.replace("          mapping: pro6000-vm\n", f"          mapping: pro6000-vm\n{extra}")


def vm_text(h) -> str:
    return (h.paths.pve / "nodes/pve1/qemu-server/201.conf").read_text()


def test_a_token_apply_that_would_set_hugepages_is_refused_before_anything_changes(host):
    # the split as root@pam with a password: the VM gets its lines, affinity and MMIO window
    assert apply(parse_spec(spec_text(host)), host.ports(), root=str(host.paths.root), timeouts=T).status == (
        "applied"
    )
    before, conf = applysim.fingerprint(host), vm_text(host)
    assert "hugepages" not in parse_qemu_conf(conf).options
    spec = parse_spec(spec_text(host, "          hugepages: 1024\n"))
    with pytest.raises(PlanRefused) as e:
        apply(spec, host.ports(auth="token"), root=str(host.paths.root), timeouts=T)
    (r,) = e.value.refusals
    assert r.reason.startswith(
        "VM 201: API token root@pam!gputopo may not set hugepages (qemu-server: only root can set "
        "'hugepages' config): log in as root@pam with a password (GPUTOPO_PVE_PASSWORD), run with --local"
    ), r.reason
    assert r.reason.endswith("or use a spec without it (hugepages unset)")
    # nothing ran: the container, its service, the GPUs' drivers and the VM's config are as they were
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert vm_text(host) == conf
    # the same spec as root@pam with a password goes through
    assert apply(spec, host.ports(), root=str(host.paths.root), timeouts=T).status == "applied"
    assert parse_qemu_conf(vm_text(host)).options["hugepages"] == "1024"
