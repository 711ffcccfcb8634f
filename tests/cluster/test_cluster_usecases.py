"""The cluster use cases called as a library (what the CLI's commands call): a refused plan, a
declined or impossible confirmation and a dry run end with the rollout's document and the error
the command ends with, never by exiting; the plan's text is shown before anything is asked."""

from __future__ import annotations

import pytest

from gputopo import exitcodes
from gputopo.errors import ApplyCancelled, ConfigError, PlanRefused
from gputopo.usecases.cluster_apply import ClusterApplyRequest, cluster_apply
from gputopo.usecases.cluster_connect import ClusterReach, ClusterSource
from gputopo.usecases.cluster_plan import ClusterPlanRequest, cluster_plan
from helpers.applysim import diff as fp_diff
from helpers.applysim import fingerprint
from helpers.clusterharness import cleanup, cluster, copy_cluster, make_template, spec_text, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a simulated cluster per test (seconds each); the full run only


def request(cluster, spec, **options) -> ClusterApplyRequest:
    return ClusterApplyRequest(
        reach=ClusterReach(spec_file=str(spec)), source=ClusterSource(sim=str(cluster.dir)), **options
    )


def fingerprints(cluster) -> dict:
    return {n: fingerprint(cluster.member(n), cluster.container(n)) for n in cluster.nodes}


def test_a_refused_plan_is_the_refused_document_and_planrefused_nothing_changed(cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1"]).replace("{numa: [0]}", "{count: 99}"))
    before = fingerprints(cluster)
    shown: list[str] = []
    result = cluster_apply(request(cluster, spec, yes=True, show=shown.append))
    assert isinstance(result.error, PlanRefused) and shown == []
    assert str(result.error).startswith("refused: node pve1")
    doc = result.doc
    assert (doc.status, doc.exit_code, doc.changed) == ("refused", exitcodes.NOTHING_CHANGED, False)
    assert doc.error == "the plan was refused (its refusals are on stderr)"
    assert [(n.node, n.outcome) for n in doc.nodes] == [("pve1", "not-started")]
    assert result.account is None
    with pytest.raises(PlanRefused):
        cluster_plan(
            ClusterPlanRequest(ClusterReach(spec_file=str(spec)), ClusterSource(sim=str(cluster.dir)))
        )
    after = fingerprints(cluster)
    for n in cluster.nodes:
        assert fp_diff(before[n], after[n]) == [], n


def test_without_yes_it_asks_and_a_no_or_nobody_to_ask_changes_nothing(cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1"], whole=["pve2", "pve3"]))
    before = fingerprints(cluster)
    asked: list[str] = []
    shown: list[str] = []

    def no(question: str) -> bool:
        asked.append(question)
        return False

    declined = cluster_apply(request(cluster, spec, show=shown.append, confirm=no))
    assert isinstance(declined.error, ApplyCancelled)
    assert asked == ["Apply on 3 node(s), 1 at a time?"]
    assert shown and shown[0].endswith("Cluster: changes on 3 of 3 node(s) (pve1, pve2, pve3)\n")
    assert (declined.doc.status, declined.doc.exit_code) == ("refused", exitcodes.NOTHING_CHANGED)

    nobody = cluster_apply(request(cluster, spec))
    assert isinstance(nobody.error, ConfigError) and "pass --yes" in str(nobody.error)
    assert nobody.doc.status == "refused"

    dry = cluster_apply(request(cluster, spec, dry_run=True))
    assert dry.error is None and dry.doc.status == "dry-run" and dry.doc.exit_code == exitcodes.OK
    assert [(n.node, n.outcome) for n in dry.doc.nodes] == [(n, "not-started") for n in cluster.nodes]
    after = fingerprints(cluster)
    for n in cluster.nodes:
        assert fp_diff(before[n], after[n]) == [], n
