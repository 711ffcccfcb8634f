"""``gputopo plan | diff``: the desired state and the difference (``render`` is in
:mod:`gputopo.cli.rendercmd`, ``init`` and ``export`` in :mod:`gputopo.cli.initcmd`).

Where the current state comes from:

* by default, Proxmox's files (``--pve-root``, default ``/etc/pve``; a missing one means nothing
  is configured yet) and the host files under ``--root``. Guests read from files count as
  running, and the inference service inside the container is not read (its drop-in always
  shows as to be written);
* with ``--sim DIR``, ``--api-url URL`` or ``--local``: the Proxmox API (guest status, configs,
  mappings) and ``pct exec`` into the container for the service, exactly as apply reads it.
  Quick mode (``--split``) then also finds the container's inference unit inside it, as
  ``init`` does.

``plan -o FILE`` saves the plan with the state it was made from for ``gputopo apply FILE``; it
reads the state as apply will (``--local`` when no source is named).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from gputopo.cli.connect import Connection, connection_options, host_root, node_for, pve_root, source_ports
from gputopo.cli.output import warn, warn_unfinished, write_output
from gputopo.errors import GputopoError, PlanRefused
from gputopo.exitcodes import with_exit_codes

SPLITS = click.Choice(["numa", "half"])


def read_facts(root: str):
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
    "nodes[0].vms.consumers[0].vmid": "--vm",
}


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


def find_service(exec, vmid: int, options: dict) -> None:
    """Quick mode and ``init`` with a connection: when ``--service-unit`` is not given, the
    unit inside container ``vmid`` whose command runs SGLang or vLLM, with the flag it spells
    (unless ``--tp-flag`` was given), goes into ``options``. A container that cannot be looked
    into is a warning: the service is then not managed."""
    from click.core import ParameterSource

    from gputopo.errors import ExecError
    from gputopo.facts.units import read_inference_units

    if options.get("service_unit"):
        return
    try:
        units = read_inference_units(exec, vmid)
    except ExecError as e:
        warn(f"container {vmid}: cannot look for its inference unit ({e}); the service is not managed")
        return
    if not units:
        warn(f"container {vmid}: no unit runs sglang or vllm; the service is not managed")
        return
    options["service_unit"] = units[0].unit
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.get_parameter_source("tp_flag") in (ParameterSource.DEFAULT, None):
        options["tp_flag"] = units[0].tp_flag
    click.echo(f"container {vmid}: {units[0].unit} runs {units[0].server} with {units[0].tp_flag} {units[0].tp}",
               err=True)


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
        find_service(ports.exec, quick["container"], quick)
    return quick_spec(facts, split=split, node=node, **quick)


def _current(spec, facts, root: str, conn: Connection, ports):
    from gputopo.facts.observe import observe
    from gputopo.plan.reads import spec_reads

    if ports is not None:
        return observe(facts, spec_reads(spec, conn.node), proxmox=ports.proxmox, exec=ports.exec,
                       files=ports.files).current
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.adapters.pvefiles import PveFiles
    from gputopo.facts.snapshot import is_snapshot
    from gputopo.plan.select import pick_node

    # a snapshot holds no /etc: its persistence files count as absent
    files = None if is_snapshot(root) else RealHostFiles(root)
    source = PveFiles(pve_root(conn), pick_node(spec, facts, conn.node).name)
    return observe(facts, spec_reads(spec, conn.node), proxmox=source, files=files).current


def _inputs(conn: Connection, quick: dict):
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
        return facts, spec, _current(spec, facts, root, conn, ports)
    finally:
        if ports is not None:
            ports.close()


def planned(conn: Connection, quick: dict, templates):
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
    from gputopo.cli.complete import complete_mappings, complete_vmids

    f = click.option("--container-mapping", default=None, shell_complete=complete_mappings,
                     help="Quick mode: PCI mapping for the container's GPUs.")(f)
    f = click.option("--vm-mapping", default="pro6000-vm", show_default=True, shell_complete=complete_mappings,
                     help="Quick mode: the VM mapping.")(f)
    f = click.option("--container", type=int, default=101, show_default=True, shell_complete=complete_vmids,
                     help="Quick mode: container vmid.")(f)
    f = click.option("--tp-flag", default="--tp", show_default=True,
                     help="Quick mode: the service's tensor-parallel flag (vLLM: --tensor-parallel-size; "
                          "with --sim/--api-url/--local: the one the found unit spells).")(f)
    f = click.option("--service-unit", default=None,
                     help="Quick mode: the inference service's systemd unit in the container (default: with "
                          "--sim/--api-url/--local the unit found inside it that runs sglang or vllm, else "
                          "not managed).")(f)
    f = click.option("--split", type=SPLITS, default=None, help="Quick mode without a spec file.")(f)
    f = click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=None, help="Spec file.")(f)
    return f


# the current state: Proxmox's files under --pve-root, or an API (--sim, --api-url, --local)
state_options = connection_options(snapshot=True, pve_root=True)
TEMPLATES_HELP = "Directory whose templates override the built-ins by name."


def _saving_conn(conn: Connection) -> Connection:
    """The connection ``plan -o`` reads through: the one apply will use (``--local`` by default).
    Raises ConfigError for a source apply cannot use (Proxmox's files, a snapshot)."""
    from gputopo.errors import ConfigError
    from gputopo.facts.snapshot import is_snapshot

    if conn.pve_root is not None:
        raise ConfigError("-o: a saved plan is made from what apply reads (--sim, --api-url or --local), "
                          "not from --pve-root")
    if conn.root is not None and is_snapshot(conn.root):
        raise ConfigError(f"-o: {conn.root} is a snapshot; a saved plan is made on the host it will be applied to")
    return conn if conn.live else dataclasses.replace(conn, local=True)


def _summary(spec, p, root: str):
    from gputopo.apply.history import last_measured
    from gputopo.cli.applycmd import step_timeouts
    from gputopo.plan.summary import Measured, summarize

    return summarize(p, step_timeouts(spec, ()), Measured.of(last_measured(root)))


def _save(path: str, force: bool, conn: Connection, quick: dict, spec, facts, p, current) -> None:
    import hashlib

    from gputopo import __version__
    from gputopo.plan.saved import save_plan

    spec_file = quick.get("spec_file")
    sha = (hashlib.sha256(Path(spec_file).read_bytes()).hexdigest() if spec_file
           else hashlib.sha256(spec.model_dump_json().encode()).hexdigest())
    source = f"sim {conn.sim}" if conn.sim else f"api {conn.api_url}" if conn.api_url else "local"
    saved = save_plan(p, spec, facts, current, version=__version__, spec_file=spec_file, spec_sha256=sha,
                      node=conn.node, source=source)
    write_output(Path(path), saved.model_dump_json(indent=2) + "\n", force=force)
    click.echo(f"wrote {path}: apply it with 'gputopo apply {path}'", err=True)


@click.command()
@spec_options
@state_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None, help=TEMPLATES_HELP)
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON (gputopo schema plan).")
@click.option("--svg", "svg", type=click.Path(dir_okay=False), default=None,
              help="Also draw the host now and after the plan side by side into this SVG file.")
