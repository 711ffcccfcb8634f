"""The HTTP side of the simulated API: parameters from query and body, answers on the wire.

Status codes, reason phrases and bodies as a PVE node sends them (proxmox-api-wire.md): a 401
has no body, an error carries ``message`` (and ``errors`` for a parameter check).
"""

from __future__ import annotations

import json
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import unquote_plus, urlsplit

from gputopo.sim.pveapi.answers import ApiError, AuthFailed, Result
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.routes import API_PREFIX


class ApiBackend(Protocol):
    """What the wire asks of the server behind it (:class:`gputopo.sim.pveapi.PveApiServer` is
    one): declared here, so the wire does not import the server that imports it."""

    auth_fail_delay: float

    def authenticate(self, method: str, path: str, headers: Any) -> Caller | None: ...

    def dispatch(self, method: str, path: str, params: dict[str, Any], caller: Caller | None) -> Result: ...


class BadBody(Exception):
    """A request body that cannot become parameters."""


def decode_urlencoded(text: str) -> list[tuple[str, str | None]]:
    """Form pairs the way pve-http-server's AnyEvent.pm decode_urlencoded reads a body or a
    query string: split on ``&`` and on ``;`` (an unencoded ``;`` starts a new parameter), each
    pair with Perl's ``split(/=/)`` (the value is the text up to a second ``=``; none, as in
    ``key`` or ``key=``, is undef: None), ``+`` and ``%XX`` decoded."""
    pairs: list[tuple[str, str | None]] = []
    for kv in re.split(r"[&;]", text):
        if not kv:
            continue
        parts = kv.split("=")
        while len(parts) > 1 and parts[-1] == "":
            parts.pop()  # Perl's split drops trailing empty fields
        value = unquote_plus(parts[1]) if len(parts) > 1 else None
        pairs.append((unquote_plus(parts[0]), value))
    return pairs


def merge_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Form pairs to a dict; a repeated key (``map=a&map=b``) becomes a list."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            out[k] = (out[k] if isinstance(out[k], list) else [out[k]]) + [v]
        else:
            out[k] = v
    return out


class ApiRequestHandler(BaseHTTPRequestHandler):
    server_obj: ApiBackend
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall
    server_version = "pve-api-daemon/3.0"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def _params(self) -> dict[str, Any]:
        url = urlsplit(self.path)
        pairs: list[tuple[str, Any]] = []
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if body:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype == "application/json":
                try:
                    obj = json.loads(body)
                except ValueError as e:
                    raise BadBody(f"unable to parse JSON body - {e}") from None
                if not isinstance(obj, dict):
                    raise BadBody("unable to parse JSON body - not an object")
                pairs += list(obj.items())
            else:
                pairs += decode_urlencoded(body.decode())
        params = merge_pairs(pairs)
        params.update(merge_pairs(decode_urlencoded(url.query)))  # the query string wins
        params.pop("_dc", None)
        return params

    def _handle(self, method: str) -> None:
        srv = self.server_obj
        path = urlsplit(self.path).path
        try:
            params = self._params()
        except BadBody as e:
            # the daemon answers every request; the exact text of this 400 is not in the wire doc
            return self._send(400, str(e), {"data": None, "message": str(e) + "\n"})
        if not path.startswith(API_PREFIX + "/"):
            return self._send(501, f"Method '{method} {path}' not implemented", None)
        rel = path[len(API_PREFIX) :].rstrip("/") or "/"
        try:
            caller = srv.authenticate(method, rel, self.headers)
        except AuthFailed as e:
            if srv.auth_fail_delay:
                time.sleep(srv.auth_fail_delay)
            return self._send(401, str(e), None)
        try:
            result = srv.dispatch(method, rel, params, caller)
        except ApiError as e:
            body: dict[str, Any] = {"data": None, "message": e.message}
            if e.errors is not None:
                body["errors"] = e.errors
            return self._send(e.status, e.message, body)
        return self._send(200, "OK", {"data": result.data, **result.extra})

    def _send(self, status: int, message: str, body: dict | None) -> None:
        reason = message.split("\n", 1)[0]
        payload = b"" if body is None else json.dumps(body).encode()
        self.send_response(status, reason)
        if body is not None:
            self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")
