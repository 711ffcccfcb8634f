"""Reading a cluster: each node's facts and node-local state over SSH, the rest from the API.

What a node alone can tell (its PCI devices and drivers, its host files, the services in its
containers) comes from that node through a :class:`gputopo.ports.NodeShellPort`, in one round
trip per node: ``gputopo cluster node-read`` (:mod:`gputopo.cluster.noderead`) gets what to
read on stdin and prints the gputopo version it runs (a node running another gputopo would plan
differently: refused with both versions), its facts (what ``gputopo discover --json`` prints)
and the answers of the reads in one JSON document. What the cluster shares (guest configs and
states, the PCI mappings) comes from the API of any node, which forwards a node's paths to it.
Nodes are read in parallel, each node's guests from the API as soon as it answered; the
first failure, in node order, is raised before anything anywhere has changed (a node that
cannot be reached or runs another version before any failure of the API).

Each node is read by :func:`gputopo.facts.observe.observe`, as a single host is, with the same
rules. What differs is only where each part comes from, because this process does not run on
the node: the facts are the node's own (its sysfs is not here to discover), the services and
host files are the answers the node recorded (``RecordedExec``, ``RecordedFiles``; a read it
could not make is made again over SSH, ``SshExec``, ``SshFiles``) instead of ``pct exec`` and
local files, and the guests come from one API login pointed at the node (:func:`node_view`).
A node whose gputopo has no ``node-read`` (an older one) is asked ``gputopo --version``, so it
is refused naming both versions. Offline (:func:`read_offline`), facts come from files and the
guests from the API or Proxmox's files, with no services or host files.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from gputopo.adapters.clusterapi import ClusterApi
from gputopo.adapters.pvefiles import DEFAULT_ROOT, PveFiles
from gputopo.adapters.ssh import RecordedExec, RecordedFiles, SshExec, SshFiles
from gputopo.cluster.noderead import (  # noqa: F401 (error_line, parse_version: rolling's, verify's)
    WORKERS,
    NodeReads,
    error_line,
    parse_version,
)
from gputopo.errors import GputopoError, SpecError, UnknownNode
from gputopo.facts.ha import read_ha_config
from gputopo.facts.observe import observe
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.spec import Spec
from gputopo.ports import NodeShellPort, ProxmoxPort

T = TypeVar("T")
DEFAULT_TIMEOUT = 60.0


@dataclass
class NodeInput:
    """What one node's plan is made from."""

    node: str
    facts: Facts
    current: CurrentState


def node_view(proxmox: ProxmoxPort, node: str) -> ProxmoxPort:
    """``proxmox`` (one login) asking about ``node``: its node paths go to that node."""
    view = copy.copy(proxmox)
    view.node = node
    return view


def parallel(nodes: list[str], fn: Callable[[str], T], workers: int = WORKERS) -> dict[str, T]:
    """``fn(node)`` for every node at once (at most ``workers``); the results by node. Raises the
    first node's error, in ``nodes`` order, once all have ended."""
    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(nodes)))) as ex:
        futures = {n: ex.submit(fn, n) for n in nodes}
    for n in nodes:
        err = futures[n].exception()
        if err is not None:
            raise err
    return {n: futures[n].result() for n in nodes}


def select_nodes(spec: Spec, wanted: list[str] | None, members: list[str] | None) -> list[str]:
    """The spec's nodes to work on, in spec order: all, or those of ``wanted`` (``--nodes``).

    Raises UnknownNode for a wanted node the spec does not name, or a node that is no member
    of the cluster (``members``; None: not known).
    """
    names = [n.name for n in spec.nodes]
    for n in wanted or []:
        if n not in names:
            raise UnknownNode(n, "in the spec", names)
    chosen = [n for n in names if wanted is None or n in wanted]
    if members is not None:
        for n in chosen:
            if n not in members:
                raise UnknownNode(n, "a member of the cluster", sorted(members))
    return chosen


def footprints_of(current: CurrentState, sent: dict[str, dict[str, Any]]) -> None:
    """Each running service's model footprint as its node read it (``cluster node-read``) into
    ``current``; a service the node sent none for is said to be unread."""
    from gputopo.model.footprint import ModelFootprint

    for vmid, ct in current.containers.items():
        if ct.status != "running" or ct.service is None or not ct.service.exec_start:
            continue
        data = sent.get(str(vmid))
        if data is None:
            ct.footprint_unread = "the node sent no footprint (its service was not running when it read)"
        elif "unread" in data:
            ct.footprint_unread = str(data["unread"])
        else:
            ct.footprint = ModelFootprint.model_validate(data)


