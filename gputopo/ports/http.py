"""HTTP to the services the containers run (the inference endpoint verify probes)."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class HttpResponse:
    status: int
    text: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON. Raises ValueError when it is not JSON."""
        return _json.loads(self.text)


@runtime_checkable
class HttpPort(Protocol):
    """HTTP requests to a service a container runs (``http://<container address>:<port>/...``)."""

    def request(self, method: str, url: str, *, json: Any = None, timeout: float) -> HttpResponse:
        """Send one request; return the reply whatever its status.

        Raises :class:`gputopo.errors.HttpError` (its ``reason``: ``timed out``, ``Connection
        refused``, ``connection closed without a reply``, ...) when no reply came.
        """
        ...
