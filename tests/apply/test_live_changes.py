"""``container_restart: auto``: where Proxmox allows it, the container keeps running while its GPUs
change, and only its service stops and starts again. Each test reads what runs: when the container
last started (the simulator's record of its boot), the GPUs its own nvidia-smi lists, the command
line of the service's main process, and the devN in its Proxmox config.

* a shrink keeps it running on PVE 8 and 9 (the removed devN wait for its next start);
* a grow hot-plugs the new devN on PVE 9, and restarts the container on PVE 8;
* ``always`` restarts it in every case;
* a live grow that fails rolls back with the container still running and its config as before.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from gputopo.apply import apply
from gputopo.errors import ApplyFailed
from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.plan.spec import parse_spec
from gputopo.sim.container import Container, SimExec
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

T = applysim.FAST_TIMEOUTS
NUMA0 = ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]
NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]


@pytest.fixture
def new_host(template):
    made = []

    def make(pve_version: str | None = None) -> SimHost:
        base = Path(tempfile.mkdtemp(prefix="gputopo-live-", dir=applysim.fast_tmp()))
        if pve_version is None:
            h = applysim.copy_host(template, base / "sim")
        else:
            h = SimHost.create(base / "sim", pve_version=pve_version)
            SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
        made.append((h, base))
        return h

    yield make
    for h, base in made:
        h.stop()
        applysim.cleanup(base)


def _seen(host) -> list[str]:
    """The GPUs the container's own nvidia-smi lists (PCI addresses, sorted)."""
    out = (
        SimExec(host.dir)
        .run(101, ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], 5)
        .stdout
    )
    return sorted(line.strip()[-12:].lower() for line in out.splitlines())


def _tp(host) -> str | None:
    main, _ = applysim.running_service(host.paths.root, 101, "sglang.service")
    m = re.search(r"--tp (\d+)", main or "")
    return m.group(1) if m else None


def _pending_deletes(host) -> list[str]:
    return sorted(parse_lxc_conf(host.paths.lxc_conf(101).read_text()).pending_delete)


def _apply(host, text: str):
    res = apply(parse_spec(text), host.ports(), root=str(host.paths.root), timeouts=T)
    assert res.status == "applied"
    return [a.kind for a in res.plan.actions]


def _grow(text: str) -> str:
    return applysim.reverse(text)


@pytest.mark.parametrize("version", ["8.4.1", "9.1.2"])
def test_a_shrink_keeps_the_container_running(new_host, version):
    host = new_host(version)
    ct = Container(host.dir, 101)
    booted = ct.booted_at()
    assert booted is not None and _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8"
    kinds = _apply(host, applysim.seed_spec_text(host))
    assert "stop_guest" not in kinds and "start_guest" not in kinds
    assert kinds.count("stop_service") == 1 and kinds.count("start_service") == 1
    assert ct.booted_at() == booted  # never restarted
    assert _seen(host) == NUMA0 and _tp(host) == "4"
    # Proxmox keeps the removals pending until the container's next start
    assert _pending_deletes(host) == ["dev4", "dev5", "dev6", "dev7"]


def _always(text: str) -> str:
    return applysim.restarting(text)


def test_a_grow_is_hot_plugged_on_pve9(new_host):
    host = new_host("9.1.2")
    ct = Container(host.dir, 101)
    text = applysim.seed_spec_text(host)
    _apply(host, _always(text))  # the container restarts: its /dev has the NUMA-0 GPUs only
    booted = ct.booted_at()
    assert "/dev/nvidia4" not in ct.devices() and _pending_deletes(host) == []
    kinds = _apply(host, _grow(text))
    assert "stop_guest" not in kinds and "start_guest" not in kinds
    assert ct.booted_at() == booted
    assert {f"/dev/nvidia{m}" for m in range(8)} <= set(ct.devices())  # hot-plugged
    assert _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8"