def read_cluster(
    spec: Spec,
    nodes: list[str],
    shell: NodeShellPort,
    proxmox: ProxmoxPort,
    timeout: float = DEFAULT_TIMEOUT,
    workers: int = WORKERS,
    begun: NodeReads | None = None,
    ha: bool = True,
) -> dict[str, NodeInput]:
    """Every node's facts and current state, read live: each node's own round trip (``begun``
    already, or begun here), then, as soon as a node answered, its guests from the API; with
    ``ha``, the cluster's HA configuration once, given to every node (each plans its HA step
    from it). Raises NodeUnreachable, VersionMismatch, RemoteCommandFailed (the first, in node
    order), then SpecError or ProxmoxError (the first, in node order)."""
    # imported here, not above: the cluster commands import this module to begin the nodes'
    # reads, and the planner's modules load while the nodes already answer
    from gputopo.plan.reads import spec_reads

    pending = begun if begun is not None else NodeReads(spec, nodes, shell, timeout, workers)
    ha_read: tuple = (None, None)

    def read(node: str) -> NodeInput:
        got = pending.get(node)
        facts, current = observe(
            got.facts,
            spec_reads(spec, node),
            proxmox=node_view(proxmox, node),
            exec=RecordedExec(got.exec, SshExec(shell, node)),
            files=RecordedFiles(got.files, SshFiles(shell, node, timeout)),
        )
        footprints_of(current, got.footprints or {})
        current.ha_config = ha_read[0].model_copy(deep=True) if ha_read[0] is not None else None
        current.ha_unread = ha_read[1]
        return NodeInput(node, facts, current)

    try:
        if not nodes:
            return {}
        ha_error: GputopoError | None = None
        if ha:
            try:
                ha_read = read_ha_config(ClusterApi(proxmox))
            except GputopoError as e:  # raised after the nodes' own errors, which come first
                ha_error = e
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(nodes)))) as ex:
            futures = {n: ex.submit(read, n) for n in nodes}
        pending.raise_first(nodes)  # a node unreachable or on another version comes first
        if ha_error is not None:
            raise ha_error
        for n in nodes:
            err = futures[n].exception()
            if err is not None:
                raise err
        return {n: futures[n].result() for n in nodes}
    finally:
        pending.close()


def load_facts(path: Path) -> Facts:
    """Facts from a ``gputopo discover --json`` file or a ``gputopo snapshot`` archive."""
    from gputopo.facts.discover import discover
    from gputopo.facts.snapshot import opened_root

    if path.suffix == ".json":
        try:
            return Facts.model_validate_json(path.read_text())
        except ValidationError as e:
            raise SpecError(
                str(path), "", f"not 'gputopo discover --json' output ({e.error_count()} errors)"
            ) from None
    from gputopo.facts.snapshot import facts_of_snapshot

    recorded = facts_of_snapshot(path)  # what discovery found when the snapshot was taken
    if recorded is not None:
        return recorded
    with opened_root(str(path)) as root:
        return discover(root)


def facts_file(facts_dir: Path, node: str) -> Path:
    """``<node>.json`` or ``<node>.tar.gz`` in ``facts_dir``. Raises UnknownNode when neither is there."""
    for name in (f"{node}.json", f"{node}.tar.gz", f"{node}.tgz"):
        if (facts_dir / name).is_file():
            return facts_dir / name
    raise UnknownNode(
        node,
        f"in {facts_dir} (no {node}.json or {node}.tar.gz)",
        sorted(p.name.split(".")[0] for p in facts_dir.glob("*") if p.is_file()),
    )


def read_offline(
    spec: Spec, nodes: list[str], facts_dir: Path, pve_root: str | None, proxmox: ProxmoxPort | None = None
) -> dict[str, NodeInput]:
    """Every node's facts from ``facts_dir`` and its state from the API (``proxmox``) or else
    Proxmox's files under ``pve_root`` (default ``/etc/pve``; guests count as running); services
    and host files are not read."""

    from gputopo.plan.reads import spec_reads

    def read(node: str) -> NodeInput:
        source = node_view(proxmox, node) if proxmox is not None else PveFiles(pve_root or DEFAULT_ROOT, node)
        facts, current = observe(
            load_facts(facts_file(facts_dir, node)), spec_reads(spec, node), proxmox=source
        )
        return NodeInput(node, facts, current)

    return {n: read(n) for n in nodes}
