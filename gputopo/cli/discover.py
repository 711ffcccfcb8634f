"""``gputopo discover`` and ``gputopo snapshot``: read-only views of a host root."""

from __future__ import annotations

import click

from gputopo.cli.complete import complete_addresses
from gputopo.cli.connect import Connection, connection_options
from gputopo.cli.params import PciAddress
from gputopo.exitcodes import with_exit_codes


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
    from gputopo.usecases.discover import DiscoverRequest
    from gputopo.usecases.discover import discover as read_facts

    facts = read_facts(DiscoverRequest(conn, addresses, all_vendors, gpu_match))
    if as_json:
        from gputopo.cli.output import print_json

        print_json(facts)
        return
    from gputopo.cli.factsview import print_facts

    print_facts(facts)


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
    from gputopo.usecases.discover import snapshot as take
    from gputopo.usecases.discover import snapshot_path

    out = snapshot_path(out)
    refuse_existing(Path(out), force)
    doc = take(conn, out)
    if as_json:
        from gputopo.cli.output import print_json

        print_json(doc)
        return
    click.echo(f"wrote {out}: {doc.pci_functions} PCI functions, {doc.files} files, {doc.links} links")
