"""Init: a commented starter spec for a change (the split asked for, the service found inside
the container when a connection is given), for one host or, on a simulated cluster, one entry
per node. ``init`` and quick mode (``plan --split``) write the same spec for the same options."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gputopo.errors import ConfigError
from gputopo.usecases.connect import Connection, host_root, source_ports
from gputopo.usecases.readplan import SpecSource, quick_spec, read_facts, require_container, with_service


@dataclass(frozen=True)
class InitRequest:
    """``gputopo init``: the host (or simulated cluster), the split and its options
    (``source``: quick mode's, ``split`` set); ``container_given``: ``--container`` was typed,
    so every node of a cluster gets that container instead of its own."""

    conn: Connection
    source: SpecSource
    container_given: bool = False


def node_spec(conn: Connection, source: SpecSource) -> str:
    """The starter spec of the one host ``conn`` reaches. Raises InputError (no such
    container), ConfigError (an option the spec refuses), SpecError (cannot split so)."""
    from gputopo.plan.starter import init_spec

    ports = source_ports(conn, default_node=conn.node)
    try:
        facts = read_facts(host_root(conn))
        if ports is not None:
            require_container(ports, source.container)
            source = with_service(ports, source)
    finally:
        if ports is not None:
            ports.close()
    quick_spec(facts, source, conn.node)  # the starter must be a spec plan accepts: check the options first
    return init_spec(facts, split=source.split, node=conn.node, **source.quick_options())


def _is_cluster(sim: str) -> bool:
    from gputopo.sim.cluster import SimCluster

    return SimCluster.is_cluster(sim)


def _split_nodes(text: str) -> tuple[list[str], tuple[list[str], list[str]]]:
    """A starter spec's lines: (up to its first node entry), (that node's entry, from policy on)."""
    lines = text.rstrip("\n").split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("  - name: "))
    # the comment above the entry stays with the head
    policy = lines.index("policy:")
    return lines[:first], (lines[first:policy], lines[policy:])


def cluster_spec(req: InitRequest) -> str:
    """One spec for the simulated cluster in ``req.conn.sim``: each node's starter entry (its own
    container unless ``--container`` is given, the service found in it), the policy and verify
    blocks once. Raises ConfigError for --vm without --node (a VM belongs to one node), and
    what a node's starter raises."""
    from gputopo.sim.cluster import SimCluster

    conn = req.conn
    cluster = SimCluster(conn.sim)
    nodes = [conn.node] if conn.node else cluster.nodes
    for n in nodes:
        cluster.node_dir(n)  # an unknown --node: SimHostError naming the members
    if req.source.vm is not None and conn.node is None:
        raise ConfigError("--vm names one node's VM: give --node with it on a simulated cluster")
    texts = []
    for n in nodes:
        node_conn = replace(conn, sim=str(cluster.node_dir(n)), node=n)
        ct = req.source.container if req.container_given else cluster.container(n)
        texts.append(node_spec(node_conn, replace(req.source, container=ct)))
    head, tail = _split_nodes(texts[0])
    entries = [_split_nodes(t)[1][0] for t in texts]
    intro = [
        f"# A simulated cluster of {len(cluster.nodes)} nodes ({', '.join(cluster.nodes)}): one entry per node",
        "# below. Check it with `gputopo cluster plan --sim DIR --spec FILE` (add --ssh-config).",
    ]
    return "\n".join(intro + head + [line for e in entries for line in e] + tail[1]) + "\n"


def init(req: InitRequest) -> str:
    """The starter spec's text: a simulated cluster's (:func:`cluster_spec`) or one host's
    (:func:`node_spec`). Raises what they raise."""
    if req.conn.sim is not None and _is_cluster(req.conn.sim):
        return cluster_spec(req)
    return node_spec(req.conn, req.source)
