"""A simulated cluster, opened: its members, the API of any node, the nodes' shells.

``SimCluster.open(DIR)`` reads ``DIR/run/cluster.json`` (:mod:`.build`). ``start(node)`` serves
the API of one member (its SimHost), which answers for every member as pveproxy does;
``ports(node)`` hands out its :class:`gputopo.ports.Ports`. ``shell()`` is a
:class:`gputopo.ports.NodeShellPort` that runs each node's shell (:mod:`.nodeshell`) as a local
process, for machines without an SSH server; the tests reach the same shell through a real
sshd (``ForceCommand``), as the real adapter reaches a node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gputopo.errors import NodeUnreachable, SimHostError
from gputopo.ports import ExecResult
from gputopo.sim.cluster.peers import cluster_info
from gputopo.sim.host import SimHost


class SimCluster:
    """The simulated cluster in ``dir``. Raises SimHostError when ``dir`` holds none."""

    def __init__(self, dir: str | os.PathLike):
        self.dir = Path(dir)
        info = cluster_info(self.dir)
        if not info.get("nodes"):
            raise SimHostError(
                str(self.dir),
                "not a simulated cluster (no run/cluster.json); create one with "
                "'gputopo sim create --nodes N DIR'",
            )
        self.info = info
        self.nodes: list[str] = list(info["nodes"])
        self.addresses: dict[str, str] = {n: m["address"] for n, m in info["nodes"].items()}
        self.host: SimHost | None = None

    open = classmethod(lambda cls, dir: cls(dir))

    @staticmethod
    def is_cluster(dir: str | os.PathLike) -> bool:
        """Whether ``dir`` holds a simulated cluster (rather than a host)."""
        return bool(cluster_info(Path(dir)).get("nodes"))

    def node_dir(self, node: str) -> Path:
        """The simulated host directory of member ``node``. Raises SimHostError for another name."""
        if node not in self.info["nodes"]:
            raise SimHostError(str(self.dir), f"no node {node} (have {', '.join(self.nodes)})")
        return self.dir / "nodes" / node

    def member(self, node: str) -> SimHost:
        return SimHost.open(self.node_dir(node))

    def vm(self, node: str) -> int:
        return int(self.info["nodes"][node]["vm"])

    def container(self, node: str) -> int:
        return int(self.info["nodes"][node]["container"])

    def start(self, node: str | None = None, **kw) -> SimHost:
        """Serve the API of ``node`` (default: the first member); it answers for all."""
        self.host = self.member(node or self.nodes[0]).start(**kw)
        return self.host

    def ports(self, node: str | None = None):
        """The ports of ``node``'s API (started when needed); ``close()`` stops it."""
        if self.host is None:
            self.start(node)
        assert self.host is not None
        return self.host.ports()

    def stop(self) -> None:
        if self.host is not None:
            self.host.stop()
            self.host = None

    def shell(self, env: dict[str, str] | None = None) -> LocalNodeShell:
        return LocalNodeShell(self, env)


class LocalNodeShell:
    """``NodeShellPort`` without sshd: each node's shell as a process on this machine."""

    def __init__(self, cluster: SimCluster, env: dict[str, str] | None = None):
        self.cluster = cluster
        self.env = env

    def run(self, node: str, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """Run ``argv`` in ``node``'s shell. Raises NodeUnreachable for a node that is no
        member or that does not answer in time."""
        if node not in self.cluster.info["nodes"]:
            raise NodeUnreachable(node, f"ssh: Could not resolve hostname {node}: Name or service not known")
        cmd = [sys.executable, "-m", "gputopo.sim.cluster.nodeshell", str(self.cluster.node_dir(node)), *argv]
        env = dict(os.environ if self.env is None else self.env)
        env.pop("SSH_ORIGINAL_COMMAND", None)
        try:
            p = subprocess.run(
                cmd,
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                stdin=subprocess.DEVNULL if input is None else None,
            )
        except subprocess.TimeoutExpired:
            raise NodeUnreachable(node, f"no answer within {timeout:g} s") from None
        said = p.stderr.strip().splitlines()
        if p.returncode == 255 and said and said[-1].startswith("ssh: "):
            # the node refuses connections (sim break node-unreachable): what ssh says
            raise NodeUnreachable(node, said[-1])
        return ExecResult(p.returncode, p.stdout, p.stderr)
