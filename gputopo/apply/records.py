"""The apply journal's records: one typed model per line of the JSONL file, and the parser of a
journal's text. :mod:`gputopo.apply.journal` describes each record and writes them."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from gputopo.actions import Action
from gputopo.errors import JournalError
from gputopo.model.strict import Strict

JOURNAL_DIR = "var/lib/gputopo/journal"
VERSION = 2


class _Rec(Strict):
    t: float = Field(default_factory=time.time)


class RunningBeforeRec(Strict):
    guests: dict[str, str] = Field(default_factory=dict)  # "lxc/101" -> running | stopped
    services: dict[str, str] = Field(default_factory=dict)  # "101/sglang.service" -> active | inactive


class Header(_Rec):
    type: Literal["header"] = "header"
    version: int = VERSION
    pid: int
    started: float
    argv: list[str] = Field(default_factory=list)
    spec: str | None = None
    spec_sha256: str | None = None
    node: str | None = None
    actions: list[Action] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)
    running_before: RunningBeforeRec = Field(default_factory=RunningBeforeRec)


class Begin(_Rec):
    type: Literal["begin"] = "begin"
    step: int
    action: Action
    before: Any  # the action's Before model as data (ActionModel.load_before reads it back)


class Done(_Rec):
    type: Literal["done"] = "done"
    step: int
    seconds: float
    warnings: list[str] = Field(default_factory=list)  # it succeeded, with these warnings


class Failed(_Rec):
    type: Literal["failed"] = "failed"
    step: int
    error: str
    error_type: str
    begun: bool = True  # False: reading the before-state failed, nothing was changed
    devices: list[str] = Field(default_factory=list)  # devices on which a write hung


class StepNote(_Rec):
    type: Literal["note"] = "note"
    step: int
    what: str


class UndoBegin(_Rec):
    type: Literal["undo-begin"] = "undo-begin"
    step: int


class UndoDone(_Rec):
    type: Literal["undo-done"] = "undo-done"
    step: int
    what: str = ""


class UndoFailed(_Rec):
    type: Literal["undo-failed"] = "undo-failed"
    step: int
    error: str


class UndoIncomplete(_Rec):
    type: Literal["undo-incomplete"] = "undo-incomplete"
    step: int
    what: str = ""
    devices: list[str] = Field(default_factory=list)


class TaskStarted(_Rec):  # a guest's task Proxmox accepted: it runs on if this process ends
    type: Literal["task"] = "task"
    upid: str
    limit: float  # seconds its step waits for it (an undo waits as long, from ``t``)
    step: int | None = None  # None: started by a rollback


class ServiceChanged(_Rec):
    type: Literal["service-changed"] = "service-changed"
    vmid: int


class RestartFailed(_Rec):
    type: Literal["restart-failed"] = "restart-failed"
    what: str
    error: str


class NeedsHuman(_Rec):
    type: Literal["needs-human"] = "needs-human"
    needs_human: list[str] = Field(default_factory=list)  # devices a human must look at
    pending: list[int] = Field(default_factory=list)  # steps whose undo did not complete
    reason: str | None = None  # why the rollback ran ("verify"), None: a failure
    left: str | None = None  # what is left, in one line (undos, guests or services not back)
    next_step: str | None = None  # what the operator does next: what to fix, then gputopo recover


class Verifying(_Rec):
    type: Literal["verifying"] = "verifying"


class Recover(_Rec):
    type: Literal["recover"] = "recover"
    mode: Literal["rollback", "finish"]
    pid: int


class End(_Rec):
    type: Literal["end"] = "end"
    result: Literal["applied", "rolled-back"]
    reason: str | None = None
    verify: str | None = None


Record = Annotated[
    Header
    | Begin
    | Done
    | Failed
    | StepNote
    | UndoBegin
    | UndoDone
    | UndoFailed
    | UndoIncomplete
    | TaskStarted
    | ServiceChanged
    | RestartFailed
    | NeedsHuman
    | Verifying
    | Recover
    | End,
    Field(discriminator="type"),
]
_RECORD: TypeAdapter[Any] = TypeAdapter(Record)


def parse_journal(text: str, name: str = "<journal>") -> list[Any]:
    """The typed records of a journal's text, in order.

    A last line without its newline is a record cut short by a crash and is dropped; any other
    line that is not a valid record raises :class:`JournalError` naming the file and line.
    """
    records: list[Any] = []
    lines = text.split("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = _RECORD.validate_json(line)
        except ValidationError as e:
            if i == len(lines):  # torn final write
                break
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise JournalError(f"{name}:{i}: not a journal record ({where}: {first['msg']})") from None
        records.append(rec)
    if records and not isinstance(records[0], Header):
        raise JournalError(f"{name}: first record is {records[0].type!r}, not the header")
    return records
