"""``gputopo init | plan | render | diff``: the desired state, its files and the difference.

Where the current state comes from:

* by default, Proxmox's files (``--pve-root``, default ``/etc/pve``; a missing one means nothing
  is configured yet) and the host files under ``--root``. Guests read from files count as
  running, and the inference service inside the container is not read (its drop-in always
  shows as to be written);
* with ``--sim DIR``, ``--api-url URL`` or ``--local``: the Proxmox API (guest status, configs,
  mappings) and ``pct exec`` into the container for the service, exactly as apply reads it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

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
    from gputopo.plan.planner import pick_node
    from gputopo.plan.spec import spec_from_split

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


def _write(path: Path, text: str) -> None:
    """Write an output file the operator named. Raises OutputError (one line, exit 2)."""
    from gputopo.errors import OutputError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise OutputError(str(path), e) from None


def _given(name: str) -> bool:
    """Whether option ``name`` was given on the command line (not its default)."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


def _current(spec, facts, root, pve_root, node, source=None):
    from gputopo.facts.current import read_current
    from gputopo.adapters.hostfiles import RealHostFiles

    if source is not None:
        return read_current(spec, facts, proxmox=source.proxmox, exec=source.exec,
                            files=source.files, node=node)
    from gputopo.facts.snapshot import is_snapshot

    # a snapshot holds no /etc: its persistence files count as absent
    files = None if is_snapshot(root) else RealHostFiles(root)
    return read_current(spec, facts, pve_root=pve_root, files=files, node=node)


class _Source:
    """The live current-state source chosen by --sim / --api-url / --local (None: files)."""

    def __init__(self, root, sim, api_url, local, user, token_name, secret_file, ca_bundle, insecure, node):
        self.ports = None
        self.root = root
        if not (sim or api_url or local):
            return
        from gputopo.cli.connect import Connection, build_ports, host_root
        from gputopo.errors import ConfigError

        # an option the live source would silently ignore is a mistake to point out
        if _given("pve_root"):
            raise ConfigError("--pve-root reads Proxmox's files; --sim, --api-url and --local read the API instead")
        if sim and _given("root"):
            raise ConfigError("--root and --sim exclude each other (a simulated host has its own root)")

        conn = Connection(root=None if sim else (root if root != "/" else None), sim=sim, api_url=api_url,
                          local=local, node=node, user=user, token_name=token_name,
                          secret_file=secret_file, ca_bundle=ca_bundle, insecure=insecure)
        self.root = host_root(conn)
        self.ports = build_ports(conn, default_node=node)

    def close(self):
        if self.ports is not None:
            from gputopo.cli.connect import release_ports

            release_ports(self.ports)


