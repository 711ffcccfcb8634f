"""A cluster node reads itself, in one SSH round trip: ``gputopo cluster node-read``.

A cluster command needs from each node what only that node can tell: its facts (its PCI
devices and drivers), the services in its containers, its host files. Asked one by one over
SSH that is a connection (and, on the node, a process start) per read; instead the cluster
side sends the node what to read (:func:`reads_document`, on stdin) and the node answers
everything at once, with the gputopo version it runs (:func:`read_node`):

* ``facts``: what ``gputopo discover --json`` prints;
* ``exec``: each command :func:`gputopo.facts.current.read_current` runs in a container for a
  service (:meth:`gputopo.model.reads.ServiceRead.show_argv` and ``dropin_argv``) with its exit
  status and output, as the node's ``pct exec`` gave them;
* ``files``: each host file asked for, its text or null when it does not exist.

Nothing is interpreted on the node. The cluster side (:func:`parse_node_read`) refuses another
gputopo version as before, checks the document against its strict model
(:class:`gputopo.model.documents.NodeReadDoc`), and :mod:`gputopo.cluster.gather` hands the
answers to :func:`gputopo.facts.observe.observe` as recorded ports, so the state comes out of
the same reader with the same rules as a host read in place. A read that failed here (a ``pct exec``
that did not finish, a file that could not be read) is left out of the document; the cluster
side then makes it again over SSH and reports its error as it always did.

The cluster side's half is here too (:class:`NodeReads`, :func:`remote_read`): the cluster
commands begin each node's round trip as soon as the spec is read, before the rest of the
cluster code and the API are loaded.

This module stays light: the node imports no pydantic and nothing of the planner, so its part
costs about what ``gputopo discover --json`` costs; the cluster side loads the document's model
and the planner's reads once the node's call has begun.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gputopo import __version__
from gputopo.errors import GputopoError, RemoteCommandFailed, SpecError, VersionMismatch
from gputopo.facts.discover import discover
from gputopo.formats.systemd import parse_show_properties, show_state
from gputopo.model.facts import Facts
from gputopo.model.reads import EXEC_TIMEOUT, ContainerRead, Reads, ServiceRead
from gputopo.ports import ContainerFilesPort, ExecPort, ExecResult, HostFilesPort, NodeShellPort

if TYPE_CHECKING:
    from gputopo.plan.spec import Spec

READ_VERSION = 1  # the node-read document's schema_version (NodeReadDoc's)
COMMAND = ["gputopo", "cluster", "node-read", "--reads", "/dev/stdin"]
NODE_READ = "gputopo cluster node-read"
WORKERS = 16  # nodes read at the same time


def reads_document(reads: Reads) -> dict[str, Any]:
    """What the cluster side asks a node to read, as JSON data: the containers (each with its
    service, if any) and the host files. The VMs and guests are read from the API instead."""
    return {
        "containers": [
            {
                "vmid": c.vmid,
                "service": None
                if c.service is None
                else {"unit": c.service.unit, "dropin_path": c.service.dropin_path},
            }
            for c in reads.containers or ()
        ],
        "files": list(reads.files),
    }


def _fields(obj: Any, keys: set[str], where: str, source: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or set(obj) != keys:
        raise SpecError(source, where, f"expected an object with exactly {', '.join(sorted(keys))}")
    return obj


def parse_reads(text: str, source: str) -> Reads:
    """The :class:`Reads` of :func:`reads_document`'s JSON. Raises SpecError naming ``source``
    and the first key that is not what it should be."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SpecError(source, "", f"not JSON ({e})") from None
    data = _fields(data, {"containers", "files"}, "", source)
    if not isinstance(data["containers"], list):
        raise SpecError(source, "containers", "expected a list")
    containers = []
    for i, c in enumerate(data["containers"]):
        c = _fields(c, {"vmid", "service"}, f"containers[{i}]", source)
        if not isinstance(c["vmid"], int) or isinstance(c["vmid"], bool):
            raise SpecError(source, f"containers[{i}].vmid", "expected an integer")
        svc = c["service"]
        if svc is not None:
            svc = _fields(svc, {"unit", "dropin_path"}, f"containers[{i}].service", source)
            if not all(isinstance(v, str) and v for v in svc.values()):
                raise SpecError(source, f"containers[{i}].service", "expected non-empty strings")
            svc = ServiceRead(svc["unit"], svc["dropin_path"])
        containers.append(ContainerRead(c["vmid"], svc))
    files = data["files"]
    if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
        raise SpecError(source, "files", "expected a list of paths")
    return Reads(containers=tuple(containers), files=tuple(files))


