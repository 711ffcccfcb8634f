"""Whether a simulated cluster node answers SSH: the ``node-unreachable`` fault.

A node that is down, or whose sshd is stopped, refuses the connection; the OpenSSH client then
prints ``ssh: connect to host HOST port 22: Connection refused`` and exits 255 (ssh(1), EXIT
STATUS: "ssh exits with the exit status of the remote command or with 255 if an error
occurred"; the message is ssh.c/sshconnect.c ssh_connect_direct's ``error("ssh: connect to
host %s port %s: %s", ...)``). The fault lives in the node's run state: the node shell answers
every command so (:mod:`.nodeshell`, also without sshd), and ``gputopo sim cluster-ssh`` stops
the node's sshd while it is set, so a real client is refused by the kernel.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

UNREACHABLE = "unreachable.json"  # in the node's run directory


def unreachable(node_dir: str | os.PathLike) -> bool:
    """Whether the node in ``node_dir`` is broken to refuse SSH."""
    return (Path(node_dir) / "run" / UNREACHABLE).is_file()


def refusal(node_dir: str | os.PathLike) -> str:
    """The client's words for the refused connection."""
    try:
        host = json.loads((Path(node_dir) / "run" / UNREACHABLE).read_text()).get("host", "")
    except (OSError, ValueError):
        host = ""
    return f"ssh: connect to host {host or Path(node_dir).name} port 22: Connection refused"


def set_unreachable(node_dir: str | os.PathLike, on: bool) -> None:
    """Break (``on``) or heal the node in ``node_dir``."""
    from gputopo.sim.files import atomic_write
    from gputopo.sim.host import SimHost

    path = Path(node_dir) / "run" / UNREACHABLE
    if not on:
        path.unlink(missing_ok=True)
        return
    host = SimHost.open(node_dir)
    from gputopo.sim.cluster.peers import cluster_dir_of, cluster_info

    address = cluster_info(cluster_dir_of(host)).get("nodes", {}).get(host.node, {}).get("address", "")
    atomic_write(path, json.dumps({"host": address}) + "\n")
