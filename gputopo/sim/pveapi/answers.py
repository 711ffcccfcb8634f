"""What a handler of the simulated API answers: data, or an error as Proxmox builds it."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answer: ``status``, ``message`` (full text, as Proxmox builds it), ``errors``."""

    def __init__(self, status: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors


def die(msg: str) -> ApiError:
    """A plain Perl ``die "$msg\\n"``: status 500, the message with its newline."""
    return ApiError(500, msg + "\n")


def param_error(errors: dict[str, str]) -> ApiError:
    return ApiError(400, "Parameter verification failed.\n", errors)


def perm_error(what: str | None = None) -> ApiError:
    return ApiError(403, f"Permission check failed ({what})\n" if what else "Permission check failed\n")


class AuthFailed(Exception):
    """A 401 from the auth handler: no body, the reason phrase only."""


class Result:
    """A handler's data and the extra top-level keys of the answer (``total`` of a task log).

    ``stderr`` holds the texts the handler printed on its standard error on the way (a Perl ``warn``
    such as ``cannot delete 'dev7' - not set in current configuration!``): the daemon's journal
    over HTTP, the terminal under pvesh.
    """

    def __init__(self, data: Any, **extra: Any):
        self.data = data
        self.extra = extra
        self.stderr: list[str] = []
