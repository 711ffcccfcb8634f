"""Commands on other cluster nodes through the OpenSSH client: the trust a Proxmox cluster sets
up between its nodes (``root@<node>``, keys in ``/root/.ssh``, host keys known cluster-wide).

* :class:`SshRunner` implements :class:`gputopo.ports.NodeShellPort`: ``ssh -o BatchMode=yes
  -o StrictHostKeyChecking=yes ... root@<node> -- <command>`` (never a password prompt, never
  an unknown host key accepted); ssh's own failures (exit 255 with ssh's message) and a run past
  its timeout raise :class:`gputopo.errors.NodeUnreachable` naming the node;
* :class:`SshExec` runs commands in a node's containers (``pct exec``), and :class:`SshFiles`
  reads a node's host files (``cat``, ``stat``): what the current state of a remote node needs.
  Both only read;
* :class:`RecordedExec` and :class:`RecordedFiles` answer those reads from what the node read
  of itself in one round trip (``gputopo cluster node-read``), and ask over SSH only what it
  did not record.

The remote command is one shell word list (``shlex.join``), as sshd hands it to the login shell.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
from collections.abc import Mapping, Sequence

from gputopo.adapters.cannotrun import cannot_run
from gputopo.errors import ConfigError, ExecError, HostFileError, NodeUnreachable
from gputopo.ports import ExecResult, FileMeta

# what ssh itself prints when it, not the remote command, fails (it then exits 255)
_SSH_FAILURE = re.compile(
    r"^(ssh: |Host key verification failed|Permission denied|Connection closed|Connection reset|"
    r"kex_exchange_identification|Connection timed out|banner exchange|No route to host|"
    r"Could not resolve hostname|Bad owner or permissions|Load key|.*REMOTE HOST IDENTIFICATION)",
)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class SshRunner:
    """``NodeShellPort`` over the ``ssh`` binary.

    ``config_file`` is an ssh_config (``-F``: host names, ports, keys, known_hosts);
    ``options`` more ``-o`` settings (``Port=2222``); ``connect_timeout`` bounds the TCP
    connect and the banner exchange.
    """

    def __init__(
        self,
        *,
        user: str = "root",
        config_file: str | None = None,
        options: Sequence[str] = (),
        connect_timeout: float = 10.0,
        binary: str = "ssh",
    ):
        self.user = user
        self.config_file = config_file
        self.options = list(options)
        self.connect_timeout = connect_timeout
        self.binary = binary
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._aborted: set[subprocess.Popen] = set()

    def __repr__(self) -> str:
        return f"SshRunner({self.user}@<node>{', -F ' + self.config_file if self.config_file else ''})"

    def command(self, node: str) -> list[str]:
        """The ssh command line up to ``--`` for ``node``."""
        cmd = [self.binary]
        if self.config_file:
            cmd += ["-F", self.config_file]
        cmd += [
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o",
            "LogLevel=ERROR",
            "-T",
        ]
        for opt in self.options:
            cmd += ["-o", opt]
        return cmd + [f"{self.user}@{node}", "--"]

    def run(self, node: str, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """Run ``argv`` on ``node``. Raises NodeUnreachable (refused, timed out, host key or
        login refused), ConfigError when there is no ssh client."""
        return self.start(node, argv, stdin=input is not None).result(timeout, input)

    def start(self, node: str, argv: list[str], stdin: bool = True) -> SshCall:
        """Begin ``argv`` on ``node`` now; its input is written, and its answer read, by
        :meth:`SshCall.result`. So the connection and the node's start-up run while the caller
        works out what to send. Raises ConfigError when there is no ssh client."""
        cmd = self.command(node) + [shlex.join(argv)]
        try:
            p = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except FileNotFoundError:
            raise ConfigError(f"{self.binary}: the OpenSSH client is not installed") from None
        except OSError as e:
            raise ConfigError(cannot_run(self.binary, e)) from None
        with self._lock:
            self._running.add(p)
        return SshCall(self, node, argv, p)

    def _ended(self, p: subprocess.Popen) -> bool:
        """Forget ``p``; whether :meth:`abort` ended it."""
        with self._lock:
            self._running.discard(p)
            aborted = p in self._aborted
            self._aborted.discard(p)
        return aborted

    def abort(self) -> None:
        """End every command this runner has running now (each of those ``run`` calls raises
        NodeUnreachable). The cluster commands call it only while what runs are reads, when
        something else failed first and their answers are no longer wanted."""
        with self._lock:
            running = list(self._running)
            self._aborted.update(running)
        for p in running:
            p.kill()


class SshCall:
    """A command :meth:`SshRunner.start` began on ``node``."""

    def __init__(self, runner: SshRunner, node: str, argv: list[str], proc: subprocess.Popen):
        self.runner = runner
        self.node = node
        self.argv = argv
        self.proc = proc

    def result(self, timeout: float, input: str | None = None) -> ExecResult:
        """Write ``input`` to the command and wait at most ``timeout`` seconds for its end.
        Raises NodeUnreachable (refused, timed out, host key or login refused, aborted)."""
        p, what = self.proc, shlex.join(self.argv[:2])
        try:
            stdout, stderr = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise NodeUnreachable(self.node, f"no answer within {timeout:g} s ({what})") from None
        finally:
            aborted = self.runner._ended(p)
        if aborted:
            raise NodeUnreachable(self.node, f"left unanswered ({what}): another node failed first")
        if p.returncode == 255:
            last = _last_line(stderr)
            if not last or _SSH_FAILURE.match(last):
                raise NodeUnreachable(self.node, last or "ssh exited 255")
        return ExecResult(p.returncode, stdout, stderr)

    def cancel(self) -> None:
        """End the command unanswered (nothing was sent to it)."""
        self.proc.kill()
        self.proc.communicate()
        self.runner._ended(self.proc)


class SshExec:
    """``ExecPort`` reads in the containers of ``node``: ``pct exec <vmid> -- argv`` over ssh."""

    def __init__(self, runner, node: str):
        self.runner = runner
        self.node = node

    def run(self, vmid: int, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """Run argv in container ``vmid``. Raises ExecError when it takes longer than
        ``timeout``, NodeUnreachable when the node cannot be reached."""
        try:
            return self.runner.run(self.node, ["pct", "exec", str(vmid), "--", *argv], timeout, input)
        except NodeUnreachable as e:
            if e.reason.startswith("no answer within"):
                raise ExecError(vmid, argv, None, f"on node {self.node}") from None
            raise

    def push(self, vmid: int, path: str, content: str, mode: int = 0o644) -> None:
        """Not offered: a remote node's containers are changed by that node's own apply."""
        raise ExecError(vmid, ["pct", "push", path], 1, f"read-only view of node {self.node}")


class SshFiles:
    """A read-only ``HostFilesPort`` of ``node``'s root: ``cat`` and ``stat`` over ssh."""

    root = "/"

    def __init__(self, runner, node: str, timeout: float = 30.0):
        self.runner = runner
        self.node = node
        self.timeout = timeout

    def _abs(self, path: str) -> str:
        return "/" + path.lstrip("/")

    def read(self, path: str) -> str | None:
        """The file's text, None when it does not exist. Raises HostFileError otherwise."""
        res = self.runner.run(self.node, ["cat", "--", self._abs(path)], self.timeout)
        if res.rc == 0:
            return res.stdout
        if "No such file or directory" in res.stderr:
            return None
        raise HostFileError(path, OSError(res.rc, _last_line(res.stderr) or f"cat exited {res.rc}"))

    def meta(self, path: str) -> FileMeta | None:
        res = self.runner.run(self.node, ["stat", "-c", "%a %u %g", "--", self._abs(path)], self.timeout)
        if res.rc != 0:
            return None
        mode, uid, gid = res.stdout.split()
        return FileMeta(int(mode, 8), int(uid), int(gid))

    def is_dir(self, path: str) -> bool:
        return self.runner.run(self.node, ["test", "-d", self._abs(path)], self.timeout).rc == 0

    def write(self, path: str, content: str, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
        raise HostFileError(path, OSError(30, f"read-only view of node {self.node}"))

    def remove(self, path: str) -> None:
        raise HostFileError(path, OSError(30, f"read-only view of node {self.node}"))

    def remove_dir(self, path: str) -> None:
        raise HostFileError(path, OSError(30, f"read-only view of node {self.node}"))

    def discard_temps(self, path: str) -> None:
        raise HostFileError(path, OSError(30, f"read-only view of node {self.node}"))

    def unwritable(self, path: str) -> str | None:
        return f"{self._abs(path)}: read-only view of node {self.node}"


class RecordedExec:
    """``ExecPort`` reads answered from what the node ran for them (``recorded``: the result of
    each ``(vmid, argv)``); any other command goes to ``live`` (an :class:`SshExec`)."""

    def __init__(self, recorded: Mapping[tuple[int, tuple[str, ...]], ExecResult], live):
        self.recorded = recorded
        self.live = live

    def run(self, vmid: int, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """The recorded result of ``argv`` in container ``vmid``, else the live one."""
        res = self.recorded.get((vmid, tuple(argv))) if input is None else None
        return res if res is not None else self.live.run(vmid, argv, timeout, input)

    def push(self, vmid: int, path: str, content: str, mode: int = 0o644) -> None:
        self.live.push(vmid, path, content, mode)


class RecordedFiles:
    """A read-only ``HostFilesPort`` whose reads come from ``recorded`` (path: text, None when
    the node has no such file); other paths and other questions go to ``live`` (an
    :class:`SshFiles`)."""

    root = "/"

    def __init__(self, recorded: Mapping[str, str | None], live):
        self.recorded = recorded
        self.live = live

    def read(self, path: str) -> str | None:
        if path in self.recorded:
            return self.recorded[path]
        return self.live.read(path)

    def meta(self, path: str) -> FileMeta | None:
        return self.live.meta(path)

    def is_dir(self, path: str) -> bool:
        return self.live.is_dir(path)

    def write(self, path: str, content: str, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
        self.live.write(path, content, mode, owner)

    def remove(self, path: str) -> None:
        self.live.remove(path)

    def remove_dir(self, path: str) -> None:
        self.live.remove_dir(path)

    def unwritable(self, path: str) -> str | None:
        return self.live.unwritable(path)
