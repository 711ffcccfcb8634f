"""The JSON Schema of the spec file (``gputopo schema spec``)."""

from __future__ import annotations

from typing import Any


def spec_schema() -> dict[str, Any]:
    """The spec's JSON Schema, for editors."""
    from gputopo.plan.spec import Spec

    return Spec.model_json_schema()
