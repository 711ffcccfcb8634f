"""Verifying a cluster: every node's own verify, and what only the cluster can show.

* each node runs ``gputopo verify --spec /dev/stdin --json`` itself (over SSH): fresh facts,
  Proxmox's mapping check for that node (``check-node``, which only the node itself answers),
  the container, the service, the inference endpoint;
* ``converged``: the cluster plan is empty (every node, every mapping line, the HA placement);
* ``migration``: for each VM with mapped GPUs, Proxmox's own migration precondition
  (``GET /nodes/{node}/qemu/{vmid}/migrate``): a node where a mapping has no device would fail
  an offline migration there. That is a WARN, or a FAIL when the VM's HA placement allows that
  node (an HA recovery would try it).

The report (``gputopo cluster verify --json``) is :class:`gputopo.model.documents.ClusterReport`.
"""

from __future__ import annotations

import json
from typing import Any

from gputopo.cluster.gather import error_line, parallel
from gputopo.cluster.ha import HaState
from gputopo.cluster.plan import ClusterPlan
from gputopo.formats.hacfg import node_list, resource_list, vm_sid
from gputopo.model.documents import Check, ClusterReport, NodeReport, VerifyReport
from gputopo.ports import ClusterApiPort, NodeShellPort


def node_report(shell: NodeShellPort, node: str, spec_text: str, timeout: float) -> NodeReport:
    """The node's own verify, read with the verify document's own models
    (:meth:`VerifyReport.read`): a document this version does not know (a field added or
    missing) is one FAIL saying so, never read in part. Raises NodeUnreachable."""
    res = shell.run(
        node,
        ["gputopo", "verify", "--spec", "/dev/stdin", "--json", "--node", node],
        timeout,
        input=spec_text,
    )
    if res.rc in (0, 1) and res.stdout.strip():
        try:
            data = json.loads(res.stdout)
        except ValueError:
            data = None
        if data is not None:
            try:
                return NodeReport(node=node, checks=VerifyReport.read(data).checks)
            except ValueError as e:
                summary = (
                    f"gputopo verify --json printed a document this gputopo cannot read ({e}); "
                    "run the same gputopo version on every node"
                )
                return NodeReport(node=node, checks=[Check(name="verify", status="FAIL", summary=summary)])
    return NodeReport(node=node, checks=[Check(name="verify", status="FAIL", summary=error_line(res))])


def _allowed_by_ha(vmid: int, ha: HaState | None) -> list[str] | None:
    """The nodes the VM's HA placement allows (None: not HA-managed; [] : anywhere)."""
    sid = vm_sid(vmid)
    if ha is None or sid not in ha.resources:
        return None
    if ha.uses_rules:
        for r in ha.rules:
            if (
                r.get("type") == "node-affinity"
                and not int(r.get("disable", 0))
                and int(r.get("strict", 0))
                and sid in resource_list(str(r.get("resources", "")))
            ):
                return sorted(node_list(str(r.get("nodes", ""))))
        return []
    group = ha.resources[sid].get("group")
    for g in ha.groups:
        if g.get("group") == group and int(g.get("restricted", 0)):
            return sorted(node_list(str(g.get("nodes", ""))))
    return []


def _mapped(key: str, info: dict[str, Any]) -> str:
    name = (info.get(key) or {}).get("name", "?")
    return f"{key} mapping {name}"


def migration_check(api: ClusterApiPort, vms: list[tuple[str, int]], ha: HaState | None) -> Check:
    """Proxmox's migration precondition for each (node, vmid) with mapped devices."""
    problems, warnings, details = [], [], {}
    for node, vmid in vms:
        pre = api.migrate_check(node, vmid)
        blocked = {
            n: v.get("unavailable-resources", [])
            for n, v in (pre.get("not_allowed_nodes") or {}).items()
            if v.get("unavailable-resources")
        }
        if not pre.get("mapped-resources"):
            continue
        details[str(vmid)] = {"node": node, "allowed": pre.get("allowed_nodes", []), "blocked": blocked}
        if not blocked:
            continue
        info = pre.get("mapped-resource-info") or {}
        where = ", ".join(
            f"{n} ({', '.join(_mapped(k, info) for k in keys)})" for n, keys in sorted(blocked.items())
        )
        allowed = _allowed_by_ha(vmid, ha)
        risky = sorted(n for n in blocked if allowed is not None and (not allowed or n in allowed))
        if risky:
            problems.append(
                f"VM {vmid} ({node}): HA may recover it on {', '.join(risky)}, where its mapping has "
                f"no device: {where}"
            )
        else:
            warnings.append(
                f"VM {vmid} ({node}): an offline migration would fail on {where}: no device there"
            )
    if problems:
        return Check(name="migration", status="FAIL", summary="; ".join(problems), details=details)
    if warnings:
        return Check(name="migration", status="WARN", summary="; ".join(warnings), details=details)
    return Check(
        name="migration",
        status="PASS",
        summary=f"{len(details)} VM(s) with mapped GPUs can migrate to every node that has them",
        details=details,
    )


def verify_cluster(
    cplan: ClusterPlan,
    spec_text: str,
    shell: NodeShellPort,
    api: ClusterApiPort | None,
    ha: HaState | None,
    vms: list[tuple[str, int]],
    timeout: float,
) -> ClusterReport:
    """Every node's verify (in parallel) and the cluster's checks. Raises NodeUnreachable."""
    order = [n.node for n in cplan.nodes]
    reports = parallel(order, lambda n: node_report(shell, n, spec_text, timeout))
    report = ClusterReport(nodes=[reports[n] for n in order])
    changed = cplan.changed_nodes()
    if cplan.is_empty:
        report.checks.append(
            Check(
                name="converged",
                status="PASS",
                summary=f"{len(order)} node(s), mappings and HA placement as the spec says",
            )
        )
    else:
        what = [f"{n}: {len(cplan.node(n).plan.actions)} action(s)" for n in changed]
        what += [f"HA: {c.describe()}" for c in cplan.ha]
        report.checks.append(Check(name="converged", status="FAIL", summary="; ".join(what)))
    if api is not None and vms:
        report.checks.append(migration_check(api, vms, ha))
    return report
