"""Preflight: every problem that would make a plan fail or harm a workload, found before anything
stops. Changes nothing.

:func:`refuse_other_node` comes first, before anything is read: the Proxmox API must act on the
node whose sysfs and containers this process changes (recover: :func:`check_recover_node`, which
compares without the API first and goes on without it when the journal proves the node). What
the plan as a whole needs is checked here too (its containers exist, the Proxmox API answers,
the journal's directory can be written);
everything else is each step's own ``preflight`` (:mod:`gputopo.actions`): IOMMU and drivers for
rebinds, processes holding a moving GPU (from ``<root>/proc``), running VMs outside the plan that
use a moving device, the login's right to change ``devN``, a running container for a drop-in.

Device nodes (:mod:`gputopo.actions.devnodes`): every NVIDIA node a container of the plan will
be given (its ``devN`` entries after the plan, of every container the plan changes or starts)
must exist on the host, since Proxmox refuses a ``devN`` whose node is missing and the nvidia
driver makes none; so must those of the configs a rollback gives back (:func:`all_nodes`). Preflight refuses a missing node that ``nvidia-modprobe`` cannot make; the
ones it can make, :func:`make_device_nodes` makes under the lock before the first step (the one
change made before the journal: a node the driver's own user space would make on first use),
and refuses, nothing stopped, when it did not make them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gputopo.actions import PreflightContext, UpdateContainer
from gputopo.actions.devnodes import is_nvidia_node, make_nodes, missing_nodes, node_command, refusal
from gputopo.apply.journal import JOURNAL_DIR
from gputopo.errors import ConfigError, PreflightError, ProxmoxError
from gputopo.facts.host import node_name
from gputopo.facts.pci import read_drm_nodes
from gputopo.facts.procfs import read_holders
from gputopo.formats.devn import dev_entries, dev_path, dev_sort, is_devn_key
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.model import Plan
from gputopo.plan.select import pick_node
from gputopo.plan.spec import Spec
from gputopo.ports import Ports

# what talking to the API may raise besides its refusals: pvesh not installed (not a Proxmox node)
API_ERRORS = (ProxmoxError, ConfigError)


def _cannot_use(ports: Ports, e: Exception) -> PreflightError:
    return PreflightError(
        f"cannot use the Proxmox API via {ports.proxmox.address} ({e}); nothing was changed"
    )


def _other_node(ports: Ports, host: str, served: list[str] | None = None) -> PreflightError:
    """The refusal of an API that would act on another node than ``host`` (this one), or that
    does not serve it (``served``: the nodes it serves; None: not asked)."""
    node, where = ports.proxmox.node, ports.proxmox.address
    if served is None:
        said = f"gputopo would act on node {node} (the Proxmox API via {where}), "
    else:
        said = f"the Proxmox API via {where} serves node(s) {', '.join(served) or 'none'}, "
        if node != host:
            said += f"and gputopo would act on node {node}, "
    return PreflightError(
        f"{said}but this host is {host}: sysfs and pct act on this machine only; run it on the node itself "
        "(nothing was changed)"
    )


def refuse_other_node(ports: Ports, root: str) -> None:
    """Raises PreflightError (exit 2, nothing changed) unless the node the API calls name is this
    host and the API serves it, or when the API does not answer. sysfs writes, host files and
    ``pct`` always act on the machine whose root is ``root``; a node elsewhere would get its guests
    stopped and configured for GPUs this host moves. Checked by apply itself, whoever calls it;
    recover checks with :func:`refuse_other_node_here` and :func:`check_recover_node`."""
    host = node_name(root)
    try:
        served = ports.proxmox.nodes()
    except API_ERRORS as e:
        raise _cannot_use(ports, e) from None
    if ports.proxmox.node != host or host not in served:
        raise _other_node(ports, host, served)


def refuse_other_node_here(ports: Ports, root: str) -> None:
    """Raises PreflightError (exit 2, nothing changed) when the node the API calls name is not
    this host. Compared here, without asking the API: recover checks this before anything else."""
    host = node_name(root)
    if ports.proxmox.node != host:
        raise _other_node(ports, host)


def check_recover_node(ports: Ports, root: str, changed: str | None, warn: Callable[[str], None]) -> None:
    """recover's node check, once it holds the lock and found an open journal whose apply
    changed node ``changed`` (None: the journal does not say).

    What can be compared without the API is compared first: the journal's node, this host and
    the node the API calls name must be one node, else PreflightError. Then the API must serve
    this host, as for apply. An API that does not answer (pmxcfs or pveproxy down after a
    crash) does not stop recover when the journal names this host: the journal itself proves
    which node was changed, and undoing sysfs and host files needs no API. ``warn`` then says
    the check was skipped; the undo steps that need the API fail on their own, recover names
    them and the journal stays open for the next recover. An API that does not answer while
    the journal names no node is a PreflightError, as for apply.
    """
    host = node_name(root)
    refuse_other_node_here(ports, root)
    if changed is not None and changed != host:
        raise PreflightError(
            f"the interrupted apply changed node {changed}, but this host is {host}: recover it on "
            f"{changed} (nothing was changed)"
        )
    try:
        served = ports.proxmox.nodes()
    except API_ERRORS as e:
        if changed != host:
            raise _cannot_use(ports, e) from None
        warn(
            f"warning: cannot use the Proxmox API via {ports.proxmox.address} ({e}); the journal shows "
            f"the apply changed this host ({host}), so recover goes on: the undo steps that need the API "
            "will fail and be named"
        )
        return
    if host not in served:
        raise _other_node(ports, host, served)


def preflight(
    p: Plan, facts: Facts, current: CurrentState, spec: Spec, ports: Ports, root: str, node: str | None = None
) -> list[str]:
    """Every problem that would make ``p`` fail or harm a workload, one line each ([] = go).

    A container of the spec that does not exist is the only problem reported: the plan was made
    for a host other than this one, so every other finding would follow from that mistake.
    """
    spec_node = pick_node(spec, facts, node)
    missing = [
        f"container {c.vmid} does not exist on node {spec_node.name}"
        for c in spec_node.containers
        if c.vmid not in current.containers
    ]
    if missing:
        return missing
    problems: list[str] = []
    try:
        ports.proxmox.version()
        api_ok = True
    except ProxmoxError as e:
        problems.append(f"the Proxmox API is not reachable: {e}")
        api_ok = False
    ctx = PreflightContext(
        facts=facts,
        current=current,
        ports=ports,
        actions=list(p.actions),
        api_ok=api_ok,
        driver_loaded=lambda name: (Path(root) / "sys/bus/pci/drivers" / name).is_dir(),
        holders=lambda paths: read_holders(root, paths),
        drm_nodes=lambda address: read_drm_nodes(root, address),
    )
    # the journal is the first thing written: a directory that cannot take it (a read-only
    # /var) would fail the apply after the lock, with nothing to roll back but no record either
    why = ports.files.unwritable(f"{JOURNAL_DIR}/probe.jsonl")
    if why is not None:
        problems.append(
            f"cannot write the apply journal under /{JOURNAL_DIR} ({why}): make it writable, then apply again"
        )
    for a in p.actions:
        problems += a.preflight(ctx)
    problems += _node_problems(p, facts, current, ports, root)
    return list(dict.fromkeys(problems))  # one line per problem, in the order found


def container_nodes(p: Plan, current: CurrentState) -> dict[str, str]:
    """Every NVIDIA device node a container of ``p`` will be given -> who names it first
    (``CT 101 dev4``): the ``devN`` entries each container the plan changes has after its
    change, and those of each container it starts. The nodes of GPUs coming back to nvidia are
    not known before their bind (the container step makes them, :mod:`gputopo.actions.devnodes`)."""
    devs: dict[int, dict[str, str]] = {}
    for a in p.actions:
        if isinstance(a, UpdateContainer):
            ct = current.containers.get(a.vmid)
            cfg = {k: v for k, v in dev_entries(ct.config if ct else {}).items() if k not in a.delete}
            cfg.update({k: v for k, v in a.set.items() if is_devn_key(k)})
            devs[a.vmid] = cfg
    for a in p.actions:
        g = a.started_guest()
        if g is not None and g[0] == "lxc" and g[1] not in devs and g[1] in current.containers:
            devs[g[1]] = dev_entries(current.containers[g[1]].config)
    out: dict[str, str] = {}
    for vmid, cfg in devs.items():
        for k, v in sorted(cfg.items(), key=lambda kv: dev_sort(kv[0])):
            path = dev_path(v)
            if is_nvidia_node(path):
                out.setdefault(path, f"CT {vmid} {k}")
    return out


def _nvidia_minors(facts: Facts) -> dict[int, str]:
    return {g.minor: g.address for g in facts.gpus if g.driver == "nvidia" and g.minor is not None}


def all_nodes(p: Plan, facts: Facts, current: CurrentState, root: str) -> dict[str, str]:
    """:func:`container_nodes`, then every node of the configs a rollback may give back (the
    ``devN`` entries each container the plan changes or stops has now) that nvidia-modprobe can
    make: a rollback after the container stopped starts it with that config, and Proxmox refuses
    to start a container whose devN node is missing (pve-container LXC/Tools.pm
    get_device_mode_and_rdev "Device $path does not exist"). One that no command can make (its
    GPU is not on nvidia) is left alone: the container could not start with it now either."""
    wanted = container_nodes(p, current)
    minors = _nvidia_minors(facts)
    vmids = [a.vmid for a in p.actions if isinstance(a, UpdateContainer)]
    vmids += [g[1] for g in (a.stopped_guest() for a in p.actions) if g is not None and g[0] == "lxc"]
    for vmid in dict.fromkeys(vmids):
        ct = current.containers.get(vmid)
        for k, v in sorted(dev_entries(ct.config if ct else {}).items(), key=lambda kv: dev_sort(kv[0])):
            path = dev_path(v)
            if is_nvidia_node(path) and node_command(path, minors, root) is not None:
                wanted.setdefault(path, f"CT {vmid} {k} (its config now, which a rollback restores)")
    return wanted


def _node_problems(p: Plan, facts: Facts, current: CurrentState, ports: Ports, root: str) -> list[str]:
    """The missing nodes no command of this apply can make (:func:`make_device_nodes` makes the rest)."""
    wanted = all_nodes(p, facts, current, root)
    minors = _nvidia_minors(facts)
    refused = (
        refusal(path, wanted[path], node_command(path, minors, root), minors, ports.host is not None)
        for path in missing_nodes(root, list(wanted))
    )
    return [r for r in refused if r is not None]


def make_device_nodes(
    p: Plan, facts: Facts, current: CurrentState, ports: Ports, root: str, timeout: float
) -> tuple[list[str], list[str]]:
    """Make the missing NVIDIA nodes the containers of ``p`` will be given, before anything
    stops. Returns (what was made, one line each; the nodes still missing, one line each)."""
    return make_nodes(ports.host, root, all_nodes(p, facts, current, root), _nvidia_minors(facts), timeout)
