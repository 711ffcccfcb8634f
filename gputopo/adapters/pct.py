"""Commands inside a container on a real Proxmox VE node: the real :class:`gputopo.ports.ExecPort`.

``pct exec <vmid> -- argv...`` runs a command through lxc-attach; ``pct push <vmid> <file>
<dest> --perms <mode>`` copies a host file in. Both need root on the node. pct itself fails with
exit 255 and a one-line message (``container '101' not running!``, ``can only push files to a
running CT``) that is passed on in :class:`gputopo.errors.ExecError`.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable

from gputopo.adapters.cannotrun import cannot_run
from gputopo.errors import ExecError
from gputopo.ports import ExecResult


class PctExec:
    """ExecPort over the ``pct`` command. ``runner`` is ``subprocess.run`` (injectable for tests)."""

    def __init__(
        self,
        pct: str = "pct",
        runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
        push_timeout: float = 60.0,
    ):
        self.pct = pct
        self.runner = runner
        self.push_timeout = push_timeout

    def run(self, vmid: int, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """Run ``argv`` in container ``vmid``; return its exit status and output.

        A non-zero exit is returned, not raised (the caller decides what it means).
        Raises :class:`ExecError` (rc None) when it does not finish within ``timeout`` seconds,
        (rc 127) when ``pct`` is not found and (rc 126) when it cannot be started.
        """
        cmd = [self.pct, "exec", str(int(vmid)), "--", *argv]
        try:
            cp = self.runner(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise ExecError(vmid, list(argv), None, _text(e.stderr)) from None
        except FileNotFoundError as e:
            raise ExecError(vmid, list(argv), 127, f"{self.pct}: {e.strerror or 'not found'}") from None
        except OSError as e:
            raise ExecError(vmid, list(argv), 126, cannot_run(self.pct, e)) from None
        return ExecResult(rc=cp.returncode, stdout=cp.stdout or "", stderr=cp.stderr or "")

    def push(self, vmid: int, path: str, content: str, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` inside container ``vmid`` with permissions ``mode``.

        The content goes through a private (0600) temp file on the host, removed afterwards.
        Raises :class:`ExecError` when pct push fails or does not finish in ``push_timeout``.
        """
        argv = ["pct", "push", str(vmid), path]
        fd, tmp = tempfile.mkstemp(prefix="gputopo-push-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(content)
            cmd = [self.pct, "push", str(int(vmid)), tmp, path, "--perms", f"{mode:04o}"]
            try:
                cp = self.runner(cmd, capture_output=True, text=True, timeout=self.push_timeout, check=False)
            except subprocess.TimeoutExpired as e:
                raise ExecError(vmid, argv, None, _text(e.stderr)) from None
            except FileNotFoundError as e:
                raise ExecError(vmid, argv, 127, f"{self.pct}: {e.strerror or 'not found'}") from None
            except OSError as e:
                raise ExecError(vmid, argv, 126, cannot_run(self.pct, e)) from None
            if cp.returncode != 0:
                raise ExecError(vmid, argv, cp.returncode, cp.stderr or cp.stdout or "")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        # pct's exit status is not trusted alone (a failed worker may still exit 0): read it back.
        back = self.run(vmid, ["cat", path], timeout=self.push_timeout)
        if back.rc != 0 or back.stdout != content:
            raise ExecError(
                vmid,
                argv,
                back.rc if back.rc != 0 else 1,
                back.stderr or f"{path} does not hold what was pushed",
            )


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data
