"""``gputopo cluster node-read``: what a cluster command runs on each node over SSH (internal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from gputopo.model.strict import Strict


class NodeReadRequest(Strict):
    """``reads_file``: what to read, as JSON (``/dev/stdin``: what the cluster side sends);
    ``sim``: a simulated node's directory (None: this host)."""

    model_config = ConfigDict(frozen=True)

    reads_file: str
    sim: str | None = None


def node_read(req: NodeReadRequest) -> dict[str, Any]:
    """This node's facts and the reads asked for, as the node-read document
    (:class:`gputopo.model.documents.NodeReadDoc`). A read that fails is left out. Raises
    SpecError (the reads), RootError (the host root)."""
    from gputopo.adapters.ctfiles import RootContainerFiles, proc_root
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.cluster.noderead import node_facts, read_node, read_reads
    from gputopo.facts.ctread import ExecContainerFiles

    if req.sim is not None:
        from gputopo.sim.container import SimExec, SimPaths

        paths = SimPaths(Path(req.sim))
        root = str(paths.root)
        exec_port = SimExec(req.sim)
        root_of = lambda vmid: str(paths.rootfs(vmid))  # noqa: E731 -- the simulated container's root
    else:
        from gputopo.adapters.hostcmd import RealHostCommands
        from gputopo.adapters.pct import PctExec

        root, exec_port = "/", PctExec()
        root_of = proc_root(RealHostCommands(), root)
    facts = node_facts(root)  # first: the cluster side sends the reads meanwhile
    reads = read_reads(req.reads_file)  # no spec here: the node's part costs about what discover does
    ctfiles = RootContainerFiles(root_of, ExecContainerFiles(exec_port))
    return read_node(facts, reads, exec_port, RealHostFiles(root), ctfiles)
