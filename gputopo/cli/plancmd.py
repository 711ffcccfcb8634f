"""``gputopo init | plan | render | diff``: the desired state, its files and the difference.

Where the current state comes from:

* by default, Proxmox's files (``--pve-root``, default ``/etc/pve``; a missing one means nothing
  is configured yet) and the host files under ``--root``. Guests read from files count as
  running, and the inference service inside the container is not read (its drop-in always
  shows as to be written);
* with ``--sim DIR``, ``--api-url URL`` or ``--local``: the Proxmox API (guest status, configs,
  mappings) and ``pct exec`` into the container for the service, exactly as apply reads it.

Those options, ``--root`` and ``--node`` are :mod:`gputopo.cli.connect`'s, shared with apply,
recover and verify; ``init`` takes only ``--root``, ``--sim`` and ``--node`` of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gputopo.cli.output import write_output
from gputopo.cli.connect import Connection, connection_options, host_root, pve_root, source_ports
from gputopo.errors import GputopoError, PlanRefused

SPLITS = click.Choice(["numa", "half"])


def _facts(root: str):
    """Discover ``root``: a host root directory or a ``gputopo snapshot`` archive."""
    from gputopo.facts.discover import discover
    from gputopo.facts.snapshot import opened_root

    with opened_root(root) as r:
        facts = discover(r)
    facts.root = root
    return facts


# quick mode: the spec field each option fills, so an error names the option the operator typed
_QUICK_OPTIONS = {
    "nodes[0].name": "--node",
    "nodes[0].containers[0].vmid": "--container",
    "nodes[0].containers[0].mapping": "--container-mapping",
    "nodes[0].containers[0].service.unit": "--service-unit",
    "nodes[0].containers[0].service.tp_flag": "--tp-flag",
    "nodes[0].vms.mappings[0].name": "--vm-mapping",
}


def _quick_spec(facts, **options):
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


def _spec(facts, spec_file, split, container, vm_mapping, container_mapping, node, service_unit=None,
          tp_flag="--tp"):
    from gputopo.errors import ConfigError
    from gputopo.plan.spec import load_spec

    if spec_file and split:
        raise ConfigError("give either --spec FILE or --split, not both")
    if spec_file:
        return load_spec(spec_file)
    if not split:
        raise ConfigError("give --spec FILE, or --split numa --container N --vm-mapping NAME")
    return _quick_spec(
        facts, split=split, container=container, vm_mapping=vm_mapping,
        container_mapping=container_mapping, node=node, service_unit=service_unit, tp_flag=tp_flag,
    )


def _current(spec, facts, root: str, conn: Connection, ports):
    from gputopo.facts.current import read_current

    if ports is not None:
        return read_current(spec, facts, proxmox=ports.proxmox, exec=ports.exec, files=ports.files, node=conn.node)
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.facts.snapshot import is_snapshot

    # a snapshot holds no /etc: its persistence files count as absent
    files = None if is_snapshot(root) else RealHostFiles(root)
    return read_current(spec, facts, pve_root=pve_root(conn), files=files, node=conn.node)


def _inputs(conn: Connection, quick: dict):
    """(facts, spec, current state) for plan/render/diff, read from the host root and Proxmox's
    files or the API that ``conn`` names; ``quick`` holds the spec options.

    Raises SpecError/ConfigError for bad input, ProxmoxError when the API fails.
    """
    ports = source_ports(conn, default_node=conn.node)
    try:
        root = host_root(conn)
        facts = _facts(root)
        spec = _spec(facts, node=conn.node, **quick)
        return facts, spec, _current(spec, facts, root, conn, ports)
    finally:
        if ports is not None:
            ports.close()


def _planned(conn: Connection, quick: dict, templates):
    """(facts, spec, plan, current state) for plan/render; a refused plan prints its refusals and exits 2."""
    from gputopo.plan.planner import plan as make_plan

    facts, spec, current = _inputs(conn, quick)
    try:
        return facts, spec, make_plan(facts, spec, current, node=conn.node, templates=templates), current
    except PlanRefused as e:
        _print_refused(e)
        sys.exit(e.exit_code)


def _print_refused(e: PlanRefused) -> None:
    for r in e.refusals:
        click.echo(f"refused: {r}", err=True)


def spec_options(f):
    """The spec file, or quick mode's options; the command gets them as keyword arguments."""
    f = click.option("--container-mapping", default=None, help="Quick mode: PCI mapping for the container's GPUs.")(f)
    f = click.option("--vm-mapping", default="pro6000-vm", show_default=True, help="Quick mode: the VM mapping.")(f)
    f = click.option("--container", type=int, default=101, show_default=True, help="Quick mode: container vmid.")(f)
    f = click.option("--tp-flag", default="--tp", show_default=True,
                     help="Quick mode: the service's tensor-parallel flag (vLLM: --tensor-parallel-size).")(f)
    f = click.option("--service-unit", default=None,
                     help="Quick mode: the inference service's systemd unit in the container (default: not managed).")(f)
    f = click.option("--split", type=SPLITS, default=None, help="Quick mode without a spec file.")(f)
    f = click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=None, help="Spec file.")(f)
    return f