def read_reads(path: str) -> Reads:
    """The reads in the file at ``path`` (``/dev/stdin``: what the cluster side sent). Raises
    SpecError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SpecError(path, "", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(path, "", f"not UTF-8 text (byte {e.start})") from None
    return parse_reads(text, path)


def node_facts(root: str) -> Facts:
    """The facts of the host at ``root``, as ``gputopo discover --json`` prints them. Raises
    RootError. The node discovers before it reads what to read: the cluster side works that out
    while the node starts and discovers."""
    facts = discover(root)
    facts.root = root
    return facts


def read_node(
    facts: Facts,
    reads: Reads,
    exec: ExecPort,
    files: HostFilesPort,
    ctfiles: ContainerFilesPort | None = None,
) -> dict[str, Any]:
    """The node-read document: the node's ``facts``, what ``reads`` asks of its containers
    (through ``exec``) and of its host files (through ``files``), and each running service's
    model footprint (through ``ctfiles``, else exec). A read that fails is left out (see the
    module's docstring)."""
    ran = []
    for c in reads.containers or ():
        if c.service is None:
            continue
        # a stopped container answers pct's error here; the cluster side then does not ask
        for argv in (c.service.show_argv(), c.service.dropin_argv()):
            try:
                res = exec.run(c.vmid, argv, EXEC_TIMEOUT)
            except GputopoError:
                continue
            ran.append(
                {"vmid": c.vmid, "argv": argv, "rc": res.rc, "stdout": res.stdout, "stderr": res.stderr}
            )
    texts: dict[str, str | None] = {}
    for path in reads.files:
        try:
            texts[path] = files.read(path)
        except GputopoError:
            continue
    return {
        "schema_version": READ_VERSION,
        "gputopo_version": __version__,
        "facts": facts.model_dump(mode="json", by_alias=True),
        "exec": ran,
        "files": texts,
        "footprints": _footprints(ran, exec, ctfiles),
    }


def _footprints(
    ran: list[dict[str, Any]], exec: ExecPort, ctfiles: ContainerFilesPort | None
) -> dict[str, Any]:
    """Container -> the footprint of the model its active service runs (as JSON data), or
    ``{"unread": why}``; read here, on the node, where the container's files are."""
    commands = {}
    for r in ran:
        if r["rc"] == 0 and r["argv"][:2] == ["systemctl", "show"]:
            active, command = show_state(parse_show_properties(r["stdout"]))
            if active and command:
                commands[r["vmid"]] = command
    if not commands:
        return {}
    from gputopo.facts.ctread import ExecContainerFiles
    from gputopo.facts.footprint import read_footprint  # pydantic: only where a service runs

    out: dict[str, Any] = {}
    for vmid, command in commands.items():
        fp, why = read_footprint(ctfiles or ExecContainerFiles(exec), exec, vmid, command)
        out[str(vmid)] = fp.model_dump(mode="json") if fp is not None else {"unread": why}
    return out


# --- the cluster side -----------------------------------------------------------------------------


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
    command it ran in a container (by ``(vmid, argv)``), the host files it read, each served
    model's footprint (container -> its JSON data or ``{"unread": why}``)."""

    facts: Facts
    exec: dict[tuple[int, tuple[str, ...]], ExecResult]
    files: dict[str, str | None]
    footprints: dict[str, dict[str, Any]] | None = None


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
    from pydantic import ValidationError

    from gputopo.model.documents import NodeReadDoc

    try:
        doc = NodeReadDoc.model_validate(data)
        facts = Facts.model_validate(doc.facts)
    except ValidationError as e:
        raise RemoteCommandFailed(
            node, NODE_READ, 0, f"not a node-read document ({e.error_count()} errors)"
        ) from None
    ran = {(r.vmid, tuple(r.argv)): ExecResult(r.rc, r.stdout, r.stderr) for r in doc.exec}
    return NodeRead(facts, ran, dict(doc.files), dict(doc.footprints))


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
        timeout: float,
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
