"""The real :class:`gputopo.ports.HttpPort`: requests to a container's service over the network."""

from __future__ import annotations

import re
from typing import Any

from gputopo.errors import HttpError
from gputopo.ports import HttpResponse

_ERRNO_RE = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


def http_reason(error: BaseException) -> str:
    """A short reason for a failed HTTP request: ``timed out``, ``Connection refused`` (an
    errno's text), ``connection closed without a reply``; the exception's class name otherwise."""
    text, name = str(error), type(error).__name__
    if "Timeout" in name or "timed out" in text.lower():
        return "timed out"
    m = _ERRNO_RE.search(text)
    if m:
        return m.group(1).strip()
    if "Remote end closed connection" in text or "Connection aborted" in text:
        return "connection closed without a reply"
    return name


class RequestsHttp:
    """HttpPort over one ``requests.Session`` (connections are reused between calls)."""

    def __init__(self) -> None:
        self._session: Any = None

    def request(self, method: str, url: str, *, json: Any = None, timeout: float) -> HttpResponse:
        """See :class:`gputopo.ports.HttpPort`. Raises HttpError when no reply came."""
        import requests

        if self._session is None:
            self._session = requests.Session()
        try:
            r = self._session.request(method, url, json=json, timeout=timeout)
        except requests.RequestException as e:
            raise HttpError(url, http_reason(e)) from None
        return HttpResponse(status=r.status_code, text=r.text)
