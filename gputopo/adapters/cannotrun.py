"""Why a program of the node could not be started, in one line: the words every adapter that
runs one (pvesh, pct, the host's commands, ssh) gives for an OSError from ``subprocess``.

``subprocess`` searches ``PATH`` as ``execvp`` does: a directory on it that this user cannot
search, or a file of that name it cannot execute, ends the search in EACCES (PermissionError)
when no later entry has the program, not in ENOENT.
"""

from __future__ import annotations


def start_failure(program: str, error: OSError) -> str:
    """Why ``program`` could not be started, from the ``error`` starting it raised (not
    FileNotFoundError, which each adapter words itself)."""
    if isinstance(error, PermissionError):
        return (
            f"permission denied (a directory on PATH this user cannot search, or a {program} there "
            "it cannot execute); run as root on the Proxmox node"
        )
    return f"cannot run it: {error.strerror or type(error).__name__}"


def cannot_run(program: str, error: OSError) -> str:
    """``PROGRAM: WHY`` (:func:`start_failure`)."""
    return f"{program}: {start_failure(program, error)}"