def test_a_grow_after_a_live_shrink_cancels_the_pending_removals_on_pve9(new_host):
    host = new_host("9.1.2")
    ct = Container(host.dir, 101)
    text = applysim.seed_spec_text(host)
    _apply(host, text)
    booted = ct.booted_at()
    assert _pending_deletes(host) == ["dev4", "dev5", "dev6", "dev7"]
    kinds = _apply(host, _grow(text))
    assert "stop_guest" not in kinds and ct.booted_at() == booted
    assert _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8"
    assert _pending_deletes(host) == []  # the GPUs came back: nothing waits for a restart


def test_a_grow_restarts_the_container_on_pve8(new_host):
    host = new_host()
    assert host.ports().proxmox.version()["version"].startswith("8.")
    ct = Container(host.dir, 101)
    text = applysim.seed_spec_text(host)
    _apply(host, text)
    booted = ct.booted_at()
    kinds = _apply(host, _grow(text))
    # pve-container before 6.x cannot hot-plug a devN: the container stops and starts with them
    assert kinds.count("stop_guest") == 1 and kinds.count("start_guest") == 1
    assert ct.booted_at() != booted
    assert _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8" and _pending_deletes(host) == []


def test_always_restarts_the_container_even_where_it_could_keep_running(new_host):
    host = new_host("9.1.2")
    ct = Container(host.dir, 101)
    booted = ct.booted_at()
    text = _always(applysim.seed_spec_text(host))
    kinds = _apply(host, text)
    assert kinds.count("stop_guest") == 1 and kinds.count("start_guest") == 1
    assert ct.booted_at() != booted
    assert _seen(host) == NUMA0 and _pending_deletes(host) == []  # the restart applied the removals


def test_a_failed_live_grow_rolls_back_with_the_container_still_running(new_host):
    """A hot-plugged devN cannot leave a running container (pve-container's
    vmconfig_hotplug_pending skips every devN delete): the rollback puts the GPUs back on
    vfio-pci and leaves those devN pending removal, which is where a live shrink leaves a
    container too; the container never stops, and its config once the removals apply is the
    one it had."""
    from gputopo.sim.container import break_container
    from gputopo.sim.pveapi.guest_config import apply_pending
    from gputopo.verify import verify

    host = new_host("9.1.2")
    ct = Container(host.dir, 101)
    text = applysim.seed_spec_text(host)
    _apply(host, _always(text))
    booted = ct.booted_at()
    before = applysim.fingerprint(host)
    conf = host.paths.lxc_conf(101).read_text()
    break_container(host.dir, 101, "service_fails", message="CUDA error", tp=8)
    with pytest.raises(ApplyFailed) as e:
        apply(parse_spec(_grow(text)), host.ports(), root=str(host.paths.root), timeouts=T)
    assert e.value.rolled_back
    assert ct.booted_at() == booted
    changed = applysim.diff(before, applysim.fingerprint(host))
    # what differs: the config (the pending removals) and the container's /dev, which keeps the
    # hot-plugged nodes of GPUs that are on vfio-pci again until its next restart
    assert sorted(line.split(":")[0] + ":" + line.split(":")[1] for line in changed) == [
        "ct:/dev",
        "pve:nodes/pve1/lxc/101.conf",
    ], changed
    assert {f"/dev/nvidia{m}" for m in range(4, 8)} <= set(ct.devices())
    assert _pending_deletes(host) == ["dev4", "dev5", "dev6", "dev7"]
    now, was = parse_lxc_conf(host.paths.lxc_conf(101).read_text()), parse_lxc_conf(conf)
    apply_pending(now)
    assert now.options == was.options
    assert _seen(host) == NUMA0 and _tp(host) == "4"
    for a in NUMA1:
        assert (host.paths.root / "sys/bus/pci/devices" / a / "driver").resolve().name == "vfio-pci"
    report = verify(parse_spec(_always(text)), host.ports(), root=str(host.paths.root))
    container = next(c for c in report.checks if c.name == "container")
    assert container.status == "WARN" and "dev4" in container.summary
