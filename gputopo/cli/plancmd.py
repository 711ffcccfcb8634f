"""``gputopo init | plan | render | diff``: the desired state, its files and the difference.

Current state comes from Proxmox's files (``--pve-root``, default ``/etc/pve``; a missing one
means nothing is configured yet) and the host files under ``--root``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gputopo.errors import GputopoError, PlanRefused

SPLITS = click.Choice(["numa", "half"])


def _facts(root: str):
    from gputopo.discover import discover

    return discover(root)


def _spec(facts, spec_file, split, container, vm_mapping, container_mapping, node):
    from gputopo.errors import ConfigError
    from gputopo.spec import load_spec, spec_from_split

    if spec_file and split:
        raise ConfigError("give either --spec FILE or --split, not both")
    if spec_file:
        return load_spec(spec_file)
    if not split:
        raise ConfigError("give --spec FILE, or --split numa --container N --vm-mapping NAME")
    return spec_from_split(
        facts, split=split, container=container, vm_mapping=vm_mapping,
        container_mapping=container_mapping, node=node,
    )


def _current(spec, facts, root, pve_root, node):
    from gputopo.current import read_current
    from gputopo.hostfiles import RealHostFiles

    return read_current(spec, facts, pve_root=pve_root, files=RealHostFiles(root), node=node)


def _print_refused(e: PlanRefused) -> None:
    for r in e.refusals:
        click.echo(f"refused: {r}", err=True)


def spec_options(f):
    f = click.option("--node", default=None, help="Proxmox node name (default: the host's name).")(f)
    f = click.option("--pve-root", default="/etc/pve", show_default=True, type=click.Path(file_okay=False),
                     help="Proxmox's config tree to read the current state from.")(f)
    f = click.option("--root", default="/", show_default=True, type=click.Path(file_okay=False),
                     help="Host root holding sys/ and proc/.")(f)
    f = click.option("--container-mapping", default=None, help="Quick mode: PCI mapping for the container's GPUs.")(f)
    f = click.option("--vm-mapping", default="pro6000-vm", show_default=True, help="Quick mode: the VM mapping.")(f)
    f = click.option("--container", type=int, default=101, show_default=True, help="Quick mode: container vmid.")(f)
    f = click.option("--split", type=SPLITS, default=None, help="Quick mode without a spec file.")(f)
    f = click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=None, help="Spec file.")(f)
    return f


@click.command()
@click.option("--root", default="/", show_default=True, type=click.Path(file_okay=False))
@click.option("--split", type=SPLITS, default="numa", show_default=True)
@click.option("--container", type=int, default=101, show_default=True)
@click.option("--vm-mapping", default="pro6000-vm", show_default=True)
@click.option("--container-mapping", default=None)
@click.option("--node", default=None)
@click.option("--service-unit", default="sglang.service", show_default=True)
@click.option("--tp-flag", default="--tp", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout).")
def init(root, split, container, vm_mapping, container_mapping, node, service_unit, tp_flag, output):
    """Write a commented starter spec for this host."""
    from gputopo.spec import init_spec

    text = init_spec(
        _facts(root), split=split, container=container, vm_mapping=vm_mapping,
        container_mapping=container_mapping, node=node, service_unit=service_unit, tp_flag=tp_flag,
    )
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)


@click.command()
@spec_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None)
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON.")
def plan(spec_file, split, container, vm_mapping, container_mapping, root, pve_root, node, templates, as_json):
    """Show the target state and the ordered actions; "No changes" when converged (exit 2 if refused)."""
    from gputopo.cli.output import print_json
    from gputopo.plan import plan as make_plan

    facts = _facts(root)
    spec = _spec(facts, spec_file, split, container, vm_mapping, container_mapping, node)
    current = _current(spec, facts, root, pve_root, node)
    try:
        p = make_plan(facts, spec, current, node=node, templates=templates)
    except PlanRefused as e:
        _print_refused(e)
        sys.exit(e.exit_code)
    if as_json:
        print_json(p)
    else:
        sys.stdout.write(p.to_text())


@click.command()
@spec_options
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory to write the files to.")
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None,
              help="Directory whose templates override the built-ins by name.")
def render(spec_file, split, container, vm_mapping, container_mapping, root, pve_root, node, out, templates):
    """Write the files the plan stands for under --out."""
    from gputopo.plan import plan as make_plan
    from gputopo.render import render as render_files

    facts = _facts(root)
    spec = _spec(facts, spec_file, split, container, vm_mapping, container_mapping, node)
    current = _current(spec, facts, root, pve_root, node)
    try:
        p = make_plan(facts, spec, current, node=node, templates=templates)
    except PlanRefused as e:
        _print_refused(e)
        sys.exit(e.exit_code)
    files = render_files(p, spec, facts, templates)
    for rel, text in sorted(files.items()):
        dest = Path(out) / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        click.echo(str(dest))


@click.command()
@spec_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None)
@click.option("--exit-code", "exit_code", is_flag=True, help="Exit 0: no difference, 2: differences, 1: error.")
@click.option("--json", "as_json", is_flag=True)
def diff(spec_file, split, container, vm_mapping, container_mapping, root, pve_root, node, templates, exit_code, as_json):
    """Show how the host differs from the spec, by area, files as unified diffs."""
    from gputopo.cli.output import print_json
    from gputopo.diff import diff as make_diff

    try:
        facts = _facts(root)
        spec = _spec(facts, spec_file, split, container, vm_mapping, container_mapping, node)
        current = _current(spec, facts, root, pve_root, node)
        report = make_diff(facts, spec, current, node=node, templates=templates)
    except PlanRefused as e:
        _print_refused(e)
        sys.exit(1 if exit_code else e.exit_code)
    except GputopoError as e:
        if not exit_code:
            raise
        click.echo(f"gputopo: error: {e}", err=True)
        sys.exit(1)
    if as_json:
        print_json({"node": report.node, "is_empty": report.is_empty,
                    "areas": {k: v.model_dump() for k, v in report.areas.items()}})
    else:
        sys.stdout.write(report.to_text())
    if exit_code:
        sys.exit(0 if report.is_empty else 2)
