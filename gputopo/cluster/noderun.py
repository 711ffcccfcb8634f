"""One node's part of a rolling apply: its own ``gputopo apply`` over SSH, and its outcome.

The node runs ``gputopo apply --spec /dev/stdin --yes --json --node N --expect-plan SIGNATURE``,
the spec on stdin, the signature the one the cluster plan showed for that node (a node whose
plan changed since refuses, nothing changed there). Its outcome
(:class:`gputopo.cluster.account.NodeOutcome`) is told from the apply document it printed and
its exit status; ssh failing before the command was sent is ``not-started``, the connection
lost after it ``unknown``.
"""

from __future__ import annotations

import json
import re
import time

from pydantic import ValidationError

from gputopo import exitcodes
from gputopo.cluster.account import DONE, UNCHANGED_CODES, NodeOutcome, Outcome, look_at, recover_at
from gputopo.cluster.gather import error_line
from gputopo.errors import NodeUnreachable
from gputopo.model.documents import ApplyDoc
from gputopo.ports import ExecResult, NodeShellPort

DEFAULT_NODE_TIMEOUT = 1800.0

# what ssh prints when it failed before the remote command was sent (OpenSSH portable): the name
# (ssh.c resolve_host), the TCP connect (sshconnect.c ssh_connect_direct), the banner (kex.c
# kex_exchange_identification), the host key (sshconnect2.c verify_host_key_callback; sshconnect.c
# for a changed key), the login (sshconnect2.c userauth: "user@host: Permission denied (...)"),
# the ssh_config's permissions (readconf.c). Anything else that ends the session (a connection
# closed or reset, clientloop.c's "closed by remote host", no answer in time) may come after the
# command started.
_BEFORE_THE_COMMAND = re.compile(
    r"^(ssh: connect to host |ssh: Could not resolve hostname |"
    r"Host key verification failed|(\S+@\S+: )?Permission denied|kex_exchange_identification|"
    r"Connection timed out during banner exchange|Bad owner or permissions|"
    r".*REMOTE HOST IDENTIFICATION HAS CHANGED)"
)


def read_apply_doc(stdout: str) -> tuple[ApplyDoc | None, str | None]:
    """(the apply document a node printed, None), or (None, why it cannot be read). Read with
    the document's own strict model: a field this version does not know is refused, not dropped."""
    try:
        data = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return None, "gputopo apply --json printed no result"
    try:
        return ApplyDoc.model_validate(data), None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the document"
        return (
            None,
            f"gputopo apply --json printed a document this gputopo cannot read ({where}: {first['msg']})",
        )


def _without_document(node: str, res: ExecResult, seconds: float, unread: str | None) -> NodeOutcome:
    """The outcome of a node's apply that printed no document it can be told from: only the
    exit status says anything (2 and 4 change nothing, 3 needs a human, ssh's 255 before the
    command was sent: not started)."""
    out = NodeOutcome(node, Outcome.UNKNOWN, seconds, rc=res.rc, failed=True)
    out.reason = error_line(res) if res.rc != 0 else (unread or "gputopo apply --json printed no result")
    if res.rc == exitcodes.SSH_ERROR and not res.stdout.strip() and _BEFORE_THE_COMMAND.match(out.reason):
        return NodeOutcome(
            node, Outcome.NOT_STARTED, seconds, reason=f"node {node}: {out.reason}", failed=True
        )
    if res.rc == exitcodes.SSH_ERROR:
        out.rc = None  # ssh's own status: the connection ended before the apply did
        out.reason = f"the connection was lost during its apply ({out.reason})"
    if res.rc in UNCHANGED_CODES:
        out.status = Outcome.REFUSED
    elif res.rc == exitcodes.NEEDS_HUMAN:
        out.status = Outcome.NEEDS_HUMAN
        out.next_step = recover_at(node)
    else:
        out.next_step = look_at(node)
    return out


