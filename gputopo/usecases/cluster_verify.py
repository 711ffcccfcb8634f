"""``gputopo cluster verify``: every node's own verify and the cluster's checks."""

from __future__ import annotations

from dataclasses import dataclass

from gputopo.cluster.verify import verify_cluster
from gputopo.model.documents import ClusterReport
from gputopo.usecases.cluster_connect import DEFAULT_TIMEOUT, ClusterReach, ClusterSource, open_and_plan


@dataclass(frozen=True)
class ClusterVerifyRequest:
    """The spec and nodes (``reach``) and the API the shared state comes from (``source``)."""

    reach: ClusterReach
    source: ClusterSource


def cluster_verify(req: ClusterVerifyRequest) -> ClusterReport:
    """Every node's verify (Proxmox's mapping check for that node included) and the cluster's
    checks: converged, offline migration to nodes without the mapping. The report says what
    failed (``ok``); it changes nothing. Raises ConfigError, SpecError, UnknownNode,
    NodeUnreachable, VersionMismatch, ProxmoxError, PlanRefused."""
    c, cplan = open_and_plan(req.reach, req.source)
    with c:
        vms = [(n, vmid) for n in c.nodes for vmid in c.inputs[n].current.guests]
        # a node's verify waits for its inference probe (verify.timeout) on top of its checks
        timeout = max(req.reach.timeout, c.spec.verify.timeout + DEFAULT_TIMEOUT)
        return verify_cluster(cplan, c.spec_text, c.shell, c.api, c.ha, vms, timeout)
