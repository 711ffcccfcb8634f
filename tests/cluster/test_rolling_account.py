"""How a rolling apply tells each node's outcome from what the node's own ``gputopo apply --json``
printed (its document and exit status) or how ssh failed, and the rollout's exit code from the
outcomes: 2 or 4 only when nothing was changed anywhere, 3 when a node needs a human or its
outcome is unknown, else 1. Nodes here are stand-ins that answer as a node's apply does."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gputopo.cli.schema import schema_of
from gputopo.cluster.account import RollingResult
from gputopo.cluster.noderun import apply_node
from gputopo.cluster.rolling import rolling_apply
from gputopo.errors import ClusterApplyFailed, NodeUnreachable
from gputopo.model.documents import versioned
from gputopo.ports import ExecResult


def doc(status: str, exit_code: int = 0, steps: int = 3, verify_ok: bool | None = True, error=None) -> str:
    step = {"phase": "switch", "kind": "rebind", "description": "rebind", "seconds": 0.1, "warnings": []}
    data = {
        "status": status,
        "exit_code": exit_code,
        "error": error,
        "changed": status in ("applied", "rolled-back"),
        "steps": [{"step": i + 1, "status": "done", **step} for i in range(steps)],
        "verify": None
        if verify_ok is None
        else {
            "ok": verify_ok,
            "summary": "all clear: 7 PASS" if verify_ok else "verification failed: 1 FAIL (inference)",
        },
    }
    return json.dumps(versioned(data))


class Node:
    """Answers every command with ``res``, or raises ``err``."""

    def __init__(self, res: ExecResult | None = None, err: Exception | None = None):
        self.res, self.err = res, err

    def run(self, node, argv, timeout, input=None):
        if self.err is not None:
            raise self.err
        return self.res


def outcome(res=None, err=None):
    return apply_node(Node(res, err), "pve2", "sig", "spec", 5.0)


CASES = {
    # what the node printed -> (outcome, kept, failed)
    "applied": (ExecResult(0, doc("applied")), "applied-and-kept", True, False),
    "no changes": (ExecResult(0, doc("no-changes", steps=0, verify_ok=None)), "no-changes", False, False),
    "verify failed, kept": (
        ExecResult(1, doc("applied", exit_code=1, verify_ok=False)),
        "failed-verify-kept",
        True,
        True,
    ),
    "verify failed, rolled back": (
        ExecResult(1, doc("rolled-back", exit_code=1, verify_ok=False)),
        "applied-then-rolled-back",
        False,
        True,
    ),
    "a step failed, rolled back": (
        ExecResult(1, doc("error", 1, steps=5, verify_ok=None, error="apply failed at step 5; rolled back")),
        "applied-then-rolled-back",
        False,
        True,
    ),
    "interrupted, rolled back": (
        ExecResult(143, doc("error", 143, steps=2, verify_ok=None, error="interrupted")),
        "applied-then-rolled-back",
        False,
        True,
    ),
    "lock held": (
        ExecResult(4, doc("error", 4, steps=0, verify_ok=None, error="lock held")),
        "refused",
        False,
        True,
    ),
    "plan changed": (
        ExecResult(2, doc("error", 2, steps=0, verify_ok=None, error="the host changed")),
        "refused",
        False,
        True,
    ),
    "failed before its first step": (
        ExecResult(1, doc("error", 1, steps=0, verify_ok=None, error="API down")),
        "refused",
        False,
        True,
    ),
    "rollback stuck": (
        ExecResult(3, doc("error", 3, steps=4, verify_ok=None, error="needs a human: 0000:91:00.0")),
        "needs-human",
        True,
        True,
    ),
    "ssh ended mid-apply": (
        ExecResult(255, "", "[4/12] rebind\nConnection to 10.0.0.2 closed by remote host.\n"),
        "unknown",
        None,
        True,
    ),
    "login refused, ssh's 255": (
        ExecResult(255, "", "root@10.0.0.2: Permission denied (publickey).\n"),
        "not-started",
        False,
        True,
    ),
    "a crash without a document": (
        ExecResult(1, "", "Traceback ...\nKeyError: 'x'\n"),
        "unknown",
        None,
        True,
    ),
    "usage error without a document": (
        ExecResult(2, "", "gputopo: error: no such option\n"),
        "refused",
        False,
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_nodes_outcome_comes_from_its_apply_document_and_exit_status(case):
    res, status, kept, failed = CASES[case]
    o = outcome(res)
    assert (o.status, o.kept, o.failed) == (status, kept, failed), o
    if status in ("unknown", "needs-human"):
        assert "gputopo recover" in o.next_step
    if status == "failed-verify-kept":
        assert o.reason == "applied, but its verification failed: verification failed: 1 FAIL (inference)"


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ("ssh: connect to host 10.0.0.2 port 22: Connection refused", "not-started"),
        ("ssh: Could not resolve hostname pve2: Name or service not known", "not-started"),
        ("Host key verification failed.", "not-started"),
        ("root@10.0.0.2: Permission denied (publickey).", "not-started"),
        ("Permission denied (publickey).", "not-started"),
        ("kex_exchange_identification: read: Connection reset by peer", "not-started"),
        ("no answer within 1800 s (gputopo apply)", "unknown"),
        ("Connection closed by 10.0.0.2 port 22", "unknown"),
        ("ssh exited 255", "unknown"),
    ],
)
def test_ssh_failing_before_the_command_is_not_started_after_it_unknown(reason, status):
    o = outcome(err=NodeUnreachable("pve2", reason))
    assert (o.status, o.failed) == (status, True)
    assert (o.next_step != "") == (status == "unknown")


def outcomes(*pairs: tuple[str, str]) -> RollingResult:
    from gputopo.cluster.account import NodeOutcome

    return RollingResult(
        [
            NodeOutcome(n, s, failed=s not in ("applied-and-kept", "no-changes", "not-started"))
            for n, s in pairs
        ]
    )


@pytest.mark.parametrize(
    ("pairs", "code"),
    [
        ((("pve1", "applied-and-kept"), ("pve2", "no-changes")), 0),
        ((("pve1", "refused"), ("pve2", "not-started")), 2),
        ((("pve1", "applied-and-kept"), ("pve2", "refused"), ("pve3", "not-started")), 1),
        ((("pve1", "applied-then-rolled-back"), ("pve2", "not-started")), 1),
        ((("pve1", "applied-and-kept"), ("pve2", "failed-verify-kept")), 1),
        ((("pve1", "applied-and-kept"), ("pve2", "unknown"), ("pve3", "not-started")), 3),
        ((("pve1", "needs-human"), ("pve2", "not-started")), 3),
        ((("pve1", "no-changes"), ("pve2", "unknown")), 3),
    ],
)
def test_the_rollouts_exit_code_says_whether_anything_changed(pairs, code):
    assert outcomes(*pairs).exit_code == code


def test_a_first_node_locked_passes_on_4_only_while_nothing_changed():
    from gputopo.cluster.account import NodeOutcome

    r = RollingResult([NodeOutcome("pve1", "refused", rc=4, failed=True), NodeOutcome("pve2", "not-started")])
    assert r.exit_code == 4 and "nothing was changed anywhere" in r.summary()
    r.outcomes.insert(0, NodeOutcome("pve0", "applied-and-kept"))
    assert r.exit_code == 1 and "nothing was changed" not in r.summary()


class Cluster:
    """Nodes answering as their applies would: ``by_node`` maps a node to its result or error."""

    def __init__(self, by_node):
        self.by_node = by_node
        self.ran: list[str] = []

    def run(self, node, argv, timeout, input=None):
        self.ran.append(node)
        what = self.by_node[node]
        if isinstance(what, Exception):
            raise what
        return what


class _Plan:
    def __init__(self, nodes):
        from types import SimpleNamespace

        self.nodes = [SimpleNamespace(node=n, signature="sig") for n in nodes]
        self.ha = []


def test_the_rollout_stops_at_a_lost_node_and_its_document_says_how_every_node_ended():
    shell = Cluster(
        {
            "pve1": ExecResult(0, doc("applied")),
            "pve2": NodeUnreachable("pve2", "no answer within 1800 s (gputopo apply)"),
            "pve3": ExecResult(0, doc("applied")),
        }
    )
    with pytest.raises(ClusterApplyFailed) as e:
        rolling_apply(_Plan(["pve1", "pve2", "pve3"]), "spec", shell, None)
    assert shell.ran == ["pve1", "pve2"]
    assert e.value.exit_code == 3 and e.value.unknown == ["pve2"] and e.value.kept == ["pve1"]
    data = json.loads(e.value.account.to_doc().model_dump_json())
    jsonschema.validate(versioned(data), schema_of("cluster-apply"))
    assert [(n["node"], n["outcome"], n["kept"]) for n in data["nodes"]] == [
        ("pve1", "applied-and-kept", True),
        ("pve2", "unknown", None),
        ("pve3", "not-started", False),
    ]
    assert data["status"] == "stopped" and data["changed"] is True and data["error"] == str(e.value)
    text = e.value.account.to_text()
    assert "next: see how its apply ended with 'gputopo history' on pve2" in text


def test_a_rollout_where_every_node_is_done_returns_its_account():
    shell = Cluster(
        {"pve1": ExecResult(0, doc("applied")), "pve2": ExecResult(0, doc("no-changes", steps=0))}
    )
    result = rolling_apply(_Plan(["pve1", "pve2"]), "spec", shell, None)
    assert result.exit_code == 0 and not result.failed
    assert result.to_doc().status == "applied"
    assert result.summary().endswith("applied and kept: pve1; no changes: pve2")


def test_a_signal_between_two_batches_names_the_last_node_told_in_the_error_too():
    """SIGTERM after pve2's apply ended and before pve3's began: the account says pve3 was not
    started because the rollout stopped at pve2, and the error line names pve2 as well."""
    import signal

    from gputopo.cluster.account import NodeOutcome

    r = RollingResult(
        [
            NodeOutcome("pve1", "applied-and-kept"),
            NodeOutcome("pve2", "applied-and-kept"),
            NodeOutcome("pve3", "not-started", reason="the rollout stopped at pve2"),
        ]
    )
    r.signum = signal.SIGTERM
    err = r.error()
    assert err.exit_code == 143
    assert str(err).startswith("stopped at node pve2: interrupted (SIGTERM); applied and kept: pve1, pve2")
    assert str(err).endswith("not started: pve3")
