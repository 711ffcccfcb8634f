"""The contract every action kind keeps, checked for every kind the registry holds.

For each kind in :func:`gputopo.actions.action_kinds` a real instance is taken from a real plan
(the seed host's split, or its reverse on a host that applied the split) and run on a simulated
host in the state an apply leaves it right before that step (the plan's earlier steps done;
:class:`Case` says where a case does fewer). Then:

1. ``describe()`` is one non-empty line;
2. its before-state (the kind's typed ``Before``) survives the journal: written by
   :class:`gputopo.apply.journal.Journal` as apply writes it, read back from the file, equal;
3. doing twice equals doing once: the host after ``do(); do()`` is the host after ``do()``, as
   :func:`host_view` shows it (drivers, files and modes, Proxmox's configs and mappings through
   the API, guests, the service and what it runs, the container's ``/dev``), and ``do()``
   changed something;
4. ``expect()`` matches the simulator: the facts and state read before the step, changed by
   ``expect``, equal the facts and state read from the host after ``do()``;
5. undo restores: the rollback of the journaled step (``undo`` from the journaled before-state,
   then the restart of what ran before, as :meth:`gputopo.apply.runner.Runner.backward` does)
   gives back the host of before ``do()``, and a second ``undo`` changes nothing; an undo that
   changed something declares what it restores (``undo_restores()``, the rollback's order);
6. its commands (``plan --commands``): a kind defines ``commands`` and ``undo_commands`` of its
   own, a step whose ``do()`` changed the host has commands, and they and the undo's are valid
   shell (``bash -n``). That they reach what ``do()`` reaches is
   ``tests/cli/test_plan_commands.py``'s, on whole plans.

A kind registered without a case here fails its own parameter (and the coverage test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gputopo.actions import ActionModel, World, action_kinds
from gputopo.actions.shell import CommandContext
from gputopo.apply import Progress
from gputopo.apply.journal import Begin, Done, Header, Journal, UndoDone
from gputopo.apply.runner import Runner, running_before_of, step_context
from gputopo.facts.ha import read_ha
from gputopo.facts.observe import observe
from gputopo.formats.mapline import normalize_map_entry
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState, HaConfig
from gputopo.plan.planner import plan as make_plan
from gputopo.plan.reads import spec_reads
from gputopo.plan.spec import Spec, parse_spec
from gputopo.sim.cluster import SimCluster
from gputopo.sim.host import SimHost
from gputopo.usecases.apply import apply
from helpers import applysim, clusterharness
from helpers.applysim import template  # noqa: F401 (fixtures)

VM_CONSUMER = (
    "      consumers:\n        - {vmid: 201, mapping: pro6000-vm, gpus: 4, when_gpus_leave: remove}\n"
)


def split(text: str) -> str:
    """The seed host's split as ``gputopo init`` writes it (the container keeps running)."""
    return text


def split_with_vm(text: str) -> str:
    """The split with VM 201 consuming the VM mapping: the plan configures the VM too."""
    out = text.replace("      guests: []\n", "      guests: []\n" + VM_CONSUMER, 1)
    assert out != text, "the seed spec no longer lists 'guests: []' under vms"
    return out


def split_restarting(text: str) -> str:
    """The split with ``container_restart: always``: the container is stopped and started."""
    return applysim.restarting(text)


def reverse(text: str) -> str:
    """The container takes every GPU back (planned on a host that applied the split)."""
    return applysim.reverse(text)


def cluster_split(text: str) -> str:
    """Not a host's spec: the ``cluster`` host plans the cluster's split (see :func:`pve1_applied`)."""
    return text


@dataclass(frozen=True)
class Case:
    """Where one instance of a kind comes from: the host (the seed, or the seed after applying
    the split), the spec planned on it, which of the plan's steps of that kind (the first one
    ``where`` accepts), and which earlier steps run before it (``setup``)."""

    kind: str
    spec: Callable[[str], str]
    host: str = "seed"  # seed | applied | cluster (node pve2 of a cluster where pve1 applied the split)
    where: Callable[[ActionModel], bool] = field(default=lambda a: True)
    name: str = ""
    # the kinds of the plan's earlier steps done first (None: every earlier step, the host as
    # apply leaves it right before this one); fewer where a one-step rollback cannot give that
    # host back (see CASES)
    setup: tuple[str, ...] | None = None

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.name}" if self.name else self.kind


