"""What a running ``gputopo sim cluster-ssh`` serves, as ``gputopo sim heal`` sees it from
another process: whether it runs, each node's address and port, a node whose sshd exited
without ``sim break``, and waiting until a node's sshd accepts connections again.

The server (:func:`.sshd.serve`) owns the sshd processes. One that exits while its node is not
broken is recorded here (``run/ssh/died.json``) and said on the server's stderr; the server
starts it again once heal takes the record out (:func:`revive`), so a node is never started by
two processes.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from gputopo.errors import SimHostError
from gputopo.sim import state

RECORD = "cluster-ssh.json"  # the server's record in the cluster's run directory
DIED = "died"  # run/ssh/died.json: node -> how its sshd exited
ACCEPT_TIMEOUT = 15.0  # seconds heal waits for a node's sshd to accept a connection
NOTICE = 2.0  # seconds heal gives the server to see an sshd that exited (it looks every 0.5 s)


def _ssh_dir(cluster_dir: str | os.PathLike) -> Path:
    return Path(cluster_dir) / "run" / "ssh"


def serving(cluster_dir: str | os.PathLike) -> bool:
    """Whether a ``gputopo sim cluster-ssh`` serves the cluster in ``cluster_dir`` now."""
    try:
        pid = int(json.loads((Path(cluster_dir) / "run" / RECORD).read_text())["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def addresses(cluster_dir: str | os.PathLike) -> dict[str, tuple[str, int]]:
    """node -> (address, port) of its sshd, from the server's ssh_config (empty without one)."""
    out: dict[str, tuple[str, int]] = {}
    try:
        text = (_ssh_dir(cluster_dir) / "ssh_config").read_text()
    except OSError:
        return out
    node, address = "", ""
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "Host":
            node = value
        elif key == "HostName":
            address = value
        elif key == "Port" and node:
            out[node] = (address, int(value))
    return out


def accepts(address: str, port: int) -> bool:
    """Whether an SSH server greets on ``address:port`` now."""
    try:
        with socket.create_connection((address, port), timeout=1.0) as s:
            s.settimeout(2.0)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def died(cluster_dir: str | os.PathLike) -> dict[str, str]:
    """node -> how its sshd exited, for the nodes whose sshd the server found gone."""
    return state.read_state(_ssh_dir(cluster_dir), DIED, {}) or {}


def mark_died(cluster_dir: str | os.PathLike, node: str, how: str) -> None:
    """Record (the server) that ``node``'s sshd exited: it stays down until :func:`revive`."""
    with state.locked(_ssh_dir(cluster_dir), DIED):
        gone = died(cluster_dir)
        gone[node] = how
        state.write_state(_ssh_dir(cluster_dir), DIED, gone)


def revive(cluster_dir: str | os.PathLike, node: str) -> str | None:
    """Take ``node`` out of the record, so the server starts its sshd again; returns how it had
    exited (None when it was not recorded)."""
    with state.locked(_ssh_dir(cluster_dir), DIED):
        gone = died(cluster_dir)
        how = gone.pop(node, None)
        if how is not None:
            state.write_state(_ssh_dir(cluster_dir), DIED, gone)
    return how


def wait_accepting(cluster_dir: str | os.PathLike, node: str, timeout: float = ACCEPT_TIMEOUT) -> None:
    """Wait until ``node``'s sshd accepts a connection. Raises SimHostError after ``timeout``."""
    where = addresses(cluster_dir).get(node)
    if where is None:
        raise SimHostError(
            str(cluster_dir), f"node {node}: not in the ssh_config of 'gputopo sim cluster-ssh'"
        )
    deadline = time.monotonic() + timeout
    while not accepts(*where):
        if time.monotonic() > deadline:
            raise SimHostError(
                str(cluster_dir),
                f"node {node}: its sshd on {where[0]}:{where[1]} did not accept a connection within "
                f"{timeout:g} s (see the output of 'gputopo sim cluster-ssh')",
            )
        time.sleep(0.1)


def restart_exited(cluster_dir: str | os.PathLike, nodes: list[str], broken) -> dict[str, str]:
    """Have the server start again the sshd of each of ``nodes`` that exited without ``sim
    break`` (``broken(node)``: whether the node is broken so), and wait until each accepts.
    Returns node -> what was done, one line. Nothing when no server runs."""
    if not serving(cluster_dir):
        return {}
    where = addresses(cluster_dir)
    gone = {n for n in nodes if n in died(cluster_dir)}
    quiet = [n for n in nodes if n not in gone and n in where and not broken(n) and not accepts(*where[n])]
    deadline = time.monotonic() + NOTICE
    while quiet and time.monotonic() < deadline:
        time.sleep(0.1)  # the server marks an sshd that exited within one of its polls
        gone |= {n for n in quiet if n in died(cluster_dir)}
        quiet = [n for n in quiet if n not in gone]
    done = {}
    for node in sorted(gone):
        how = revive(cluster_dir, node)
        wait_accepting(cluster_dir, node)
        done[node] = f"sshd started again (it had {how or 'exited'})"
    return done
