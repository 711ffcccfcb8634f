"""The plan: the target of every GPU, container and mapping, and the ordered actions that get there.

A plan is data: every action is a model of :mod:`gputopo.actions` with a ``kind``, a ``phase`` and a
one-line ``describe()``. Apply iterates the actions in order; an empty action list means the host is
converged ("No changes"). Phases, in execution order:

* ``prepare`` -- safe while everything runs: persistence files, PCI mappings, the service drop-in
  (systemd reads it only at the next start);
* ``stop``    -- the service, the container, VMs whose devices change (only what must stop);
* ``switch``  -- one Rebind per IOMMU group; they may run in parallel;
* ``config``  -- the container's device entries (with the digest read at plan time);
* ``start``   -- what was stopped, in reverse.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import Field

from gputopo.actions import VFIO, Action
from gputopo.capacity.estimate import Capacity
from gputopo.model.owner import Owner
from gputopo.model.strict import Strict


class GpuTarget(Strict):
    address: str
    owner: Owner = Field(description="container:<vmid> | vm:<mapping> | host (left untouched)")
    driver: Literal["nvidia", "vfio-pci"] | None = Field(description="Target driver; null = untouched")
    current_driver: str | None
    companions: list[str] = Field(default_factory=list)
    numa_node: int | None = None
    minor: int | None = None
    iommu_group: int | None = None


class ServiceTarget(Strict):
    unit: str
    tp_flag: str
    tp: int
    dropin: str
    command: str | None = Field(None, description="Base command; null when unknown (drop-in not managed)")
    current_tp: int | None = None


class ContainerTarget(Strict):
    vmid: int
    gpus: list[str]
    device_mode: Literal["devN", "legacy"]
    devices: dict[str, str] = Field(description="Every devN entry the config will have")
    lxc: list[list[str]] = Field(default_factory=list, description="gputopo's raw lxc.* lines (legacy)")
    mapping: str | None = None
    service: ServiceTarget | None = None


class MappingTarget(Strict):
    map: list[str]
    description: str | None = None


class VmTarget(Strict):
    """A VM of ``vms.consumers``: the GPUs it takes and the config keys gputopo owns."""

    vmid: int
    mapping: str = Field(description="The mapping its hostpciN lines name (after a repoint)")
    gpus: int = Field(description="hostpciN lines: one GPU each")
    numa_nodes: list[int] = Field(default_factory=list, description="NUMA nodes of the mapping's GPUs")
    mmio64_need: int = Field(0, description="Bytes of 64-bit BARs its GPUs bring")
    config: dict[str, str] = Field(
        default_factory=dict, description="Every key gputopo owns, as it will read"
    )
    notes: list[str] = Field(default_factory=list, description="Why each setting is what it is")


class Plan(Strict):
    node: str
    target: list[GpuTarget]
    containers: list[ContainerTarget] = Field(default_factory=list)
    vms: list[VmTarget] = Field(default_factory=list)
    mappings: dict[str, MappingTarget] = Field(default_factory=dict, description="Mappings the spec manages")
    kept_mappings: dict[str, MappingTarget] = Field(
        default_factory=dict, description="Other mappings, untouched"
    )
    p2p_disable: bool = False
    keep_override: bool = True
    placement: list[str] = Field(
        default_factory=list,
        description="Why each owner's GPUs, one line per owner: how far apart, where they meet, how many stay",
    )
    capacity: list[Capacity] = Field(
        default_factory=list,
        description="Each served model at its new tensor-parallel size (gputopo.plan.capacity)",
    )
    capacity_unknown: list[str] = Field(
        default_factory=list, description="Why a served model's capacity could not be checked, one line each"
    )
    warnings: list[str] = Field(default_factory=list)
    actions: list[Action] = Field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.actions

    def signature(self) -> str:
        """A hash of what the actions will do (``ActionModel.signature``: without the digests
        read again before each write; HA placement, planned again when it runs, left out). Two
        plans with the same signature make the same changes; ``gputopo apply --expect-plan``
        refuses a plan whose signature is not the one shown."""
        data = json.dumps(
            [a.signature() for a in self.actions if a.in_signature], sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(data.encode()).hexdigest()[:16]

    def to_data(self, summary: dict[str, Any] | None = None) -> dict[str, Any]:
        """The plan document (``gputopo schema plan``) without ``schema_version``: the plan, each
        action with its one-line description as the text shows it, ``no_changes``, the
        ``signature`` apply --expect-plan takes and, when given, the summary's numbers."""
        data = self.model_dump(mode="json")
        for entry, action in zip(data["actions"], self.actions):
            entry["description"] = action.describe()
        data["no_changes"] = self.is_empty
        data["signature"] = self.signature()
        if summary is not None:
            data["summary"] = summary
        return data

    @classmethod
    def document_schema(cls) -> dict[str, Any]:
        """The JSON Schema of :meth:`to_data`'s document (``gputopo schema plan``) without
        ``schema_version``: the plan's, each action with its description, and the keys
        :meth:`to_data` adds (the summary's are :meth:`gputopo.plan.summary.PlanSummary.to_data`'s)."""
        schema = cls.model_json_schema(mode="serialization")
        for d in schema.get("$defs", {}).values():
            if "kind" in d.get("properties", {}):  # an action kind: the JSON adds its one-line description
                d["properties"]["description"] = {"type": "string"}
        schema["properties"]["no_changes"] = {"type": "boolean"}
        schema["properties"]["signature"] = {
            "type": "string",
            "description": "What apply --expect-plan takes",
        }
        schema["properties"]["summary"] = {
            "type": "object",
            "description": "The plan's one-line summary and its numbers",
            "properties": {
                "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                "stop_window_steps": {"type": "integer"},
                "expected_stop_window_s": {"type": ["number", "null"]},
                "max_stop_window_s": {"type": ["number", "null"]},
                "text": {"type": "string"},
            },
            "required": ["counts", "text"],
            "additionalProperties": False,
        }
        schema["required"] = sorted(set(schema.get("required", [])) | {"no_changes", "signature"})
        return schema

    def vfio_addresses(self) -> list[str]:
        """Every address that the target puts on vfio-pci (VM GPUs and their companions)."""
        out: set[str] = set()
        for t in self.target:
            if t.driver == VFIO:
                out.add(t.address)
                out.update(t.companions)
        return sorted(out)

    def to_text(self) -> str:
        """The plan for humans: target table, warnings, numbered actions or 'No changes'."""
        lines = [f"Node {self.node}"]
        lines.append(f"{'GPU':<14} {'NUMA':<5} {'MINOR':<6} {'GROUP':<6} {'DRIVER':<22} OWNER")
        for t in self.target:
            drv = t.current_driver or "none"
            if t.driver and t.driver != t.current_driver:
                drv = f"{drv} -> {t.driver}"
            comp = f" (+{', '.join(t.companions)})" if t.companions else ""
            lines.append(
                f"{t.address:<14} {_dash(t.numa_node):<5} {_dash(t.minor):<6} {_dash(t.iommu_group):<6} "
                f"{drv:<22} {t.owner}{comp}"
            )
        for ct in self.containers:
            svc = ""
            if ct.service is not None:
                was = (
                    f" (now {ct.service.current_tp})"
                    if ct.service.current_tp not in (None, ct.service.tp)
                    else ""
                )
                svc = f", {ct.service.unit} tp {ct.service.tp}{was}"
            lines.append(
                f"Container {ct.vmid}: {len(ct.gpus)} GPU(s), tp {len(ct.gpus)}, {ct.device_mode}{svc}"
            )
        for mid, m in sorted(self.mappings.items()):
            lines.append(f"Mapping {mid}: {len(m.map)} device(s)")
        for vm in self.vms:
            nodes = ",".join(map(str, vm.numa_nodes)) or ("unknown" if vm.gpus else "-")
            lines.append(f"VM {vm.vmid}: {vm.gpus} GPU(s) from {vm.mapping}, NUMA node {nodes}")
            lines += [f"  - {n}" for n in vm.notes]
        if self.capacity or self.capacity_unknown:
            lines.append("Capacity:")
            lines += [f"  - {c.text}" for c in self.capacity]
            lines += [f"  - {u}" for u in self.capacity_unknown]
        if self.placement:
            lines.append("Placement:")
            lines += [f"  - {p}" for p in self.placement]
        if self.warnings:
            lines.append("Warnings:")
            lines += [f"  - {w}" for w in self.warnings]
        if not self.actions:
            lines.append("No changes")
        else:
            lines.append("Actions:")
            for i, a in enumerate(self.actions, 1):
                lines.append(f"  {i:>2}. [{a.phase}] {a.describe()}")
        return "\n".join(lines) + "\n"


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)