CASES: list[Case] = [
    Case("write_host_file", split),
    Case("set_mapping", split),
    Case("write_service_dropin", split),
    # a rollback's restart reloads systemd: a drop-in written but not yet loaded would not
    # survive it, so the service stops from the unit it runs now
    Case("stop_service", split, setup=()),
    # the service stopped first: it holds the GPU's /dev/nvidia node (the drop-in: as above)
    Case("rebind", split, name="to-vfio", setup=("stop_service",)),
    # with the devices still on nvidia: Proxmox refuses to put back a devN whose node is gone,
    # which a rollback avoids by rebinding the GPUs first
    Case("update_container", split, name="live-delete", setup=()),
    Case("update_vm_config", split_with_vm),
    # the drop-in written and the service stopped: the start loads the new drop-in
    Case("start_service", split, setup=("write_service_dropin", "stop_service")),
    # a container's start starts its service: the service must run before the container stops
    Case("stop_guest", split_restarting, setup=()),
    Case("start_guest", split_restarting),
    Case("remove_host_file", reverse, host="applied"),
    Case("delete_mapping", reverse, host="applied"),
    Case("rebind", reverse, host="applied", where=lambda a: a.to_driver == "nvidia", name="to-nvidia"),
    Case("update_container", reverse, host="applied", where=lambda a: bool(a.resolve), name="resolve"),
    # pve2's lines join pve1's in the VM mapping: the cluster's VMs using it may now run on both
    Case("ha_placement", cluster_split, host="cluster"),
]


def _params() -> list[Any]:
    """One parameter per case, and one (kind, None) per registered kind without a case."""
    out = [pytest.param(c.kind, c, id=c.id) for c in CASES]
    covered = {c.kind for c in CASES}
    out += [pytest.param(k, None, id=f"{k}-no-case") for k in action_kinds() if k not in covered]
    return out


def test_every_registered_kind_has_a_case():
    assert {c.kind for c in CASES} == set(action_kinds())


# --- hosts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(action_kinds()))
def test_every_kind_says_its_commands_and_their_undo(kind: str):
    cls = action_kinds()[kind]
    for name in ("commands", "undo_commands"):
        assert getattr(cls, name) is not getattr(ActionModel, name), f"{kind} has no {name}() of its own"


def _shell_ok(commands: list[str]) -> None:
    """Assert ``commands`` parse as bash (``bash -n``), naming the first that does not."""
    for c in commands:
        res = subprocess.run(["bash", "-n"], input=c + "\n", capture_output=True, text=True)
        assert res.returncode == 0, f"not valid shell: {c}\n{res.stderr}"


