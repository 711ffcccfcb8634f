"""The verdicts: one :class:`Check` per check, gathered in a :class:`VerifyReport` with its
text table and its JSON form (``gputopo verify --json``, a stable shape).

``Check``, ``Status`` and ``VerifyReport`` are the verify document, declared once in
:mod:`gputopo.model.documents` (the cluster reads a node's report back with the same models);
this module adds how a check comes to its verdict."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gputopo.model.documents import FAIL, PASS, SKIP, WARN, Check, Status, VerifyReport

__all__ = ["FAIL", "PASS", "SKIP", "WARN", "Check", "Status", "VerifyReport", "skipped", "verdict"]


def verdict(
    name: str,
    details: dict[str, Any],
    passed: str,
    problems: Iterable[str] = (),
    warnings: Iterable[str] = (),
) -> Check:
    """The Check ``name``: FAIL with the ``problems`` joined by ``; `` when there are any, else
    WARN with the ``warnings``, else PASS with the line ``passed``."""
    problems, warnings = list(problems), list(warnings)
    if problems:
        return Check(name=name, status=FAIL, summary="; ".join(problems), details=details)
    if warnings:
        return Check(name=name, status=WARN, summary="; ".join(warnings), details=details)
    return Check(name=name, status=PASS, summary=passed, details=details)


def skipped(name: str, why: str, details: dict[str, Any] | None = None) -> Check:
    """The Check ``name`` that did not run: SKIP, its summary ``not run: <why>``."""
    return Check(name=name, status=SKIP, summary=f"not run: {why}", details=details or {})
