"""Export: the host as it is now as a spec, checked by planning it (a plan of it should say "No
changes"; what it would still change is listed)."""

from __future__ import annotations

from dataclasses import dataclass

from gputopo.usecases.connect import Connection, host_root, pve_root, source_ports
from gputopo.usecases.readplan import read_facts


@dataclass(frozen=True)
class Exported:
    """The exported spec's YAML text, its notes (said on stderr), and what a plan of it would
    still change (empty: nothing)."""

    text: str
    notes: list[str]
    remaining: list[str]


def export(conn: Connection) -> Exported:
    """Read the host ``conn`` reaches (the containers' units too with a connection) and write
    it as a spec. Raises RootError, ConfigError, ProxmoxError, SpecError."""
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.adapters.pvefiles import PveFiles
    from gputopo.facts.export import read_node
    from gputopo.facts.observe import observe
    from gputopo.facts.snapshot import is_snapshot
    from gputopo.plan.export import checked_export, export_yaml
    from gputopo.plan.reads import spec_reads

    ports = source_ports(conn, default_node=conn.node)
    try:
        root = host_root(conn)
        facts = read_facts(root)
        node = conn.node or (facts.host.hostname or "").split(".")[0] or "pve1"
        if ports is not None:
            source, exec, files = ports.proxmox, ports.exec, ports.files
        else:
            source, exec = PveFiles(pve_root(conn), node), None
            files = None if is_snapshot(root) else RealHostFiles(root)
        now = read_node(facts, source, exec)
        ex, remaining = checked_export(
            facts,
            now.state,
            node,
            now.units,
            lambda spec: (
                observe(facts, spec_reads(spec, node), proxmox=source, exec=exec, files=files).current
            ),
        )
        ex.notes = now.notes + ex.notes
    finally:
        if ports is not None:
            ports.close()
    notes = list(ex.notes)
    if remaining:
        ex.notes.append(f"a plan of this spec would still: {'; '.join(remaining)}")
    return Exported(export_yaml(ex, facts), notes, list(remaining))
