"""A throwaway certificate authority and server certificate for the simulated API server.

The server certificate carries the names pve-cluster's ``gen_pve_ssl_cert`` gives a node's
``pve-ssl.pem``: ``IP:127.0.0.1, IP:::1, DNS:localhost`` and ``DNS:<node>``, CN the node name,
``OU=PVE Cluster Node``, ``O=Proxmox Virtual Environment``; it is signed by a CA named like the
cluster's (``CN=Proxmox Virtual Environment, O=PVE Cluster Manager CA``).
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any

NODE_NAMES = ("127.0.0.1", "::1", "localhost")  # pve-cluster gen_pve_ssl_cert, before the node's own


def cert_fingerprint(cert_path: Path) -> str:
    """The SHA-256 fingerprint of the PEM certificate at ``cert_path`` the way Proxmox prints
    it (pve-common Certificate.pm get_certificate_fingerprint, Net::SSLeay X509_get_fingerprint):
    upper-case hex pairs of the DER digest joined by ``:``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    digest = x509.load_pem_x509_certificate(Path(cert_path).read_bytes()).fingerprint(hashes.SHA256())
    return ":".join(f"{b:02X}" for b in digest)


def make_ca_and_server_cert(directory: Path, node: str = "pve1") -> tuple[Path, Path, Path]:
    """Write ``ca.pem``, ``server.pem`` and ``server.key`` (0600) into ``directory``.

    The server certificate is signed by the CA and names 127.0.0.1, ::1, localhost and
    ``node``. Returns (ca_cert, server_cert, server_key) paths. Raises OSError when the files
    cannot be written.
    """
    hosts = (*NODE_NAMES, node)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    existing = _reusable(directory, now, hosts)
    if existing is not None:
        # Another server of the same simulated host may be running: its clients trust this CA.
        return existing
    ca_key, ca_cert = _ca_certificate(now)
    key, cert = _server_certificate(ca_key, ca_cert.subject, node, hosts, now)
    return _write_pems(directory, ca_cert, cert, key)


def _ca_certificate(now: datetime.datetime) -> tuple[Any, Any]:
    """A new CA key and its self-signed certificate, named like a Proxmox cluster's CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "Proxmox Virtual Environment"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "gputopo simulated host"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "PVE Cluster Manager CA"),
        ]
    )
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca_cert


def _server_certificate(
    ca_key: Any, ca_name: Any, node: str, hosts: tuple[str, ...], now: datetime.datetime
) -> tuple[Any, Any]:
    """A new server key and its certificate for ``node``, naming ``hosts``, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "PVE Cluster Node"),
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Proxmox Virtual Environment"),
                    x509.NameAttribute(NameOID.COMMON_NAME, node),
                ]
            )
        )
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _write_pems(directory: Path, ca_cert: Any, cert: Any, key: Any) -> tuple[Path, Path, Path]:
    """Write the CA certificate, the server certificate and its key (0600) as PEM files."""
    from cryptography.hazmat.primitives import serialization

    ca_path = directory / "ca.pem"
    cert_path = directory / "server.pem"
    key_path = directory / "server.key"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


def _reusable(
    directory: Path, now: datetime.datetime, hosts: tuple[str, ...]
) -> tuple[Path, Path, Path] | None:
    """The paths of an existing CA + server certificate that stay valid for a day and name
    every one of ``hosts``, else None."""
    from cryptography import x509

    paths = (directory / "ca.pem", directory / "server.pem", directory / "server.key")
    if not all(p.is_file() for p in paths):
        return None
    try:
        cert = x509.load_pem_x509_certificate(paths[1].read_bytes())
    except ValueError:
        return None
    if cert.not_valid_after_utc < now + datetime.timedelta(days=1):
        return None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    named = set(san.get_values_for_type(x509.DNSName)) | {
        str(a) for a in san.get_values_for_type(x509.IPAddress)
    }
    if not {str(ipaddress.ip_address(h)) if _is_ip(h) else h for h in hosts} <= named:
        return None
    return paths


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
