"""A connection to the Proxmox API that fails is said in one short line, not urllib3's repr:
Connection refused, No route to host, name not found, timed out; an expired certificate says
that it expired, when, and how Proxmox renews it."""

from __future__ import annotations

import socket
import ssl
import threading
from datetime import UTC, datetime

import pytest

from gputopo.adapters.credentials import ApiConfig
from gputopo.adapters.neterrors import RENEW, connection_reason
from gputopo.adapters.proxmox import ProxmoxClient
from gputopo.errors import ConnectFailed

ENV = {"GPUTOPO_PVE_PASSWORD": "secret-password"}


def _connect(host: str, port: int, timeout: float = 3.0, ca_bundle: str | None = None) -> str:
    cfg = ApiConfig(host=host, port=port, timeout=timeout, ca_bundle=ca_bundle)
    with pytest.raises(ConnectFailed) as e:
        ProxmoxClient.from_config(cfg, env=ENV)
    text = str(e.value)
    assert "\n" not in text and "HTTPSConnectionPool" not in text and "secret-password" not in text
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_and_a_name_not_found_are_a_few_words():
    port = _free_port()
    assert _connect("127.0.0.1", port) == f"connect https://127.0.0.1:{port}: Connection refused"
    # .invalid never resolves (RFC 6761)
    assert _connect("pve1.invalid", 8006) == "connect https://pve1.invalid:8006: name pve1.invalid not found"


@pytest.mark.slow  # about half a second or more: out of the one-minute loop
def test_a_server_that_never_answers_times_out():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)  # the TCP handshake completes in the backlog; TLS never answers
        port = srv.getsockname()[1]
        assert _connect("127.0.0.1", port, timeout=0.5) == f"connect https://127.0.0.1:{port}: timed out"


def test_no_route_and_unreachable_from_urllib3s_wrapping():
    wrapped = (
        "HTTPSConnectionPool(host='10.0.0.9', port=8006): Max retries exceeded with url: "
        "/api2/json/access/ticket (Caused by NewConnectionError(\"HTTPSConnection(host='10.0.0.9', "
        'port=8006): Failed to establish a new connection: [Errno 113] No route to host"))'
    )
    assert connection_reason(ConnectionError(wrapped)) == "No route to host"
    unreachable = wrapped.replace("[Errno 113] No route to host", "[Errno 101] Network is unreachable")
    assert connection_reason(ConnectionError(unreachable)) == "Network is unreachable"


def _expired_cert(tmp_path):
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pve1")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(datetime(2020, 1, 1, tzinfo=UTC))
        .not_valid_after(datetime(2021, 3, 4, 5, 6, tzinfo=UTC))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_an_expired_certificate_says_when_and_how_proxmox_renews_it(tmp_path):
    cert, key = _expired_cert(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            try:
                with ctx.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        text = _connect("127.0.0.1", port, ca_bundle=str(cert))
    finally:
        stop.set()
        t.join(5)
        srv.close()
    assert (
        text == f"connect https://127.0.0.1:{port}: the certificate expired on 2021-03-04 05:06 UTC; {RENEW}"
    )
    assert "does not chain" not in text and "pvecm updatecerts --force" in text
