"""Commands on the Proxmox host itself: the real :class:`gputopo.ports.HostCommandPort`.

Only a host whose root is ``/`` can run them: a command run here would otherwise change this
machine, not the host under ``--root``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from gputopo.adapters.cannotrun import start_failure
from gputopo.errors import HostCommandError
from gputopo.ports import ExecResult


class RealHostCommands:
    """HostCommandPort over ``subprocess.run`` (``runner`` is injectable for tests)."""

    def __init__(self, runner: Callable[..., subprocess.CompletedProcess] = subprocess.run):
        self.runner = runner

    def run(self, argv: list[str], timeout: float) -> ExecResult:
        """Run ``argv``; a non-zero exit is returned. Raises HostCommandError when it cannot
        start or does not finish within ``timeout`` seconds."""
        try:
            cp = self.runner(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise HostCommandError(argv, "not found (is this the Proxmox node?)") from None
        except OSError as e:
            raise HostCommandError(argv, start_failure(argv[0], e)) from None
        except subprocess.TimeoutExpired:
            raise HostCommandError(argv, f"did not finish within {timeout:g} s") from None
        return ExecResult(cp.returncode, cp.stdout or "", cp.stderr or "")
