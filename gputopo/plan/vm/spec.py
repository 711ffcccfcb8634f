"""The spec's VM entries (``nodes[].vms.consumers``): a VM that takes GPUs from a PCI mapping,
how its ``hostpciN`` lines read, where it runs, and what happens when its mapping's GPUs leave.

Part of :mod:`gputopo.plan.spec` (``gputopo/v1``, additive: a spec without consumers plans as
before). Strict like the rest of the spec. Pure.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from gputopo.model.strict import Strict

# pve-configid (pve-common JSONSchema.pm): a letter, then letters, digits, - or _
MAPPING_ID_PATTERN = r"^[a-zA-Z][a-zA-Z0-9_-]+$"


class VmConsumer(Strict):
    """One VM that gets GPUs from a mapping: gputopo writes its ``hostpciN: mapping=NAME,...``
    lines (one per GPU), its CPU ``affinity`` and NUMA placement, and the firmware's 64-bit MMIO
    window when its GPUs' BARs need a larger one."""

    model_config = ConfigDict(populate_by_name=True)

    vmid: int = Field(ge=100, le=999999999, description="The VM (it must exist on the node)")
    mapping: str = Field(pattern=MAPPING_ID_PATTERN, description="The PCI mapping its GPUs come from")
    gpus: int | None = Field(
        None,
        ge=1,
        le=16,
        description="How many of the mapping's GPUs (one hostpciN line each); default: all of them",
    )
    pcie: bool = Field(True, description="pcie=1 (PCI Express; needs machine q35)")
    x_vga: bool = Field(False, alias="x-vga", description="x-vga=1 (primary display; SeaBIOS only)")
    rombar: bool = Field(True, description="rombar=0 when false (the ROM hidden from the guest)")
    affinity: bool = Field(True, description="Pin the VM's CPUs (affinity) to the NUMA node of its GPUs")
    numa: bool = Field(True, description="numa: 1, and guest node 0 bound to the GPUs' host node (numa0)")
    hugepages: Literal["2", "1024", "any"] | None = Field(
        None, description="hugepages: 2 or 1024 (MiB pages) or any; unset: the VM's setting is left alone"
    )
    mmio64_mb: int | None = Field(
        None, ge=1, description="OVMF's 64-bit MMIO window in MiB; unset: computed from the GPUs' BARs"
    )
    when_gpus_leave: Literal["refuse", "remove", "repoint"] = Field(
        "refuse",
        description=(
            "When GPUs of its mapping go to a container: refuse the plan, remove the hostpciN lines of the "
            "GPUs that left, or repoint every line to repoint_to. With remove or repoint, a mapping with fewer "
            "GPUs than asked is a warning (the VM gets what is there), not a refusal"
        ),
    )
    repoint_to: str | None = Field(None, pattern=MAPPING_ID_PATTERN, description="The mapping for 'repoint'")
    start: bool = Field(False, description="The VM should run: apply starts it when it is stopped")
    verify_guest: bool = Field(
        False,
        description="verify starts it (when stopped), runs nvidia-smi through its guest agent and "
        "compares the GPUs, then stops it again",
    )

    @field_validator("hugepages", mode="before")
    @classmethod
    def _page_size(cls, value: Any) -> Any:
        # YAML reads an unquoted 1024 as a number
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _repoint(self) -> VmConsumer:
        if self.when_gpus_leave == "repoint" and not self.repoint_to:
            raise ValueError("repoint_to: a mapping is required with when_gpus_leave: repoint")
        if self.repoint_to and self.when_gpus_leave != "repoint":
            raise ValueError("repoint_to: only used with when_gpus_leave: repoint")
        if self.repoint_to and self.repoint_to.lower() == self.mapping.lower():
            raise ValueError(f"repoint_to: {self.repoint_to} is the VM's own mapping")
        return self


def check_consumers(consumers: list[VmConsumer], container_ids: set[int]) -> None:
    """Cross-field checks of a node's consumers. Raises ValueError naming the field."""
    seen: set[int] = set()
    for i, c in enumerate(consumers):
        if c.vmid in seen:
            raise ValueError(f"vms.consumers[{i}].vmid: VM {c.vmid} is listed twice")
        if c.vmid in container_ids:
            raise ValueError(f"vms.consumers[{i}].vmid: {c.vmid} is a container of this node")
        seen.add(c.vmid)
