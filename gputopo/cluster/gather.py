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
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from gputopo import __version__
from gputopo.adapters.pvefiles import DEFAULT_ROOT, PveFiles
from gputopo.adapters.ssh import RecordedExec, RecordedFiles, SshExec, SshFiles
from gputopo.cluster.noderead import COMMAND, reads_document
from gputopo.errors import RemoteCommandFailed, SpecError, UnknownNode, VersionMismatch
from gputopo.facts.observe import observe
from gputopo.model.documents import NodeReadDoc
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
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


@dataclass
class NodeRead:
    """What a node read of itself (``gputopo cluster node-read``): its facts, the result of each
    command it ran in a container (by ``(vmid, argv)``), the host files it read."""

    facts: Facts
    exec: dict[tuple[int, tuple[str, ...]], ExecResult]
    files: dict[str, str | None]


NODE_READ = "gputopo cluster node-read"


def parse_node_read(node: str, text: str) -> NodeRead:
    """``node``'s node-read document. Raises VersionMismatch when another gputopo version wrote
    it, RemoteCommandFailed when it is not such a document."""
    try:
        data = json.loads(text)
    except ValueError:
        raise RemoteCommandFailed(node, NODE_READ, 0, "not JSON") from None
    theirs = data.get("gputopo_version") if isinstance(data, dict) else None
    if not isinstance(theirs, str):
        raise RemoteCommandFailed(node, NODE_READ, 0, "not a node-read document (no gputopo_version)")
    if theirs != __version__:
        # another version may write another document: the version decides, before the model
        raise VersionMismatch(node, __version__, theirs)
    try:
        doc = NodeReadDoc.model_validate(data)
        facts = Facts.model_validate(doc.facts)
    except ValidationError as e:
        raise RemoteCommandFailed(
            node, NODE_READ, 0, f"not a node-read document ({e.error_count()} errors)"
        ) from None
    ran = {(r.vmid, tuple(r.argv)): ExecResult(r.rc, r.stdout, r.stderr) for r in doc.exec}
    return NodeRead(facts, ran, dict(doc.files))


def remote_read(shell: NodeShellPort, node: str, spec: Spec, timeout: float) -> NodeRead:
    """``gputopo cluster node-read`` on ``node``, asked for what the spec's node reads there.
    Raises VersionMismatch, RemoteCommandFailed, NodeUnreachable."""
    start = getattr(shell, "start", None)  # SshRunner's: the node starts and discovers meanwhile
    call = start(node, COMMAND) if callable(start) else None
    try:
        from gputopo.plan.reads import reads_of  # the planner's modules: after the call began

        sent = json.dumps(reads_document(reads_of(spec.node(node))))
    except BaseException:
        if call is not None:
            call.cancel()
        raise
    res = call.result(timeout, sent) if call is not None else shell.run(node, COMMAND, timeout, input=sent)
    if res.rc != 0:
        check_version(shell, node, timeout)  # a gputopo without node-read is another version
        raise RemoteCommandFailed(node, NODE_READ, res.rc, error_line(res))
    return parse_node_read(node, res.stdout)


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


class NodeReads:
    """Every node's own round trip (``gputopo cluster node-read``), begun in the background at
    once: the cluster commands begin it as soon as the spec is read and reach the API meanwhile.
    ``close(abort=True)`` ends what still runs (the shell's ``abort``, where it has one) when
    something else failed first."""

    def __init__(
        self,
        spec: Spec,
        nodes: list[str],
        shell: NodeShellPort,
        timeout: float = DEFAULT_TIMEOUT,
        workers: int = WORKERS,
    ):
        self.shell = shell
        self.nodes = list(nodes)
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(self.nodes))))
        self.futures = {n: self._pool.submit(remote_read, shell, n, spec, timeout) for n in self.nodes}

    def get(self, node: str) -> NodeRead:
        """``node``'s answer, once it came. Raises its error."""
        return self.futures[node].result()

    def raise_first(self, nodes: list[str]) -> None:
        """Once all of ``nodes`` answered: the first error among them, in ``nodes`` order."""
        for n in nodes:
            err = self.futures[n].exception()
            if err is not None:
                raise err

    def close(self, abort: bool = False) -> None:
        if abort:
            end = getattr(self.shell, "abort", None)
            if callable(end):
                end()
        self._pool.shutdown(wait=True)


def read_cluster(
    spec: Spec,
    nodes: list[str],
    shell: NodeShellPort,
    proxmox: ProxmoxPort,
    timeout: float = DEFAULT_TIMEOUT,
    workers: int = WORKERS,
    begun: NodeReads | None = None,
) -> dict[str, NodeInput]:
    """Every node's facts and current state, read live: each node's own round trip (``begun``
    already, or begun here), then, as soon as a node answered, its guests from the API. Raises
    NodeUnreachable, VersionMismatch, RemoteCommandFailed (the first, in node order), then
    SpecError or ProxmoxError (the first, in node order)."""
    # imported here, not above: the cluster commands import this module to begin the nodes'
    # reads, and the planner's modules load while the nodes already answer
    from gputopo.plan.reads import spec_reads

    pending = begun if begun is not None else NodeReads(spec, nodes, shell, timeout, workers)

    def read(node: str) -> NodeInput:
        got = pending.get(node)
        facts, current = observe(
            got.facts,
            spec_reads(spec, node),
            proxmox=node_view(proxmox, node),
            exec=RecordedExec(got.exec, SshExec(shell, node)),
            files=RecordedFiles(got.files, SshFiles(shell, node, timeout)),
        )
        return NodeInput(node, facts, current)

    try:
        if not nodes:
            return {}
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(nodes)))) as ex:
            futures = {n: ex.submit(read, n) for n in nodes}
        pending.raise_first(nodes)  # a node unreachable or on another version comes first
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
