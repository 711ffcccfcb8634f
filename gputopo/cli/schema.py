"""``gputopo schema facts|spec|topo``: print the JSON Schema of discovery's output, the spec or
``topo --json``."""

from __future__ import annotations

import json

import click


@click.command()
@click.argument("what", type=click.Choice(["facts", "spec", "topo"]))
def schema(what: str) -> None:
    """Print the JSON Schema of the facts (discover --json), the spec file or topo --json."""
    from gputopo.errors import GputopoError

    if what == "facts":
        from gputopo.model.facts import Facts

        data = Facts.model_json_schema(by_alias=True)
    elif what == "topo":
        from gputopo.topo.model import TopoReport

        data = TopoReport.model_json_schema(by_alias=True)
    else:
        try:
            from gputopo.plan.spec import Spec
        except ImportError as e:
            raise GputopoError(f"spec schema unavailable: gputopo.plan.spec cannot be imported ({e})") from e
        data = Spec.model_json_schema()
    click.echo(json.dumps(data, indent=2))
