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

from gputopo.cli.connect import Connection, connection_options
from gputopo.cli.inputs import SPLITS
from gputopo.cli.output import refuse_existing, warn, write_output
from gputopo.exitcodes import with_exit_codes
from gputopo.usecases.specsource import SpecSource


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
    from click.core import ParameterSource

    from gputopo.usecases.init import InitRequest
    from gputopo.usecases.init import init as starter

    if output:
        refuse_existing(Path(output), force)
    ctx = click.get_current_context()
    source = SpecSource(
        split=split,
        container=container,
        vm_mapping=vm_mapping,
        container_mapping=container_mapping,
        service_unit=service_unit,
        tp_flag=tp_flag,
        tp_flag_given=ctx.get_parameter_source("tp_flag") not in (ParameterSource.DEFAULT, None),
        vm=vm,
    )
    given = ctx.get_parameter_source("container") == ParameterSource.COMMANDLINE
    _emit(starter(InitRequest(conn, source, given)), output, force)


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
    from gputopo.usecases.export import export as read_export

    if output:
        refuse_existing(Path(output), force)
    ex = read_export(conn)
    for note in ex.notes:
        warn(note)
    if ex.remaining:
        warn(f"a plan of this spec is not empty: {'; '.join(ex.remaining)}")
    _emit(ex.text, output, force)
