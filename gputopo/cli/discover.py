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
@click.argument("addresses", nargs=-1, type=PciAddress(), metavar="[ADDRESS]...", shell_complete=complete_addresses)
@connection_options(snapshot=True, sim=False, api=False, node=False)
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON (gputopo schema facts).")
@click.option("--all", "all_vendors", is_flag=True, help="Count display-class devices of any vendor as GPUs.")
@click.option("--gpu-match", "gpu_match", multiple=True, metavar="VENDOR[:CLASSPREFIX]",
              help="Which devices count as GPUs, e.g. 0x10de:0x03 (repeatable; replaces the default).")
@with_exit_codes("discover")
def discover(addresses: tuple[str, ...], conn: Connection, as_json: bool, all_vendors: bool,
             gpu_match: tuple[str, ...]) -> None:
    """Show the GPUs of a host: NUMA node, IOMMU group, driver, minor, link; only the GPUs at
    ADDRESS... when given (an address that is no GPU here is refused)."""
    from gputopo.facts.discover import discover as run
    from gputopo.facts.snapshot import opened_root

    rules = _parse_matches(gpu_match)
    root = host_root(conn)
    with opened_root(root) as r:
        facts = run(r, all_vendors=all_vendors, gpu_match=rules)
    facts.root = root
    if addresses:
        facts.gpus = _only(facts, addresses)
    if as_json:
        from gputopo.cli.output import print_json

        print_json(facts)
        return
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


def print_facts(facts) -> None:
    """The host summary and the GPU table (rich)."""
    from rich.table import Table

    from gputopo.cli.output import console

    out = console()
    if not out.is_terminal:
        # Piped output has no width to fit; keep each GPU on one line for grep and logs.
        out.width = 200
    h = facts.host
    mods = [m for m, on in h.modules.model_dump().items() if on]
    nodes = ", ".join(f"{n.id}:{n.cpulist or 'no CPUs'}" for n in h.numa_nodes) or "none"
    out.print(f"[bold]{h.hostname or '?'}[/]  kernel {h.kernel or '?'}  "
              f"nvidia {h.nvidia_driver_version or 'not loaded'}  SEV-SNP {_yn(h.sev_snp)}")
    out.print(f"IOMMU: {_iommu_text(h)}  NUMA nodes: {nodes}")
    out.print(f"modules: {' '.join(mods) or 'none of interest'}"
              + (f"  vfio groups: {', '.join(map(str, h.vfio_groups))}" if h.vfio_groups else ""))
    t = Table(show_lines=False, header_style="bold")
    for col in ("address", "model", "NUMA", "IOMMU group", "driver", "minor", "boot VGA", "link"):
        t.add_column(col, no_wrap=col not in ("model", "IOMMU group"), min_width=len(col))
    for g in facts.gpus:
        comp = ", ".join(f"{m.address.split(':', 1)[1]} {m.role.value}" for m in g.iommu_members)
        group = "-" if g.iommu_group is None else str(g.iommu_group) + (f" (+{comp})" if comp else "")
        if g.foreign_members:
            group = f"[red]{group}[/]"
        numa = "?" if g.numa_node is None else str(g.numa_node) + ("*" if g.numa_source == "cpulist" else "")
        link = ""
        if g.link.current_speed:
            link = f"{g.link.current_speed.replace(' PCIe', '').replace('.0 ', '')} x{g.link.current_width or '?'}"
        t.add_row(g.address, _short_model(g.model) or f"{g.vendor}:{g.device}", numa, group,
                  g.driver or "-", "-" if g.minor is None else str(g.minor),
                  "yes" if g.boot_vga else "no" if g.boot_vga is False else "?", link)
    out.print(t)
    if facts.nvswitches:
        out.print(f"NVSwitches (not GPUs): {', '.join(s.address for s in facts.nvswitches)}")
    if any(g.numa_source == "cpulist" for g in facts.gpus):
        out.print("* NUMA node derived from local_cpulist (numa_node is -1)")
    for w in facts.warnings:
        out.print(f"[yellow]warning:[/] {w}")


def _short_model(model: str | None) -> str | None:
    """'GB202GL [RTX PRO 6000 Blackwell Server Edition]' -> the marketing name in brackets."""
    if model and model.endswith("]") and "[" in model:
        return model[model.index("[") + 1 : -1]
    return model


def _iommu_text(h) -> str:
    """'translated (39 groups)', or 'off (no groups)': without groups nothing can be passed through,
    whatever the command line asks for."""
    if not h.iommu_enabled:
        asked = f"; the command line asks for {h.iommu_mode}" if h.iommu_mode not in (None, "off") else ""
        return f"off (no groups{asked})"
    return f"{h.iommu_mode or 'unknown'} ({h.iommu_group_count} groups)"


def _yn(v: bool | None) -> str:
    return "unknown" if v is None else "on" if v else "off"


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

        print_json({"path": out, "pci_functions": counts["pci_functions"], "files": counts["files"],
                    "links": counts["links"]})
        return
    click.echo(f"wrote {out}: {counts['pci_functions']} PCI functions, "
               f"{counts['files']} files, {counts['links']} links")
