"""``gputopo init`` (a starter spec for a change) and ``gputopo export`` (the host as it is).

Both look inside the container when a connection is given (``--sim``, ``--api-url``,
``--local``): the unit whose command runs SGLang or vLLM, and the tensor-parallel flag it
spells. ``init`` and quick mode (``plan --split``) write the same spec for the same options.
Neither overwrites a file without ``--force``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gputopo.cli.connect import Connection, connection_options, host_root, pve_root, source_ports
from gputopo.cli.inputs import SPLITS, find_service, quick_spec, read_facts, require_container
from gputopo.cli.output import refuse_existing, warn, write_output
from gputopo.exitcodes import with_exit_codes


def _emit(text: str, output: str | None, force: bool) -> None:
    if output:
        write_output(Path(output), text, force=force)
        click.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)


@click.command()
@connection_options(snapshot=True)
@click.option(
    "--split",
    type=SPLITS,
    default="numa",
    show_default=True,
    help="numa: the lowest NUMA node's GPUs stay with the container; half: the lower half by address; "
    "auto: each side as close together on the PCIe tree as the host allows, then balanced across NUMA nodes.",
)
@click.option("--container", type=int, default=101, show_default=True, help="The container's vmid.")
@click.option("--vm-mapping", default="pro6000-vm", show_default=True, help="PCI mapping for the VM GPUs.")
@click.option(
    "--container-mapping", default=None, help="PCI mapping listing the container's GPUs (optional)."
)
@click.option(
    "--service-unit",
    default=None,
    help="The inference service's systemd unit in the container (default: with --sim, --api-url or "
    "--local the unit found inside it that runs sglang or vllm; else the service block is "
    "written commented out).",
)
@click.option(
    "--tp-flag",
    default="--tp",
    show_default=True,
    help="The service's tensor-parallel flag (vLLM: --tensor-parallel-size; default with a "
    "connection: the one the found unit spells).",
)
@click.option(
    "--vm",
    type=int,
    default=None,
    help="A VM that takes the VM mapping's GPUs (its hostpciN lines, NUMA pinning, MMIO window).",
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout)."
)
@click.option("--force", is_flag=True, help="Replace an existing --output file.")
@with_exit_codes("init")
def init(
    conn: Connection,
    split,
    container,
    vm_mapping,
    container_mapping,
    service_unit,
    tp_flag,
    vm,
    output,
    force,
):
    """Write a commented starter spec for this host: the split asked for, the service found
    inside the container (exit 2 for an option the spec would refuse, or a host that cannot be
    split that way). With --sim on a simulated cluster (sim create --nodes N DIR): one entry per
    node, each with that node's container and service, for 'gputopo cluster plan'; --node
    writes that node's entry alone."""
    options = dict(
        container=container,
        vm_mapping=vm_mapping,
        container_mapping=container_mapping,
        service_unit=service_unit,
        tp_flag=tp_flag,
        vm=vm,
    )
    if output:
        refuse_existing(Path(output), force)
    if conn.sim is not None and _is_cluster(conn.sim):
        _emit(_cluster_spec(conn, split, options), output, force)
        return
    _emit(_node_spec(conn, split, options), output, force)


def _node_spec(conn: Connection, split: str, options: dict) -> str:
    """The starter spec of the one host ``conn`` reaches."""
    from gputopo.plan.starter import init_spec

    container = options["container"]
    ports = source_ports(conn, default_node=conn.node)
    options = dict(options)
    try:
        facts = read_facts(host_root(conn))
        if ports is not None:
            require_container(ports, container)
            find_service(ports, container, options)
    finally:
        if ports is not None:
            ports.close()
    options.update(split=split, node=conn.node)
    quick_spec(facts, **options)  # the starter must be a spec plan accepts: check the options first
    return init_spec(facts, **options)


def _is_cluster(sim: str) -> bool:
    from gputopo.sim.cluster import SimCluster

    return SimCluster.is_cluster(sim)


def _cluster_spec(conn: Connection, split: str, options: dict) -> str:
    """One spec for the simulated cluster in ``conn.sim``: each node's starter entry (its own
    container unless --container is given, the service found in it), the policy and verify
    blocks once. Raises ConfigError for --vm without --node (a VM belongs to one node), and
    what a node's starter raises."""
    from dataclasses import replace

    from click.core import ParameterSource

    from gputopo.errors import ConfigError
    from gputopo.sim.cluster import SimCluster

    cluster = SimCluster(conn.sim)
    nodes = [conn.node] if conn.node else cluster.nodes
    for n in nodes:
        cluster.node_dir(n)  # an unknown --node: SimHostError naming the members
    if options["vm"] is not None and conn.node is None:
        raise ConfigError("--vm names one node's VM: give --node with it on a simulated cluster")
    given = click.get_current_context().get_parameter_source("container") == ParameterSource.COMMANDLINE
    texts = []
    for n in nodes:
        node_conn = replace(conn, sim=str(cluster.node_dir(n)), node=n)
        ct = options["container"] if given else cluster.container(n)
        texts.append(_node_spec(node_conn, split, {**options, "container": ct}))
    head, tail = _split_nodes(texts[0])
    entries = [_split_nodes(t)[1][0] for t in texts]
    intro = [
        f"# A simulated cluster of {len(cluster.nodes)} nodes ({', '.join(cluster.nodes)}): one entry per node",
        "# below. Check it with `gputopo cluster plan --sim DIR --spec FILE` (add --ssh-config).",
    ]
    return "\n".join(intro + head + [line for e in entries for line in e] + tail[1]) + "\n"


def _split_nodes(text: str) -> tuple[list[str], tuple[list[str], list[str]]]:
    """A starter spec's lines: (up to its first node entry), (that node's entry, from policy on)."""
    lines = text.rstrip("\n").split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("  - name: "))
    # the comment above the entry stays with the head
    policy = lines.index("policy:")
    return lines[:first], (lines[first:policy], lines[policy:])


@click.command()
@connection_options(snapshot=True, pve_root=True)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout)."
)
@click.option("--force", is_flag=True, help="Replace an existing --output file.")
@with_exit_codes("export")
def export(conn: Connection, output, force):
    """Write the host as it is now as a spec: 'gputopo plan --spec FILE' of it says "No changes".

    Containers keep the GPUs their devN entries grant, VM mappings the vfio-pci GPUs they list;
    with --sim, --api-url or --local the unit inside each container that runs sglang or vllm is
    named with its tensor-parallel flag and size. What a plan of the spec would still change
    (boot persistence files not written yet, say) is listed on stderr and in the file.
    """
    from gputopo.adapters.pvefiles import PveFiles
    from gputopo.facts.export import read_node
    from gputopo.facts.observe import observe
    from gputopo.facts.snapshot import is_snapshot
    from gputopo.plan.export import checked_export, export_yaml
    from gputopo.plan.reads import spec_reads

    if output:
        refuse_existing(Path(output), force)
    ports = source_ports(conn, default_node=conn.node)
    try:
        root = host_root(conn)
        facts = read_facts(root)
        node = conn.node or (facts.host.hostname or "").split(".")[0] or "pve1"
        if ports is not None:
            source, exec, files = ports.proxmox, ports.exec, ports.files
        else:
            from gputopo.adapters.hostfiles import RealHostFiles

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
    for note in ex.notes:
        warn(note)
    if remaining:
        ex.notes.append(f"a plan of this spec would still: {'; '.join(remaining)}")
        warn(f"a plan of this spec is not empty: {'; '.join(remaining)}")
    _emit(export_yaml(ex, facts), output, force)
