"""The apply document (``gputopo apply --json``, ``gputopo recover --json``; ``gputopo schema
apply``), made here from what apply or recover returned or raised.

Every document is checked against :class:`gputopo.model.documents.ApplyDoc` before it is handed
out, so what apply produces and what the cluster and the Ansible module read cannot drift
apart. The keys keep the order scripts have seen since the first version; keys that have no
value for an outcome (an error has no plan) are left out, as before.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gputopo.apply.boot import BootRefresh
from gputopo.apply.history import left_down, own_journal, settled_journal
from gputopo.apply.journal import Journal
from gputopo.apply.progress import ApplyResult
from gputopo.errors import GputopoError, VerifyFailed
from gputopo.model.documents import ApplyDoc

CHANGED = ("applied", "rolled-back", "recovered", "finished")


def verify_failure(result: ApplyResult) -> VerifyFailed | None:
    """The error an apply that ended ``result`` exits with: its verification failed (rolled
    back, or applied and failed), else None."""
    if result.status == "rolled-back":
        return VerifyFailed("verification failed after apply; the host was rolled back")
    if result.verify is not None and not result.verify.ok:
        return VerifyFailed(
            "applied, but verification failed (see above); 'gputopo recover' cannot undo a finished apply"
        )
    return None


def verify_stopped_line(result: ApplyResult) -> str | None:
    """What an apply says when a signal stopped its verification after the last step, else None."""
    if result.verify_stopped is None:
        return None
    return f"applied; {result.verify_stopped} stopped the verification before it ended: run 'gputopo verify'"


def _checked(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` once :class:`ApplyDoc` accepts it (raises pydantic's ValidationError otherwise)."""
    ApplyDoc.model_validate(doc)
    return doc


def result_document(result: ApplyResult, boot: BootRefresh | None = None) -> dict[str, Any]:
    """The document of an apply or recover that returned ``result``; ``boot``: what the next
    boot needs (:func:`gputopo.apply.boot.after_apply`). ``exit_code`` is what the command
    exits with (:func:`verify_failure`)."""
    actions = list(result.plan.actions) if result.plan is not None else []
    if not actions and result.journal:
        # recover returns no plan: the journal holds the steps it settled
        actions = list(Journal.load(result.journal).header.actions)
    kinds = {i: a.kind for i, a in enumerate(actions)}
    steps = [
        {
            "step": s.index + 1,
            "phase": s.phase,
            "kind": kinds.get(s.index, ""),
            "description": s.text,
            "status": s.status,
            "seconds": round(s.seconds, 3),
            "warnings": list(s.warnings),
        }
        for s in sorted(result.steps, key=lambda s: s.index)
    ]
    # the verify document as verify --json prints it (its text read back: the same values)
    verify = None if result.verify is None else json.loads(result.verify.to_json())
    failed = verify_failure(result)
    p = result.plan
    return _checked(
        {
            "status": result.status,
            "exit_code": failed.exit_code if failed else 0,
            "node": p.node if p is not None else None,
            "changed": result.status in CHANGED,
            "signature": p.signature() if p is not None else None,
            "journal": result.journal,
            "wall_s": round(result.wall_s, 3),
            "stop_window_s": None if result.stop_window_s is None else round(result.stop_window_s, 3),
            "steps": steps,
            "warnings": [f"step {s['step']}: {w}" for s in steps for w in s["warnings"]]
            + [line for line in [verify_stopped_line(result)] if line],
            "plan": list(result.would) or [a.describe() for a in actions],
            "verify": verify,
            "boot": None if boot is None else {"commands": boot.commands, "ran": boot.ran},
        }
    )


def error_document(error: GputopoError, root: str | os.PathLike, recover: bool = False) -> dict[str, Any]:
    """The document of an apply or recover under ``root`` that raised ``error``.

    An apply's names the journal this process wrote and each of its steps as the journal
    recorded it (an apply refused before its journal began has none): a step whose undo came
    back but left a guest or service down is ``undo-incomplete`` and names it among its
    warnings (:func:`gputopo.apply.history.left_down`). A recover's (``recover``)
    names the journal it was settling (:func:`gputopo.apply.history.settled_journal`), without
    steps."""
    steps: list[dict[str, Any]] = []
    if recover:
        journal = settled_journal(root)
    else:
        journal, records = own_journal(root)
        left = left_down(Journal.load(journal)) if journal is not None else {}
        steps = [
            {
                "step": s.step,
                "phase": s.phase,
                "kind": s.kind,
                "description": s.description,
                "status": s.status,
                "seconds": s.seconds or 0.0,
                "warnings": s.warnings + ([left[s.step - 1]] if s.step - 1 in left else []),
            }
            for s in records
        ]
    return _checked(
        {
            "status": "error",
            "exit_code": error.exit_code,
            "error": str(error),
            "journal": journal,
            "steps": steps,
        }
    )
