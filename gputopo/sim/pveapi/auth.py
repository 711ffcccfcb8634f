"""Who calls the simulated API: API tokens, tickets with a CSRF token, and privileges.

root@pam has every privilege; the operator user (``ops@pve``) has VM and mapping privileges
only, so a test sees the 403s a non-root caller gets.
"""

from __future__ import annotations

import base64
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from gputopo.sim.pveapi.answers import ApiError, AuthFailed
from gputopo.sim.pveapi.routes import NO_AUTH

ROOT_PRIVS = None  # root@pam has every privilege
OPERATOR_PRIVS = frozenset(
    {
        "VM.Audit",
        "VM.PowerMgmt",
        "VM.Config.Disk",
        "VM.Config.CPU",
        "VM.Config.Memory",
        "VM.Config.Network",
        "VM.Config.Options",
        "Mapping.Audit",
        "Mapping.Modify",
        "Mapping.Use",
        "Sys.Audit",
    }
)


@dataclass
class Caller:
    user: str  # "root@pam" or "root@pam!gputopo" for a token
    via: str  # "ticket" | "token" | "cli"

    @property
    def is_root_pam(self) -> bool:
        return self.user == "root@pam"


class Auth:
    """Authentication and privileges of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def authenticate(self, method: str, path: str, headers: Any) -> Caller | None:
        """The caller, or None for paths without auth. Raises AuthFailed with the phrase."""
        if (method, path) in NO_AUTH:
            return None
        auth = headers.get("Authorization", "") or ""
        m = re.match(r"^PVEAPIToken[= ](?P<user>[^!]+)!(?P<tid>[^=]+)=(?P<secret>.+)$", auth)
        if m:
            token = f"{m['user']}!{m['tid']}"
            known = {
                self.root_token_id: self.root_token_secret,
                self.operator_token_id: self.operator_token_secret,
            }
            if known.get(token) is None or not secrets.compare_digest(known[token], m["secret"]):
                raise AuthFailed("Authentication failed!")
            return Caller(token, "token")
        ticket = None
        m = re.match(r"^PVEAuthCookie=(.+)$", auth)
        if m:
            ticket = unquote(m.group(1))
        else:
            for part in (headers.get("Cookie", "") or "").split(";"):
                k, _, v = part.strip().partition("=")
                if k == "PVEAuthCookie":
                    ticket = unquote(v)
        if not ticket:
            raise AuthFailed("No ticket")
        entry = self._tickets.get(ticket)
        if entry is None:
            raise AuthFailed("Authentication failed!")
        user, csrf = entry
        if method != "GET":
            got = headers.get("CSRFPreventionToken", "") or ""
            if not secrets.compare_digest(got, csrf):
                raise AuthFailed("Permission denied - invalid csrf token")
        return Caller(user, "ticket")

    def _has_any(self, caller: Caller, privs: tuple[str, ...]) -> bool:
        user = caller.user.split("!")[0]
        if user == "root@pam":
            return True
        if user == self.operator_user:
            return any(p in OPERATOR_PRIVS for p in privs)
        return False

    # --- POST /access/ticket -------------------------------------------------------------

    def h_ticket(self, caller: Caller | None, p: dict) -> Any:
        user = p["username"]
        if "@" not in user and p.get("realm"):
            user = f"{user}@{p['realm']}"
        pw = p["password"]
        if pw in self._tickets and self._tickets[pw][0] == user:
            ok = True  # renewal: the old ticket serves as the password
        else:
            ok = (user, pw) in (
                (self.root_user, self.root_password),
                (self.operator_user, self.operator_password),
            )
        if not ok:
            if self.auth_fail_delay:
                time.sleep(self.auth_fail_delay)
            raise ApiError(401, "authentication failure\n")
        now = f"{int(time.time()):08X}"
        sig = base64.b64encode(secrets.token_bytes(48)).decode()
        ticket = f"PVE:{user}:{now}::{sig}"
        csrf = f"{now}:{base64.b64encode(secrets.token_bytes(32)).decode().rstrip('=')}"
        self._tickets[ticket] = (user, csrf)
        privs = {"VM.Audit": 1, "VM.PowerMgmt": 1}
        return {
            "username": user,
            "ticket": ticket,
            "CSRFPreventionToken": csrf,
            "cap": {
                "vms": privs,
                "access": {},
                "storage": {},
                "nodes": {"Sys.Audit": 1},
                "sdn": {},
                "dc": {},
                "mapping": {"Mapping.Modify": 1},
            },
        }
