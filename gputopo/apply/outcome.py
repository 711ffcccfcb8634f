"""What a rollback left and what to do next, and what ``recover`` would do, in words.

A rollback that could not complete leaves the journal open (``history``: needs-human) and the
apply exits 3: its error names what is left (:func:`left_over`) and the next step
(:func:`next_step`: what to fix by hand, then ``gputopo recover``); both are journaled in the
``NeedsHuman`` record, so the next apply's refusal and ``history`` say the same.
``recover --dry-run`` lists :func:`would_recover`.
"""

from __future__ import annotations

from gputopo.actions import RunningBefore
from gputopo.apply.journal import Journal, RestartFailed, UndoFailed
from gputopo.apply.runner import Runner
from gputopo.errors import JournalError


def left_over(j: Journal, since: int, said: str | None = None) -> str:
    """What a rollback that began at record ``since`` could not do, in one line: the steps whose
    undo did not complete (with the first error of each), then what did not start again (with
    its error, unless it is ``said``: the line already gave it)."""
    parts = []
    pending = j.pending_undo()
    if pending:
        parts.append("undo of step(s) " + ", ".join(str(i + 1) for i in pending) + " not complete")
    failed: dict[int, str] = {}
    for r in j.records[since:]:
        if isinstance(r, UndoFailed) and r.step in pending:
            failed.setdefault(r.step, r.error)
    parts += [f"undo {n + 1}: {error}" for n, error in failed.items()]
    parts += [
        f"{guest_or_service(r.what)} did not start again" + ("" if r.error == said else f": {r.error}")
        for r in j.records[since:]
        if isinstance(r, RestartFailed)
    ]
    return "; ".join(parts) or "a device still needs a human"


def next_step(j: Journal, since: int, stuck: list[str]) -> str:
    """What the operator does after a rollback that began at record ``since`` left the journal
    open: what to fix by hand first, then ``gputopo recover`` (which retries what is left)."""
    if stuck:
        return (
            f"fix {', '.join(stuck)} by hand (a write hung there or it left the bus; "
            "a reboot frees a hung write), then run 'gputopo recover'"
        )
    restarts = [guest_or_service(r.what) for r in j.records[since:] if isinstance(r, RestartFailed)]
    if restarts and not j.pending_undo():
        return (
            f"find why {', '.join(dict.fromkeys(restarts))} did not start, fix it, then run 'gputopo recover'"
        )
    return "run 'gputopo recover' to retry what is left (fix the error it names first)"


def guest_or_service(key: str) -> str:
    """``lxc/101`` -> ``CT 101``, ``qemu/201`` -> ``VM 201``, ``101/sglang.service`` ->
    ``sglang.service in CT 101``: running_before's keys as the operator names them."""
    a, b = key.split("/", 1)
    if a == "lxc":
        return f"CT {b}"
    if a == "qemu":
        return f"VM {b}"
    return f"{b} in CT {a}"


def would_recover(runner: Runner, j: Journal, rb: RunningBefore, finish: bool, undoing: bool) -> list[str]:
    """What :func:`recover` would do with journal ``j``, one line each, in order. Raises
    JournalError for ``finish`` once a rollback began, as recover does."""
    acts = j.header.actions
    if j.verifying and not undoing:
        return ["close the journal as applied: every step was done, only the verification was interrupted"]
    if finish and undoing:
        raise JournalError(f"{j.path}: its rollback already began; run 'gputopo recover' without --finish")
    if finish:
        steps = j.steps()
        todo = [i for i in range(len(acts)) if i not in steps or steps[i].status != "done"]
        return [f"run step {i + 1}: {acts[i].describe()}" for i in todo] + ["close the journal as applied"]
    out = [f"undo step {n + 1}: {acts[n].describe()}" for n in runner.undo_order()]
    hung = sorted(j.hung_devices() | set(j.needs_human.needs_human if j.needs_human else []))
    if hung:
        out.insert(0, f"retry the device(s) on which an earlier write hung: {', '.join(hung)}")
    return out + runner.restarts(rb) + ["close the journal as rolled back"]
