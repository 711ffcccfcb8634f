"""Where a spec comes from: a spec file, or quick mode's split and its options. Light: the
commands that take these options import it to parse them, nothing of the planner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpecSource:
    """Where the spec comes from: ``spec_file``, or quick mode's ``split`` and its options.

    ``tp_flag_given``: the operator typed ``--tp-flag``, so a unit found inside the container
    does not replace it with the flag the unit spells.
    """

    spec_file: str | None = None
    split: str | None = None
    container: int = 101
    vm_mapping: str = "pro6000-vm"
    container_mapping: str | None = None
    service_unit: str | None = None
    tp_flag: str = "--tp"
    tp_flag_given: bool = False
    vm: int | None = None

    def quick_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`gputopo.plan.starter.spec_from_split` it stands for."""
        return dict(
            container=self.container,
            vm_mapping=self.vm_mapping,
            container_mapping=self.container_mapping,
            service_unit=self.service_unit,
            tp_flag=self.tp_flag,
            vm=self.vm,
        )