# the current state: Proxmox's files under --pve-root, or an API (--sim, --api-url, --local)
state_options = connection_options(snapshot=True, pve_root=True)
TEMPLATES_HELP = "Directory whose templates override the built-ins by name."


@click.command()
@connection_options(snapshot=True, api=False)
@click.option("--split", type=SPLITS, default="numa", show_default=True,
              help="numa: the lowest NUMA node's GPUs stay with the container; half: the lower half by address.")
@click.option("--container", type=int, default=101, show_default=True, help="The container's vmid.")
@click.option("--vm-mapping", default="pro6000-vm", show_default=True, help="PCI mapping for the VM GPUs.")
@click.option("--container-mapping", default=None, help="PCI mapping listing the container's GPUs (optional).")
@click.option("--service-unit", default="sglang.service", show_default=True,
              help="The inference service's systemd unit in the container.")
@click.option("--tp-flag", default="--tp", show_default=True,
              help="The service's tensor-parallel flag (vLLM: --tensor-parallel-size).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout).")
def init(conn: Connection, split, container, vm_mapping, container_mapping, service_unit, tp_flag, output):
    """Write a commented starter spec for this host (exit 2 for an option the spec would refuse,
    or a host that cannot be split that way)."""
    from gputopo.plan.starter import init_spec

    facts = _facts(host_root(conn))
    options = dict(split=split, container=container, vm_mapping=vm_mapping, container_mapping=container_mapping,
                   node=conn.node, service_unit=service_unit, tp_flag=tp_flag)
    _quick_spec(facts, **options)  # the starter must be a spec plan accepts: check the options first
    text = init_spec(facts, **options)
    if output:
        write_output(Path(output), text)
        click.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)


@click.command()
@spec_options
@state_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None, help=TEMPLATES_HELP)
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON.")
@click.option("--svg", "svg", type=click.Path(dir_okay=False), default=None,
              help="Also draw the host now and after the plan side by side into this SVG file.")
def plan(conn: Connection, templates, as_json, svg, **quick):
    """Show the target state and the ordered actions; "No changes" when converged.

    Exit codes: 0 a plan (or no changes), 2 bad input or a refused plan (one line per reason).
    """
    from gputopo.cli.output import print_json

    facts, _, p, current = _planned(conn, quick, templates)
    if svg:
        from gputopo.cli.topoview import plan_svg

        write_output(Path(svg), plan_svg(facts, current, p))
    if as_json:
        data = p.model_dump(mode="json")
        # the JSON carries each action's one-line description too, as the text does
        for entry, action in zip(data["actions"], p.actions):
            entry["description"] = action.describe()
        data["no_changes"] = p.is_empty
        print_json(data)
    else:
        sys.stdout.write(p.to_text())


@click.command()
@spec_options
@state_options
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory to write the files to.")
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None, help=TEMPLATES_HELP)
def render(conn: Connection, out, templates, **quick):
    """Write the files the plan stands for under --out (exit 2 for bad input or a refused plan)."""
    from gputopo.plan.render import render as render_files

    facts, spec, p, _ = _planned(conn, quick, templates)
    files = render_files(p, spec, facts, templates)
    for rel, text in sorted(files.items()):
        dest = Path(out) / rel
        write_output(dest, text)
        click.echo(str(dest))


@click.command()
@spec_options
@state_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None, help=TEMPLATES_HELP)
@click.option("--exit-code", "exit_code", is_flag=True, help="Exit 0: no difference, 2: differences, 1: error.")
@click.option("--json", "as_json", is_flag=True, help="The difference as JSON.")
def diff(conn: Connection, templates, exit_code, as_json, **quick):
    """Show how the host differs from the spec, by area, files as unified diffs.

    Exit codes: 0, or 2 for bad input or a refused plan; with --exit-code 0 no difference,
    2 differences, 1 any error (bad input included).
    """
    from gputopo.cli.output import print_json
    from gputopo.plan.diff import diff as make_diff

    try:
        facts, spec, current = _inputs(conn, quick)
        report = make_diff(facts, spec, current, node=conn.node, templates=templates)
    except PlanRefused as e:
        _print_refused(e)
        sys.exit(1 if exit_code else e.exit_code)
    except GputopoError as e:
        # --exit-code keeps 2 for "differences": any error, bad input included, is 1
        if not exit_code:
            raise
        for line in str(e).splitlines() or [type(e).__name__]:
            click.echo(f"gputopo: error: {line}", err=True)
        sys.exit(1)
    if as_json:
        print_json({"node": report.node, "is_empty": report.is_empty,
                    "areas": {k: v.model_dump() for k, v in report.areas.items()},
                    "changes": {k: v.model_dump() for k, v in report.changes.items()}})
    else:
        sys.stdout.write(report.to_text())
    if exit_code:
        sys.exit(0 if report.is_empty else 2)
