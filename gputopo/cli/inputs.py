"""The spec and current-state options of ``plan``, ``diff``, ``render`` and ``init``, and the
one read they stand for (:mod:`gputopo.usecases.readplan`): the facts, the spec (a file, or
quick mode's options) and the current state, from the host root and Proxmox's files or an API.

Shared by those commands, so none of them imports another command's module. Where the current
state comes from is told in :mod:`gputopo.cli.plancmd`.
"""

from __future__ import annotations

import click

from gputopo.cli.connect import connection_options
from gputopo.usecases.specsource import SpecSource

SPLITS = click.Choice(["numa", "half", "auto"])
TEMPLATES_HELP = "Directory whose templates override the built-ins by name."

# the current state: Proxmox's files under --pve-root, or an API (--sim, --api-url, --local)
state_options = connection_options(snapshot=True, pve_root=True)


def source_of(quick: dict) -> SpecSource:
    """The spec source quick mode's options (or ``--spec``) stand for; ``--tp-flag`` counts as
    given when the command line (or the environment) set it."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    given = ctx is not None and ctx.get_parameter_source("tp_flag") not in (ParameterSource.DEFAULT, None)
    return SpecSource(**quick, tp_flag_given=given)


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
