"""The apply journal: one JSONL file per apply, durable record by record (orchestration layer).

``<root>/var/lib/gputopo/journal/<UTC timestamp>-<pid>.jsonl`` holds, one JSON object a line:

* ``header`` -- spec path and SHA-256, the planned actions (as data), a facts summary, pid,
  command and start time;
* ``begin``  -- step index, the action, and ``before``: the state the step changes, complete
  enough to undo the step from the journal alone (a later process, after a crash);
* ``done`` / ``failed`` (with the error) per step;
* ``undo-begin`` / ``undo-done`` / ``undo-failed`` per step during a rollback or recovery, and
  ``undo-incomplete`` for a step whose undo had to leave a device alone (a write hung there, or
  it fell off the bus);
* ``needs-human`` -- a rollback that could not complete: ``needs_human`` (the devices) and
  ``pending`` (the steps whose undo did not complete). It does NOT end the journal: the next
  apply refuses until ``gputopo recover`` retries those undos and ends it;
* ``end`` -- ``applied`` or ``rolled-back`` (journals written by earlier versions may also end
  in ``needs-human``).

Every record is appended, flushed and fsynced (the file, and the directory when the file is
created), so after a SIGKILL or a power cut the journal shows every step that may have begun.
A journal without ``end`` belongs to an apply that did not finish: :func:`find_unfinished`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from gputopo.errors import JournalError, UnfinishedApply

JOURNAL_DIR = "var/lib/gputopo/journal"
END_STATES = ("applied", "rolled-back", "needs-human")


def parse_journal(text: str, name: str = "<journal>") -> list[dict[str, Any]]:
    """The records of a journal's text, in order.

    A last line without its newline is a record cut short by a crash and is dropped; any other
    line that is not a JSON object raises :class:`JournalError` naming the file and line.
    """
    records: list[dict[str, Any]] = []
    lines = text.split("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):  # torn final write
                break
            raise JournalError(f"{name}:{i}: not a JSON record") from None
        if not isinstance(rec, dict) or "type" not in rec:
            raise JournalError(f"{name}:{i}: record without a type")
        records.append(rec)
    if records and records[0]["type"] != "header":
        raise JournalError(f"{name}: first record is {records[0]['type']!r}, not the header")
    return records


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _utc_stamp(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


class Journal:
    """One apply's journal file. Build with :meth:`create` (a new apply) or :meth:`load`."""

    def __init__(self, path: Path, records: list[dict[str, Any]]):
        self.path = Path(path)
        self.records = records
        self._lock = threading.Lock()

    # --- creation and loading ----------------------------------------------------------------

    @classmethod
    def create(cls, root: str | os.PathLike, header: dict[str, Any]) -> Journal:
        """Start a journal under ``root`` with ``header`` as its first record; returns it.

        Raises OSError when the journal directory cannot be written (nothing was changed yet).
        """
        d = Path(root) / JOURNAL_DIR
        d.mkdir(parents=True, exist_ok=True)
        now = time.time()
        path = d / f"{_utc_stamp(now)}-{os.getpid()}.jsonl"
        n = 1
        while path.exists():  # two applies in one second from one pid (tests)
            path = d / f"{_utc_stamp(now)}-{os.getpid()}.{n}.jsonl"
            n += 1
        j = cls(path, [])
        j.append("header", pid=os.getpid(), started=now, **header)
        _fsync_dir(d)
        return j

    @classmethod
    def load(cls, path: str | os.PathLike) -> Journal:
        """Read a journal file. Raises JournalError when it cannot be read or parsed."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise JournalError(f"{p}: cannot read journal ({e.strerror})") from None
        recs = parse_journal(text, str(p))
        if not recs:
            raise JournalError(f"{p}: empty journal")
        return cls(p, recs)

    # --- writing -------------------------------------------------------------------------------

    def append(self, type: str, **fields: Any) -> dict[str, Any]:
        """Append one record durably (write, flush, fsync) and return it. Thread-safe."""
        rec = {"type": type, "t": time.time(), **fields}
        line = json.dumps(rec, sort_keys=True, default=str) + "\n"
        with self._lock:
            with open(self.path, "a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.records.append(rec)
        return rec

    # --- reading -------------------------------------------------------------------------------

    @property
    def header(self) -> dict[str, Any]:
        return self.records[0]

    @property
    def result(self) -> str | None:
        """The ``end`` record's result, or None while unfinished."""
        for r in reversed(self.records):
            if r["type"] == "end":
                return r.get("result")
        return None

    @property
    def finished(self) -> bool:
        return self.result is not None

    def steps(self) -> dict[int, dict[str, Any]]:
        """Step index -> {"action", "before", "status"}: ``status`` is the last word on the step
        (begun, done, failed, undo-begin, undo-done, undo-failed)."""
        out: dict[int, dict[str, Any]] = {}
        for r in self.records:
            if r["type"] == "begin":
                # a step begun again (recover --finish) keeps its first before-state: the original
                first = out.get(r["step"], {}).get("before", r.get("before"))
                out[r["step"]] = {"action": r["action"], "before": first, "status": "begun"}
            elif r["type"] in ("done", "failed", "undo-begin", "undo-done", "undo-failed",
                               "undo-incomplete") and r.get("step") in out:
                out[r["step"]]["status"] = {"done": "done", "failed": "failed"}.get(r["type"], r["type"])
                if r["type"] == "done" and "after" in r:
                    out[r["step"]]["after"] = r["after"]
        return out

    @property
    def needs_human(self) -> dict[str, Any] | None:
        """The ``needs-human`` record when it is the journal's last word (a rollback that could not
        complete and that no later recover has settled), else None."""
        for r in reversed(self.records):
            if r["type"] in ("needs-human", "end", "recover"):
                return r if r["type"] == "needs-human" else None
        return None

    def pending_undo(self) -> list[int]:
        """Indices of begun steps whose undo has not completed, in the order they began."""
        steps = self.steps()
        return [i for i in dict.fromkeys(self.begun()) if steps[i]["status"] != "undo-done"]

    def begun(self) -> list[int]:
        """Indices of steps that began (whatever happened after), in the order they began."""
        return [r["step"] for r in self.records if r["type"] == "begin"]

    def unfinished_error(self) -> UnfinishedApply:
        """The error that refuses a new apply while this journal is open."""
        nh = self.needs_human
        if nh is None:
            return UnfinishedApply(str(self.path), self.describe())
        return UnfinishedApply(str(self.path), self.describe(), list(nh.get("needs_human") or []),
                               list(nh.get("pending") or []))

    def describe(self) -> str:
        """One line: the file, the pid and start time of the apply that wrote it, its progress."""
        h = self.header
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(h.get("started", 0)))
        steps = self.steps()
        done = sum(1 for s in steps.values() if s["status"] == "done")
        return (f"{self.path} (pid {h.get('pid')}, started {started}, {len(steps)} of "
                f"{len(h.get('actions', []))} step(s) begun, {done} done)")


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
    """The newest journal under ``root`` without an ``end`` record, or None.

    Raises JournalError when such a journal cannot be parsed (a human must look at it).
    """
    for p in reversed(list_journals(root)):
        j = Journal.load(p)
        if not j.finished:
            return j
    return None
