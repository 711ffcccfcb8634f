"""``gputopo demo``: the operator's story on a simulated seed host, end to end.

Creates a simulated Proxmox host (8x RTX PRO 6000 on two NUMA nodes, container 101 serving
SGLang with ``--tp 8`` on all eight), then discovers it, writes the NUMA-split spec, plans and
applies it with progress and verifies the result: four GPUs stay with the container
(``--tp 4``), four go to vfio-pci behind the mapping ``pro6000-vm``.
"""

from __future__ import annotations

import sys

import click

from gputopo.cli.params import Finite
from gputopo.exitcodes import with_exit_codes


@click.command()
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Create the simulated host here and keep it (default: a temporary directory, removed).",
)
@click.option(
    "--from",
    "source",
    default="seed",
    show_default=True,
    help="Fixture name, host yaml or snapshot .tar.gz the simulated host starts from.",
)
@click.option(
    "--pace",
    type=Finite(allow_zero=True),
    default=0.05,
    show_default=True,
    help="Latency scale: 1 = a real server's pace (unbind 1-3 s per GPU, service start 20 s ...).",
)
@with_exit_codes("demo")
def demo(workdir: str | None, source: str, pace: float) -> None:
    """Split the simulated seed host's GPUs by NUMA node: discover, plan, apply, verify."""
    from gputopo.usecases.connect import require_sim_extra

    require_sim_extra("demo")
    from rich.rule import Rule

    from gputopo.cli.factsview import print_facts
    from gputopo.cli.output import console, print_report
    from gputopo.cli.progress import display
    from gputopo.errors import VerifyFailed
    from gputopo.usecases.demo import DemoShow, Timeouts, demo_host, run_demo

    out = console()
    out.print(Rule("gputopo demo: a simulated Proxmox host"))
    with demo_host(workdir, source, pace) as sim:
        out.print(f"simulated host {sim.host.node} in {sim.dir / 'sim'}; Proxmox API at {sim.host.api.url}")
        show = DemoShow(
            heading=lambda t: out.print(Rule(t, align="left")),
            facts=print_facts,
            text=lambda t: out.print(t, markup=False, highlight=False, soft_wrap=True),
            report=print_report,
            progress=display(),
        )
        result = run_demo(sim.ports, str(sim.host.paths.root), sim.dir, show, timeouts=Timeouts(poll=0.05))
        out.print(Rule())
        a = result.applied
        if a.stop_window_s is not None:
            out.print(
                f"applied in {a.wall_s:.1f} s; service down for {a.stop_window_s:.1f} s", soft_wrap=True
            )
        if workdir is not None:
            sim_dir = sim.dir / "sim"
            out.print(f"journal: {a.journal}", soft_wrap=True)
            out.print(
                f"the simulated host stays in {sim_dir}: try "
                f"gputopo diff --sim {sim_dir} --spec {result.spec_path} --exit-code",
                soft_wrap=True,
            )
        if not result.ok:
            raise VerifyFailed("the demo did not end converged and verified (see above)")
    sys.stdout.flush()
