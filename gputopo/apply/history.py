"""Past applies, read from their journals (``gputopo history``): when, which spec, how it ended,
how long the stop window was, and each step with its timing.

Only the journal is read: a record here is what the apply wrote while it ran, never what a
later process remembers. An unreadable journal is listed as such rather than hiding the others.
"""

from __future__ import annotations

import os
import time
from typing import Any

from gputopo.actions import stop_window
from gputopo.apply.journal import (
    Begin,
    Done,
    End,
    Failed,
    Journal,
    NeedsHuman,
    Recover,
    RestartFailed,
    UndoDone,
    UndoFailed,
    UndoIncomplete,
    find_unfinished,
    list_journals,
)
from gputopo.apply.outcome import guest_or_service
from gputopo.errors import HistoryError, JournalError
from gputopo.model.documents import ApplyRecord, HistoryEntry, HistoryList, Outcome, StepRecord

__all__ = [
    "ApplyRecord",
    "HistoryEntry",
    "HistoryList",
    "StepRecord",
    "entry",
    "find",
    "history",
    "last_measured",
    "left_down",
    "own_journal",
    "record_of",
    "recover_node",
    "settled_journal",
    "unfinished_warning",
]


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _steps(j: Journal) -> list[StepRecord]:
    out: dict[int, StepRecord] = {}
    for r in j.records:
        if isinstance(r, Begin):
            a = r.action
            rec = out.get(r.step) or StepRecord(
                step=r.step + 1,
                phase=a.phase,
                kind=a.kind,
                description=a.describe(),
                status="begun",
                started=r.t,
            )
            rec.status = "begun"
            out[r.step] = rec
        elif isinstance(r, (Done, Failed, UndoDone, UndoFailed, UndoIncomplete)) and r.step in out:
            rec = out[r.step]
            rec.status = r.type
            if isinstance(r, Done):
                rec.seconds, rec.warnings = r.seconds, list(r.warnings)
            elif isinstance(r, (Failed, UndoFailed)):
                rec.error = r.error
            else:
                rec.undo = r.what or None
    for n, (what, error) in _left_down(j).items():
        rec = out.get(n)
        if rec is not None and rec.status == "undo-done":
            rec.status = "undo-incomplete"
            left = f"left down: {what} did not start again" + ("" if error == rec.error else f": {error}")
            rec.undo = "; ".join(x for x in (rec.undo, left) if x)
    return [out[k] for k in sorted(out)]


def _touches(a: Any, key: str) -> bool:
    """Whether action ``a`` stops or starts ``key`` (``lxc/101``, ``qemu/201``,
    ``101/sglang.service``: running_before's keys)."""
    first, second = key.split("/", 1)
    if first in ("lxc", "qemu"):
        return (first, int(second)) in (a.stopped_guest(), a.started_guest())
    return (int(first), second) in (a.stopped_service(), a.started_service())


def left_down(j: Journal) -> dict[int, str]:
    """Step index -> what the rollback left of it, in one line, for each undone step that
    stopped or started a guest or service the rollback could not start again (see
    :func:`_left_down`)."""
    return {
        n: f"left down: {what} did not start again: {error}" for n, (what, error) in _left_down(j).items()
    }


def _left_down(j: Journal) -> dict[int, tuple[str, str]]:
    """Step index -> what its undo left, for the undone steps that stopped or started a guest or
    service the last rollback could not start again (its ``RestartFailed``): the undo of each
    came back, but what it stopped stays down: (the guest or service, the error). Only the last
    rollback's failures count (a later recover starts them again or journals its own)."""
    failed: dict[str, str] = {}
    for r in j.records:
        if isinstance(r, Recover):
            failed = {}
        elif isinstance(r, RestartFailed):
            failed.setdefault(r.what, r.error)
    out: dict[int, tuple[str, str]] = {}
    for key, error in failed.items():
        for n in dict.fromkeys(j.begun()):
            if _touches(j.header.actions[n], key):
                out.setdefault(n, (guest_or_service(key), error))
    return out


def _stop_window(j: Journal, steps: list[StepRecord]) -> float | None:
    """How long the inference service was down: from the begin of the stop window's first stop
    step (:func:`gputopo.actions.stop_window`) to the end of its last start step; after a
    rollback, to the end of the first rollback that started the container and its service
    again: a rollback that could not (a restart failed, or the apply was killed) leaves it down
    until a later recover does, but one that needed a human only for a device does not count
    the hours until the operator ran recover."""
    bounds = stop_window(j.header.actions)
    if bounds is None:
        return None
    begins = [
        s.started
        for s in steps
        if s.phase == "stop" and s.started is not None and bounds[0] <= s.step - 1 <= bounds[1]
    ]
    if not begins:
        return None
    start = min(begins)
    if j.result == "applied":
        ends = [
            r.t
            for r in j.of(Done)
            if bounds[0] <= r.step <= bounds[1] and j.header.actions[r.step].phase == "start"
        ]
        return max(ends) - start if ends else None
    down = False  # the run that ends at the next End or NeedsHuman left the service down
    for r in j.records:
        if r.t < start:
            continue
        if isinstance(r, RestartFailed) and not r.what.startswith("qemu/"):
            down = True
        elif isinstance(r, (End, NeedsHuman)):
            if not down:
                return r.t - start
            down = False
    return j.records[-1].t - start


def _needs_human_reason(nh: NeedsHuman) -> str:
    """A needs-human journal's reason, one line: the devices, what is left, what to do next."""
    parts = [f"needs a human: {', '.join(nh.needs_human)}" if nh.needs_human else "needs a human"]
    if nh.left:
        parts.append(nh.left)
    parts.append(nh.next_step or "see the journal, then run 'gputopo recover'")
    return "; ".join(parts)


