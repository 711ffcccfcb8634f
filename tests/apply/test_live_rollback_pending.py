"""A live change that fails and rolls back leaves the container's config, ``[pve:pending]``
included, as it was.

On PVE 9, after a split applied live (the container runs with dev4..dev7, queued for deletion),
giving every GPU back sets dev4..dev7 again: Proxmox cannot hot-plug a devN the running container
already has, so a value that differs waits in ``[pve:pending]``, and a delete leaves it there
(pve-guest-common AbstractConfig.pm add_to_pending_delete); only ``revert`` drops it
(pve-container LXC/Config.pm update_pct_config l. 1306-1309). Left behind, it would hand the
container another guest's GPU at its next start.

A live change on PVE 8 that fails and rolls back leaves no pending change in the container's
config, judged from what the API answers at ``GET .../lxc/{vmid}/pending``. On PVE 8 gputopo
changes a running container only by removing devN (a new one would wait in [pve:pending] until a
restart, so a grow restarts the container instead); the rollback sets them back, and Proxmox's
``cleanup_pending`` drops both the pending value that equals the current one and the pending
delete it replaces, so no ``revert`` is needed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from proxmoxer import ProxmoxAPI

from gputopo.apply.journal import find_unfinished
from gputopo.errors import ApplyFailed
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.container import Container, break_container
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.apply import apply
from helpers import TESTS, applysim

pytestmark = pytest.mark.slow  # applies on a simulated host (seconds)


def _host(version: str):
    base = Path(tempfile.mkdtemp(prefix="gputopo-pve-", dir=applysim.fast_tmp()))
    h = SimHost.create(base / "sim", pve_version=version)
    SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
    yield h
    h.stop()
    applysim.cleanup(base)


@pytest.fixture
def pve8():
    yield from _host("8.4.1")


@pytest.fixture
def pve9():
    yield from _host("9.1.2")


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


T = applysim.FAST_TIMEOUTS
OWN = {f"nvidia{m}" for m in range(4)}  # the minors of CT 101's NUMA-0 GPUs


def _split_live(h: SimHost) -> tuple[str, bytes]:
    """The seed split applied live on ``h``: CT 101 keeps running with dev4..dev7 queued for
    deletion. Returns the spec's text and the container's config file."""
    text = applysim.seed_spec_text(h)
    res = apply(parse_spec(text), h.ports(), root=str(h.paths.root), timeouts=T)
    assert res.status == "applied"
    conf = h.paths.lxc_conf(101).read_bytes()
    assert b"[pve:pending]\ndelete: dev4,dev5,dev6,dev7\n" in conf, conf.decode()
    return text, conf


def _gpu_nodes(ct: Container) -> set[str]:
    return {d.rsplit("/", 1)[-1] for d in ct.devices() if d.rsplit("/", 1)[-1][len("nvidia") :].isdigit()}


def _restart_sees_only_its_own_gpus(h: SimHost) -> None:
    """Stop and start CT 101 through the API: what Proxmox kept pending applies, and the container's
    /dev holds the nodes of its own GPUs only."""
    px = h.ports().proxmox
    px.guest_action("lxc", 101, "shutdown", 30)
    px.guest_action("lxc", 101, "start", 30)
    assert _gpu_nodes(Container(h.dir, 101)) == OWN


def test_a_failed_give_back_on_pve9_reverts_what_it_left_pending(pve9):
    ports = pve9.ports()
    text, conf = _split_live(pve9)
    before = applysim.fingerprint(pve9)
    break_container(pve9.dir, 101, "service_fails", message="CUDA error", tp=8)
    with pytest.raises(ApplyFailed) as e:
        apply(parse_spec(applysim.reverse(text)), ports, root=str(pve9.paths.root), timeouts=T)
    assert e.value.rolled_back and e.value.exit_code == 1, str(e.value)
    assert "start sglang.service" in str(e.value)  # it failed after the live config step
    assert pve9.paths.lxc_conf(101).read_bytes() == conf
    assert applysim.diff(before, applysim.fingerprint(pve9)) == []
    _restart_sees_only_its_own_gpus(pve9)


# which minor each GPU back on nvidia takes (nvidia's lowest free one, in the order they bind):
# the last address first, each devN's new value differs and waits in [pve:pending]; in address
# order each takes its old minor back, and Proxmox's cleanup_pending drops a pending value equal
# to the current one, the pending delete with it (pve-guest-common AbstractConfig.pm
# cleanup_pending): nothing is pending. Both happen on a host, as the parallel binds interleave.
BIND_ORDERS = {
    "last-address-first": {b"dev4": b"7", b"dev5": b"6", b"dev6": b"5", b"dev7": b"4"},
    "address-order": None,
}


@pytest.mark.parametrize("order", BIND_ORDERS)
def test_sigkill_after_the_live_config_step_then_recover_reverts_what_it_left_pending(pve9, order):
    """Killed while the new ``--tp 8`` server loads its model (the config step is done, the
    journal holds the pending section it found): recover puts the config back as it was, its
    pending delete of dev4..dev7 included."""
    text, conf = _split_live(pve9)
    before = applysim.fingerprint(pve9)
    spec = pve9.dir / "give-back.yaml"
    spec.write_text(applysim.reverse(text))
    state.write_state(pve9.paths.run, "latencies", {"service.start": 60.0})
    _bind_in_order(pve9, last_first=order == "last-address-first")
    res = _drive(pve9, "apply", "--spec", str(spec), "--yes", "--no-verify", at="job:1")
    assert res.returncode == -signal.SIGKILL, res.stderr
    conf_now = pve9.paths.lxc_conf(101).read_bytes()
    main, _, pending = conf_now.partition(b"[pve:pending]")
    want = BIND_ORDERS[order]
    if want is None:
        assert not pending, conf_now.decode()
        assert re.findall(rb"^dev[4-7]: /dev/nvidia([4-7]),", main, re.M) == [b"4", b"5", b"6", b"7"]
    else:
        got = dict(re.findall(rb"^(dev[4-7]): /dev/nvidia(\d+),", pending, re.M))
        assert got == want, conf_now.decode()
    state.write_state(pve9.paths.run, "latencies", {})
    rec = _drive(pve9, "recover", "--timeout", "sysfs=5")
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert find_unfinished(pve9.paths.root) is None
    assert pve9.paths.lxc_conf(101).read_bytes() == conf
    assert applysim.diff(before, applysim.fingerprint(pve9)) == []
    _restart_sees_only_its_own_gpus(pve9)


def _bind_in_order(h: SimHost, last_first: bool) -> None:
    """Make the GPUs on vfio-pci bind to nvidia one after another, in address order or the last
    address first, by a longer bind latency for the ones to come later."""
    drivers = h.paths.root / "sys/bus/pci/drivers/vfio-pci"
    gpus = sorted(p.name for p in drivers.iterdir() if p.name.startswith("0000:") and p.name.endswith(".0"))
    assert len(gpus) == 4, gpus
    if last_first:
        gpus.reverse()
    # 10, 20, 30, 40 s of the host's time: 0.1 .. 0.4 s at the tests' time scale
    SimKernel(h.paths.root).configure(
        address_latency={a: {"bind": 10.0 * (i + 1)} for i, a in enumerate(gpus)}
    )


def _drive(h: SimHost, *args: str, at: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUTOPO_CRASH_AT": at}
    return subprocess.run(
        [sys.executable, str(TESTS / "helpers" / "crashdriver.py"), *args, "--sim", str(h.dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
