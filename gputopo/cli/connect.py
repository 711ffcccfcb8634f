"""How a command reaches a host: the connection options and the :class:`gputopo.ports.Ports` they build.

Every command that acts on or checks a host (``apply``, ``recover``, ``verify``) takes the same
options through :func:`connection_options` and turns them into ports with :func:`build_ports`:

* ``--sim DIR``: a simulated host (``gputopo sim create DIR``); its Proxmox API and inference
  endpoint are served from this process on loopback, its root is ``DIR/root``;
* ``--api-url https://HOST[:PORT]``: the Proxmox API over HTTPS (API token with ``--token-name``,
  else a password); secrets only from ``GPUTOPO_PVE_PASSWORD`` / ``GPUTOPO_PVE_TOKEN`` /
  ``GPUTOPO_PVE_TOKEN_SECRET`` or ``--secret-file``;
* ``--local`` (the default without ``--api-url``): ``pvesh`` on the node itself.

On a real host sysfs writes, host files and ``pct exec`` work on ``--root`` (default ``/``).
Call :func:`release_ports` when done: it stops what :func:`build_ports` started.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass, fields
from typing import Any, Callable
from urllib.parse import urlsplit

import click

from gputopo.cli.params import Finite
from gputopo.errors import ConfigError
from gputopo.ports import Ports

ENV_API_URL = "GPUTOPO_PVE_URL"
DEFAULT_API_PORT = 8006


@dataclass
class Connection:
    """The connection options as given on the command line (no secrets)."""

    root: str | None = None
    sim: str | None = None
    api_url: str | None = None
    local: bool = False
    node: str | None = None
    user: str = "root@pam"
    token_name: str | None = None
    secret_file: str | None = None
    ca_bundle: str | None = None
    insecure: bool = False
    api_timeout: float = 60.0


_FIELDS = [f.name for f in fields(Connection)]


def connection_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Click decorator: add the connection options and pass them as one ``conn: Connection``."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        conn = Connection(**{name: kwargs.pop(name) for name in _FIELDS})
        return f(*args, conn=conn, **kwargs)

    options = [
        click.option("--root", default=None, type=click.Path(file_okay=False),
                     help="Host root holding sys/, proc/, dev/, etc/ (default: /, or DIR/root with --sim)."),
        click.option("--sim", default=None, type=click.Path(file_okay=False),
                     help="Work on the simulated host in DIR (gputopo sim create DIR)."),
        click.option("--api-url", default=None, envvar=ENV_API_URL, show_envvar=True,
                     help="Proxmox API, e.g. https://pve1:8006 (default: --local)."),
        click.option("--local", is_flag=True, help="Use pvesh on this node instead of the HTTPS API."),
        click.option("--node", default=None, help="Proxmox node name (default: the spec's node, else this host's name)."),
        click.option("--user", default="root@pam", show_default=True, help="Proxmox user (password or token owner)."),
        click.option("--token-name", default=None, help="API token id of --user (secret from GPUTOPO_PVE_TOKEN_SECRET)."),
        click.option("--secret-file", default=None, type=click.Path(dir_okay=False),
                     help="Owner-only file holding the password or token secret."),
        click.option("--ca-bundle", default=None, type=click.Path(dir_okay=False),
                     help="CA certificate(s) to check the API's TLS certificate with."),
        click.option("--insecure", is_flag=True, help="Do not check the API's TLS certificate."),
        click.option("--api-timeout", default=60.0, show_default=True, type=Finite(),
                     help="Seconds per Proxmox API call."),
    ]
    for opt in reversed(options):
        wrapper = opt(wrapper)
    return wrapper


def parse_api_url(url: str) -> tuple[str, int]:
    """(host, port) of ``https://HOST[:PORT][/...]``; a bare ``HOST[:PORT]`` means https too.

    Raises ConfigError for another scheme or a URL without a host.
    """
    text = url.strip()
    if "://" not in text:
        text = "https://" + text
    parts = urlsplit(text)
    if parts.scheme != "https":
        raise ConfigError(f"--api-url {url}: the Proxmox API is served over https")
    try:
        port = DEFAULT_API_PORT if parts.port is None else parts.port
    except ValueError:
        raise ConfigError(f"--api-url {url}: bad port") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"--api-url {url}: bad port")
    if not parts.hostname:
        raise ConfigError(f"--api-url {url}: no host")
    return parts.hostname, port


def host_root(conn: Connection) -> str:
    """The host root the command works on: ``--root``, ``DIR/root`` with ``--sim``, else ``/``.

    Raises ConfigError when ``--root`` and ``--sim`` are both given.
    """
    if conn.sim:
        if conn.root:
            raise ConfigError("--root and --sim exclude each other (a simulated host has its own root)")
        return os.path.join(conn.sim, "root")
    return conn.root or "/"


def build_ports(conn: Connection, default_node: str | None = None, env: dict[str, str] | None = None) -> Ports:
    """The ports for ``conn``: a simulated host's, or real sysfs/pct/host files plus the Proxmox API.

    ``default_node`` is the node name used when ``--node`` is not given (the spec's node); the
    host's short name otherwise. Raises ConfigError for contradictory options or bad
    credentials, ProxmoxError when the API refuses the login, SimHostError for a ``--sim``
    directory that holds no simulated host.
    """
    if conn.sim:
        if conn.api_url or conn.local:
            raise ConfigError("--sim excludes --api-url and --local (the simulated host serves its own API)")
        host_root(conn)
        from gputopo.sim.host import SimHost

        sim = SimHost.open(conn.sim)
        if conn.node and conn.node != sim.node:
            raise ConfigError(f"--node {conn.node}: the simulated host in {conn.sim} is node {sim.node}")
        sim.start()
        return sim.ports()

    if conn.api_url and conn.local:
        raise ConfigError("--api-url and --local exclude each other")
    from gputopo.adapters.http import RequestsHttp
    from gputopo.adapters.pct import PctExec
    from gputopo.adapters.sysfs import RealSysfs
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.adapters.credentials import ApiConfig
    from gputopo.adapters.proxmox import ProxmoxClient

    root = host_root(conn)
    node = conn.node or default_node or socket.gethostname().split(".")[0]
    if conn.api_url:
        host, port = parse_api_url(conn.api_url)
        cfg = ApiConfig(backend="https", host=host, port=port, node=node, user=conn.user,
                        token_name=conn.token_name, verify_ssl=not conn.insecure,
                        ca_bundle=conn.ca_bundle, secret_file=conn.secret_file, timeout=conn.api_timeout)
    else:
        cfg = ApiConfig(backend="local", node=node, timeout=conn.api_timeout)
    client = ProxmoxClient.from_config(cfg, env=env)
    return Ports(sysfs=RealSysfs(root), proxmox=client, exec=PctExec(), files=RealHostFiles(root),
                 http=RequestsHttp())


def release_ports(ports: Ports) -> None:
    """Stop whatever :func:`build_ports` started for ``ports`` (a simulated host's servers)."""
    ports.close()
