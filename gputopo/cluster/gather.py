"""Reading a cluster: each node's facts and node-local state over SSH, the rest from the API.

What a node alone can tell (its PCI devices and drivers, its host files, the services in its
containers) comes from that node through a :class:`gputopo.ports.NodeShellPort`: ``gputopo
--version`` first (a node running another gputopo would plan differently: refused with both
versions), then ``gputopo discover --json``, ``pct exec`` and ``cat``. What the cluster shares
(guest configs and states, the PCI mappings) comes from the API of any node, which forwards a
node's paths to it. Nodes are read in parallel; the first failure, in node order, is raised
before anything anywhere has changed.

Each node is read by :func:`gputopo.facts.observe.observe`, as a single host is, with the same
rules. What differs is only where each part comes from, because this process does not run on
the node: the facts are the node's own ``gputopo discover --json`` (its sysfs is not here to
discover), the services and host files come over SSH (``SshExec``, ``SshFiles``) instead of
``pct exec`` and local files, and the guests from one API login pointed at the node
(:func:`node_view`). Offline (:func:`read_offline`), facts come from files and the guests from
the API or Proxmox's files, with no services or host files.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from gputopo import __version__
from gputopo.actions.haplace import read_ha_config
from gputopo.adapters.clusterapi import ClusterApi
from gputopo.adapters.pvefiles import DEFAULT_ROOT, PveFiles
from gputopo.adapters.ssh import SshExec, SshFiles
from gputopo.errors import RemoteCommandFailed, SpecError, UnknownNode, VersionMismatch
from gputopo.facts.observe import observe
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.reads import spec_reads
from gputopo.plan.spec import Spec
from gputopo.ports import ExecResult, NodeShellPort, ProxmoxPort

T = TypeVar("T")
WORKERS = 16
DEFAULT_TIMEOUT = 60.0


@dataclass
class NodeInput:
    """What one node's plan is made from."""

    node: str
    facts: Facts
    current: CurrentState


def error_line(res: ExecResult) -> str:
    """The one-line reason a remote gputopo gave (``gputopo: error: ...``), else its last line."""
    lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("gputopo: error: "):
            return ln[len("gputopo: error: ") :]
    if lines:
        return lines[-1]
    out = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
    return out[-1] if out else f"exit status {res.rc}"


def parse_version(text: str) -> str | None:
    """The version in ``gputopo --version`` output (``gputopo, version 0.1.0``)."""
    m = re.search(r"version (\S+)", text)
    return m.group(1) if m else None


def check_version(shell: NodeShellPort, node: str, timeout: float) -> str:
    """The gputopo version ``node`` runs. Raises VersionMismatch when it is not this one,
    RemoteCommandFailed when it has none, NodeUnreachable."""
    res = shell.run(node, ["gputopo", "--version"], timeout)
    theirs = parse_version(res.stdout) if res.rc == 0 else None
    if theirs is None:
        raise RemoteCommandFailed(node, "gputopo --version", res.rc, error_line(res))
    if theirs != __version__:
        raise VersionMismatch(node, __version__, theirs)
    return theirs


def remote_facts(shell: NodeShellPort, node: str, timeout: float) -> Facts:
    """``gputopo discover --json`` on ``node``. Raises RemoteCommandFailed, NodeUnreachable."""
    res = shell.run(node, ["gputopo", "discover", "--json"], timeout)
    if res.rc != 0:
        raise RemoteCommandFailed(node, "gputopo discover --json", res.rc, error_line(res))
    try:
        return Facts.model_validate_json(res.stdout)
    except ValidationError as e:
        raise RemoteCommandFailed(
            node, "gputopo discover --json", 0, f"not facts JSON ({e.error_count()} errors)"
        ) from None


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


def read_cluster(
    spec: Spec,
    nodes: list[str],
    shell: NodeShellPort,
    proxmox: ProxmoxPort,
    timeout: float = DEFAULT_TIMEOUT,
    workers: int = WORKERS,
    ha: bool = True,
) -> dict[str, NodeInput]:
    """Every node's facts and current state, read live; with ``ha``, the cluster's HA
    configuration once, given to every node (each plans its HA step from it). Raises
    NodeUnreachable, VersionMismatch, RemoteCommandFailed, ProxmoxError (the first, in node order)."""
    parallel(nodes, lambda n: check_version(shell, n, timeout), workers)
    ha_read = read_ha_config(ClusterApi(proxmox)) if ha else (None, None)

    def read(node: str) -> NodeInput:
        facts, current = observe(
            remote_facts(shell, node, timeout),
            spec_reads(spec, node),
            proxmox=node_view(proxmox, node),
            exec=SshExec(shell, node),
            files=SshFiles(shell, node, timeout),
        )
        current.ha_config = ha_read[0].model_copy(deep=True) if ha_read[0] is not None else None
        current.ha_unread = ha_read[1]
        return NodeInput(node, facts, current)

    return parallel(nodes, read, workers)


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

    def read(node: str) -> NodeInput:
        source = node_view(proxmox, node) if proxmox is not None else PveFiles(pve_root or DEFAULT_ROOT, node)
        facts, current = observe(
            load_facts(facts_file(facts_dir, node)), spec_reads(spec, node), proxmox=source
        )
        return NodeInput(node, facts, current)

    return {n: read(n) for n in nodes}
