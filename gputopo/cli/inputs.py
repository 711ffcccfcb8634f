"""The spec and current-state options of ``plan``, ``diff``, ``render`` and ``init``, and the
one read they stand for: the facts, the spec (a file, or quick mode's options) and the current
state, from the host root and Proxmox's files or an API.

Shared by those commands, so none of them imports another command's module. Where the current
state comes from is told in :mod:`gputopo.cli.plancmd`.
"""

from __future__ import annotations

import sys

import click

from gputopo.cli.connect import Connection, connection_options, host_root, node_for, pve_root, source_ports
from gputopo.cli.output import print_refused, warn, warn_unfinished
from gputopo.errors import PlanRefused

SPLITS = click.Choice(["numa", "half", "auto"])
TEMPLATES_HELP = "Directory whose templates override the built-ins by name."

# the current state: Proxmox's files under --pve-root, or an API (--sim, --api-url, --local)
state_options = connection_options(snapshot=True, pve_root=True)

# quick mode: the spec field each option fills, so an error names the option the operator typed
_QUICK_OPTIONS = {
    "nodes[0].name": "--node",
    "nodes[0].containers[0].vmid": "--container",
    "nodes[0].containers[0].mapping": "--container-mapping",
    "nodes[0].containers[0].service.unit": "--service-unit",
    "nodes[0].containers[0].service.tp_flag": "--tp-flag",
    "nodes[0].vms.mappings[0].name": "--vm-mapping",
    "nodes[0].vms.consumers[0].vmid": "--vm",
}


def read_facts(root: str):
    """Discover ``root``: a host root directory or a ``gputopo snapshot`` archive."""
    from gputopo.facts.snapshot import discover_opened

    return discover_opened(root)


def quick_spec(facts, **options):
    """The spec of quick mode (``--split`` and its options). Raises ConfigError naming the
    option whose value the spec refuses, SpecError when the host cannot be split that way."""
    from gputopo.errors import ConfigError, SpecError
    from gputopo.plan.select import pick_node
    from gputopo.plan.starter import spec_from_split

    try:
        spec = spec_from_split(facts, **options)
        pick_node(spec, facts, None)
        return spec
    except SpecError as e:
        option = _QUICK_OPTIONS.get(e.field)
        if option is None:
            raise
        raise ConfigError(f"{option}: {e.expected}") from None


def find_service(ports, vmid: int, options: dict) -> None:
    """Quick mode and ``init`` with a connection: when ``--service-unit`` is not given, the
    unit inside container ``vmid`` whose command runs SGLang or vLLM, with the flag it spells
    (unless ``--tp-flag`` was given), goes into ``options``. A container that cannot be looked
    into is a one-line warning: the service is then not managed. A container that does not exist
    is not looked into: the plan refuses it, ``init`` stops first (:func:`require_container`)."""
    from click.core import ParameterSource

    from gputopo.facts.units import find_inference_unit

    if options.get("service_unit"):
        return
    status = container_status(ports.proxmox, vmid)
    if status is None:
        return
    if status != "running":
        # pct exec is lxc-attach into the container (pve-container src/PVE/CLI/pct.pm, exec),
        # which a stopped container cannot take: say so instead of what lxc-attach prints
        warn(
            f"container {vmid} is {status}: its inference unit cannot be looked for; the service is not managed"
        )
        return
    unit, why = find_inference_unit(ports.exec, vmid)
    if unit is None:
        warn(why)
        return
    options["service_unit"] = unit.unit
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.get_parameter_source("tp_flag") in (ParameterSource.DEFAULT, None):
        options["tp_flag"] = unit.tp_flag
    click.echo(f"container {vmid}: {unit.unit} runs {unit.server} with {unit.tp_flag} {unit.tp}", err=True)


def container_status(proxmox, vmid: int) -> str | None:
    """Container ``vmid``'s status on the API's node (``running``, ``stopped``), None when
    there is no such container there."""
    for guest in proxmox.list_guests("lxc"):
        if str(guest.get("vmid")) == str(vmid):
            return str(guest.get("status") or "unknown")
    return None


def require_container(ports, vmid: int) -> None:
    """Raises InputError (exit 2) when there is no container ``vmid`` on the API's node."""
    from gputopo.errors import InputError

    if container_status(ports.proxmox, vmid) is None:
        have = sorted(
            int(g["vmid"]) for g in ports.proxmox.list_guests("lxc") if str(g.get("vmid")).isdigit()
        )
        node = getattr(ports.proxmox, "node", None)
        where = f" on node {node}" if node else ""
        raise InputError(
            f"container {vmid} does not exist{where} (containers there: "
            f"{', '.join(map(str, have)) or 'none'}); give its vmid with --container"
        )


