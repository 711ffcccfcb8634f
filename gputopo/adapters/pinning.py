"""Pinning a Proxmox node's certificate by its SHA-256 fingerprint, as Proxmox's own clients do.

Proxmox prints a certificate's fingerprint as upper-case hex pairs of the SHA-256 of its DER
form, joined by ``:`` (pve-common ``Certificate.pm`` ``get_certificate_fingerprint``, Net::SSLeay
``X509_get_fingerprint``; ``GET /nodes`` ``ssl_fingerprint``, the web UI's certificate view).
``PVE::APIClient::LWP`` given ``cached_fingerprints`` trusts exactly those certificates: it
compares the peer's fingerprint and skips the CA and host name checks; the option is checked
with the ``fingerprint-sha256`` pattern of pve-common ``JSONSchema.pm``.

Here urllib3 compares the fingerprint on every connection (``assert_fingerprint``), the login
included: :func:`pinned_api` builds proxmoxer's resource over a session that only talks to the
pinned certificate, and logs in through that session.
"""

from __future__ import annotations

import re
import time
from typing import Any

from gputopo.errors import ConfigError

# pve-common JSONSchema.pm standard option 'fingerprint-sha256'
FINGERPRINT_RE = re.compile(r"^([A-Fa-f0-9]{2}:){31}[A-Fa-f0-9]{2}$")
_MISMATCH_RE = re.compile(r'Fingerprints did not match\. Expected "([0-9a-fA-F:]+)", got "([0-9a-fA-F]+)"')


def normalize_fingerprint(text: str) -> str:
    """``text`` as Proxmox prints a SHA-256 fingerprint (``AA:BB:...``, 32 pairs).

    Raises ConfigError naming the value when it is not 32 colon-separated hex pairs.
    """
    value = text.strip()
    if not FINGERPRINT_RE.match(value):
        raise ConfigError(
            f"--fingerprint {text}: a SHA-256 fingerprint is 32 hex pairs joined by ':' "
            "(AA:BB:...), as the node's certificate view and GET /nodes show it"
        )
    return value.upper()


def colon_hex(hexdigest: str) -> str:
    """``ab12...`` -> ``AB:12:...``."""
    h = hexdigest.upper()
    return ":".join(h[i : i + 2] for i in range(0, len(h), 2))


def presented_fingerprint(err: BaseException) -> str | None:
    """The fingerprint the server presented, from urllib3's mismatch error anywhere in ``err``'s
    text; None when ``err`` is not a fingerprint mismatch."""
    m = _MISMATCH_RE.search(str(err).replace('\\"', '"'))
    return colon_hex(m.group(2)) if m else None


def _session(fingerprint: str) -> Any:
    from proxmoxer.backends.https import ProxmoxHttpSession
    from requests.adapters import HTTPAdapter

    class PinnedAdapter(HTTPAdapter):
        """Every connection's certificate must have ``fingerprint`` (no CA or name check)."""

        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["assert_fingerprint"] = fingerprint
            super().init_poolmanager(*args, **kwargs)

    session = ProxmoxHttpSession()
    session.mount("https://", PinnedAdapter())
    session.headers["Connection"] = "keep-alive"
    return session


def pinned_api(
    host: str,
    port: int,
    fingerprint: str,
    user: str,
    timeout: float,
    *,
    password: str | None = None,
    token_name: str | None = None,
    token_value: str | None = None,
) -> Any:
    """A proxmoxer resource for ``https://host:port/api2/json`` whose every request, the ticket
    login included, goes to the certificate with ``fingerprint`` only.

    Raises proxmoxer's AuthenticationError when the login is refused, requests' SSLError
    (see :func:`presented_fingerprint`) when the certificate is another.
    """
    from proxmoxer.backends.https import (
        JsonSerializer,
        ProxmoxHTTPApiTokenAuth,
        ProxmoxHTTPAuth,
        ProxmoxHTTPAuthBase,
    )
    from proxmoxer.core import AuthenticationError, ProxmoxResource

    base = f"https://{host}:{port}/api2/json"
    session = _session(fingerprint)

    class PinnedTicketAuth(ProxmoxHTTPAuth):
        """proxmoxer's ticket auth, logging in (and renewing) through the pinned session."""

        def _get_new_tokens(
            self, password: str | None = None, otp: str | None = None, otptype: str | None = None
        ) -> None:
            data = {
                "username": self.username,
                "password": password if password is not None else self.pve_auth_ticket,
            }
            bare = ProxmoxHTTPAuthBase(timeout=self.timeout, verify_ssl=False)
            r = session.request("POST", base + "/access/ticket", data=data, auth=bare, timeout=self.timeout)
            if r.status_code != 200:
                raise AuthenticationError(
                    f"Couldn't authenticate user: {self.username} to {base}/access/ticket "
                    f"code: {r.status_code}"
                )
            got = r.json()["data"]
            if got.get("NeedTFA") is not None:
                raise AuthenticationError(f"{self.username}: two-factor authentication is not supported")
            self.birth_time = time.monotonic()
            self.pve_auth_ticket = got["ticket"]
            self.csrf_prevention_token = got["CSRFPreventionToken"]

    if token_name:
        auth: Any = ProxmoxHTTPApiTokenAuth(user, token_name, token_value, verify_ssl=False, timeout=timeout)
    else:
        auth = PinnedTicketAuth(user, password, base_url=base, verify_ssl=False, timeout=timeout)
    session.auth = auth
    session.headers["accept"] = JsonSerializer().get_accept_types()
    return ProxmoxResource(base_url=base, session=session, serializer=JsonSerializer())
