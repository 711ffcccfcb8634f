"""The action kinds a plan is made of, one module each (see :mod:`gputopo.actions.base`).

``Action`` is the discriminated union of every kind (keyed by ``kind``), for the plan's and the
journal's models; :func:`action_class` maps a kind back to its class.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field, TypeAdapter

from gputopo.actions.base import (
    PHASES,
    ActionModel,
    DiffArea,
    DiffContext,
    Holder,
    Phase,
    PreflightContext,
    Resource,
    RunningBefore,
    StepContext,
    Timeouts,
    World,
    action_class,
    action_kinds,
    stop_window,
    undo_order,
)
from gputopo.actions.container import RestartFallback, UpdateContainer
from gputopo.actions.dropin import WriteServiceDropin
from gputopo.actions.guest import StartGuest, StopGuest
from gputopo.actions.ha import PlaceHa
from gputopo.actions.hostfile import RemoveHostFile, WriteHostFile
from gputopo.actions.mapping import DeleteMapping, SetMapping
from gputopo.actions.rebind import NVIDIA, VFIO, Rebind
from gputopo.actions.service import StartService, StopService
from gputopo.actions.vmconfig import UpdateVmConfig

Action = Annotated[Union[tuple(action_kinds().values())], Field(discriminator="kind")]  # type: ignore[valid-type]  # noqa: UP007 (a Union of a computed tuple)
ACTION = TypeAdapter(Action)

__all__ = [
    "ACTION",
    "NVIDIA",
    "PHASES",
    "VFIO",
    "Action",
    "ActionModel",
    "DeleteMapping",
    "DiffArea",
    "DiffContext",
    "Holder",
    "Phase",
    "PlaceHa",
    "PreflightContext",
    "Rebind",
    "RemoveHostFile",
    "Resource",
    "RestartFallback",
    "RunningBefore",
    "SetMapping",
    "StartGuest",
    "StartService",
    "StepContext",
    "StopGuest",
    "StopService",
    "Timeouts",
    "UpdateContainer",
    "UpdateVmConfig",
    "World",
    "WriteHostFile",
    "WriteServiceDropin",
    "action_class",
    "action_kinds",
    "stop_window",
    "undo_order",
]
