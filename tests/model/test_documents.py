"""The versioned documents are declared once (:mod:`gputopo.model.documents`) and read back
strictly: the cluster refuses a node's verify or apply document with a field this version does
not know, instead of dropping it; the Ansible module reads only keys the apply document has."""

from __future__ import annotations

import ast
import json
import re

from gputopo.cluster.noderun import apply_node, read_apply_doc
from gputopo.cluster.verify import node_report
from gputopo.model.documents import ApplyDoc, Check, VerifyReport, versioned
from gputopo.ports import ExecResult
from helpers import REPO

PKG = REPO / "gputopo"
MODULE = REPO / "ansible_collections/gputopo/proxmox/plugins/modules/topology.py"


class Shell:
    """A node that prints ``stdout`` and exits ``rc`` whatever it is asked."""

    def __init__(self, stdout: str, rc: int = 0):
        self.res = ExecResult(rc=rc, stdout=stdout, stderr="")

    def run(self, node, argv, timeout, input=None):
        return self.res


def _verify_doc() -> dict:
    report = VerifyReport(
        node="pve2",
        checks=[
            Check(name="converged", status="PASS", summary="the plan is empty"),
            Check(name="memory", status="WARN", summary="2 GiB left", details={"free_gib": 2}),
        ],
    )
    return versioned(report.to_data())


def test_the_cluster_reads_a_nodes_verify_document():
    report = node_report(Shell(json.dumps(_verify_doc())), "pve2", "spec", 5.0)
    assert [(c.name, c.status) for c in report.checks] == [("converged", "PASS"), ("memory", "WARN")]
    assert report.checks[1].details == {"free_gib": 2}


def test_the_cluster_refuses_a_verify_document_with_an_unknown_field():
    for where, doc in (("checks.0.severity", _verify_doc()), ("uptime", _verify_doc())):
        if where == "uptime":
            doc["uptime"] = 12
        else:
            doc["checks"][0]["severity"] = "low"
        report = node_report(Shell(json.dumps(doc), rc=0), "pve2", "spec", 5.0)
        (check,) = report.checks
        assert check.status == "FAIL" and not report.ok, where
        assert "cannot read" in check.summary and where in check.summary, check.summary


def test_the_cluster_refuses_a_verify_document_of_another_version():
    doc = _verify_doc()
    doc["schema_version"] = 2
    (check,) = node_report(Shell(json.dumps(doc)), "pve2", "spec", 5.0).checks
    assert check.status == "FAIL" and "schema_version 2" in check.summary


def _apply_doc() -> dict:
    return versioned(
        {
            "status": "applied",
            "exit_code": 0,
            "node": "pve2",
            "changed": True,
            "signature": "abc",
            "journal": "/var/lib/gputopo/journal/x.jsonl",
            "wall_s": 1.0,
            "stop_window_s": 0.5,
            "steps": [
                {
                    "step": 1,
                    "phase": "stop",
                    "kind": "stop_guest",
                    "description": "stop CT 101",
                    "status": "done",
                    "seconds": 0.5,
                    "warnings": [],
                }
            ],
            "warnings": [],
            "plan": ["stop CT 101"],
            "verify": _verify_doc(),
            "boot": None,
        }
    )


def test_a_rolling_apply_reads_a_nodes_apply_document_strictly():
    doc, why = read_apply_doc(json.dumps(_apply_doc()))
    assert why is None and doc.status == "applied" and len(doc.steps) == 1
    outcome = apply_node(Shell(json.dumps(_apply_doc())), "pve2", "abc", "spec", 5.0)
    assert (outcome.status, outcome.steps, outcome.failed) == ("applied-and-kept", 1, False)
    drifted = _apply_doc()
    drifted["steps"][0]["retries"] = 2
    doc, why = read_apply_doc(json.dumps(drifted))
    assert doc is None and "steps.0.retries" in why
    outcome = apply_node(Shell(json.dumps(drifted)), "pve2", "abc", "spec", 5.0)
    # it exited 0, but what it did cannot be told: unknown, never "applied"
    assert outcome.status == "unknown" and outcome.failed and "cannot read" in outcome.reason


def test_check_and_status_are_declared_once():
    """Only model/documents.py declares the verdict models; verify/ and cluster/ use them."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in ("Check", "VerifyReport", "ApplyDoc"):
                found.append((path.relative_to(PKG).as_posix(), node.name))
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "Status" for t in node.targets):
                found.append((path.relative_to(PKG).as_posix(), "Status"))
    assert sorted(found) == [
        ("model/documents.py", n) for n in ("ApplyDoc", "Check", "Status", "VerifyReport")
    ]


def test_the_ansible_module_reads_only_keys_the_apply_document_has():
    """The module runs where gputopo may not be importable, so it reads plain dicts: every key
    it takes from ``gputopo apply --json`` must be one the document declares."""
    text = MODULE.read_text()
    keys = set(re.findall(r'\bdata\.get\("(\w+)"', text)) | set(re.findall(r'\bdata\["(\w+)"\]', text))
    assert {"status", "changed", "steps", "verify", "warnings"} <= keys
    assert keys <= set(ApplyDoc.model_fields), keys - set(ApplyDoc.model_fields)


def test_the_ansible_module_reads_only_keys_the_plan_and_diff_documents_have():
    from gputopo.cli.schema import schema_of
    from gputopo.model.documents import DiffDoc

    text = MODULE.read_text()
    plan_keys = set(re.findall(r'\bplan\.get\("(\w+)"', text))
    diff_keys = set(re.findall(r'\breport\.get\("(\w+)"', text))
    verify_keys = set(re.findall(r'\bverdict\.get\("(\w+)"', text))
    assert {"actions", "no_changes", "signature", "warnings"} <= plan_keys and diff_keys == {"changes"}
    assert verify_keys == {"ok"}
    assert plan_keys <= set(schema_of("plan")["properties"])
    assert diff_keys <= set(DiffDoc.model_fields)
    assert verify_keys <= set(schema_of("verify")["properties"])


def test_versioned_puts_the_version_first_and_keeps_a_documents_own():
    assert list(versioned({"a": 1})) == ["schema_version", "a"] and versioned({"a": 1})["schema_version"] == 1
    # a document with a version of its own (the facts document) is not given this module's
    assert versioned({"a": 1, "schema_version": 2}) == {"schema_version": 2, "a": 1}
    assert list(versioned({"a": 1, "schema_version": 2})) == ["schema_version", "a"]
