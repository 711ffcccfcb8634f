"""``gputopo schema NAME``: the JSON Schema of the spec file or of a JSON document a command
prints or writes (every one carries ``schema_version``; see :mod:`gputopo.cli.documents`)."""

from __future__ import annotations

import json

import click

from gputopo.exitcodes import with_exit_codes

# gputopo.cli.documents.DOCUMENTS, named here so that --help does not import pydantic's models
NAMES = ["spec", "facts", "topo", "plan", "saved-plan", "diff", "verify", "apply", "snapshot", "sim-serve",
         "history", "history-entry", "render-manifest"]


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
        from gputopo.cli.documents import schema_of

        data = schema_of(what)
    click.echo(json.dumps(data, indent=2))