@click.option("-o", "--out", "save_to", type=click.Path(dir_okay=False), default=None,
              help="Save the plan and the state it was made from for 'gputopo apply FILE' (gputopo schema "
                   "saved-plan); the state is read as apply reads it (--local unless --sim or --api-url).")
@click.option("--force", is_flag=True, help="With -o: replace an existing file.")
@with_exit_codes("plan")
def plan(conn: Connection, templates, as_json, svg, save_to, force, **quick):
    """Show the target state and the ordered actions ("No changes" when converged), then one
    line: how many rebinds, mapping changes and guest restarts, and the expected stop window.
    """
    from gputopo.cli.output import print_json, refuse_existing

    if save_to:
        refuse_existing(Path(save_to), force)  # before anything is read: an answer in seconds
        conn = _saving_conn(conn)
    facts, spec, p, current = planned(conn, quick, templates)
    summary = None if p.is_empty else _summary(spec, p, host_root(conn))
    if svg:
        from gputopo.cli.topoview import plan_svg

        write_output(Path(svg), plan_svg(facts, current, p))
    if save_to:
        _save(save_to, force, conn, quick, spec, facts, p, current)
    if as_json:
        data = p.model_dump(mode="json")
        # the JSON carries each action's one-line description too, as the text does
        for entry, action in zip(data["actions"], p.actions):
            entry["description"] = action.describe()
        data["no_changes"] = p.is_empty
        data["signature"] = p.signature()  # what apply --expect-plan takes
        if summary is not None:
            data["summary"] = summary.to_data()
        print_json(data)
    else:
        sys.stdout.write(p.to_text())
        if summary is not None:
            sys.stdout.write(f"Summary: {summary.to_text()}\n")


@click.command()
@spec_options
@state_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None, help=TEMPLATES_HELP)
@click.option("--exit-code", "exit_code", is_flag=True, help="Exit 0: no difference, 2: differences, 1: error.")
@click.option("--json", "as_json", is_flag=True, help="The difference as JSON (gputopo schema diff).")
@with_exit_codes("diff")
def diff(conn: Connection, templates, exit_code, as_json, **quick):
    """Show how the host differs from the spec, by area, files as unified diffs."""
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
                    "areas": {name.replace(" ", "_"): {"title": name, **area.model_dump()}
                              for name, area in report.areas.items()},
                    "changes": {k: v.model_dump() for k, v in report.changes.items()}})
    else:
        sys.stdout.write(report.to_text())
    if exit_code:
        sys.exit(0 if report.is_empty else 2)
