"""``gputopo cluster plan``: one plan per node, the cluster-wide mappings once, the HA placement."""

from __future__ import annotations

from dataclasses import dataclass

from gputopo.cluster.plan import ClusterPlan
from gputopo.usecases.cluster_connect import ClusterReach, ClusterSource, open_and_plan


@dataclass(frozen=True)
class ClusterPlanRequest:
    """The spec and nodes (``reach``), where the shared state comes from (``source``), and
    ``facts_dir`` to plan offline (``<node>.json`` or ``<node>.tar.gz`` per node)."""

    reach: ClusterReach
    source: ClusterSource
    facts_dir: str | None = None


def cluster_plan(req: ClusterPlanRequest) -> ClusterPlan:
    """The cluster plan (its document: :meth:`ClusterPlan.to_data`). Changes nothing anywhere.
    Raises PlanRefused (every node's refusals), ConfigError, SpecError, UnknownNode,
    NodeUnreachable, VersionMismatch, ProxmoxError, SimHostError."""
    c, cplan = open_and_plan(req.reach, req.source, req.facts_dir)
    c.close()
    return cplan
