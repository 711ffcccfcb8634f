"""``gputopo schema NAME``: the JSON Schema of the spec file or of a JSON document a command
prints or writes (every one carries ``schema_version``).

The documents are declared below the CLI, most in :mod:`gputopo.model.documents` (facts, topo,
plan and saved-plan with their own models), and :func:`gputopo.model.documents.schema_of`
makes each schema; :data:`DOCUMENTS` only says which command prints each one. A model is
imported only when its schema is asked for: ``--help`` stays light.
"""

from __future__ import annotations

import json
from typing import Any

import click

from gputopo.exitcodes import with_exit_codes

# name -> (what prints it, the model that declares it: module:class)
DOCUMENTS: dict[str, tuple[str, str]] = {
    "facts": ("discover --json", "gputopo.model.facts:Facts"),
    "topo": ("topo --json", "gputopo.topo.model:TopoReport"),
    "plan": ("plan --json, show PLANFILE --json", "gputopo.plan.model:Plan"),
    "saved-plan": ("plan -o FILE", "gputopo.plan.saved:SavedPlan"),
    "diff": ("diff --json", "gputopo.model.documents:DiffDoc"),
    "verify": ("verify --json", "gputopo.model.documents:VerifyReport"),
    "apply": ("apply --json, recover --json", "gputopo.model.documents:ApplyDoc"),
    "snapshot": ("snapshot --json", "gputopo.model.documents:SnapshotDoc"),
    "sim-serve": ("sim serve --json", "gputopo.model.documents:SimServeDoc"),
    "history": ("history --json", "gputopo.model.documents:HistoryList"),
    "history-entry": ("history show ID --json", "gputopo.model.documents:HistoryEntry"),
    "render-manifest": ("render --out DIR (.gputopo-render.json)", "gputopo.model.documents:RenderManifest"),
    "cluster-diff": ("cluster diff --json", "gputopo.model.documents:ClusterDiffDoc"),
    "cluster-verify": ("cluster verify --json", "gputopo.model.documents:ClusterReport"),
    "cluster-apply": ("cluster apply --json", "gputopo.model.documents:ClusterApplyDoc"),
}


NAMES = ["spec", *DOCUMENTS]


def schema_of(name: str) -> dict[str, Any]:
    """The JSON Schema of document ``name``, ``schema_version`` included. Raises KeyError."""
    import importlib

    from gputopo.model.documents import schema_of as document_schema

    module, attr = DOCUMENTS[name][1].split(":")
    return document_schema(getattr(importlib.import_module(module), attr))


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
    plan             plan --json, show PLANFILE --json
    saved-plan       plan -o FILE
    diff             diff --json
    verify           verify --json
    apply            apply --json, recover --json
    snapshot         snapshot --json
    sim-serve        sim serve --json
    history          history --json
    history-entry    history show ID --json
    render-manifest  render --out DIR's .gputopo-render.json
    cluster-diff     cluster diff --json
    cluster-verify   cluster verify --json
    cluster-apply    cluster apply --json
    """
    if what == "spec":
        from gputopo.usecases.schema import spec_schema

        data = spec_schema()
    else:
        data = schema_of(what)
    click.echo(json.dumps(data, indent=2))
