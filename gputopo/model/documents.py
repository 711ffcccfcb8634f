"""Every versioned JSON document gputopo prints or writes, declared once (``gputopo schema NAME``).

apply and verify produce these documents (:mod:`gputopo.apply.document`,
:meth:`VerifyReport.to_data`); the CLI prints them, ``cluster/`` reads a node's apply and verify
output back with them, and the Ansible module reads the same keys. Every model is strict
(``extra="forbid"``): a field one side adds and the other does not know is an error, never
silently dropped.

Each document carries ``schema_version`` at its top; a change that a script would notice (a
key renamed or removed, a meaning changed) raises it. Keys are names without spaces (a
``snake_case`` word, or a path, an address, a vmid); file modes are octal strings (``"0644"``).

This module stays light: ``print_json``, which every ``--json`` command calls, imports it, so it
imports pydantic and nothing of the planner.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError

from gputopo.model.docbase import VERSION, versioned  # noqa: F401  (named here with every document)
from gputopo.model.docbase import Doc as _Doc
from gputopo.model.hostdocs import (  # noqa: F401  (every document is named here)
    ApplyRecord,
    HistoryEntry,
    HistoryList,
    ManifestFile,
    NodeReadDoc,
    NodeReadExec,
    Outcome,
    RenderManifest,
    SimServeDoc,
    SnapshotDoc,
    StepRecord,
)
from gputopo.model.strict import Strict


def schema_of(model: Any) -> dict[str, Any]:
    """The JSON Schema of the document ``model`` declares (``gputopo schema NAME``),
    ``schema_version`` first: its ``document_schema()`` where the document adds keys to the
    model's own (plan, verify), else the model's."""
    if hasattr(model, "document_schema"):
        schema = model.document_schema()
    else:
        schema = model.model_json_schema(by_alias=True, mode="serialization")
    props = dict(schema.get("properties", {}))
    props.pop("schema_version", None)
    # a document with a version of its own (the saved plan's) keeps it
    own = getattr(model, "model_fields", {}).get("schema_version")
    version = own.default if own is not None and isinstance(own.default, int) else VERSION
    schema["properties"] = {
        "schema_version": {
            "const": version,
            "type": "integer",
            "description": "Raised when a change would break a script",
        },
        **props,
    }
    schema["required"] = ["schema_version", *[r for r in schema.get("required", []) if r != "schema_version"]]
    return schema


# --- diff, apply, snapshot, sim serve, render -------------------------------------------------


class DiffAreaDoc(Strict):
    title: str = Field(description="The area as the text output names it")
    lines: list[str]
    files: dict[str, str] = Field(description="path -> unified diff")


class FileChangeDoc(Strict):
    """One file of ``diff --json``'s ``changes`` (:class:`gputopo.plan.diff.FileChange`, whose
    module is not imported here: print_json, which every --json command calls, loads this one)."""

    before: str | None = Field(description="The text now; null: the file does not exist")
    after: str | None = Field(description="The text the plan leads to; null: removed")


class DiffDoc(_Doc):
    """``gputopo diff --json``."""

    node: str
    is_empty: bool
    areas: dict[str, DiffAreaDoc] = Field(description="driver_bindings, container_devices, mappings, ...")
    changes: dict[str, FileChangeDoc] = Field(
        default_factory=dict, description="path -> the whole file before and after"
    )


class StepDoc(Strict):
    step: int = Field(description="1-based, as the plan numbers it")
    phase: str
    kind: str
    description: str
    status: str = Field(description="done | failed")
    seconds: float
    warnings: list[str] = Field(default_factory=list)


class BootDoc(Strict):
    commands: list[list[str]] = Field(description="What the next boot needs run, in order")
    ran: bool = Field(description="True when apply ran them (--refresh-boot)")


class ApplyDoc(_Doc):
    """``gputopo apply --json`` and ``gputopo recover --json``: how it ended, each step and its time."""

    status: str = Field(
        description="applied, no-changes, dry-run, rolled-back, recovered, finished, "
        "nothing-to-recover, or error"
    )
    exit_code: int
    error: str | None = None
    node: str | None = None
    changed: bool = Field(
        False, description="Whether the host was changed (a rolled-back apply changed it twice)"
    )
    signature: str | None = Field(None, description="The plan's signature (apply --expect-plan)")
    journal: str | None = None
    wall_s: float | None = None
    stop_window_s: float | None = None
    steps: list[StepDoc] = Field(default_factory=list)
    plan: list[str] = Field(
        default_factory=list,
        description="Every planned step's description, in order (recover --dry-run: what it would do)",
    )
    verify: dict[str, Any] | None = Field(None, description="The verify document (gputopo schema verify)")
    boot: BootDoc | None = Field(None, description="Boot persistence changed: what must run before a reboot")
    warnings: list[str] = Field(default_factory=list, description="Every step's warnings as 'step N: text'")


class ClusterDiffDoc(_Doc):
    """``gputopo cluster diff --json``: each node's diff document, as ``gputopo diff --json`` prints
    it on that node (``gputopo schema diff``, without its ``schema_version``), and the HA placement's."""

    nodes: list[DiffDoc] = Field(description="Each node's diff document, in the cluster's order")
    ha: list[str] = Field(description="One line per HA change")
    ha_files: dict[str, FileChangeDoc] = Field(
        description="path -> the HA file (rules.cfg, or groups.cfg and resources.cfg) before and after"
    )
    is_empty: bool = Field(description="No difference on any node, nor in the HA placement")


