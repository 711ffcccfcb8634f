"""The apply journal: one JSONL file per apply, durable record by record, every record a typed model.

``<root>/var/lib/gputopo/journal/<UTC timestamp>-<pid>.jsonl`` holds one JSON object a line:

* :class:`Header` -- format version, spec path and SHA-256, the planned actions, a facts summary,
  what ran before, pid, command and start time;
* :class:`Begin` -- step index, the action, and ``before``: the state the step changes, complete
  enough to undo the step from the journal alone (a later process, after a crash);
* :class:`Done` / :class:`Failed` per step; :class:`StepNote`: a fact about a begun step, written
  before it happens, for a later finish or undo (``fallback: container stopped by this step``);
* :class:`UndoBegin` / :class:`UndoDone` / :class:`UndoFailed` per step during a rollback or
  recovery, and :class:`UndoIncomplete` for a step whose undo had to leave a device alone (a
  write hung there, or it fell off the bus);
* :class:`TaskStarted` -- a guest's Proxmox task by its UPID: it runs on if this process ends;
* :class:`ServiceChanged` -- an undo put back a service's drop-in: the service must be restarted
  with it (by a later process too, after a crash);
* :class:`RestartFailed` -- what ran before could not be started again;
* :class:`NeedsHuman` -- a rollback that could not complete: the devices and the steps whose
  undo did not complete. It does NOT end the journal: the next apply refuses until
  ``gputopo recover`` retries those undos and ends it;
* :class:`Verifying` -- every step is done and the verification that may roll the apply back
  runs (``--rollback-on-verify-failure``); a crash here leaves an apply that finished;
* :class:`Recover` -- a recovery began (its mode);
* :class:`End` -- ``applied`` or ``rolled-back``.

Every record is appended, flushed and fsynced (the file, and the directory when the file is
created), so after a SIGKILL or a power cut the journal shows every step that may have begun.
A journal without ``End`` belongs to an apply that did not finish: :func:`find_unfinished`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputopo.apply.records import (  # noqa: F401 (the records are part of this module's interface)
    JOURNAL_DIR,
    VERSION,
    Begin,
    Done,
    End,
    Failed,
    Header,
    NeedsHuman,
    Record,
    Recover,
    RestartFailed,
    RunningBeforeRec,
    ServiceChanged,
    StepNote,
    TaskStarted,
    UndoBegin,
    UndoDone,
    UndoFailed,
    UndoIncomplete,
    Verifying,
    parse_journal,
)
from gputopo.errors import JournalError, UnfinishedApply


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _utc_stamp(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


# a step's last word in the journal, as describe() says it (in this order)
STATUS_WORDS = {
    "done": "done",
    "failed": "failed",
    "begun": "in progress",
    "undo-begin": "being undone",
    "undo-done": "undone",
    "undo-failed": "undo failed",
    "undo-incomplete": "undo incomplete",
}


@dataclass
class Step:
    """One step as the journal tells it: the action, its first before-state, the last word on it
    (begun, done, failed, undo-begin, undo-done, undo-failed, undo-incomplete)."""

    action: Any
    before: Any
    status: str


class Journal:
    """One apply's journal file. Build with :meth:`create` (a new apply) or :meth:`load`."""

    def __init__(self, path: Path, records: list[Any]):
        self.path = Path(path)
        self.records = records
        self._lock = threading.Lock()

    # --- creation and loading ----------------------------------------------------------------

    @classmethod
    def create(cls, root: str | os.PathLike, header: Header) -> Journal:
        """Start a journal under ``root`` with ``header`` as its first record; returns it.

        Raises OSError when the journal directory cannot be written (nothing was changed yet).
        """
        d = Path(root) / JOURNAL_DIR
        d.mkdir(parents=True, exist_ok=True)
        now = header.started
        path = d / f"{_utc_stamp(now)}-{header.pid}.jsonl"
        n = 1
        while path.exists():  # two applies in one second from one pid (tests)
            path = d / f"{_utc_stamp(now)}-{header.pid}.{n}.jsonl"
            n += 1
        j = cls(path, [])
        j.append(header)
        _fsync_dir(d)
        return j

    @classmethod
    def load(cls, path: str | os.PathLike) -> Journal:
        """Read a journal file. Raises JournalError when it cannot be read or parsed."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise JournalError(f"{p}: cannot read journal ({e.strerror})") from None
        except UnicodeDecodeError as e:
            raise JournalError(f"{p}: not a journal (byte {e.start} is not UTF-8 text)") from None
        recs = parse_journal(text, str(p))
        if not recs:
            raise JournalError(f"{p}: empty journal")
        return cls(p, recs)

    # --- writing -------------------------------------------------------------------------------

    def append(self, rec: Any) -> Any:
        """Append one record durably (write, flush, fsync) and return it. Thread-safe."""
        line = rec.model_dump_json() + "\n"
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.records.append(rec)
        return rec

    # --- reading -------------------------------------------------------------------------------

    @property
    def header(self) -> Header:
        return self.records[0]

    @property
    def result(self) -> str | None:
        """The ``End`` record's result, or None while unfinished."""
        for r in reversed(self.records):
            if isinstance(r, End):
                return r.result
        return None

    @property
    def finished(self) -> bool:
        return self.result is not None

    def of(self, kind: type) -> list[Any]:
        """Every record of type ``kind``, in order."""
        return [r for r in self.records if isinstance(r, kind)]

    def steps(self) -> dict[int, Step]:
        """Step index -> :class:`Step`. A step begun again (recover --finish) keeps its first
        before-state: the original."""
        out: dict[int, Step] = {}
        for r in self.records:
            if isinstance(r, Begin):
                first = out[r.step].before if r.step in out else r.before
                out[r.step] = Step(action=r.action, before=first, status="begun")
            elif (
                isinstance(r, (Done, Failed, UndoBegin, UndoDone, UndoFailed, UndoIncomplete))
                and r.step in out
            ):
                out[r.step].status = r.type
        return out

    @property
    def needs_human(self) -> NeedsHuman | None:
        """The ``NeedsHuman`` record when it is the journal's last word (a rollback that could not
        complete and that no later recover has settled), else None."""
        for r in reversed(self.records):
            if isinstance(r, (NeedsHuman, End, Recover)):
                return r if isinstance(r, NeedsHuman) else None
        return None

    @property
    def verifying(self) -> bool:
        """True when every step was done and only the verification was running."""
        return any(isinstance(r, Verifying) for r in self.records)

    def services_to_restart(self) -> set[int]:
        """Containers whose service drop-in an undo put back (from any process)."""
        return {r.vmid for r in self.records if isinstance(r, ServiceChanged)}

    def begun(self) -> list[int]:
        """Indices of steps that began (whatever happened after), in the order they began."""
        return [r.step for r in self.records if isinstance(r, Begin)]

    def pending_undo(self) -> list[int]:
        """Indices of begun steps whose undo has not completed, in the order they began."""
        steps = self.steps()
        return [i for i in dict.fromkeys(self.begun()) if steps[i].status != "undo-done"]

    def hung_devices(self) -> set[str]:
        """Devices on which a write of this apply hung (the worker may still be blocked there)."""
        return {d for r in self.records if isinstance(r, Failed) for d in r.devices}

    def describe(self) -> str:
        """One line: the file, the pid and start time of the apply that wrote it, its progress."""
        h = self.header
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(h.started))
        steps = self.steps()
        counts = Counter(s.status for s in steps.values())
        where = ", ".join(f"{counts[k]} {word}" for k, word in STATUS_WORDS.items() if counts[k])
        return (
            f"{self.path} (pid {h.pid}, started {started}, {len(steps)} of "
            f"{len(h.actions)} step(s) begun" + (f": {where})" if where else ")")
        )

    def unfinished_error(self) -> UnfinishedApply:
        """The error that refuses a new apply while this journal is open."""
        nh = self.needs_human
        if nh is None:
            return UnfinishedApply(str(self.path), self.describe())
        return UnfinishedApply(
            str(self.path), self.describe(), list(nh.needs_human), list(nh.pending), nh.left, nh.next_step
        )


def list_journals(root: str | os.PathLike) -> list[Path]:
    """Every journal file under ``root``, oldest first (names start with a UTC timestamp)."""
    d = Path(root) / JOURNAL_DIR
    if not d.is_dir():
        return []

    def key(p: Path) -> tuple[str, int, str]:
        # "<stamp>-<pid>.jsonl", then "<stamp>-<pid>.<n>.jsonl" for later ones in that second
        parts = p.name[: -len(".jsonl")].split(".")
        return (parts[0].split("-")[0], int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0, p.name)

    return sorted((p for p in d.iterdir() if p.suffix == ".jsonl"), key=key)


def find_unfinished(root: str | os.PathLike) -> Journal | None:
    """The newest journal under ``root`` without an ``End`` record, or None.

    Raises JournalError when such a journal cannot be parsed (a human must look at it).
    """
    for p in reversed(list_journals(root)):
        j = Journal.load(p)
        if not j.finished:
            return j
    return None
