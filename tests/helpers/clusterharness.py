"""Helpers for the cluster tests: a simulated 3-node cluster per test (a copy of one made per
session), and real OpenSSH servers on loopback, one per simulated node.

Each node's sshd (``/usr/sbin/sshd -D -f <config> -e``, run as root without systemd) listens
on its own address (127.0.0.11, .12, ...) with its own generated host key, takes the session's
generated user key for root, and runs the node's shell as its ``ForceCommand``
(``python -m gputopo.sim.cluster.nodeshell <node dir>``), so that ``ssh root@pve2 -- gputopo
discover --json`` reads that simulated node. The client side is the real ``ssh`` through an
ssh_config naming each node's address, port, key and known host key (``HostKeyAlias``).
Without sshd, or not as root, the SSH tests skip with a message, unless GPUTOPO_REQUIRE_SSH=1
(CI) makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import gputopo
from gputopo.sim.cluster import SimCluster, create_cluster
from gputopo.sim.kernel import SimKernel
from helpers.applysim import SCALE, cleanup, fast_tmp

SSHD = "/usr/sbin/sshd"
REQUIRE_SSH = os.environ.get("GPUTOPO_REQUIRE_SSH") == "1"

SPEC = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
{nodes}
"""
SPLIT_NODE = """\
  - name: {name}
    containers:
      - vmid: {ct}
        gpus: {{numa: [0]}}
        service: {{unit: sglang.service}}
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {{numa: [1]}}
          description: GPUs for VM passthrough
"""
WHOLE_NODE = """\
  - name: {name}
    containers:
      - vmid: {ct}
        gpus: {{count: 8}}
        service: {{unit: sglang.service}}
"""


def make_template(pve_version: str = "8.4.1", count: int = 3) -> Path:
    d = Path(tempfile.mkdtemp(prefix="gputopo-cluster-tpl-", dir=fast_tmp())) / "cluster"
    create_cluster(d, count, pve_version=pve_version)
    for node in SimCluster(d).nodes:
        SimKernel(d / "nodes" / node / "root").configure(time_scale=SCALE)
    return d


def copy_cluster(template: Path, dest: Path) -> SimCluster:
    subprocess.run(["cp", "-a", str(template), str(dest)], check=True)
    return SimCluster(dest)


def spec_text(cluster: SimCluster, split: list[str], whole: list[str] = (), restart: bool = False) -> str:
    """A spec: the ``split`` nodes give NUMA 1 to the VM mapping pro6000-vm, the ``whole`` nodes
    keep every GPU in their container. ``restart``: ``container_restart: always`` (by default a
    split keeps its container running and only restarts the service)."""
    parts = []
    for n in cluster.nodes:
        if n in split:
            parts.append(SPLIT_NODE.format(name=n, ct=cluster.container(n)))
        elif n in whole:
            parts.append(WHOLE_NODE.format(name=n, ct=cluster.container(n)))
    text = SPEC.format(nodes="".join(parts).rstrip("\n"))
    return text + "policy: {container_restart: always}\n" if restart else text


@pytest.fixture(scope="module")
def template():
    """A three-node PVE 8 cluster, made once per test module (``cluster`` copies it)."""
    d = make_template()
    yield d
    cleanup(d.parent)


@pytest.fixture
def cluster(template, tmp_path):
    """A private copy of the module's ``template``; its servers stop afterwards."""
    c = copy_cluster(template, tmp_path / "cluster")
    yield c
    c.stop()


# --- OpenSSH ---------------------------------------------------------------------------------


def sshd_missing() -> str | None:
    """Why the SSH tests cannot run here, or None."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install -y openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client (ssh, ssh-keygen) is not installed"
    if os.geteuid() != 0:
        return "sshd must run as root to log in as root@<node>"
    return None


def require_sshd() -> None:
    why = sshd_missing()
    if why is None:
        return
    if REQUIRE_SSH:
        pytest.fail(f"GPUTOPO_REQUIRE_SSH=1 but {why}", pytrace=False)
    pytest.skip(why)


def keygen(path: Path) -> str:
    """Make an ed25519 key pair at ``path``; returns the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True
    )
    return Path(f"{path}.pub").read_text().strip()


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_listening(address: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {address}:{port} did not come up")


class SshNodes:
    """One real sshd per node of ``cluster``; ``config`` is the client's ssh_config."""

    def __init__(self, cluster: SimCluster, workdir: Path, keys: Path):
        self.cluster = cluster
        self.dir = workdir
        self.keys = keys
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.config = workdir / "ssh_config"
        self.known_hosts = workdir / "known_hosts"
        self.env: dict[str, dict[str, str]] = {}

    def start(self, env: dict[str, dict[str, str]] | None = None) -> SshNodes:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
        self.env = env or {}
        hosts, known = [], []
        for node in self.cluster.nodes:
            address = self.cluster.addresses[node]
            port = free_port(address)
            self.ports[node] = port
            self._start_one(node, address, port)
            hostkey = (self.keys / f"host-{node}.pub").read_text().split()
            known.append(f"{node} {hostkey[0]} {hostkey[1]}")
            hosts.append(
                f"Host {node}\n  HostName {address}\n  Port {port}\n  HostKeyAlias {node}\n"
                f"  IdentityFile {self.keys / 'user'}\n  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
                f"  StrictHostKeyChecking yes\n"
            )
        self.known_hosts.write_text("\n".join(known) + "\n")
        self.config.write_text("\n".join(hosts))
        for node in self.cluster.nodes:
            wait_listening(self.cluster.addresses[node], self.ports[node])
        return self

    def _start_one(self, node: str, address: str, port: int) -> None:
        node_dir = self.cluster.node_dir(node).resolve()
        conf = self.dir / f"sshd-{node}.conf"
        lines = [
            f"ListenAddress {address}:{port}",
            f"HostKey {self.keys / f'host-{node}'}",
            f"PidFile {self.dir / f'sshd-{node}.pid'}",
            f"AuthorizedKeysFile {self.keys / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PrintMotd no",
            "LogLevel ERROR",
            f"ForceCommand {sys.executable} -m gputopo.sim.cluster.nodeshell {node_dir}",
        ]
        # sshd hands its sessions a fresh environment: the node runs the gputopo this process
        # imports (a checkout's, not whatever copy is installed), unless ``env`` names another
        env = {"PYTHONPATH": str(Path(gputopo.__file__).resolve().parent.parent), **self.env.get(node, {})}
        for k, v in env.items():
            lines.append(f"SetEnv {k}={v}")
        conf.write_text("\n".join(lines) + "\n")
        log = open(self.dir / f"sshd-{node}.log", "w")
        self.procs[node] = subprocess.Popen([SSHD, "-D", "-e", "-f", str(conf)], stdout=log, stderr=log)

    def stop(self, node: str | None = None) -> None:
        for n in [node] if node else list(self.procs):
            p = self.procs.pop(n, None)
            if p is not None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def make_keys(base: Path, nodes: list[str]) -> Path:
    """The user key (its public half in ``authorized_keys``) and one host key per node."""
    keys = base / "keys"
    keys.mkdir(parents=True)
    user = keygen(keys / "user")
    (keys / "authorized_keys").write_text(user + "\n")
    for n in nodes:
        keygen(keys / f"host-{n}")
    for p in keys.iterdir():
        p.chmod(0o600)
    return keys
