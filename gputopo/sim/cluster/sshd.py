"""A simulated cluster behind real OpenSSH servers on loopback: one ``sshd`` per node.

Each node's sshd (``/usr/sbin/sshd -D -f <config> -e``, run as root without systemd) listens on
the node's own address (127.0.0.11, .12, ...) with its own generated host key, takes one
generated user key for root, and runs the node's shell as its ``ForceCommand`` (``python -m
gputopo.sim.cluster.nodeshell <node dir>``), so that ``ssh root@pve2 -- gputopo discover
--json`` reads that simulated node. The client side is the real ``ssh`` through the
``ssh_config`` written here, naming each node's address, port, key and known host key
(``HostKeyAlias``): ``gputopo cluster plan --ssh-config FILE`` reaches the nodes as it reaches
real ones. ``gputopo sim cluster-ssh DIR`` and the cluster tests both use :class:`SshNodes`.

The node shell imports the same gputopo as the process that starts the servers: sshd starts
every session with a fresh environment, so ``PYTHONPATH`` is set per node with ``SetEnv``
(sshd_config(5): "SetEnv: Specifies one or more environment variables to set in child
sessions started by sshd(8)").
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import gputopo
from gputopo.errors import SimHostError

SSHD = "/usr/sbin/sshd"


def sshd_missing() -> str | None:
    """Why real sshd servers cannot run here, or None."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install -y openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client (ssh, ssh-keygen) is not installed"
    if os.geteuid() != 0:
        return "sshd must run as root to log in as root@<node>"
    return None


def keygen(path: Path) -> str:
    """Make an ed25519 key pair at ``path`` (no passphrase); returns the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return Path(f"{path}.pub").read_text().strip()


def make_keys(base: Path, nodes: list[str]) -> Path:
    """``base/keys``: the user key (its public half in ``authorized_keys``) and one host key per
    node, all owner-only. Returns the directory."""
    keys = Path(base) / "keys"
    keys.mkdir(parents=True)
    user = keygen(keys / "user")
    (keys / "authorized_keys").write_text(user + "\n")
    for n in nodes:
        keygen(keys / f"host-{n}")
    for p in keys.iterdir():
        p.chmod(0o600)
    return keys


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_listening(address: str, port: int, timeout: float = 10.0) -> None:
    """Wait until an SSH server greets on ``address:port``. Raises RuntimeError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {address}:{port} did not come up")


def package_path() -> str:
    """The directory this gputopo is imported from, for the node shells' ``PYTHONPATH``."""
    return str(Path(gputopo.__file__).resolve().parent.parent)


class SshNodes:
    """One real sshd per node of ``cluster`` (a :class:`gputopo.sim.cluster.SimCluster`);
    ``config`` is the client's ssh_config, written in ``workdir`` with the servers' files."""

    def __init__(self, cluster, workdir: Path, keys: Path, die_with_parent: bool = False):
        self.cluster = cluster
        self.die_with_parent = die_with_parent
        self.dir = Path(workdir)
        self.keys = Path(keys)
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.config = self.dir / "ssh_config"
        self.known_hosts = self.dir / "known_hosts"
        self.env: dict[str, dict[str, str]] = {}

    def start(self, env: dict[str, dict[str, str]] | None = None) -> SshNodes:
        """Start every node's sshd and write ``config`` and ``known_hosts``; returns self once
        all of them greet. ``env``: per node, variables its sessions get (over this gputopo's
        ``PYTHONPATH``). Raises RuntimeError for a server that does not come up (the others are
        stopped)."""
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
        self.env = env or {}
        hosts, known = [], []
        try:
            for node in self.cluster.nodes:
                address = self.cluster.addresses[node]
                port = free_port(address)
                self.ports[node] = port
                self._start_one(node, address, port)
                hostkey = (self.keys / f"host-{node}.pub").read_text().split()
                known.append(f"{node} {hostkey[0]} {hostkey[1]}")
                hosts.append(self._host_entry(node, address, port))
            self.known_hosts.write_text("\n".join(known) + "\n")
            self.config.write_text("\n".join(hosts))
            for node in self.cluster.nodes:
                self._wait(node)
        except BaseException:
            self.stop()
            raise
        return self

    def _host_entry(self, node: str, address: str, port: int) -> str:
        return (
            f"Host {node}\n  HostName {address}\n  Port {port}\n  User root\n  HostKeyAlias {node}\n"
            f"  IdentityFile {self.keys / 'user'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
            f"  StrictHostKeyChecking yes\n"
        )

    def _wait(self, node: str) -> None:
        proc = self.procs[node]
        try:
            wait_listening(self.cluster.addresses[node], self.ports[node])
        except RuntimeError:
            log = self.dir / f"sshd-{node}.log"
            said = log.read_text().strip().splitlines()[-1:] if log.is_file() else []
            exited = f" (exited {proc.poll()})" if proc.poll() is not None else ""
            raise RuntimeError(
                f"sshd of {node} on {self.cluster.addresses[node]}:{self.ports[node]} did not come up"
                f"{exited}{': ' + said[0] if said else ''}"
            ) from None

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
        env = {"PYTHONPATH": package_path(), **self.env.get(node, {})}
        for k, v in env.items():
            lines.append(f"SetEnv {k}={v}")
        conf.write_text("\n".join(lines) + "\n")
        with open(self.dir / f"sshd-{node}.log", "w") as log:
            self.procs[node] = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(conf)],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )

    def stop(self, node: str | None = None) -> None:
        """Stop ``node``'s sshd (every node's when None); its sessions end with it."""
        for n in [node] if node else list(self.procs):
            p = self.procs.pop(n, None)
            if p is not None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def restart(self, node: str) -> None:
        """Start ``node``'s sshd again on the port it had (after :meth:`stop`)."""
        if node in self.procs:
            return
        self._start_one(node, self.cluster.addresses[node], self.ports[node])
        self._wait(node)


