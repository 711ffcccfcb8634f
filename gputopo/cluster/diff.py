"""How a cluster differs from its spec: each node's diff, the HA files, in one report.

A node's part is :func:`gputopo.plan.diff.diff` on that node's facts and state (so it is empty
exactly when the node's plan is, its HA placement step included); the cluster is without
differences exactly when every node is. The HA part shows ``rules.cfg`` (PVE 9) or
``groups.cfg`` and ``resources.cfg`` (PVE 8) before and after the placement once every node
is done. Its document
(``gputopo cluster diff --json``) holds each node's as ``gputopo diff --json`` prints it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gputopo.cluster.gather import NodeInput
from gputopo.cluster.ha import HaChange, HaState, ha_files
from gputopo.model.documents import ClusterDiffDoc
from gputopo.model.strict import Strict
from gputopo.plan.diff import DiffReport, FileChange, diff, unified
from gputopo.plan.spec import Spec


class ClusterDiff(Strict):
    nodes: list[DiffReport] = Field(default_factory=list)
    ha: list[str] = Field(default_factory=list, description="One line per HA change")
    ha_files: dict[str, FileChange] = Field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        # the HA placement is each node's step: it differs only where a node's diff does
        return all(n.is_empty for n in self.nodes)

    def to_data(self) -> dict[str, Any]:
        """The cluster diff document (``gputopo schema cluster-diff``) without ``schema_version``:
        each node's entry is that node's diff document (:meth:`DiffReport.to_data`, what
        ``gputopo diff --json`` prints there)."""
        data = {
            "nodes": [n.to_data() for n in self.nodes],
            "ha": list(self.ha),
            "ha_files": {k: v.model_dump() for k, v in self.ha_files.items()},
            "is_empty": self.is_empty,
        }
        ClusterDiffDoc.model_validate(data)  # what it declares, and nothing else
        return data

    def to_text(self) -> str:
        out = [n.to_text().rstrip("\n") for n in self.nodes]
        if self.ha:
            out.append("HA placement once every node is done")
            out += [f"  {line}" for line in self.ha]
            out += [unified(path, c.before, c.after).rstrip("\n") for path, c in self.ha_files.items()]
        out.append("Cluster: no differences" if self.is_empty else "Cluster: differences")
        return "\n".join(out) + "\n"


def diff_cluster(
    spec: Spec,
    inputs: dict[str, NodeInput],
    order: list[str],
    ha_changes: list[HaChange],
    ha: HaState | None,
    templates: str | None = None,
) -> ClusterDiff:
    """The cluster's differences. Raises PlanRefused (a node's spec cannot be carried out)."""
    report = ClusterDiff()
    for node in order:
        i = inputs[node]
        report.nodes.append(diff(i.facts, spec, i.current, node=node, templates=templates))
    if ha is not None and ha_changes:
        report.ha = [c.describe() for c in ha_changes]
        report.ha_files = {p: FileChange(before=b, after=a) for p, (b, a) in ha_files(ha, ha_changes).items()}
    return report
