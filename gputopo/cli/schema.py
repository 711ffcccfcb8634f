"""``gputopo schema facts|spec``: print the JSON Schema of discovery's output or the spec."""

from __future__ import annotations

import json

import click


@click.command()
@click.argument("what", type=click.Choice(["facts", "spec"]))
def schema(what: str) -> None:
    """Print the JSON Schema of the facts (discover --json) or of the spec file."""
    from gputopo.errors import GputopoError

    if what == "facts":
        from gputopo.model.facts import Facts

        data = Facts.model_json_schema(by_alias=True)
    else:
        try:
            from gputopo.plan.spec import Spec
        except ImportError as e:
            raise GputopoError(f"spec schema unavailable: gputopo.plan.spec cannot be imported ({e})") from e
        data = Spec.model_json_schema()
    click.echo(json.dumps(data, indent=2))