def record_of(j: Journal, with_steps: bool = False) -> ApplyRecord:
    """The :class:`ApplyRecord` of one journal."""
    h = j.header
    steps = _steps(j)
    end = next((r for r in reversed(j.records) if isinstance(r, End)), None)
    nh = j.needs_human
    outcome: Outcome = end.result if end is not None else "needs-human" if nh is not None else "unfinished"
    reason = end.reason if end is not None else (_needs_human_reason(nh) if nh is not None else None)
    name = os.path.basename(str(j.path))
    return ApplyRecord(
        id=name.removesuffix(".jsonl"),
        journal=str(j.path),
        started=h.started,
        started_utc=_utc(h.started),
        node=h.node,
        spec=h.spec,
        spec_sha256=h.spec_sha256,
        pid=h.pid,
        outcome=outcome,
        rolled_back=outcome == "rolled-back"
        or any(isinstance(r, (UndoDone, UndoIncomplete)) for r in j.records),
        reason=reason,
        verify=end.verify if end is not None else None,
        steps_total=len(h.actions),
        steps_done=sum(1 for r in j.of(Done)),
        stop_window_s=_stop_window(j, steps),
        wall_s=j.records[-1].t - h.started,
        steps=steps if with_steps else None,
    )


def entry(root: str | os.PathLike, ident: str) -> HistoryEntry:
    """The apply ``ident`` names (see :func:`find`) with its steps: ``history show ID``'s document.
    Raises HistoryError, JournalError."""
    return HistoryEntry(**record_of(find(root, ident), with_steps=True).model_dump())


def own_journal(root: str | os.PathLike, pid: int | None = None) -> tuple[str | None, list[StepRecord]]:
    """(path, steps) of the newest journal under ``root`` that process ``pid`` (default: this
    one) wrote; (None, []) when it wrote none. What an apply that raised had done, read from the
    journal alone; journals that cannot be read are skipped."""
    pid = os.getpid() if pid is None else pid
    for p in reversed(list_journals(root)):
        try:
            j = Journal.load(p)
        except JournalError:
            continue
        if j.header.pid != pid:
            continue
        return str(p), list(record_of(j, with_steps=True).steps or [])
    return None, []


def recover_node(root: str | os.PathLike, default: str | None) -> str | None:
    """The node a recover under ``root`` acts on: the one the open journal's apply changed, else
    ``default``. Raises JournalError when the open journal cannot be read."""
    j = find_unfinished(root)
    return j.header.node if j is not None else default


def settled_journal(root: str | os.PathLike, pid: int | None = None) -> str | None:
    """The journal a recover in process ``pid`` (default: this one) was settling: the newest one
    it wrote its ``recover`` record to, else the newest open one (a recover refused before it
    wrote anything); None when there is neither. Journals that cannot be read are skipped."""
    pid = os.getpid() if pid is None else pid
    for p in reversed(list_journals(root)):
        try:
            j = Journal.load(p)
        except JournalError:
            continue
        if any(isinstance(r, Recover) and r.pid == pid for r in j.records):
            return str(p)
    try:
        j = find_unfinished(root)
    except JournalError:
        return None
    return str(j.path) if j is not None else None


def unfinished_warning(root: str | os.PathLike) -> str | None:
    """What plan, diff and verify warn while an apply's journal under ``root`` is still open (the
    host may be half-changed, and what they show is a middle state), or when the journals cannot
    be read; None when every apply finished."""
    try:
        j = find_unfinished(root)
    except Exception as e:  # an unreadable journal is worth a warning too, never a failure there
        return f"cannot read the apply journals under {root} ({e})"
    if j is None:
        return None
    return f"an apply did not finish: {j.describe()}; the host may be half-changed: run 'gputopo recover'"


def history(root: str | os.PathLike) -> list[ApplyRecord]:
    """Every apply under ``root``, oldest first; a journal that cannot be read is listed as
    ``unreadable`` with the reason."""
    out = []
    for p in list_journals(root):
        try:
            out.append(record_of(Journal.load(p)))
        except JournalError as e:
            out.append(
                ApplyRecord(
                    id=p.name.removesuffix(".jsonl"), journal=str(p), outcome="unreadable", reason=str(e)
                )
            )
    return out


def find(root: str | os.PathLike, ident: str) -> Journal:
    """The journal ``ident`` names: its id, a unique prefix of it, or ``last``.

    Raises HistoryError when none or several match, JournalError when it cannot be read.
    """
    paths = list_journals(root)
    if ident == "last":
        if not paths:
            raise HistoryError(f"no apply recorded under {root}")
        return Journal.load(paths[-1])
    hits = [p for p in paths if p.name.removesuffix(".jsonl") == ident] or [
        p for p in paths if p.name.startswith(ident)
    ]
    if not hits:
        raise HistoryError(f"{ident}: no apply with this id (see 'gputopo history')")
    if len(hits) > 1:
        raise HistoryError(
            f"{ident}: names {len(hits)} applies ({hits[0].name}, {hits[1].name}, ...); give more of the id"
        )
    return Journal.load(hits[0])


def last_measured(root: str | os.PathLike) -> list[tuple[str, str, float]]:
    """(kind, description, seconds) of every step of the newest apply that finished applied;
    [] when there is none (unreadable journals are skipped)."""
    for p in reversed(list_journals(root)):
        try:
            j = Journal.load(p)
        except JournalError:
            continue
        if j.result != "applied":
            continue
        acts = j.header.actions
        return [
            (acts[r.step].kind, acts[r.step].describe(), r.seconds) for r in j.of(Done) if r.step < len(acts)
        ]
    return []
