"""The verdicts: one :class:`Check` per check, gathered in a :class:`VerifyReport` with its
text table and its JSON form (``gputopo verify --json``, a stable shape)."""

from __future__ import annotations

import json
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["PASS", "WARN", "FAIL"]
PASS: Status = "PASS"
WARN: Status = "WARN"
FAIL: Status = "FAIL"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Check(_M):
    """One check's verdict: ``summary`` is one line with the numbers, ``details`` the data."""

    name: str
    status: Status
    summary: str
    details: dict[str, Any] = Field(default_factory=dict)


def verdict(name: str, details: dict[str, Any], passed: str,
            problems: Iterable[str] = (), warnings: Iterable[str] = ()) -> Check:
    """The Check ``name``: FAIL with the ``problems`` joined by ``; `` when there are any, else
    WARN with the ``warnings``, else PASS with the line ``passed``."""
    problems, warnings = list(problems), list(warnings)
    if problems:
        return Check(name=name, status=FAIL, summary="; ".join(problems), details=details)
    if warnings:
        return Check(name=name, status=WARN, summary="; ".join(warnings), details=details)
    return Check(name=name, status=PASS, summary=passed, details=details)


class VerifyReport(_M):
    """Every check of one verification. Its JSON form (``gputopo verify --json``) is stable."""

    node: str | None = None
    strict: bool = False
    checks: list[Check] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check FAILed (and, when ``strict``, none WARNed)."""
        worst = WARN if self.strict else FAIL
        return not any(c.status == FAIL or c.status == worst for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def check(self, name: str) -> Check | None:
        for c in self.checks:
            if c.name == name:
                return c
        return None

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, WARN: 0, FAIL: 0}
        for c in self.checks:
            out[c.status] += 1
        return out

    def summary_line(self) -> str:
        """``all clear: 7 PASS`` or ``verification failed: 2 FAIL (memory, inference), 1 WARN (platform)``."""
        n = self.counts()
        parts = []
        for status in (FAIL, WARN):
            if n[status]:
                names = ", ".join(c.name for c in self.checks if c.status == status)
                parts.append(f"{n[status]} {status} ({names})")
        if self.ok:
            head = "all clear"
            parts.insert(0, f"{n[PASS]} PASS")
        else:
            head = "verification failed" + (" (strict)" if self.strict and not n[FAIL] else "")
        return f"{head}: " + ", ".join(parts)

    def to_json(self) -> str:
        data = self.model_dump()
        data["ok"] = self.ok
        data["exit_code"] = self.exit_code
        data["summary"] = self.summary_line()
        return json.dumps(data, indent=2, default=str)

    def to_text(self) -> str:
        lines = [f"{c.status:<4}  {c.name:<10} {c.summary}" for c in self.checks]
        return "\n".join(lines + [self.summary_line()]) + "\n"
