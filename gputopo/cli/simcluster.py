"""``gputopo sim cluster-ssh``: serve a simulated cluster's nodes over real SSH on loopback."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click


@click.command("cluster-ssh")
@click.argument("dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def cluster_ssh(dir: Path) -> None:
    """Serve each node of the simulated cluster in DIR (gputopo sim create --nodes N DIR) over
    real SSH on loopback, as a real cluster's nodes are reached: one sshd per node on its own
    address (127.0.0.11, .12, ...), generated host and user keys, and DIR/ssh_config for
    'gputopo cluster ... --ssh-config'. Runs in the foreground until Ctrl-C or SIGTERM (put it
    in the background with '&', as 'sim serve'); DIR/ssh_config goes with it. Needs
    /usr/sbin/sshd and root (exit 2 otherwise)."""
    from gputopo.sim.cluster import SimCluster
    from gputopo.sim.cluster.sshd import serve
    from gputopo.sim.serving import claim

    cluster = SimCluster(dir.resolve())
    record = claim(cluster.dir / "run", str(dir), "cluster-ssh.json", "gputopo sim cluster-ssh")
    try:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())

        def ready(nodes) -> None:
            record.announce(str(cluster.dir / "ssh_config"))
            config = dir / "ssh_config"
            lines = [f"simulated cluster {dir}: {len(cluster.nodes)} nodes over SSH"]
            lines += [f"  {n}: root@{cluster.addresses[n]} port {nodes.ports[n]}" for n in cluster.nodes]
            lines += [
                f"ssh_config: {config}",
                "try:",
                f"  ssh -F {config} {cluster.nodes[0]} -- gputopo --version",
                f"  gputopo init --sim {dir} -o spec.yaml",
                f"  gputopo cluster plan --sim {dir} --ssh-config {config} --spec spec.yaml",
                "Ctrl-C stops it.",
            ]
            click.echo("\n".join(lines))
            sys.stdout.flush()

        serve(cluster, stop, on_ready=ready)
    finally:
        record.release()
    click.echo("stopped", err=True)
