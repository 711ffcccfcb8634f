"""The other members of a simulated cluster, as one node's API server reaches them.

A real node's pveproxy proxies a path of another node to that node (pve-manager
PVE/HTTPServer.pm ``rest_handler`` with ``proxyto``); a simulated node hands such a request to
an API server object of that member: its own run state, sysfs root and guest hooks, the shared
pve root. Those servers are never started: they only answer what the started one forwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputopo.sim import state

CLUSTER = "cluster"


def cluster_dir_of(host: Any) -> Path:
    """The cluster directory of a member :class:`gputopo.sim.host.SimHost`."""
    return (host.dir / host.info["cluster"]).resolve()


def cluster_info(cluster_dir: Path) -> dict:
    """``run/cluster.json`` of a simulated cluster (empty when there is none)."""
    return state.read_state(Path(cluster_dir) / "run", CLUSTER, {}) or {}


def attach_peers(api: Any, host: Any) -> None:
    """Give ``api`` (the started server of ``host``) a server for every other member."""
    from gputopo.sim.guesthooks import Hooks
    from gputopo.sim.pveapi import PveApiServer

    cdir = cluster_dir_of(host)
    for name in cluster_info(cdir).get("nodes", {}):
        if name == host.node:
            continue
        node_dir = cdir / "nodes" / name
        api.peers[name] = PveApiServer(
            host.paths.pve,
            node_dir / "run",
            node_dir / "root",
            name,
            host.version,
            tls=False,
            hooks=Hooks(node_dir),
        )
