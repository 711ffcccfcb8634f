"""``pvesh`` on the Proxmox node: the Proxmox API called through its command-line shell.

``pvesh get|set|create|delete PATH --key value ... --output-format json`` (pve-manager
``PVE/CLI/pvesh.pm``) runs as root@pam without the API's permission check. What it prints is
in the wire doc (proxmox-api-wire.md, section 6): the result as JSON on stdout (nothing for a
null result); errors on stderr, ``<code> <message>`` followed by one ``param: message`` line per
parameter for a ``PVE::Exception``, the bare message for a plain ``die``; a task runs
synchronously, its log goes to stdout before the UPID line, and a failed task prints its
message on stderr while pvesh still exits 0 with the UPID.

Only the exit code says whether a call failed: a call that succeeds may print on stderr too
(``WARN: ...`` from ``RESTEnvironment::warn``, a Perl ``warn`` such as ``cannot delete 'dev7' -
not set in current configuration!``, ``trying to acquire cfs lock 'file-...' ...`` from
pve-cluster's ``cfs_lock`` while it waits, ``Task finished with 1 warning(s)!``).

:func:`pvesh_argv` and :func:`parse_pvesh_output` are pure; :class:`Pvesh` runs them through an
injectable runner.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from typing import Any

from gputopo.adapters.cannotrun import cannot_run
from gputopo.errors import ConfigError, ProxmoxError

# runner(argv, timeout) -> (stdout, stderr, returncode): how pvesh is run
Runner = Callable[[list[str], float], tuple[str, str, int]]

VERBS = {"GET": "get", "PUT": "set", "POST": "create", "DELETE": "delete"}

_STATUS_RE = re.compile(r"^(\d{3}) (.*)$")
_PARAM_ERROR_RE = re.compile(r"^([\w\-\[\]\.]+): (.*)$")


def wire_value(v: Any) -> Any:
    """A parameter value as Proxmox takes it: booleans as 0/1 (Proxmox refuses ``True``)."""
    if isinstance(v, bool):
        return int(v)
    return v


def pvesh_argv(method: str, path: str, params: dict[str, Any]) -> list[str]:
    """The pvesh command line for ``method`` (GET, PUT, POST, DELETE) on ``path``.

    Each parameter becomes ``--key value``; a list becomes the option repeated once per item
    (how pvesh takes an array such as a mapping's ``map``); None values are left out.
    Raises ConfigError for an unknown method.
    """
    verb = VERBS.get(method.upper())
    if verb is None:
        raise ConfigError(f"pvesh has no verb for {method!r} (GET, PUT, POST, DELETE)")
    argv = ["pvesh", verb, path]
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                argv += [f"--{key}", str(wire_value(item))]
    return argv + ["--output-format", "json"]


def parse_pvesh_error(stderr: str, rc: int) -> tuple[int, str, dict[str, str] | None]:
    """(status, message, per-parameter errors) from what a failed pvesh printed on stderr.

    The status is the leading ``<code>`` of the first line, else 500; the errors are the
    ``param: message`` lines after it (None when there are none).
    """
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()] or [f"pvesh exited {rc}"]
    m = _STATUS_RE.match(lines[0])
    status, message = (int(m.group(1)), m.group(2)) if m else (500, lines[0])
    errors = {}
    for ln in lines[1:]:
        km = _PARAM_ERROR_RE.match(ln)
        if km:
            errors[km.group(1)] = km.group(2)
    return status, message, errors or None


def parse_json_output(stdout: str) -> Any:
    """The JSON result pvesh printed: None for no output; a task's log lines before its UPID
    line are skipped. Raises ValueError when no trailing part of the output is JSON."""
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    for start in range(len(lines)):
        try:
            return json.loads("\n".join(lines[start:]))
        except ValueError:
            continue
    raise ValueError(f"not JSON: {lines[0][:80]!r}")


def parse_pvesh_output(call: str, stdout: str, stderr: str, rc: int) -> Any:
    """The result of one pvesh run: its JSON (None for a null result).

    The exit code alone decides: what a successful call printed on stderr (warnings, lock
    waits, a task's outcome, which its status tells) is not a failure. Raises
    :class:`ProxmoxError` (``call``, status, message, per-parameter errors) when pvesh exits
    non-zero or prints output that is not JSON.
    """
    if rc != 0:
        raise ProxmoxError(call, *parse_pvesh_error(stderr, rc))
    try:
        return parse_json_output(stdout)
    except ValueError as e:
        raise ProxmoxError(call, 500, f"pvesh printed {e}") from None


def run_command(argv: list[str], timeout: float) -> tuple[str, str, int]:
    """Run ``argv``; (stdout, stderr, exit code). Raises ConfigError when the program is not
    installed or cannot be started, ProxmoxError when it runs longer than ``timeout`` seconds."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ConfigError(
            f"{argv[0]}: not found (the local backend runs on the Proxmox node itself)"
        ) from None
    except OSError as e:
        raise ConfigError(cannot_run(argv[0], e)) from None
    except subprocess.TimeoutExpired:
        raise ProxmoxError(" ".join(argv[:3]), None, f"timed out after {timeout:g} s") from None
    return p.stdout, p.stderr, p.returncode


class Pvesh:
    """Calls the Proxmox API through pvesh. ``runner`` runs the command (tests pass a fake)."""

    def __init__(self, runner: Runner | None = None, timeout: float = 60.0):
        self.runner: Runner = runner or run_command
        self.timeout = timeout

    def call(
        self, method: str, path: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """``method`` (GET, PUT, POST, DELETE) on the API ``path``; returns the parsed result.

        ``timeout`` replaces :attr:`timeout` for this call (a task runs to its end under pvesh).
        Raises ProxmoxError when pvesh refuses the call or times out, ConfigError when pvesh
        is not installed.
        """
        argv = pvesh_argv(method, path, params or {})
        stdout, stderr, rc = self.runner(argv, self.timeout if timeout is None else timeout)
        return parse_pvesh_output(f"{method.upper()} {path}", stdout, stderr, rc)
