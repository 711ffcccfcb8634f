"""Saved plans (terraform's ``plan -out`` / ``apply PLANFILE``). Pure.

``gputopo plan --spec S -o plan.json`` writes a :class:`SavedPlan`: the spec, the plan, and the
state it was made from as flat items (``gpu/0000:81:00.0/driver`` -> ``nvidia``) with their
SHA-256 (the fingerprint). ``gputopo apply plan.json`` reads the facts and the current state
again, under the lock too, and applies exactly the saved actions only while the items are the
same; otherwise it refuses, naming each item that changed (:class:`SavedPlanStale`, exit 2).

The file is sealed (:class:`Seal`): a SHA-256 of the canonical JSON of each of its parts, each
action, the rest of the plan, the spec, the recorded state and the file's own fields, and one
over them all. A hand edit of any part (``--tp 8`` -> ``--tp 6`` in a step) is refused on
reading, naming the part (:class:`SavedPlanEdited`, exit 2): apply runs the actions as planned
or not at all. The seal is no signature with a key: it catches edits, not forgeries.

The items are what the planner decides from: every GPU's and IOMMU-group member's driver and
override, minors, groups and NUMA nodes, the host's IOMMU and modules, each container's status,
config and service, each mapping, each VM's status and passthrough devices, and the boot
persistence files. Values that change while nothing changes for the plan are left out: the
configs' digests (a hash of the whole file) and the PCIe link speed (it drops at idle).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from gputopo.errors import SavedPlanEdited, SavedPlanStale, SpecError
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.model.strict import Strict
from gputopo.plan.model import Plan
from gputopo.plan.spec import Spec

SCHEMA_VERSION = 2  # 2: the seal and the summary
KIND = "gputopo-saved-plan"


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def state_items(facts: Facts, current: CurrentState) -> dict[str, str]:
    """The state a plan is made from as flat items, ``area/name/field`` -> value text. Pure."""
    out: dict[str, str] = {}
    h = facts.host
    out["host/iommu"] = _text(h.iommu_enabled)
    out["host/iommu_mode"] = _text(h.iommu_mode)
    out["host/nvidia"] = _text(h.nvidia_driver_version)
    out["host/sev_snp"] = _text(h.sev_snp)
    out["host/modules"] = " ".join(sorted(m for m, on in h.modules.model_dump().items() if on)) or "none"
    for g in facts.gpus:
        base = f"gpu/{g.address}"
        out[f"{base}/driver"] = _text(g.driver)
        out[f"{base}/override"] = _text(g.driver_override)
        out[f"{base}/minor"] = _text(g.minor)
        out[f"{base}/group"] = _text(g.iommu_group)
        out[f"{base}/numa"] = _text(g.numa_node)
        for m in g.iommu_members:
            out[f"device/{m.address}/driver"] = _text(m.driver)
    for vmid, ct in sorted(current.containers.items()):
        base = f"ct/{vmid}"
        out[f"{base}/status"] = ct.status
        for key, value in sorted(ct.config.items()):
            if key != "digest":
                out[f"{base}/config/{key}"] = _text(value)
        if ct.service is not None:
            s = ct.service
            out[f"{base}/service/{s.unit}/active"] = _text(s.active)
            out[f"{base}/service/{s.unit}/command"] = _text(s.exec_start)
            out[f"{base}/service/{s.unit}/dropin"] = "absent" if s.dropin is None else _sha(s.dropin)
    for mid, m in sorted(current.mappings.items()):
        out[f"mapping/{mid}/map"] = _text(sorted(m.map))
        out[f"mapping/{mid}/description"] = _text(m.description)
    for vmid, g in sorted(current.guests.items()):
        out[f"vm/{vmid}/status"] = g.status
        out[f"vm/{vmid}/hostpci"] = _text(g.hostpci)
    for path, text in sorted(current.files.items()):
        out[f"file/{path.lstrip('/')}"] = "absent" if text is None else _sha(text)
    return out


def fingerprint(items: dict[str, str]) -> str:
    """SHA-256 of the items (key order does not matter)."""
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


def _short(value: str | None) -> str:
    if value is None:
        return "(absent)"
    return value if len(value) <= 60 else value[:57] + "..."


def changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """One line per item that differs, in key order: ``gpu/0000:81:00.0/driver: nvidia -> vfio-pci``."""
    return [
        f"{k}: {_short(before.get(k))} -> {_short(now.get(k))}"
        for k in sorted(set(before) | set(now))
        if before.get(k) != now.get(k)
    ]


def _canonical_sha(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Seal(Strict):
    """The SHA-256 of each part of a saved plan (``step/N``: its N-th action; ``plan``: the
    rest of the plan; ``spec``; ``state``: the recorded host state; ``file``: the file's own
    fields) and ``digest``, the SHA-256 of them all."""

    parts: dict[str, str]
    digest: str


class SavedSummary(Strict):
    """The summary line ``plan`` printed under the plan (:meth:`gputopo.plan.summary.PlanSummary.to_data`)."""

    counts: dict[str, int]
    stop_window_steps: int
    expected_stop_window_s: float | None = None
    max_stop_window_s: float | None = None
    text: str


class SavedPlan(Strict):
    """A plan as ``plan -o`` writes it and ``apply PLANFILE`` reads it (``gputopo schema saved-plan``)."""

    schema_version: Literal[2] = SCHEMA_VERSION
    kind: Literal["gputopo-saved-plan"] = KIND
    created: float = Field(default_factory=time.time, description="Unix time the plan was made")
    gputopo_version: str
    spec: Spec
    spec_file: str | None = Field(None, description="The spec file the plan was made from")
    spec_sha256: str = Field(description="SHA-256 of the spec file's bytes (or of the spec's JSON)")
    node: str | None = Field(None, description="--node as given, or null")
    source: str = Field(description="Where the state was read: sim DIR, api URL or local")
    fingerprint: str = Field(description="SHA-256 of state")
    state: dict[str, str] = Field(description="The state the plan was made from, area/name/field -> value")
    plan: Plan
    summary: SavedSummary | None = Field(None, description="The summary line plan printed; null: no changes")
    seal: Seal = Field(description="SHA-256 of each part and of them all: an edited file is refused")

    def seal_parts(self) -> dict[str, str]:
        """The SHA-256 of each part as the file holds it now (see :class:`Seal`)."""
        parts = {
            f"step/{i}": _canonical_sha(a.model_dump(mode="json")) for i, a in enumerate(self.plan.actions, 1)
        }
        parts["plan"] = _canonical_sha(self.plan.model_dump(mode="json", exclude={"actions"}))
        parts["spec"] = _canonical_sha(self.spec.model_dump(mode="json"))
        parts["state"] = _canonical_sha(self.state)
        parts["file"] = _canonical_sha(self.model_dump(mode="json", include=_FILE_FIELDS))
        return parts

    def edits(self) -> list[str]:
        """What was edited since the file was sealed, one phrase each ([] when nothing)."""
        now = self.seal_parts()
        was = self.seal.parts
        out = []
        n_was = sum(1 for k in was if k.startswith("step/"))
        if n_was != len(self.plan.actions):  # a step added or removed: every later one shifts
            out.append(f"it has {len(self.plan.actions)} step(s), {n_was} when it was written")
        else:
            for i, a in enumerate(self.plan.actions, 1):
                if was.get(f"step/{i}") != now[f"step/{i}"]:
                    out.append(f"step {i} ({a.describe()}) was edited")
        for key, what in (
            ("plan", "its target (GPUs, containers, mappings, VMs)"),
            ("spec", "its spec"),
            ("state", "the host state it was made from"),
            ("file", "its own fields (node, source, fingerprint, summary)"),
        ):
            if was.get(key) != now[key]:
                out.append(f"{what} changed")
        if not out and _canonical_sha(was) != self.seal.digest:
            out.append("its seal does not match itself")
        return out

    def check_seal(self, path: str) -> None:
        """Raises SavedPlanEdited (exit 2) naming what was edited since ``plan -o`` wrote it."""
        edited = self.edits()
        if edited:
            raise SavedPlanEdited(path, edited)

    def stale(self, facts: Facts, current: CurrentState) -> list[str]:
        """What changed between the saved state and ``facts`` + ``current`` ([] when nothing)."""
        now = state_items(facts, current)
        if fingerprint(now) == self.fingerprint:
            return []
        return changes(self.state, now) or ["the state's fingerprint differs"]

    def checked(self, facts: Facts, current: CurrentState, path: str = "saved plan") -> Plan:
        """The saved plan when ``facts`` + ``current`` are the state it was made from.

        Raises SavedPlanEdited (exit 2) when the file was edited since it was written,
        SavedPlanStale (exit 2) naming every item that changed.
        """
        self.check_seal(path)
        moved = self.stale(facts, current)
        if moved:
            raise SavedPlanStale(path, moved)
        return self.plan


def spec_digest(spec: Spec, spec_file: str | None) -> str:
    """SHA-256 of the spec file's bytes, what ``history`` and a saved plan show; of the spec's
    JSON when there is no regular file to read again (quick mode, ``--spec /dev/stdin``)."""
    if spec_file and os.path.isfile(spec_file):
        return hashlib.sha256(Path(spec_file).read_bytes()).hexdigest()
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def save_plan(
    plan: Plan,
    spec: Spec,
    facts: Facts,
    current: CurrentState,
    *,
    version: str,
    spec_file: str | None,
    spec_sha256: str,
    node: str | None,
    source: str,
    summary: dict[str, Any] | None = None,
) -> SavedPlan:
    """The sealed :class:`SavedPlan` of ``plan``, made from ``facts`` and ``current``;
    ``summary``: the summary line's data (:meth:`gputopo.plan.summary.PlanSummary.to_data`)."""
    items = state_items(facts, current)
    saved = SavedPlan(
        gputopo_version=version,
        spec=spec,
        spec_file=spec_file,
        spec_sha256=spec_sha256,
        node=node,
        source=source,
        fingerprint=fingerprint(items),
        state=items,
        plan=plan,
        summary=None if summary is None else SavedSummary.model_validate(summary),
        seal=Seal(parts={}, digest=""),
    )
    parts = saved.seal_parts()
    saved.seal = Seal(parts=parts, digest=_canonical_sha(parts))
    return saved


_FILE_FIELDS = {
    "schema_version",
    "kind",
    "created",
    "gputopo_version",
    "spec_file",
    "spec_sha256",
    "node",
    "source",
    "fingerprint",
    "summary",
}


def parse_saved_plan(text: str, path: str) -> SavedPlan:
    """The saved plan in ``text``. Raises SpecError naming the file for anything that is not
    one (another document, another schema version, a damaged file), SavedPlanEdited (exit 2)
    for one edited since ``plan -o`` wrote it, naming what was edited."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SpecError(path, "", f"not a saved plan (not JSON: {e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise SpecError(path, "kind", f"{KIND!r} expected: write one with 'gputopo plan -o FILE'")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise SpecError(
            path,
            "schema_version",
            f"{SCHEMA_VERSION} expected (got {data.get('schema_version')!r}); "
            "make the plan again with this gputopo",
        )
    from pydantic import ValidationError

    try:
        saved = SavedPlan.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise SpecError(path, where, f"{first['msg']} (damaged saved plan)") from None
    saved.check_seal(path)
    return saved