def _die_with_parent() -> None:
    """In the child before sshd runs: SIGTERM it when the process that started it ends, however
    it ends (prctl(2) PR_SET_PDEATHSIG), so a killed ``sim cluster-ssh`` leaves no server behind."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def serve(cluster, stop, on_ready=None, poll: float = 0.5) -> None:
    """Serve ``cluster`` over SSH until ``stop`` (a threading.Event) is set: the keys (made once,
    kept in ``DIR/run/ssh/keys``), one sshd per node and ``DIR/ssh_config``. ``on_ready(nodes)``
    is called once every server greets. While it serves, a node broken with ``gputopo sim break
    node-unreachable`` has its sshd stopped (a connection is refused, as a node that is down
    answers) and started again once healed; an sshd that exits otherwise is said on stderr and
    started again by ``gputopo sim heal`` (:mod:`.served`).

    Raises SimHostError when sshd cannot run here (not installed, not root) or does not come up.
    """

    why = sshd_missing()
    if why is not None:
        raise SimHostError(str(cluster.dir), f"cannot serve the nodes over SSH: {why}")
    work = cluster.dir / "run" / "ssh"
    work.mkdir(parents=True, exist_ok=True)
    keys = work / "keys"
    if not all((keys / f).is_file() for f in ["user", *(f"host-{n}" for n in cluster.nodes)]):
        shutil.rmtree(keys, ignore_errors=True)
        make_keys(work, cluster.nodes)
    (work / "died.json").unlink(missing_ok=True)  # an earlier server's record of exited sshds
    nodes = SshNodes(cluster, work, keys, die_with_parent=True)
    try:
        nodes.start()
    except RuntimeError as e:
        raise SimHostError(str(cluster.dir), str(e)) from None
    try:
        link = cluster.dir / "ssh_config"
        link.unlink(missing_ok=True)
        link.symlink_to(nodes.config.relative_to(cluster.dir))
        if on_ready is not None:
            on_ready(nodes)
        while not stop.wait(poll):
            _keep(cluster, nodes)
    finally:
        nodes.stop()
        (cluster.dir / "ssh_config").unlink(missing_ok=True)


def _exit_words(code: int) -> str:
    return f"been killed by signal {-code}" if code < 0 else f"exited with status {code}"


def _keep(cluster, nodes: SshNodes) -> None:
    """One look at every node: stop the sshd of a node broken with ``sim break
    node-unreachable``, start a healed one's again, and record one that exited by itself (it
    stays down until ``sim heal`` revives it). Raises SimHostError for an sshd that does not
    come up again."""
    from gputopo.sim.cluster.reach import unreachable
    from gputopo.sim.cluster.served import died, mark_died

    gone = died(cluster.dir)
    for node in cluster.nodes:
        down = unreachable(cluster.node_dir(node))
        proc = nodes.procs.get(node)
        if proc is not None and proc.poll() is not None and not down:
            nodes.procs.pop(node)
            how = _exit_words(proc.returncode)
            mark_died(cluster.dir, node, how)
            sys.stderr.write(
                f"gputopo sim cluster-ssh: the sshd of {node} has {how}: "
                f"'gputopo sim heal {cluster.dir}' starts it again\n"
            )
            sys.stderr.flush()
        elif down and node in nodes.procs:
            nodes.stop(node)
        elif not down and node not in nodes.procs and node not in gone:
            try:
                nodes.restart(node)
            except RuntimeError as e:
                raise SimHostError(str(cluster.dir), str(e)) from None
