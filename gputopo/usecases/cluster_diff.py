"""``gputopo cluster diff``: how every node (and the HA placement) differs from the spec."""

from __future__ import annotations

from gputopo.cluster.diff import ClusterDiff, diff_cluster
from gputopo.usecases.cluster_connect import open_and_plan
from gputopo.usecases.cluster_plan import ClusterPlanRequest


def cluster_diff(req: ClusterPlanRequest) -> ClusterDiff:
    """The cluster's differences (its document: :meth:`ClusterDiff.to_data`, ``gputopo schema
    cluster-diff``); read as :func:`gputopo.usecases.cluster_plan.cluster_plan` reads. Raises
    what that raises (PlanRefused: a node's spec cannot be carried out)."""
    c, cplan = open_and_plan(req.reach, req.source, req.facts_dir)
    with c:
        return diff_cluster(c.spec, c.inputs, c.nodes, cplan.ha, c.ha)