# --- verify ------------------------------------------------------------------------------------

# SKIP: the check did not run (nothing of its kind in the spec, or no plan to check against);
# its summary says why. It never fails a verification, and never counts as a PASS.
Status = Literal["PASS", "WARN", "FAIL", "SKIP"]
PASS: Status = "PASS"
WARN: Status = "WARN"
FAIL: Status = "FAIL"
SKIP: Status = "SKIP"


class Check(Strict):
    """One check's verdict: ``summary`` is one line with the numbers, ``details`` the data."""

    name: str
    status: Status
    summary: str
    details: dict[str, Any] = Field(default_factory=dict)


class VerifyReport(Strict):
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
        out = {PASS: 0, WARN: 0, FAIL: 0, SKIP: 0}
        for c in self.checks:
            out[c.status] += 1
        return out

    def summary_line(self) -> str:
        """``all clear: 7 PASS`` or ``verification failed: 2 FAIL (memory, inference), 1 WARN
        (platform)``; the checks that did not run follow, ``2 SKIP (service, inference)``."""
        n = self.counts()
        parts = []
        for status in (FAIL, WARN, SKIP):
            if n[status]:
                names = ", ".join(c.name for c in self.checks if c.status == status)
                parts.append(f"{n[status]} {status} ({names})")
        if self.ok:
            head = "all clear"
            parts.insert(0, f"{n[PASS]} PASS")
        else:
            head = "verification failed" + (" (strict)" if self.strict and not n[FAIL] else "")
        return f"{head}: " + ", ".join(parts)

    def to_data(self) -> dict[str, Any]:
        """The verify document (``gputopo schema verify``) without ``schema_version``: the
        report, then ``ok``, ``exit_code`` and ``summary`` as the report works them out
        (:meth:`to_json` is its text)."""
        data = self.model_dump()
        data["ok"] = self.ok
        data["exit_code"] = self.exit_code
        data["summary"] = self.summary_line()
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_data(), indent=2, default=str)

    @classmethod
    def document_schema(cls) -> dict[str, Any]:
        """The JSON Schema of :meth:`to_data`'s document (``gputopo schema verify``) without
        ``schema_version``: the report's, with the keys worked out from its checks."""
        schema = cls.model_json_schema()
        schema["properties"].update(
            {"ok": {"type": "boolean"}, "exit_code": {"type": "integer"}, "summary": {"type": "string"}}
        )
        return schema

    @classmethod
    def read(cls, data: Any) -> VerifyReport:
        """The report in a verify document (``verify --json``, or apply's ``verify``).

        The keys worked out from the checks (``ok``, ``exit_code``, ``summary``) are dropped;
        anything else this version does not know is refused. Raises ValueError (one line: where,
        what) for another ``schema_version`` or an unknown or missing field.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a verify document is a JSON object, not {type(data).__name__}")
        if data.get("schema_version", VERSION) != VERSION:
            raise ValueError(
                f"verify document schema_version {data['schema_version']!r}, this gputopo reads {VERSION}"
            )
        derived = ("schema_version", "ok", "exit_code", "summary")
        try:
            return cls.model_validate({k: v for k, v in data.items() if k not in derived})
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "the document"
            raise ValueError(f"{where}: {first['msg']}") from None

    def to_text(self) -> str:
        lines = [f"{c.status:<4}  {c.name:<10} {c.summary}" for c in self.checks]
        return "\n".join(lines + [self.summary_line()]) + "\n"


# --- cluster verify ------------------------------------------------------------------------------


class NodeReport(Strict):
    """A node's own verify report (``gputopo verify --json``), or one FAIL saying why none came."""

    node: str
    checks: list[Check] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.status == FAIL for c in self.checks)