def _from_document(out: NodeOutcome, doc: ApplyDoc, res: ExecResult) -> None:
    """Fill ``out`` from the node's apply document ``doc`` (its status, steps, verify) and its
    exit status."""
    node = out.node
    verdict = doc.verify or {}
    out.verify = verdict.get("summary")
    out.steps = sum(1 for s in doc.steps if s.status == "done") if doc.status != "error" else len(doc.steps)
    verify_failed = bool(verdict) and not verdict.get("ok", True)
    if doc.status == "applied":
        out.status = Outcome.VERIFY_KEPT if verify_failed else Outcome.APPLIED
        if verify_failed:
            out.reason = f"applied, but its verification failed: {out.verify or 'a check failed'}"
            out.next_step = (
                f"its changes stay: 'gputopo verify' on {node} shows what failed; fix that, "
                "or apply the spec it had before"
            )
        elif res.rc != 0:
            out.reason = error_line(res)
    elif doc.status == "no-changes":
        out.status = Outcome.NO_CHANGES
        if res.rc != 0:
            out.reason = error_line(res)
    elif doc.status == "rolled-back":
        out.status = Outcome.ROLLED_BACK
        out.reason = f"its verification failed and it rolled back: {out.verify or 'a check failed'}"
    elif doc.status == "error":
        out.reason = doc.error or error_line(res)
        if doc.exit_code == exitcodes.NEEDS_HUMAN:
            out.status = Outcome.NEEDS_HUMAN
            out.next_step = recover_at(node)
        elif doc.exit_code in UNCHANGED_CODES or not doc.steps:
            # its exit 2 or 4 changes nothing; nor does an error before its first step began
            out.status = Outcome.REFUSED
        else:
            out.status = Outcome.ROLLED_BACK
    else:
        out.reason = f"gputopo apply ended '{doc.status}', which a rolling apply does not run"
        out.next_step = look_at(node)
    out.failed = res.rc != 0 or out.status not in DONE


def outcome_of(node: str, res: ExecResult, seconds: float) -> NodeOutcome:
    """The outcome of a node's ``gputopo apply --json`` that ended with ``res``: from its
    document (status, steps, verify) and its exit status."""
    doc, unread = read_apply_doc(res.stdout)
    if doc is None:
        return _without_document(node, res, seconds, unread)
    out = NodeOutcome(node, Outcome.UNKNOWN, seconds, rc=res.rc, doc=doc)
    _from_document(out, doc, res)
    return out


def lost(node: str, err: NodeUnreachable, seconds: float) -> NodeOutcome:
    """The outcome of a node whose ssh failed: not started when ssh failed before sending the
    command (connect, host key, login), else unknown (the apply may have run)."""
    if _BEFORE_THE_COMMAND.match(err.reason):
        return NodeOutcome(node, Outcome.NOT_STARTED, seconds, reason=str(err), failed=True)
    return NodeOutcome(
        node,
        Outcome.UNKNOWN,
        seconds,
        reason=f"the connection was lost during its apply ({err.reason})",
        failed=True,
        next_step=look_at(node),
    )


def apply_argv(node: str, signature: str, verify: bool = True, ha: bool = True) -> list[str]:
    """The node's own apply: the spec on stdin, refused there when its plan is no longer
    ``signature``."""
    argv = ["gputopo", "apply", "--spec", "/dev/stdin", "--yes", "--json", "--node", node]
    argv += ["--expect-plan", signature]
    if not verify:
        argv.append("--no-verify")
    if not ha:
        argv.append("--no-ha")
    return argv


def apply_node(
    shell: NodeShellPort,
    node: str,
    signature: str,
    spec_text: str,
    timeout: float,
    verify: bool = True,
    ha: bool = True,
) -> NodeOutcome:
    """Run the node's own apply; returns its outcome (:func:`outcome_of`, :func:`lost`)."""
    t0 = time.monotonic()
    try:
        res = shell.run(node, apply_argv(node, signature, verify, ha), timeout, input=spec_text)
    except NodeUnreachable as e:
        return lost(node, e, time.monotonic() - t0)
    return outcome_of(node, res, time.monotonic() - t0)
