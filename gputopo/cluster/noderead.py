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

Nothing is interpreted here. The cluster side (:mod:`gputopo.cluster.gather`) refuses another
gputopo version as before, checks the document against its strict model
(:class:`gputopo.model.documents.NodeReadDoc`) and hands the answers to
:func:`gputopo.facts.observe.observe` as recorded ports, so the state comes out of the same
reader with the same rules as a host read in place. A read that failed here (a ``pct exec``
that did not finish, a file that could not be read) is left out of the document; the cluster
side then makes it again over SSH and reports its error as it always did.

This module stays light: the node imports no pydantic and nothing of the planner, so its part
costs about what ``gputopo discover --json`` costs.
"""

from __future__ import annotations

import json
from typing import Any

from gputopo import __version__
from gputopo.errors import GputopoError, SpecError
from gputopo.facts.discover import discover
from gputopo.model.facts import Facts
from gputopo.model.reads import EXEC_TIMEOUT, ContainerRead, Reads, ServiceRead
from gputopo.ports import ExecPort, HostFilesPort

READ_VERSION = 1  # the node-read document's schema_version (NodeReadDoc's)
COMMAND = ["gputopo", "cluster", "node-read", "--reads", "/dev/stdin"]


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


def read_node(facts: Facts, reads: Reads, exec: ExecPort, files: HostFilesPort) -> dict[str, Any]:
    """The node-read document: the node's ``facts``, what ``reads`` asks of its containers
    (through ``exec``) and of its host files (through ``files``). A read that fails is left out
    (see the module's docstring)."""
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
    }