class ClusterReport(_Doc):
    """``gputopo cluster verify --json``: each node's checks, then the cluster's own."""

    nodes: list[NodeReport] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list, description="The cluster's own checks")

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes) and not any(c.status == FAIL for c in self.checks)

    def summary_line(self) -> str:
        bad = [n.node for n in self.nodes if not n.ok] + [c.name for c in self.checks if c.status == FAIL]
        warn = [c.name for c in self.checks if c.status == WARN]
        warn += [f"{n.node}/{c.name}" for n in self.nodes for c in n.checks if c.status == WARN]
        head = "all clear" if not bad else f"verification failed: {', '.join(bad)}"
        return head + f" ({len(self.nodes)} node(s)" + (f"; WARN: {', '.join(warn)}" if warn else "") + ")"


# --- cluster apply -------------------------------------------------------------------------------

NodeOutcomeName = Literal[
    "applied-and-kept",
    "no-changes",
    "applied-then-rolled-back",
    "failed-verify-kept",
    "needs-human",
    "not-started",
    "unknown",
    "refused",
]


class NodeApplyDoc(Strict):
    """One node's part of a rolling apply, told from the node's own apply document."""

    node: str
    outcome: NodeOutcomeName = Field(
        description="applied-and-kept; no-changes; applied-then-rolled-back (its apply failed and "
        "rolled itself back); failed-verify-kept (applied, its verification failed, the changes "
        "stay); needs-human (its rollback did not complete); not-started; unknown (the connection "
        "was lost during its apply); refused (it refused before changing anything)"
    )
    kept: bool | None = Field(
        description="Whether changes it made are still there; null: unknown (see next_step)"
    )
    failed: bool = Field(description="This node stopped the rollout")
    exit_code: int | None = Field(
        None, description="Its own apply's exit status; null when it did not run or the connection was lost"
    )
    seconds: float = 0.0
    steps: int = Field(0, description="Steps its apply ran")
    verify: str | None = Field(None, description="Its verification's summary line")
    reason: str | None = Field(None, description="Why it failed or did not start, one line")
    next_step: str | None = Field(None, description="What an operator does next, when anything")
    apply: ApplyDoc | None = Field(
        None, description="Its apply document, as it printed it (gputopo schema apply)"
    )


class ClusterApplyDoc(_Doc):
    """``gputopo cluster apply --json``: every node's outcome, in the rollout's order."""

    status: Literal["applied", "no-changes", "dry-run", "stopped", "refused"] = Field(
        description="applied: every node applied (or had no changes); stopped: a node failed, the "
        "rollout stopped (nodes say how); refused: refused before any node's apply"
    )
    exit_code: int
    changed: bool | None = Field(
        description="Whether any node was changed and kept; null when none is known to be but a "
        "node's outcome is unknown"
    )
    error: str | None = None
    nodes: list[NodeApplyDoc] = Field(default_factory=list)
    wall_s: float = 0.0
