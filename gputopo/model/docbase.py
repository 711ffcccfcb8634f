"""What every versioned document shares: its ``schema_version`` and where it goes in the JSON."""

from __future__ import annotations

from typing import Any, Literal

from gputopo.model.strict import Strict

VERSION = 1


class Doc(Strict):
    """A document: ``schema_version`` at its top."""

    schema_version: Literal[1] = VERSION


def versioned(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``schema_version`` first: the document's own where it carries one (the facts
    document has its own version), else this module's."""
    version = data.get("schema_version", VERSION)
    return {"schema_version": version, **{k: v for k, v in data.items() if k != "schema_version"}}
