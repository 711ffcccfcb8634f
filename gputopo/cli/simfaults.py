"""``gputopo sim break`` and ``gputopo sim heal``: put a fault into a simulated host or cluster
node, and take it out again (the faults: :mod:`gputopo.sim.faults`)."""

from __future__ import annotations

from pathlib import Path

import click

_node_option = click.option(
    "--node", default=None, help="The cluster's node to act on (DIR made with --nodes N)."
)


@click.command("break")
@click.argument("fault", required=False)
@click.argument("dir", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@_node_option
@click.option(
    "--address", default=None, help="gpu-missing: the GPU that falls off (default: the last on nvidia)."
)
@click.option(
    "--seconds", type=click.FloatRange(0), default=None, help="hung-endpoint, slow-shutdown: how long."
)
@click.option(
    "--list", "list_", is_flag=True, help="List the faults, what each breaks and how gputopo sees it."
)
def break_(
    fault: str | None,
    dir: Path | None,
    node: str | None,
    address: str | None,
    seconds: float | None,
    list_: bool,
) -> None:
    """Put FAULT into the simulated host in DIR (or, with --node, into a node of the simulated
    cluster in DIR) until 'gputopo sim heal'. 'gputopo sim break --list' lists the faults."""
    from gputopo.errors import ConfigError
    from gputopo.sim import faults

    if list_:
        width = max(map(len, faults.FAULTS))
        for f in faults.FAULTS.values():
            where = " (a cluster's node)" if f.cluster_only else ""
            click.echo(f"{f.name:<{width}}  {f.what}{where}\n{'':<{width}}  seen: {f.seen}")
        return
    if fault is None or dir is None:
        raise ConfigError("usage: gputopo sim break FAULT [--node NODE] DIR (gputopo sim break --list)")
    opts = {k: v for k, v in (("address", address), ("seconds", seconds)) if v is not None}
    did = faults.put(dir, fault, node, **opts)
    click.echo(f"broke {fault}: {did} (gputopo sim heal {fault}{f' --node {node}' if node else ''} {dir})")


@click.command("heal")
@click.argument("words", nargs=-1, required=True, metavar="[FAULT] DIR")
@_node_option
def heal(words: tuple[str, ...], node: str | None) -> None:
    """Take FAULT (every fault when none is named) out of the simulated host in DIR, or out of
    a simulated cluster's nodes (--node: that one alone)."""
    from gputopo.errors import ConfigError
    from gputopo.sim import faults

    if len(words) > 2:
        raise ConfigError("usage: gputopo sim heal [FAULT] [--node NODE] DIR")
    name, dir = (words[0], Path(words[1])) if len(words) == 2 else (None, Path(words[0]))
    if name is not None:
        faults.fault(name)  # an unknown name is refused before anything is read
    healed = faults.take(dir, name, node)
    click.echo(f"healed: {', '.join(healed)}" if healed else "nothing to heal")