@pytest.fixture(scope="module")
def applied(template):
    """A copy of the seed host that applied the seed split (the reverse plan's starting point)."""
    base = Path(tempfile.mkdtemp(prefix="gputopo-contract-applied-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    try:
        res = apply(
            parse_spec(applysim.seed_spec_text(h)),
            h.ports(),
            root=str(h.paths.root),
            timeouts=applysim.FAST_TIMEOUTS,
        )
        assert res.status == "applied"
    finally:
        h.stop()
    yield base / "sim"
    applysim.cleanup(base)


@pytest.fixture(scope="module")
def pve1_applied():
    """A three-node PVE 8 cluster whose node pve1 applied the cluster's split (pve1 and pve2 give
    NUMA 1 to the VM mapping, pve3 keeps its GPUs), and that split's spec text."""
    d = clusterharness.make_template()
    cluster = SimCluster(d)
    text = clusterharness.spec_text(cluster, split=["pve1", "pve2"], whole=["pve3"])
    spec = d.parent / "spec.yaml"
    spec.write_text(text)
    res = subprocess.run(
        [sys.executable, "-m", "gputopo", "cluster", "apply", "--yes", "--no-verify", "--nodes", "pve1"]
        + ["--sim", str(d), "--spec", str(spec)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    yield d, text
    applysim.cleanup(d.parent)


@pytest.fixture
def work():
    """A scratch directory on tmpfs for one case's host copy and journal."""
    base = Path(tempfile.mkdtemp(prefix="gputopo-contract-", dir=applysim.fast_tmp()))
    yield base
    applysim.cleanup(base)


# --- what the host shows ---------------------------------------------------------------------


def read_state(host: SimHost, spec: Spec, ports: Any) -> tuple[Facts, CurrentState]:
    """The facts and the current state, read from the host as apply reads them."""
    return tuple(
        observe(
            str(host.paths.root),
            spec_reads(spec, None),
            proxmox=ports.proxmox,
            exec=ports.exec,
            files=ports.files,
            cluster=ports.cluster,
        )
    )


def host_view(host: SimHost, ports: Any) -> dict[str, Any]:
    """What the host shows, as comparable data: :func:`applysim.fingerprint` (drivers, device
    nodes, host and container files with their modes, guest states, what the service runs, the
    container's ``/dev``), with Proxmox's configs and mappings as the API answers them instead of
    its files' bytes (a change kept pending and one made at once read the same there)."""
    out = {k: v for k, v in applysim.fingerprint(host, host.container).items() if not k.startswith("pve:")}
    px = ports.proxmox
    for g in px.list_guests("lxc"):
        out[f"api:lxc/{g['vmid']}"] = _config(px.lxc_config(int(g["vmid"])))
    for g in px.list_guests("qemu"):
        out[f"api:qemu/{g['vmid']}"] = _config(px.qemu_config(int(g["vmid"])))
    for m in px.mappings():
        out[f"api:mapping/{m['id']}"] = (list(m.get("map") or []), m.get("description"))
    if len(px.nodes()) > 1:  # a cluster's HA placement, as the API lists it
        out.update(ha_view(read_ha(ports.cluster)))
    return out


def ha_view(config: HaConfig | None) -> dict[str, Any]:
    """HA rules, groups and each resource's group as comparable data (no digests)."""
    if config is None:
        return {}
    out: dict[str, Any] = {}
    for r in config.rules:
        out[f"ha:rule/{r['rule']}"] = {
            k: str(v) for k, v in r.items() if k not in ("digest", "order", "rule")
        }
    for g in config.groups:
        out[f"ha:group/{g['group']}"] = {k: str(v) for k, v in g.items() if k not in ("digest", "group")}
    for sid, r in config.resources.items():
        out[f"ha:resource/{sid}"] = r.get("group")
    return out


def _config(cfg: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in cfg.items() if k != "digest"}


def view(facts: Facts, current: CurrentState, services: set[int]) -> dict[str, Any]:
    """What ``expect`` claims about a host, as comparable data: every GPU's and group member's
    driver, override and minor; containers, VMs and mappings without digests (a digest is the
    file's, which ``expect`` cannot know); the persistence files; and the services of
    ``services`` (a stopped container's service cannot be read, so it is compared only where the
    expectation holds one in a running container)."""
    out: dict[str, Any] = {}
    for g in facts.gpus:
        out[f"gpu:{g.address}"] = (
            g.driver,
            g.driver_override,
            g.minor,
            sorted((m.address, m.driver) for m in g.iommu_members),
        )
    for vmid, ct in current.containers.items():
        out[f"ct:{vmid}"] = (ct.status, _config(ct.config))
        if vmid in services:
            out[f"ct:{vmid}:service"] = ct.service.model_dump() if ct.service else None
    for vmid, g in current.guests.items():
        out[f"vm:{vmid}"] = (g.status, list(g.hostpci), _config(g.config))
    for mid, m in current.mappings.items():
        out[f"mapping:{mid}"] = (sorted(map(normalize_map_entry, m.map)), m.description)
    for path, text in current.files.items():
        out[f"file:{path}"] = text
    out.update(ha_view(current.ha_config))
    return out


def unchanged(a: dict[str, Any], b: dict[str, Any], what: str) -> None:
    """Assert two views of a host are equal; the message lists every difference."""
    d = applysim.diff(a, b)
    assert d == [], what + ":\n" + "\n".join(d)


def _journal_round_trip(where: Path, a: ActionModel, before: Any) -> tuple[Journal, Any]:
    """Journal ``a`` begun with ``before`` as apply does, read the file back; (journal, step)."""
    j = Journal.create(where, Header(pid=os.getpid(), started=time.time(), actions=[a]))
    j.append(Begin(step=0, action=a, before=before.model_dump()))
    j.append(Done(step=0, seconds=0.0))
    loaded = Journal.load(j.path)
    return loaded, loaded.steps()[0]


# --- the contract ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind,case", _params())
def test_action_contract(kind: str, case: Case | None, template, work: Path, request):
    assert case is not None, (
        f"action kind {kind!r} has no case in tests/actions/test_action_contract.py: add one to CASES"
    )
    # the applied host (and the cluster) is made only when a case selected to run needs it
    if case.host == "cluster":
        source, text = request.getfixturevalue("pve1_applied")
        cluster = clusterharness.copy_cluster(source, work / "cluster")
        host = cluster.start("pve2")
    else:
        source = template if case.host == "seed" else request.getfixturevalue("applied")
        host = applysim.copy_host(source, work / "sim")
        text = applysim.seed_spec_text(host)
    try:
        ports = host.ports()
        root = str(host.paths.root)
        spec = parse_spec(case.spec(text))
        facts, current = read_state(host, spec, ports)
        actions = make_plan(facts, spec, current).actions
        picks = [i for i, x in enumerate(actions) if x.kind == kind and case.where(x)]
        assert picks, f"the plan has no {kind} step for this case: {[x.describe() for x in actions]}"
        a = actions[picks[0]]
        ctx = step_context(ports, root, applysim.FAST_TIMEOUTS, Progress())
        # what the host cannot show (a drop-in written but not loaded yet) the earlier steps'
        # expect tell the step's own
        told = World(facts=facts.model_copy(deep=True), current=current.model_copy(deep=True))
        for earlier in actions[: picks[0]]:
            if case.setup is None or earlier.kind in case.setup:
                earlier.do(ctx)
                earlier.expect(told)

        # 1. one line
        text = a.describe()
        assert text and text == text.strip() and "\n" not in text, repr(text)

        facts0, current0 = read_state(host, spec, ports)
        fp0 = host_view(host, ports)

        # 6. its commands, from the same state
        cctx = CommandContext(facts0, current0, host.node)
        cmds, undo_cmds = a.commands(cctx), a.undo_commands(cctx)
        _shell_ok(cmds + undo_cmds)

        # 2. the before-state survives the journal
        before = a.before(ctx)
        assert isinstance(before, a.Before), type(before)
        journal, step = _journal_round_trip(work / "journal", a, before)
        assert step.action == a
        again = a.load_before(step.before)
        assert type(again) is type(before) and again == before

        # 3. doing twice equals doing once
        a.do(ctx)
        fp1 = host_view(host, ports)
        assert applysim.diff(fp0, fp1), f"{text}: do() changed nothing on the host"
        assert cmds, f"{text}: do() changed the host but commands() has nothing to run"
        facts1, current1 = read_state(host, spec, ports)
        a.do(ctx)
        unchanged(fp1, host_view(host, ports), f"{text}: a second do() changed the host")

        # 4. expect matches what the simulator shows
        world = World(
            facts=facts0.model_copy(deep=True), current=current0.model_copy(deep=True), reloads=told.reloads
        )
        a.expect(world)
        world.settle()
        services = {
            vmid
            for vmid, ct in world.current.containers.items()
            if ct.status == "running" and ct.service is not None
        }
        want, got = view(world.facts, world.current, services), view(facts1, current1, services)
        # not vacuous: what expect() says is a change, so an expect() that did nothing would fail here
        assert view(facts0, current0, services) != want, f"{text}: expect() changed nothing that is compared"
        unchanged(want, got, f"{text}: expect() (left) differs from the host (right)")

        # 5. undo (from the journaled before-state, then the restart of what ran before) restores
        runner = Runner(ctx, journal, Progress())
        complete, stuck = runner.backward(running_before_of([a], current0))
        assert complete and not stuck, [r for r in journal.records if r.type.startswith("undo")]
        assert [type(r) for r in journal.records if getattr(r, "step", None) == 0][-1] is UndoDone
        # an undo that changed something names what it put back (the rollback orders by it)
        what = [r.what for r in journal.records if isinstance(r, UndoDone) and r.step == 0][-1]
        assert not what or a.undo_restores(), f"{text}: undo did '{what}' but undo_restores() is empty"
        unchanged(fp0, host_view(host, ports), f"{text}: undo did not restore the host")
        assert a.undo(again, ctx) == ""
        unchanged(fp0, host_view(host, ports), f"{text}: a second undo changed the host")
    finally:
        host.stop()