def _spec(facts, spec_file, split, node, ports=None, **quick):
    from gputopo.errors import ConfigError
    from gputopo.plan.spec import load_spec

    if spec_file and split:
        raise ConfigError("give either --spec FILE or --split, not both")
    if spec_file:
        return load_spec(spec_file)
    if not split:
        raise ConfigError("give --spec FILE, or --split numa --container N --vm-mapping NAME")
    if ports is not None:
        find_service(ports, quick["container"], quick)
    return quick_spec(facts, split=split, node=node, **quick)


def _current(spec, facts, root: str, conn: Connection, ports):
    from gputopo.facts.observe import observe
    from gputopo.plan.reads import spec_reads

    if ports is not None:
        return observe(
            facts,
            spec_reads(spec, conn.node),
            proxmox=ports.proxmox,
            exec=ports.exec,
            files=ports.files,
            cluster=ports.cluster,
        ).current
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.adapters.pvefiles import PveFiles
    from gputopo.facts.snapshot import is_snapshot
    from gputopo.plan.select import pick_node

    # a snapshot holds no /etc: its persistence files count as absent
    files = None if is_snapshot(root) else RealHostFiles(root)
    source = PveFiles(pve_root(conn), pick_node(spec, facts, conn.node).name)
    return observe(facts, spec_reads(spec, conn.node), proxmox=source, files=files).current


def inputs(conn: Connection, quick: dict):
    """(facts, spec, current state) for plan/render/diff, read from the host root and Proxmox's
    files or the API that ``conn`` names; ``quick`` holds the spec options.

    Raises SpecError/ConfigError for bad input, ProxmoxError when the API fails.
    """
    root = host_root(conn)
    warn_unfinished(root)
    facts = read_facts(root)
    # a spec file is read first: the API names its node (or this host's), not the machine gputopo
    # runs on; quick mode looks into the container for its service, so it needs the ports
    spec = _spec(facts, node=conn.node, **quick) if quick.get("spec_file") else None
    ports = source_ports(conn, default_node=node_for(conn, spec, facts.host.hostname))
    try:
        if spec is None:
            spec = _spec(facts, node=conn.node, ports=ports, **quick)
        current = _current(spec, facts, root, conn, ports)
        if quick.get("split") == "auto":
            # the fewest moves: split again knowing what the container and the mapping have now
            # (the same container and mapping, so the same reads)
            spec = _spec(facts, node=conn.node, current=current, **quick)
        return facts, spec, current
    finally:
        if ports is not None:
            ports.close()


def planned(conn: Connection, quick: dict, templates):
    """(facts, spec, plan, current state) for plan/render; a refused plan prints its refusals and exits 2."""
    from gputopo.plan.planner import plan as make_plan

    facts, spec, current = inputs(conn, quick)
    try:
        return facts, spec, make_plan(facts, spec, current, node=conn.node, templates=templates), current
    except PlanRefused as e:
        print_refused(e)
        sys.exit(e.exit_code)


def spec_options(f):
    """The spec file, or quick mode's options; the command gets them as keyword arguments."""
    from gputopo.cli.complete import complete_mappings, complete_vmids

    f = click.option(
        "--container-mapping",
        default=None,
        shell_complete=complete_mappings,
        help="Quick mode: PCI mapping for the container's GPUs.",
    )(f)
    f = click.option(
        "--vm-mapping",
        default="pro6000-vm",
        show_default=True,
        shell_complete=complete_mappings,
        help="Quick mode: the VM mapping.",
    )(f)
    f = click.option(
        "--container",
        type=int,
        default=101,
        show_default=True,
        shell_complete=complete_vmids,
        help="Quick mode: container vmid.",
    )(f)
    f = click.option(
        "--tp-flag",
        default="--tp",
        show_default=True,
        help="Quick mode: the service's tensor-parallel flag (vLLM: --tensor-parallel-size; "
        "with --sim/--api-url/--local: the one the found unit spells).",
    )(f)
    f = click.option(
        "--service-unit",
        default=None,
        help="Quick mode: the inference service's systemd unit in the container (default: with "
        "--sim/--api-url/--local the unit found inside it that runs sglang or vllm, else "
        "not managed).",
    )(f)
    f = click.option(
        "--split",
        type=SPLITS,
        default=None,
        help="Quick mode without a spec file: numa, half, or auto (each side as close together as "
        "the host allows, balanced across NUMA nodes, the fewest GPUs moved).",
    )(f)
    f = click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=None, help="Spec file.")(
        f
    )
    return f
