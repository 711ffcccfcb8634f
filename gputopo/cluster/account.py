"""A rollout's account: each node's outcome, the rollout's exit code, its text and document.

Every node's outcome (:class:`Outcome`) is told from what the node's own apply printed (its
apply document: status, steps, verify), never guessed:

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

The rollout's exit code (:attr:`RollingResult.exit_code`, codes of :mod:`gputopo.exitcodes`):
0 when every node is done; 3 when a node needs a human or its outcome is unknown; 2 or 4 (the
refusing node's) only when nothing was changed anywhere; 130, 143 or 129 when Ctrl-C, SIGTERM or
SIGHUP (a dropped session to the machine it runs on) stopped it; otherwise 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gputopo import exitcodes
from gputopo.errors import ClusterApplyFailed, GputopoError
from gputopo.exitcodes import signal_name
from gputopo.model.documents import ApplyDoc, ClusterApplyDoc, NodeApplyDoc


class Outcome(StrEnum):
    """How one node's apply ended; the value is the text the account and its document show."""

    APPLIED = "applied-and-kept"
    NO_CHANGES = "no-changes"
    ROLLED_BACK = "applied-then-rolled-back"
    VERIFY_KEPT = "failed-verify-kept"
    NEEDS_HUMAN = "needs-human"
    NOT_STARTED = "not-started"
    UNKNOWN = "unknown"
    REFUSED = "refused"


# outcomes whose changes stay on the node
KEPT = (Outcome.APPLIED, Outcome.VERIFY_KEPT)
# outcomes after which the node is done
DONE = (Outcome.APPLIED, Outcome.NO_CHANGES)
# outcomes after which a human looks at the node before anything else runs there
FOR_A_HUMAN = (Outcome.NEEDS_HUMAN, Outcome.UNKNOWN)
# the exit codes of a node's apply that changed nothing there
UNCHANGED_CODES = (exitcodes.NOTHING_CHANGED, exitcodes.LOCKED)


def look_at(node: str) -> str:
    """The next step for a node whose apply's end is unknown."""
    return (
        f"see how its apply ended with 'gputopo history' on {node} (ssh root@{node} gputopo history); "
        f"if it is unfinished, 'gputopo recover' there rolls it back"
    )


def recover_at(node: str) -> str:
    """The next step for a node whose rollback did not complete."""
    return f"fix what the error names, then run 'gputopo recover' on {node}"


