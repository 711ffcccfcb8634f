"""The host summary and GPU table that ``gputopo discover`` prints (and ``gputopo demo`` shows)."""

from __future__ import annotations


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
    out.print(
        f"[bold]{h.hostname or '?'}[/]  kernel {h.kernel or '?'}  "
        f"nvidia {h.nvidia_driver_version or 'not loaded'}  SEV-SNP {_yn(h.sev_snp)}"
    )
    out.print(f"IOMMU: {_iommu_text(h)}  NUMA nodes: {nodes}")
    out.print(
        f"modules: {' '.join(mods) or 'none of interest'}"
        + (f"  vfio groups: {', '.join(map(str, h.vfio_groups))}" if h.vfio_groups else "")
    )
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
        t.add_row(
            g.address,
            _short_model(g.model) or f"{g.vendor}:{g.device}",
            numa,
            group,
            g.driver or "-",
            "-" if g.minor is None else str(g.minor),
            "yes" if g.boot_vga else "no" if g.boot_vga is False else "?",
            link,
        )
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
