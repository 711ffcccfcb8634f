"""Rolling apply: node by node over SSH, each node running its own ``gputopo apply``.

Driver binding happens only on the node itself, so each node applies its own plan with its own
lock, journal and rollback: ``gputopo apply --spec /dev/stdin --yes --json --node N
--expect-plan SIGNATURE``, the spec on stdin, the signature the one the cluster plan showed for
that node (a node whose plan changed since refuses, nothing changed there). The order:

* ``canary`` first, alone; then the other nodes in spec order, ``serial`` at a time (the nodes of
  a batch apply concurrently: their mapping writes merge, see :mod:`gputopo.actions.mapping`);
* the first failure stops the run once its batch has ended; the nodes not reached are not
  started.

HA placement is a step of each node's own apply (journaled, rolled back with the node's other
steps: :mod:`gputopo.actions.ha`); ``--no-ha`` is passed on to every node.

Every run ends with an account (:class:`RollingResult`): one outcome per node, told from what
the node's own apply printed (its apply document: status, steps, verify), never guessed:

* ``applied-and-kept``, ``no-changes``: the node is done;
* ``failed-verify-kept``: every step ran and stays, its verification failed (a node's apply
  verifies after the transaction: its changes are not undone);
* ``applied-then-rolled-back``: a step failed (or the apply was interrupted) and the node
  rolled itself back;
* ``needs-human``: its rollback did not complete (its exit 3): the journal stays open;
* ``refused``: it refused before changing anything (a lock held, a plan that changed, a
  preflight): its exit 2 or 4, or an error before its journal began;
* ``not-started``: never run, or unreachable before its command could start (ssh failed to
  connect, log in or check the host key: the command had not been sent);
* ``unknown``: the connection was lost while its apply ran (ssh ended without the document, or
  it took longer than the timeout): the node may have finished, rolled back or stopped
  half-way; its own ``gputopo history`` says which.

The rollout's exit code (:attr:`RollingResult.exit_code`): 0 when every node is done; 3 when a
node needs a human or its outcome is unknown; 2 or 4 (the refusing node's) only when nothing
was changed anywhere; otherwise 1. Ctrl-C ends it with the account too (130): the nodes
applying then are told from what they answer (a node's apply that got the same Ctrl-C rolls
back and says so), else unknown.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pydantic import ValidationError

from gputopo.cluster.gather import error_line
from gputopo.cluster.plan import ClusterPlan
from gputopo.errors import ClusterApplyFailed, ConfigError, GputopoError, NodeUnreachable, UnknownNode
from gputopo.model.documents import ApplyDoc, ClusterApplyDoc, NodeApplyDoc
from gputopo.ports import ExecResult, NodeShellPort

DEFAULT_NODE_TIMEOUT = 1800.0

APPLIED = "applied-and-kept"
NO_CHANGES = "no-changes"
ROLLED_BACK = "applied-then-rolled-back"
VERIFY_KEPT = "failed-verify-kept"
NEEDS_HUMAN = "needs-human"
NOT_STARTED = "not-started"
UNKNOWN = "unknown"
REFUSED = "refused"

# outcomes whose changes stay on the node
KEPT = (APPLIED, VERIFY_KEPT)
# outcomes after which a human looks at the node before anything else runs there
FOR_A_HUMAN = (NEEDS_HUMAN, UNKNOWN)

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


@dataclass
class NodeOutcome:
    """What one node's apply did (see the module docstring for ``status``).

    ``failed``: this node stopped the rollout; ``rc`` its apply's exit status (None when it did
    not run or the connection was lost); ``doc`` its apply document."""

    node: str
    status: str
    seconds: float = 0.0
    reason: str = ""
    rc: int | None = None
    steps: int = 0
    verify: str | None = None
    failed: bool = False
    next_step: str = ""
    doc: ApplyDoc | None = None

    @property
    def kept(self) -> bool | None:
        """Whether changes it made are still there; None: unknown."""
        if self.status in KEPT or self.status == NEEDS_HUMAN:
            return True
        return None if self.status == UNKNOWN else False

    def to_doc(self) -> NodeApplyDoc:
        return NodeApplyDoc(
            node=self.node,
            outcome=self.status,
            kept=self.kept,
            failed=self.failed,
            exit_code=self.rc,
            seconds=round(self.seconds, 3),
            steps=self.steps,
            verify=self.verify,
            reason=self.reason or None,
            next_step=self.next_step or None,
            apply=self.doc,
        )

    def progress(self) -> str:
        """``pve1: applied-and-kept  13 steps in 4.2 s; ...``: the line as the node ends."""
        return f"{self.node}: " + self.line().split("  ", 1)[1].strip()

    def line(self, width: int = 0, status_width: int = 0) -> str:
        """``pve1  applied-and-kept  13 steps in 4.2 s; verify: all clear: 9 PASS``, the node
        and the outcome padded to ``width`` and ``status_width``."""
        parts = []
        if self.rc is not None or self.steps:
            parts.append(f"{self.steps} steps in {self.seconds:.1f} s")
        if self.reason:
            parts.append(self.reason)
        elif self.verify:
            parts.append(f"verify: {self.verify}")
        head = f"{self.node.ljust(width)}  {self.status.ljust(status_width) if parts else self.status}"
        return head + (f"  {'; '.join(parts)}" if parts else "")


@dataclass
class RollingResult:
    """The rollout's account: every node's outcome, in the order they were to apply."""

    outcomes: list[NodeOutcome] = field(default_factory=list)
    wall_s: float = 0.0
    interrupted: bool = False  # Ctrl-C stopped the rollout

    def of(self, status: str | tuple[str, ...]) -> list[str]:
        wanted = (status,) if isinstance(status, str) else status
        return [o.node for o in self.outcomes if o.status in wanted]

    def done(self) -> list[str]:
        return self.of((APPLIED, NO_CHANGES))

    def kept(self) -> list[str]:
        """The nodes changed whose changes stay."""
        return self.of(KEPT)

    @property
    def stopped_at(self) -> NodeOutcome | None:
        """The first node that failed, None when none did."""
        return next((o for o in self.outcomes if o.failed), None)

    @property
    def failed(self) -> bool:
        return self.stopped_at is not None or self.interrupted

    @property
    def changed(self) -> bool | None:
        """Whether any node was changed and kept; None when none is known to be and a node's
        outcome is unknown."""
        if self.kept() or self.of(NEEDS_HUMAN):
            return True
        return None if self.of(UNKNOWN) else False

    @property
    def exit_code(self) -> int:
        """0 done; 3 a node needs a human or its outcome is unknown; 2 or 4 (the refusing
        node's) only when nothing was changed anywhere; else 1."""
        if not self.failed:
            return 0
        if self.interrupted:
            return 130
        if self.of(FOR_A_HUMAN):
            return 3
        first = self.stopped_at
        touched = self.changed or self.of(ROLLED_BACK)
        if not touched and first is not None and first.status in (REFUSED, NOT_STARTED):
            return first.rc if first.rc in (2, 4) else 2
        return 1

    def summary(self) -> str:
        """The last line: how it ended, what is changed and kept, what was not started."""
        kept = self.kept()
        parts = [f"applied and kept: {', '.join(kept) if kept else 'none'}"]
        for status, words in ((NEEDS_HUMAN, "needs a human"), (UNKNOWN, "outcome unknown")):
            if self.of(status):
                parts.append(f"{words}: {', '.join(self.of(status))}")
        if self.of(ROLLED_BACK):
            parts.append(f"rolled back: {', '.join(self.of(ROLLED_BACK))}")
        if self.of(NO_CHANGES):
            parts.append(f"no changes: {', '.join(self.of(NO_CHANGES))}")
        if self.failed and not self.changed and not self.of(ROLLED_BACK) and not self.of(UNKNOWN):
            parts.append("nothing was changed anywhere")
        not_started = self.of(NOT_STARTED)
        if not_started:
            parts.append(f"not started: {', '.join(not_started)}")
        first = self.stopped_at
        head = f"stopped at node {first.node}" if first is not None else "cluster applied"
        if self.interrupted:
            head = "interrupted (Ctrl-C)"
        return f"{head} in {self.wall_s:.1f} s: " + "; ".join(parts)

    def to_text(self) -> str:
        """The account: one line per node (its next step under it), the HA changes, the summary."""
        width = max((len(o.node) for o in self.outcomes), default=0)
        status_width = max((len(o.status) for o in self.outcomes), default=0)
        lines = ["Rollout account:"]
        for o in self.outcomes:
            lines.append("  " + o.line(width, status_width))
            if o.next_step:
                lines.append(f"  {' ' * width}  next: {o.next_step}")
        lines.append(self.summary())
        return "\n".join(lines) + "\n"

    def error(self) -> ClusterApplyFailed:
        """The error a failed rollout ends with (one line, the account's summary)."""
        first = self.stopped_at
        node = first.node if first is not None else None
        reason = first.reason if first is not None else ""
        if self.interrupted:
            node = node or self.outcomes[-1].node
            reason = f"interrupted (Ctrl-C) during its apply; {reason}" if reason else "interrupted (Ctrl-C)"
        return ClusterApplyFailed(
            node,
            reason,
            self.exit_code,
            kept=self.kept(),
            not_started=self.of(NOT_STARTED),
            unknown=self.of(UNKNOWN),
            needs_human=self.of(NEEDS_HUMAN),
            account=self,
        )

    @classmethod
    def unstarted(cls, nodes: list[str], empty: set[str] | frozenset[str] = frozenset()) -> RollingResult:
        """The account of a rollout that never started a node's apply (a dry run, no changes,
        refused): the nodes in ``empty`` have no changes, the others are not started."""
        return cls([NodeOutcome(n, NO_CHANGES if n in empty else NOT_STARTED) for n in nodes])

    def to_doc(self, status: str | None = None, error: GputopoError | None = None) -> ClusterApplyDoc:
        """The ``cluster apply --json`` document (``gputopo schema cluster-apply``); ``status``
        and ``error`` for a rollout refused before it started (``error``'s exit code)."""
        if status is None:
            status = "stopped" if self.failed else ("applied" if self.kept() else "no-changes")
        if error is None and self.failed:
            error = self.error()
        return ClusterApplyDoc(
            status=status,
            exit_code=self.exit_code if error is None else error.exit_code,
            changed=self.changed,
            error=None if error is None else str(error),
            nodes=[o.to_doc() for o in self.outcomes],
            wall_s=round(self.wall_s, 3),
        )


def batches(order: list[str], serial: int, canary: str | None) -> list[list[str]]:
    """The nodes in the order they apply: ``canary`` alone first, then ``serial`` at a time.
    Raises UnknownNode for a canary outside ``order``, ConfigError for ``serial`` < 1."""
    if serial < 1:
        raise ConfigError(f"--serial {serial}: at least 1 node at a time")
    rest = list(order)
    out: list[list[str]] = []
    if canary is not None:
        if canary not in rest:
            raise UnknownNode(canary, "one of the nodes of this run", order)
        rest.remove(canary)
        out.append([canary])
    out += [rest[i : i + serial] for i in range(0, len(rest), serial)]
    return out


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


def look_at(node: str) -> str:
    """The next step for a node whose apply's end is unknown."""
    return (
        f"see how its apply ended with 'gputopo history' on {node} (ssh root@{node} gputopo history); "
        f"if it is unfinished, 'gputopo recover' there rolls it back"
    )


def outcome_of(node: str, res: ExecResult, seconds: float) -> NodeOutcome:
    """The outcome of a node's ``gputopo apply --json`` that ended with ``res``: from its
    document (status, steps, verify) and its exit status."""
    doc, unread = read_apply_doc(res.stdout)
    out = NodeOutcome(node, UNKNOWN, seconds, rc=res.rc, doc=doc)
    if doc is None:
        # no document: only the exit status says anything (2 and 4 change nothing, 3 needs a human)
        out.reason = error_line(res) if res.rc != 0 else (unread or "gputopo apply --json printed no result")
        if res.rc == 255 and not res.stdout.strip() and _BEFORE_THE_COMMAND.match(out.reason):
            return NodeOutcome(node, NOT_STARTED, seconds, reason=f"node {node}: {out.reason}", failed=True)
        if res.rc == 255:
            out.rc = None  # ssh's own status: the connection ended before the apply did
            out.reason = f"the connection was lost during its apply ({out.reason})"
        if res.rc in (2, 4):
            out.status = REFUSED
        elif res.rc == 3:
            out.status = NEEDS_HUMAN
            out.next_step = f"fix what the error names, then run 'gputopo recover' on {node}"
        else:
            out.next_step = look_at(node)
        out.failed = True
        return out
    verdict = doc.verify or {}
    out.verify = verdict.get("summary")
    out.steps = sum(1 for s in doc.steps if s.status == "done") if doc.status != "error" else len(doc.steps)
    verify_failed = bool(verdict) and not verdict.get("ok", True)
    if doc.status == "applied":
        out.status = VERIFY_KEPT if verify_failed else APPLIED
        if verify_failed:
            out.reason = f"applied, but its verification failed: {out.verify or 'a check failed'}"
            out.next_step = (
                f"its changes stay: 'gputopo verify' on {node} shows what failed; fix that, "
                "or apply the spec it had before"
            )
        elif res.rc != 0:
            out.reason = error_line(res)
    elif doc.status == "no-changes":
        out.status = NO_CHANGES
        if res.rc != 0:
            out.reason = error_line(res)
    elif doc.status == "rolled-back":
        out.status = ROLLED_BACK
        out.reason = f"its verification failed and it rolled back: {out.verify or 'a check failed'}"
    elif doc.status == "error":
        out.reason = doc.error or error_line(res)
        if doc.exit_code == 3:
            out.status = NEEDS_HUMAN
            out.next_step = f"fix what the error names, then run 'gputopo recover' on {node}"
        elif doc.exit_code in (2, 4) or not doc.steps:
            # its exit 2 or 4 changes nothing; nor does an error before its first step began
            out.status = REFUSED
        else:
            out.status = ROLLED_BACK
    else:
        out.reason = f"gputopo apply ended '{doc.status}', which a rolling apply does not run"
        out.next_step = look_at(node)
    out.failed = res.rc != 0 or out.status not in (APPLIED, NO_CHANGES)
    return out


def lost(node: str, err: NodeUnreachable, seconds: float) -> NodeOutcome:
    """The outcome of a node whose ssh failed: not started when ssh failed before sending the
    command (connect, host key, login), else unknown (the apply may have run)."""
    if _BEFORE_THE_COMMAND.match(err.reason):
        return NodeOutcome(node, NOT_STARTED, seconds, reason=str(err), failed=True)
    return NodeOutcome(
        node,
        UNKNOWN,
        seconds,
        reason=f"the connection was lost during its apply ({err.reason})",
        failed=True,
        next_step=look_at(node),
    )


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
    argv = [
        "gputopo",
        "apply",
        "--spec",
        "/dev/stdin",
        "--yes",
        "--json",
        "--node",
        node,
        "--expect-plan",
        signature,
    ]
    if not verify:
        argv.append("--no-verify")
    if not ha:
        argv.append("--no-ha")
    t0 = time.monotonic()
    try:
        res = shell.run(node, argv, timeout, input=spec_text)
    except NodeUnreachable as e:
        return lost(node, e, time.monotonic() - t0)
    return outcome_of(node, res, time.monotonic() - t0)


CTRL_C_GRACE = 30.0  # seconds the nodes applying get to answer after Ctrl-C


def _after_ctrl_c(batch: list[str], futures: list) -> list[NodeOutcome]:
    """The outcomes of ``batch`` once Ctrl-C stopped the wait: each node's own, when its apply
    (whose ssh got the same Ctrl-C on a terminal) answers within :data:`CTRL_C_GRACE`, else
    unknown. A second Ctrl-C stops the wait."""
    deadline = time.monotonic() + CTRL_C_GRACE
    out = []
    for node, f in zip(batch, futures, strict=True):
        try:
            out.append(f.result(timeout=max(0.0, deadline - time.monotonic())))
        except (KeyboardInterrupt, TimeoutError):
            deadline = 0.0
            out.append(
                NodeOutcome(
                    node,
                    UNKNOWN,
                    reason="interrupted (Ctrl-C) while its apply ran",
                    failed=True,
                    next_step=look_at(node),
                )
            )
    return out


def rolling_apply(
    cplan: ClusterPlan,
    spec_text: str,
    shell: NodeShellPort,
    ha: bool = True,
    *,
    serial: int = 1,
    canary: str | None = None,
    timeout: float = DEFAULT_NODE_TIMEOUT,
    verify: bool = True,
    report: Callable[[NodeOutcome], None] = lambda o: None,
) -> RollingResult:
    """Apply ``cplan`` node by node (see the module docstring); ``report`` sees each outcome.

    Returns the account when every node is done. Raises ClusterApplyFailed carrying the account
    (``account``) when a node failed or Ctrl-C stopped the rollout (exit 130; the nodes applying
    then are told as they answer, else unknown), its exit code the rollout's
    (:attr:`RollingResult.exit_code`).
    """
    t0 = time.monotonic()
    order = [n.node for n in cplan.nodes]
    result = RollingResult()
    plan_of = {n.node: n for n in cplan.nodes}
    for batch in batches(order, serial, canary):

        def one(node: str) -> NodeOutcome:
            try:
                return apply_node(shell, node, plan_of[node].signature, spec_text, timeout, verify, ha)
            except GputopoError as e:  # no ssh client here: the command never ran
                return NodeOutcome(node, NOT_STARTED, reason=str(e), failed=True)

        ex = ThreadPoolExecutor(max_workers=len(batch))
        futures = [ex.submit(one, n) for n in batch]
        try:
            outcomes = [f.result() for f in futures]
        except KeyboardInterrupt:
            result.interrupted = True
            outcomes = _after_ctrl_c(batch, futures)
        finally:
            ex.shutdown(wait=False)
        for o in outcomes:
            report(o)
        result.outcomes += outcomes
        if any(o.failed for o in outcomes) or result.interrupted:
            started = {o.node for o in result.outcomes}
            stop = next((o.node for o in outcomes if o.failed), batch[-1])
            result.outcomes += [
                NodeOutcome(n, NOT_STARTED, reason=f"the rollout stopped at {stop}")
                for n in order
                if n not in started
            ]
            result.wall_s = time.monotonic() - t0
            raise result.error()
    result.wall_s = time.monotonic() - t0
    if result.failed:
        raise result.error()
    return result