@dataclass
class NodeOutcome:
    """What one node's apply did (``status``: an :class:`Outcome`, its text accepted too).

    ``failed``: this node stopped the rollout; ``rc`` its apply's exit status (None when it did
    not run or the connection was lost); ``doc`` its apply document."""

    node: str
    status: Outcome
    seconds: float = 0.0
    reason: str = ""
    rc: int | None = None
    steps: int = 0
    verify: str | None = None
    failed: bool = False
    next_step: str = ""
    doc: ApplyDoc | None = None

    def __post_init__(self) -> None:
        self.status = Outcome(self.status)

    @property
    def kept(self) -> bool | None:
        """Whether changes it made are still there; None: unknown."""
        if self.status in KEPT or self.status == Outcome.NEEDS_HUMAN:
            return True
        return None if self.status == Outcome.UNKNOWN else False

    def to_doc(self) -> NodeApplyDoc:
        return NodeApplyDoc(
            node=self.node,
            outcome=self.status.value,
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
        status = self.status.value
        head = f"{self.node.ljust(width)}  {status.ljust(status_width) if parts else status}"
        return head + (f"  {'; '.join(parts)}" if parts else "")


@dataclass
class RollingResult:
    """The rollout's account: every node's outcome, in the order they were to apply."""

    outcomes: list[NodeOutcome] = field(default_factory=list)
    wall_s: float = 0.0
    signum: int | None = None  # the signal that stopped the rollout: SIGINT (Ctrl-C), SIGTERM, SIGHUP

    @property
    def interrupted(self) -> bool:
        """Whether a signal stopped the rollout."""
        return self.signum is not None

    def of(self, status: Outcome | tuple[Outcome, ...]) -> list[str]:
        wanted = (status,) if isinstance(status, str) else status
        return [o.node for o in self.outcomes if o.status in wanted]

    def done(self) -> list[str]:
        return self.of(DONE)

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
        if self.kept() or self.of(Outcome.NEEDS_HUMAN):
            return True
        return None if self.of(Outcome.UNKNOWN) else False

    @property
    def exit_code(self) -> int:
        """0 done; 3 a node needs a human or its outcome is unknown; 2 or 4 (the refusing
        node's) only when nothing was changed anywhere; 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; else 1."""
        if not self.failed:
            return exitcodes.OK
        if self.signum is not None:
            return exitcodes.of_signal(self.signum)
        if self.of(FOR_A_HUMAN):
            return exitcodes.NEEDS_HUMAN
        first = self.stopped_at
        touched = self.changed or self.of(Outcome.ROLLED_BACK)
        if not touched and first is not None and first.status in (Outcome.REFUSED, Outcome.NOT_STARTED):
            return first.rc if first.rc in UNCHANGED_CODES else exitcodes.NOTHING_CHANGED
        return exitcodes.FAILED

    def summary(self) -> str:
        """The last line: how it ended, what is changed and kept, what was not started."""
        kept = self.kept()
        parts = [f"applied and kept: {', '.join(kept) if kept else 'none'}"]
        for status, words in ((Outcome.NEEDS_HUMAN, "needs a human"), (Outcome.UNKNOWN, "outcome unknown")):
            if self.of(status):
                parts.append(f"{words}: {', '.join(self.of(status))}")
        if self.of(Outcome.ROLLED_BACK):
            parts.append(f"rolled back: {', '.join(self.of(Outcome.ROLLED_BACK))}")
        if self.of(Outcome.NO_CHANGES):
            parts.append(f"no changes: {', '.join(self.of(Outcome.NO_CHANGES))}")
        if self.failed and not self.changed and not self.of((Outcome.ROLLED_BACK, Outcome.UNKNOWN)):
            parts.append("nothing was changed anywhere")
        not_started = self.of(Outcome.NOT_STARTED)
        if not_started:
            parts.append(f"not started: {', '.join(not_started)}")
        first = self.stopped_at
        head = f"stopped at node {first.node}" if first is not None else "cluster applied"
        if self.signum is not None:
            head = f"interrupted ({signal_name(self.signum)})"
        return f"{head} in {self.wall_s:.1f} s: " + "; ".join(parts)

    def to_text(self) -> str:
        """The account: one line per node (its next step under it), the summary."""
        width = max((len(o.node) for o in self.outcomes), default=0)
        status_width = max((len(o.status.value) for o in self.outcomes), default=0)
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
        if self.signum is not None:
            # the last node whose outcome is known: a signal between two batches stops the
            # rollout after it, not at a node of the batch that never started
            told = [o.node for o in self.outcomes if o.status != Outcome.NOT_STARTED]
            node = node or (told[-1] if told else self.outcomes[-1].node)
            said = f"interrupted ({signal_name(self.signum)})"
            reason = f"{said} during its apply; {reason}" if reason else said
        return ClusterApplyFailed(
            node,
            reason,
            self.exit_code,
            kept=self.kept(),
            not_started=self.of(Outcome.NOT_STARTED),
            unknown=self.of(Outcome.UNKNOWN),
            needs_human=self.of(Outcome.NEEDS_HUMAN),
            account=self,
        )

    @classmethod
    def unstarted(cls, nodes: list[str], empty: set[str] | frozenset[str] = frozenset()) -> RollingResult:
        """The account of a rollout that never started a node's apply (a dry run, no changes,
        refused): the nodes in ``empty`` have no changes, the others are not started."""
        return cls([NodeOutcome(n, Outcome.NO_CHANGES if n in empty else Outcome.NOT_STARTED) for n in nodes])

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
