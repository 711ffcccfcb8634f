"""Why a connection to the Proxmox API failed, in a few words: requests and urllib3 wrap the
socket's error in two or three layers of repr (``HTTPSConnectionPool(...): Max retries exceeded
... (Caused by NewConnectionError(...: [Errno 111] Connection refused))``), of which an operator
needs the last clause only.

The reasons: the socket error's own words (``Connection refused``, ``No route to host``,
``Network is unreachable``), ``name HOST not found``, ``timed out``, ``the certificate expired
on DATE`` (the date read from the certificate the server presents), ``certificate verify
failed: WHY`` (OpenSSL's reason); any other error's first line, its wrapping cut off.
"""

from __future__ import annotations

import re
import ssl
from datetime import UTC, datetime

_VERIFY_RE = re.compile(r"certificate verify failed: (.+?)(?: \(_ssl\.c|\"\)|$)")
_ERRNO_RE = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
_NAME_ERRORS = (
    "Name or service not known",
    "nodename nor servname provided",
    "Temporary failure in name resolution",
    "No address associated with hostname",
    "NameResolutionError",
    "getaddrinfo failed",
)

# Proxmox VE's admin guide, "Certificate Management" (pve-admin-guide, sysadmin_certificate_management,
# https://pve.proxmox.com/pve-docs/pve-admin-guide.html#sysadmin_certificate_management): the API
# presents /etc/pve/nodes/NODE/pveproxy-ssl.pem when one is installed (a custom or ACME certificate,
# which takes precedence), else the self-signed pve-ssl.pem issued by the cluster CA, which
# `pvecm updatecerts --force` issues again (pve-cluster data/PVE/CLI/pvecm.pm, updatecerts ->
# PVE::Cluster::Setup::updatecerts_and_ssh with force); pveproxy reads it at its restart.
RENEW = (
    "renew it on the node: `pvecm updatecerts --force` issues a new self-signed pve-ssl.pem, or replace "
    "a custom /etc/pve/nodes/NODE/pveproxy-ssl.pem (it takes precedence), then `systemctl restart pveproxy`"
)


def expired(error: BaseException) -> bool:
    """True when ``error`` (anywhere in its text) is OpenSSL's verdict on an expired certificate."""
    return "certificate has expired" in str(error)


def connection_reason(error: BaseException, host: str | None = None) -> str:
    """The short reason ``error`` (a requests/urllib3 connection or TLS error) says, one line."""
    text = f"{type(error).__name__}: {error}"
    if expired(error):
        return "the certificate has expired"
    m = _VERIFY_RE.search(text)
    if m:
        return f"certificate verify failed: {m.group(1).strip().rstrip('.')}"
    if any(n in text for n in _NAME_ERRORS):
        return f"name {host} not found" if host else "name not found"
    if "Timeout" in text or "timed out" in text.lower():
        return "timed out"
    m = _ERRNO_RE.search(text)  # the socket's own words: Connection refused, No route to host, ...
    if m:
        return m.group(1).strip()
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    # urllib3's wrapping: keep what the innermost "Caused by" says
    inner = first.rsplit("Caused by ", 1)[-1]
    return inner[:120]


def certificate_expiry(host: str, port: int, timeout: float) -> datetime | None:
    """When the certificate ``host:port`` presents expires (UTC), read without verifying it;
    None when it cannot be read."""
    try:
        from cryptography import x509

        pem = ssl.get_server_certificate((host, port), timeout=timeout)
        cert = x509.load_pem_x509_certificate(pem.encode())
    except Exception:
        return None
    return cert.not_valid_after_utc.astimezone(UTC)


def expired_message(host: str, port: int, timeout: float) -> str:
    """``the certificate expired on DATE; renew it ...`` for the API at ``host:port``."""
    when = certificate_expiry(host, port, timeout)
    on = f" on {when:%Y-%m-%d %H:%M} UTC" if when is not None else ""
    return f"the certificate expired{on}; {RENEW}"
