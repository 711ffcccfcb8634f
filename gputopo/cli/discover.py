"""``gputopo discover`` and ``gputopo snapshot``: read-only views of a host root."""

from __future__ import annotations

import click

from gputopo.cli.complete import complete_addresses
from gputopo.cli.connect import Connection, connection_options, host_root
from gputopo.cli.params import PciAddress
from gputopo.exitcodes import with_exit_codes


def _parse_matches(values: tuple[str, ...]) -> list[tuple[str | None, str | None]] | None:
    if not values:
        return None
    from gputopo.facts.discover import parse_gpu_match

    return [parse_gpu_match(v) for v in values]


@click.command()
@click.argument(
    "addresses", nargs=-1, type=PciAddress(), metavar="[ADDRESS]...", shell_complete=complete_addresses
)
@connection_options(snapshot=True, sim=False, api=False, node=False)
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON (gputopo schema facts).")
@click.option("--all", "all_vendors", is_flag=True, help="Count display-class devices of any vendor as GPUs.")
@click.option(
    "--gpu-match",
    "gpu_match",
    multiple=True,
    metavar="VENDOR[:CLASSPREFIX]",
    help="Which devices count as GPUs, e.g. 0x10de:0x03 (repeatable; replaces the default).",
)
@with_exit_codes("discover")
def discover(
    addresses: tuple[str, ...], conn: Connection, as_json: bool, all_vendors: bool, gpu_match: tuple[str, ...]
) -> None:
    """Show the GPUs of a host: NUMA node, IOMMU group, driver, minor, link; only the GPUs at
    ADDRESS... when given (an address that is no GPU here is refused)."""
    from gputopo.facts.snapshot import discover_opened

    facts = discover_opened(host_root(conn), all_vendors=all_vendors, gpu_match=_parse_matches(gpu_match))
    if addresses:
        facts.gpus = _only(facts, addresses)
    if as_json:
        from gputopo.cli.output import print_json

        print_json(facts)
        return
    from gputopo.cli.factsview import print_facts

    print_facts(facts)


def _only(facts, addresses: tuple[str, ...]) -> list:
    """The GPUs of ``facts`` at ``addresses``. Raises ConfigError naming one that is no GPU here."""
    from gputopo.errors import ConfigError

    wanted = list(addresses)
    have = {g.address for g in facts.gpus}
    for a in wanted:
        if a not in have:
            raise ConfigError(f"{a}: not a GPU of this host (have {', '.join(sorted(have)) or 'none'})")
    return [g for g in facts.gpus if g.address in wanted]


def snapshot_path(name: str) -> str:
    """``name`` as the archive's file name: ``NAME`` without ``.tar.gz`` or ``.tgz`` gets ``.tar.gz``."""
    return name if name.endswith((".tar.gz", ".tgz")) else name + ".tar.gz"


@click.command()
@click.argument("out", metavar="NAME", type=click.Path(dir_okay=False))
@connection_options(sim=False, api=False, node=False)
@click.option("--force", is_flag=True, help="Replace an existing archive.")
@click.option("--json", "as_json", is_flag=True, help="What was written, as JSON (gputopo schema snapshot).")
@with_exit_codes("snapshot")
def snapshot(out: str, conn: Connection, force: bool, as_json: bool) -> None:
    """Capture what discovery reads from a host into NAME.tar.gz (NAME without .tar.gz or .tgz
    gets .tar.gz); read-only, no secrets; an existing file is refused without --force."""
    from pathlib import Path

    from gputopo.cli.output import refuse_existing
    from gputopo.facts.snapshot import snapshot as run

    out = snapshot_path(out)
    refuse_existing(Path(out), force)
    counts = run(host_root(conn), out)
    if as_json:
        from gputopo.cli.output import print_json
        from gputopo.model.documents import SnapshotDoc

        print_json(
            SnapshotDoc(
                path=out, pci_functions=counts["pci_functions"], files=counts["files"], links=counts["links"]
            )
        )
        return
    click.echo(
        f"wrote {out}: {counts['pci_functions']} PCI functions, "
        f"{counts['files']} files, {counts['links']} links"
    )