def source_options(f):
    """--sim / --api-url / --local: read the current state live instead of from files."""
    opts = [
        click.option("--sim", default=None, type=click.Path(file_okay=False),
                     help="Read the current state from the simulated host in DIR."),
        click.option("--api-url", default=None, help="Read the current state through the Proxmox API (https)."),
        click.option("--local", is_flag=True, help="Read the current state through pvesh and pct on this node."),
        click.option("--user", default="root@pam", show_default=True, help="Proxmox user."),
        click.option("--token-name", default=None, help="API token id of --user."),
        click.option("--secret-file", default=None, type=click.Path(dir_okay=False),
                     help="Owner-only file holding the password or token secret."),
        click.option("--ca-bundle", default=None, type=click.Path(dir_okay=False), help="CA for the API's TLS."),
        click.option("--insecure", is_flag=True, help="Do not check the API's TLS certificate."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _inputs(spec_file, split, service_unit, tp_flag, container, vm_mapping, container_mapping, root, pve_root,
            node, source):
    """(facts, spec, current state) for plan/render/diff, read from --root and files or the live source.

    Raises SpecError/ConfigError for bad input, ProxmoxError when the live source fails.
    """
    src = _Source(root, node=node, **source)
    try:
        facts = _facts(src.root)
        spec = _spec(facts, spec_file, split, container, vm_mapping, container_mapping, node, service_unit, tp_flag)
        return facts, spec, _current(spec, facts, src.root, pve_root, node, src.ports)
    finally:
        src.close()


def _planned(spec_file, split, service_unit, tp_flag, container, vm_mapping, container_mapping, root, pve_root,
             node, source, templates):
    """(facts, spec, plan, current state) for plan/render; a refused plan prints its refusals and exits 2."""
    from gputopo.plan.planner import plan as make_plan

    facts, spec, current = _inputs(spec_file, split, service_unit, tp_flag, container, vm_mapping,
                                   container_mapping, root, pve_root, node, source)
    try:
        return facts, spec, make_plan(facts, spec, current, node=node, templates=templates), current
    except PlanRefused as e:
        _print_refused(e)
        sys.exit(e.exit_code)


def _print_refused(e: PlanRefused) -> None:
    for r in e.refusals:
        click.echo(f"refused: {r}", err=True)


def spec_options(f):
    f = click.option("--node", default=None, help="Proxmox node name (default: the host's name).")(f)
    f = click.option("--pve-root", default="/etc/pve", show_default=True, type=click.Path(file_okay=False),
                     help="Proxmox's config tree to read the current state from.")(f)
    f = click.option("--root", default="/", show_default=True, type=click.Path(),
                     help="Host root holding sys/ and proc/, or a gputopo snapshot .tar.gz.")(f)
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


@click.command()
@click.option("--root", default="/", show_default=True, type=click.Path(),
              help="Host root holding sys/ and proc/, or a gputopo snapshot .tar.gz.")
@click.option("--split", type=SPLITS, default="numa", show_default=True,
              help="numa: the lowest NUMA node's GPUs stay with the container; half: the lower half by address.")
@click.option("--container", type=int, default=101, show_default=True, help="The container's vmid.")
@click.option("--vm-mapping", default="pro6000-vm", show_default=True, help="PCI mapping for the VM GPUs.")
@click.option("--container-mapping", default=None, help="PCI mapping listing the container's GPUs (optional).")
@click.option("--node", default=None, help="Proxmox node name (default: the host's name; must be this host).")
@click.option("--service-unit", default="sglang.service", show_default=True,
              help="The inference service's systemd unit in the container.")
@click.option("--tp-flag", default="--tp", show_default=True,
              help="The service's tensor-parallel flag (vLLM: --tensor-parallel-size).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout).")
def init(root, split, container, vm_mapping, container_mapping, node, service_unit, tp_flag, output):
    """Write a commented starter spec for this host (exit 2 for an option the spec would refuse,
    or a host that cannot be split that way)."""
    from gputopo.plan.spec import init_spec

    facts = _facts(root)
    options = dict(split=split, container=container, vm_mapping=vm_mapping, container_mapping=container_mapping,
                   node=node, service_unit=service_unit, tp_flag=tp_flag)
    _quick_spec(facts, **options)  # the starter must be a spec plan accepts: check the options first
    text = init_spec(facts, **options)
    if output:
        _write(Path(output), text)
        click.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)


@click.command()
@spec_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None)
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON.")
@click.option("--svg", "svg", type=click.Path(dir_okay=False), default=None,
              help="Also draw the host now and after the plan side by side into this SVG file.")
@source_options
def plan(spec_file, split, service_unit, tp_flag, container, vm_mapping, container_mapping, root, pve_root, node, templates, as_json,
         svg, **source):
    """Show the target state and the ordered actions; "No changes" when converged.

    Exit codes: 0 a plan (or no changes), 2 bad input or a refused plan (one line per reason).
    """
    from gputopo.cli.output import print_json

    facts, _, p, current = _planned(spec_file, split, service_unit, tp_flag, container, vm_mapping,
                                    container_mapping, root, pve_root, node, source, templates)
    if svg:
        from gputopo.cli.topoview import plan_svg

        _write(Path(svg), plan_svg(facts, current, p))
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
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory to write the files to.")
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None,
              help="Directory whose templates override the built-ins by name.")
@source_options
def render(spec_file, split, service_unit, tp_flag, container, vm_mapping, container_mapping, root, pve_root, node, out, templates,
           **source):
    """Write the files the plan stands for under --out (exit 2 for bad input or a refused plan)."""
    from gputopo.plan.render import render as render_files

    facts, spec, p, _ = _planned(spec_file, split, service_unit, tp_flag, container, vm_mapping,
                                 container_mapping, root, pve_root, node, source, templates)
    files = render_files(p, spec, facts, templates)
    for rel, text in sorted(files.items()):
        dest = Path(out) / rel
        _write(dest, text)
        click.echo(str(dest))


@click.command()
@spec_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None)
@click.option("--exit-code", "exit_code", is_flag=True, help="Exit 0: no difference, 2: differences, 1: error.")
@click.option("--json", "as_json", is_flag=True)
@source_options
def diff(spec_file, split, service_unit, tp_flag, container, vm_mapping, container_mapping, root, pve_root, node, templates, exit_code,
         as_json, **source):
    """Show how the host differs from the spec, by area, files as unified diffs.

    Exit codes: 0, or 2 for bad input or a refused plan; with --exit-code 0 no difference,
    2 differences, 1 any error (bad input included).
    """
    from gputopo.cli.output import print_json
    from gputopo.plan.diff import diff as make_diff

    try:
        facts, spec, current = _inputs(spec_file, split, service_unit, tp_flag, container, vm_mapping,
                                       container_mapping, root, pve_root, node, source)
        report = make_diff(facts, spec, current, node=node, templates=templates)
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
                    "areas": {k: v.model_dump() for k, v in report.areas.items()}})
    else:
        sys.stdout.write(report.to_text())
    if exit_code:
        sys.exit(0 if report.is_empty else 2)
