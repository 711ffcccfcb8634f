"""``gputopo schema NAME``: the JSON Schema of the spec file or of a JSON document a command
prints or writes (every one carries ``schema_version``).

The documents are declared in :mod:`gputopo.model.documents` (facts, topo, plan and saved-plan
with their own models); :data:`DOCUMENTS` says which command prints each one. A model is
imported only when its schema is asked for: ``--help`` stays light.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from gputopo.exitcodes import with_exit_codes


def _verify_doc() -> dict[str, Any]:
    from gputopo.model.documents import VerifyReport

    schema = VerifyReport.model_json_schema()
    schema["properties"].update(
        {"ok": {"type": "boolean"}, "exit_code": {"type": "integer"}, "summary": {"type": "string"}}
    )
    return schema


def _plan_doc() -> dict[str, Any]:
    from gputopo.plan.model import Plan

    schema = Plan.model_json_schema(mode="serialization")
    for d in schema.get("$defs", {}).values():
        if "kind" in d.get("properties", {}):  # an action kind: the JSON adds its one-line description
            d["properties"]["description"] = {"type": "string"}
    schema["properties"]["no_changes"] = {"type": "boolean"}
    schema["properties"]["signature"] = {"type": "string", "description": "What apply --expect-plan takes"}
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


def _model(path: str) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        import importlib

        module, attr = path.split(":")
        model = getattr(importlib.import_module(module), attr)
        return model.model_json_schema(by_alias=True, mode="serialization")

    return make


# name -> (what prints it, its schema without schema_version where the model has none)
DOCUMENTS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "facts": ("discover --json", _model("gputopo.model.facts:Facts")),
    "topo": ("topo --json", _model("gputopo.topo.model:TopoReport")),
    "plan": ("plan --json", _plan_doc),
    "saved-plan": ("plan -o FILE", _model("gputopo.plan.saved:SavedPlan")),
    "diff": ("diff --json", _model("gputopo.model.documents:DiffDoc")),
    "verify": ("verify --json", _verify_doc),
    "apply": ("apply --json, recover --json", _model("gputopo.model.documents:ApplyDoc")),
    "snapshot": ("snapshot --json", _model("gputopo.model.documents:SnapshotDoc")),
    "sim-serve": ("sim serve --json", _model("gputopo.model.documents:SimServeDoc")),
    "history": ("history --json", _model("gputopo.model.documents:HistoryList")),
    "history-entry": ("history show ID --json", _model("gputopo.model.documents:HistoryEntry")),
    "render-manifest": (
        "render --out DIR (.gputopo-render.json)",
        _model("gputopo.model.documents:RenderManifest"),
    ),
}


NAMES = ["spec", *DOCUMENTS]


def schema_of(name: str) -> dict[str, Any]:
    """The JSON Schema of document ``name``, ``schema_version`` included. Raises KeyError."""
    from gputopo.model.documents import VERSION

    _, make = DOCUMENTS[name]
    schema = make()
    props = dict(schema.get("properties", {}))
    props.pop("schema_version", None)
    schema["properties"] = {
        "schema_version": {
            "const": VERSION,
            "type": "integer",
            "description": "Raised when a change would break a script",
        },
        **props,
    }
    schema["required"] = ["schema_version", *[r for r in schema.get("required", []) if r != "schema_version"]]
    return schema


@click.command()
@click.argument("what", metavar="NAME", type=click.Choice(NAMES))
@with_exit_codes("schema")
def schema(what: str) -> None:
    """Print the JSON Schema of the spec file, or of the JSON document a command prints.

    NAME is one of:

    \b
    spec             the spec file (YAML), for editors
    facts            discover --json
    topo             topo --json
    plan             plan --json
    saved-plan       plan -o FILE
    diff             diff --json
    verify           verify --json
    apply            apply --json, recover --json
    snapshot         snapshot --json
    sim-serve        sim serve --json
    history          history --json
    history-entry    history show ID --json
    render-manifest  render --out DIR's .gputopo-render.json
    """
    if what == "spec":
        from gputopo.plan.spec import Spec

        data = Spec.model_json_schema()
    else:
        data = schema_of(what)
    click.echo(json.dumps(data, indent=2))
