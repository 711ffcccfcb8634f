"""Who a plan gives a GPU to: a container, a VM mapping, or the host (left untouched).

One typed value instead of strings: its text form (``container:<vmid>``, ``vm:<mapping>``,
``host``) is what plans, their JSON and messages carry, and :meth:`Owner.parse` reads it back, so
the formats on disk stay what they were. A pydantic field of this type validates from that text
and serialises to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class OwnerKind(str, Enum):
    """The kinds of owner; the value is the text before the colon."""

    CONTAINER = "container"
    VM = "vm"
    HOST = "host"


@dataclass(frozen=True)
class Owner:
    """A GPU's owner in a plan. ``name`` is the container's vmid (as text), the VM mapping's id,
    or empty for the host."""

    kind: OwnerKind
    name: str = ""

    def __post_init__(self) -> None:
        if (self.kind == OwnerKind.HOST) != (self.name == ""):
            raise ValueError(f"owner {self.kind.value!r} with name {self.name!r}")
        if self.kind == OwnerKind.CONTAINER and not self.name.isdigit():
            raise ValueError(f"container owner needs a numeric vmid, not {self.name!r}")

    @classmethod
    def container(cls, vmid: int) -> Owner:
        return cls(OwnerKind.CONTAINER, str(vmid))

    @classmethod
    def vm(cls, mapping: str) -> Owner:
        return cls(OwnerKind.VM, mapping)

    @classmethod
    def host(cls) -> Owner:
        return HOST

    @classmethod
    def parse(cls, text: str) -> Owner:
        """``container:101`` / ``vm:NAME`` / ``host`` as an Owner. Raises ValueError otherwise."""
        kind, sep, name = text.partition(":")
        try:
            k = OwnerKind(kind)
        except ValueError:
            raise ValueError(f"not an owner: {text!r} (container:<vmid> | vm:<mapping> | host)") from None
        if (k == OwnerKind.HOST) == bool(sep):
            raise ValueError(f"not an owner: {text!r} (container:<vmid> | vm:<mapping> | host)")
        return cls(k, name)

    def __str__(self) -> str:
        return self.kind.value if self.kind == OwnerKind.HOST else f"{self.kind.value}:{self.name}"

    @property
    def is_container(self) -> bool:
        return self.kind == OwnerKind.CONTAINER

    @property
    def is_vm(self) -> bool:
        return self.kind == OwnerKind.VM

    @property
    def vmid(self) -> int:
        """The container's vmid. Raises ValueError for any other owner."""
        if not self.is_container:
            raise ValueError(f"{self} is not a container")
        return int(self.name)

    @property
    def label(self) -> str:
        """For people: ``container 101``, ``vm NAME``, ``host``."""
        return str(self).replace(":", " ", 1)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """As a pydantic field: validated from an Owner or its text, serialised as the text."""
        from pydantic_core import core_schema

        def coerce(v: Any) -> Owner:
            return v if isinstance(v, Owner) else cls.parse(v)

        return core_schema.no_info_plain_validator_function(
            coerce,
            json_schema_input_schema=core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(
                str, return_schema=core_schema.str_schema()
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "string", "pattern": r"^(container:\d+|vm:.+|host)$"}


HOST = Owner(OwnerKind.HOST)
