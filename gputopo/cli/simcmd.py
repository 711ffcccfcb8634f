"""``gputopo sim``: create and serve a simulated Proxmox VE host (rehearsal and demos).

The group and ``sim create`` are here; the other commands live by concern: :mod:`.simserve`
(``serve``), :mod:`.simguest` (``guest``), :mod:`.simcluster` (``cluster-ssh``),
:mod:`.simfaults` (``break``, ``heal``) and :mod:`.simshell` (``shell``)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import click

from gputopo.cli.connect import require_sim_extra
from gputopo.cli.simcluster import cluster_ssh
from gputopo.cli.simfaults import break_, heal
from gputopo.cli.simguest import guest
from gputopo.cli.simserve import serve
from gputopo.cli.simshell import shell
from gputopo.exitcodes import with_exit_codes


@click.group()
@with_exit_codes("sim")
def sim() -> None:
    """A simulated Proxmox VE host: kernel sysfs, Proxmox API, containers and their service."""
    # Checked for every subcommand, 'create' too: a host made here is only of use served
    # (sim serve, or --sim DIR on the other commands), and that needs the certificate.
    require_sim_extra("sim")


@sim.command("create")
@click.argument("dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--from",
    "source",
    default="seed",
    show_default=True,
    help="Fixture name, fixture .yaml or a 'gputopo snapshot' .tar.gz.",
)
@click.option("--node", default=None, help="Node name (default: the host's hostname).")
@click.option(
    "--service",
    type=click.Choice(["sglang", "vllm"]),
    default="sglang",
    show_default=True,
    help="The inference server running in the container.",
)
@click.option(
    "--pve-version",
    type=click.Choice(["8.4.1", "9.1.2"]),
    default="8.4.1",
    show_default=True,
    help="Proxmox VE release to behave as (9: new devN are hot-plugged into a running container).",
)
@click.option(
    "--nodes",
    "count",
    type=click.IntRange(2, 64),
    default=None,
    help="A cluster of this many nodes (pve1..pveN) sharing one /etc/pve instead of one host.",
)
@click.option(
    "--ha",
    "ha",
    multiple=True,
    metavar="SID",
    help="Make a guest an HA resource (ct:101, vm:201; repeatable): its start and stop go through "
    "the HA manager, which moves it seconds after the task ends.",
)
def create(
    dir: Path,
    source: str,
    node: str | None,
    service: str,
    pve_version: str,
    count: int | None,
    ha: tuple[str, ...] = (),
) -> None:
    """Create a simulated host in DIR (the seed story: container 101 serving on every GPU), or
    with --nodes N a cluster of N such hosts (containers 101.., VMs 201.., one /etc/pve)."""
    if count is not None:
        from gputopo.errors import ConfigError
        from gputopo.sim.cluster import SimCluster, create_cluster

        if node is not None:
            raise ConfigError("--node names one host; a cluster's nodes are pve1..pveN")
        create_cluster(dir, count, source=source, service=service, pve_version=pve_version)
        c = SimCluster(dir)
        members = ", ".join(f"{n} ({c.addresses[n]}, CT {c.container(n)}, VM {c.vm(n)})" for n in c.nodes)
        click.echo(f"created simulated cluster of {len(c.nodes)} nodes in {dir}: {members}")
        return
    from gputopo.errors import ConfigError
    from gputopo.sim.host import SimHost

    for sid in ha:
        if not re.fullmatch(r"(ct|vm):\d+", sid):
            raise ConfigError(f"--ha {sid}: an HA resource id is ct:<vmid> or vm:<vmid>")
    existed = dir.exists()
    host = SimHost.create(dir, source=source, node=node, service=service, pve_version=pve_version)
    try:
        for sid in ha:
            host.make_ha_managed(sid)
    except BaseException:
        _undo_create(dir, existed)
        raise
    click.echo(f"created simulated host {host.node} in {dir} (container {host.container})")


def _undo_create(dir: Path, existed: bool) -> None:
    """Leave ``dir`` as it was before ``sim create`` made a host in it: absent, or empty."""
    if not existed:
        shutil.rmtree(dir, ignore_errors=True)
        return
    for p in dir.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


sim.add_command(serve)
sim.add_command(guest)
sim.add_command(cluster_ssh)
sim.add_command(break_)
sim.add_command(heal)
sim.add_command(shell)
