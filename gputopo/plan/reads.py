"""What the current state is read for, said by the spec: the containers of the spec's node for
this host with their services, the VMs it names, the persistence files. Pure.

The reader (:mod:`gputopo.facts.current`) sits below planning and takes this as data; the
spec's node depends on the facts (the host's name), so :func:`spec_reads` hands
:func:`gputopo.facts.observe.observe` a function of the facts.
"""

from __future__ import annotations

from collections.abc import Callable

from gputopo.model.facts import Facts
from gputopo.model.reads import ContainerRead, Reads, ServiceRead
from gputopo.plan.render import PERSISTENCE_PATHS, dropin_path
from gputopo.plan.select import pick_node
from gputopo.plan.spec import Node, Spec


def node_reads(spec: Spec, facts: Facts, node: str | None = None) -> Reads:
    """What to read for the spec's node for this host (:func:`pick_node`, whose SpecError it
    raises): its containers and services, every VM it names, the persistence files."""
    return reads_of(pick_node(spec, facts, node))


def reads_of(n: Node) -> Reads:
    """What to read for the spec's node ``n``: what :func:`node_reads` says once the node is
    picked (a cluster asks a node for it before that node's facts are here)."""
    containers = tuple(
        ContainerRead(
            c.vmid,
            ServiceRead(c.service.unit, dropin_path(c.service.unit, c.service.dropin))
            if c.service is not None
            else None,
        )
        for c in n.containers
    )
    # every VM of the node is read anyway; these are the ones named even if it lists none of them
    vms = (*n.vms.guests, *(c.vmid for c in n.vms.consumers))
    return Reads(containers=containers, vms=vms, files=PERSISTENCE_PATHS)


def spec_reads(spec: Spec, node: str | None = None) -> Callable[[Facts], Reads]:
    """:func:`node_reads` of ``spec`` once the facts are known: what observe takes."""
    return lambda facts: node_reads(spec, facts, node)
