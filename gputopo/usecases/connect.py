"""How a command reaches a host: the :class:`Connection` the command line fills and the
:class:`gputopo.ports.Ports` it builds (the options themselves are :mod:`gputopo.cli.connect`'s).

Where a connection leads:

* ``sim``: a simulated host (``gputopo sim create DIR``); its Proxmox API and inference
  endpoint are served from this process on loopback, its root is ``DIR/root``;
* ``api_url``: the Proxmox API over HTTPS (an API token or a password, secrets only from the
  environment or ``secret_file``); the certificate checked against the system CAs,
  ``ca_bundle``, or pinned by ``fingerprint``; ``insecure`` checks nothing and says so on
  stderr. The node the API calls name is ``node``, else the spec's only node, else this host's
  name (:func:`node_for`);
* ``local``: ``pvesh`` and ``pct`` on the node itself (apply, recover and verify without an URL);
* none of them (plan, render, diff): Proxmox's files under ``pve_root`` (default ``/etc/pve``).

An option that the chosen source would silently ignore is refused with a one-line
:class:`gputopo.errors.ConfigError` naming it. Call the ports' ``close()`` when done: it stops
what :func:`build_ports` started.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gputopo.errors import ConfigError
from gputopo.ports import Ports

ENV_API_URL = "GPUTOPO_PVE_URL"
DEFAULT_API_PORT = 8006
DEFAULT_PVE_ROOT = "/etc/pve"
DEFAULT_USER = "root@pam"
DEFAULT_API_TIMEOUT = 60.0


@dataclass(frozen=True)
class Connection:
    """The connection options as given on the command line (no secrets); None: not given."""

    root: str | None = None
    pve_root: str | None = None
    sim: str | None = None
    api_url: str | None = None
    local: bool = False
    node: str | None = None
    user: str | None = None
    token_name: str | None = None
    secret_file: str | None = None
    ca_bundle: str | None = None
    insecure: bool = False
    api_timeout: float | None = None
    fingerprint: str | None = None

    @property
    def live(self) -> bool:
        """Whether an API was asked for (``--sim``, ``--api-url`` or ``--local``)."""
        return self.sim is not None or self.api_url is not None or self.local


#: options that only the HTTPS API uses: field -> option
HTTPS_ONLY = {
    "user": "--user",
    "token_name": "--token-name",
    "secret_file": "--secret-file",
    "ca_bundle": "--ca-bundle",
    "fingerprint": "--fingerprint",
    "insecure": "--insecure",
}


def parse_api_url(url: str) -> tuple[str, int]:
    """(host, port) of ``https://HOST[:PORT][/...]``; a bare ``HOST[:PORT]`` means https too.

    Raises ConfigError for another scheme or a URL without a host.
    """
    from urllib.parse import urlsplit

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


def _sim_host(conn: Connection):
    """The simulated host of ``--sim`` (not started). Raises ConfigError for ``--root`` given
    too or a ``--node`` that is not its node, SimHostError for a directory that holds none."""
    from gputopo.sim.host import SimHost

    if conn.root is not None:
        raise ConfigError("--root and --sim exclude each other (a simulated host has its own root)")
    sim = SimHost.open(conn.sim)
    if conn.node and conn.node != sim.node:
        raise ConfigError(f"--node {conn.node}: the simulated host in {conn.sim} is node {sim.node}")
    return sim


def host_root(conn: Connection) -> str:
    """The host root the command works on: ``--root``, ``DIR/root`` with ``--sim``, else ``/``.

    Raises ConfigError when ``--root`` and ``--sim`` are both given, SimHostError for a
    ``--sim`` directory that holds no simulated host.
    """
    if conn.sim is not None:
        return str(_sim_host(conn).paths.root)
    return "/" if conn.root is None else conn.root


def _refuse_ignored(conn: Connection, timeout_used: bool) -> None:
    """Raises ConfigError naming an API option that the chosen source would ignore."""
    if conn.api_url is None:
        for name, option in HTTPS_ONLY.items():
            if getattr(conn, name):
                raise ConfigError(f"{option} applies to --api-url only")
    if conn.api_timeout is not None and not timeout_used:
        raise ConfigError("--api-timeout applies to --api-url and --local only")


def _tls(conn: Connection) -> None:
    """Raises ConfigError when more than one way to check the certificate is given; warns on
    stderr that ``--insecure`` checks nothing."""
    given = [
        opt
        for name, opt in (
            ("ca_bundle", "--ca-bundle"),
            ("fingerprint", "--fingerprint"),
            ("insecure", "--insecure"),
        )
        if getattr(conn, name)
    ]
    if len(given) > 1:
        raise ConfigError(
            f"{' and '.join(given)} exclude each other (each decides how the API's certificate is checked)"
        )
    if conn.insecure:
        print(
            "gputopo: warning: --insecure: the API's TLS certificate is not checked, anyone on the way "
            "can read the credentials; pin it with --fingerprint instead",
            file=sys.stderr,
        )


def this_host(root: str) -> str:
    """This host's name as Proxmox names its node: the short hostname under ``root``, else
    this machine's (:func:`gputopo.facts.host.node_name`, which apply checks the API against)."""
    from gputopo.facts.host import node_name

    return node_name(root)


def node_for(conn: Connection, spec: Any = None, hostname: str | None = None) -> str | None:
    """The node the API calls name when ``--node`` is not given: the spec's only node, else
    ``hostname`` (this host's name, as the host root says). None leaves it to build_ports."""
    if conn.node:
        return conn.node
    if spec is not None and len(spec.nodes) == 1:
        return spec.nodes[0].name
    return hostname.split(".")[0] if hostname else None


def _api_config(conn: Connection, node: str) -> Any:
    """The Proxmox API's configuration: HTTPS to ``--api-url`` (its login and certificate
    checks), else ``pvesh`` on this node. Raises ConfigError for a bad URL or TLS options."""
    from gputopo.adapters.credentials import ApiConfig

    timeout = DEFAULT_API_TIMEOUT if conn.api_timeout is None else conn.api_timeout
    if conn.api_url is None:
        return ApiConfig(backend="local", node=node, timeout=timeout)
    from gputopo.adapters.pinning import normalize_fingerprint

    host, port = parse_api_url(conn.api_url)
    _tls(conn)
    return ApiConfig(
        backend="https",
        host=host,
        port=port,
        node=node,
        user=conn.user or DEFAULT_USER,
        token_name=conn.token_name,
        verify_ssl=not conn.insecure,
        ca_bundle=conn.ca_bundle,
        fingerprint=normalize_fingerprint(conn.fingerprint) if conn.fingerprint else None,
        secret_file=conn.secret_file,
        timeout=timeout,
    )


def build_ports(
    conn: Connection, default_node: str | None = None, env: dict[str, str] | None = None
) -> Ports:
    """The ports for ``conn``: a simulated host's, or real sysfs/pct/host files plus the Proxmox API
    (``pvesh`` on this node without ``--api-url``).

    ``default_node`` is the node name used when ``--node`` is not given (:func:`node_for`); the
    host root's short hostname otherwise. Raises ConfigError for contradictory or ignored options and
    bad credentials, ProxmoxError when the API refuses the login, SimHostError for a ``--sim``
    directory that holds no simulated host.
    """
    if conn.sim is not None:
        if conn.api_url is not None or conn.local:
            raise ConfigError("--sim excludes --api-url and --local (the simulated host serves its own API)")
        sim = _sim_host(conn)
        _refuse_ignored(conn, timeout_used=False)
        require_sim_extra("--sim")  # its API serves HTTPS: one line, not an ImportError's traceback
        sim.start()
        return sim_ports(sim)

    if conn.api_url is not None and conn.local:
        raise ConfigError("--api-url and --local exclude each other")
    _refuse_ignored(conn, timeout_used=True)
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.adapters.http import RequestsHttp
    from gputopo.adapters.pct import PctExec
    from gputopo.adapters.proxmox import ProxmoxClient
    from gputopo.adapters.sysfs import RealSysfs

    root = host_root(conn)
    cfg = _api_config(conn, conn.node or default_node or this_host(root))
    client = ProxmoxClient.from_config(cfg, env=env)
    from gputopo.adapters.hostcmd import RealHostCommands
    from gputopo.adapters.udev import UdevEvents

    # commands run here change this machine: only when it is the host (--root /)
    host = RealHostCommands() if root == "/" else None
    from gputopo.adapters.clusterapi import ClusterApi
    from gputopo.adapters.ctfiles import RootContainerFiles, proc_root
    from gputopo.facts.ctread import ExecContainerFiles

    exec = PctExec()
    return Ports(
        sysfs=RealSysfs(root),
        proxmox=client,
        exec=exec,
        files=RealHostFiles(root),
        http=RequestsHttp(),
        host=host,
        # udev's events are this machine's: heard only when the root is the host's
        udev=UdevEvents() if root == "/" else None,
        cluster=ClusterApi(client),
        # a container's files through /proc/<init pid>/root when this is the node, else pct exec
        ctfiles=RootContainerFiles(proc_root(host, root), ExecContainerFiles(exec)),
    )


def sim_ports(sim: Any) -> Ports:
    """A started simulated host's ports, its containers' files read in their rootfs (as a real
    node reads ``/proc/<init pid>/root``): every path that plans on a simulated host reads the
    served model the same way."""
    return _with_ctfiles(sim.ports(), lambda vmid: str(sim.paths.rootfs(vmid)))


def _with_ctfiles(ports: Ports, root_of: Callable[[int], str | None]) -> Ports:
    """``ports`` reading containers' files under ``root_of(vmid)`` (a simulated container's
    rootfs), through exec where that is not a directory."""
    from dataclasses import replace

    from gputopo.adapters.ctfiles import RootContainerFiles
    from gputopo.facts.ctread import ExecContainerFiles

    return replace(ports, ctfiles=RootContainerFiles(root_of, ExecContainerFiles(ports.exec)))


def source_ports(conn: Connection, default_node: str | None = None) -> Ports | None:
    """For plan, render and diff: the ports of the API the current state is read from, or None
    when it is read from Proxmox's files (no ``--sim``, ``--api-url`` or ``--local``).

    Raises ConfigError for ``--pve-root`` with an API or an API option without one, and what
    :func:`build_ports` raises.
    """
    if not conn.live:
        _refuse_ignored(conn, timeout_used=False)
        return None
    if conn.pve_root is not None:
        raise ConfigError(
            "--pve-root reads Proxmox's files; --sim, --api-url and --local read the API instead"
        )
    return build_ports(conn, default_node=default_node)


def pve_root(conn: Connection) -> str:
    """Proxmox's config tree for the file source: ``--pve-root``, the simulated host's with
    ``--sim``, else ``/etc/pve``."""
    if conn.sim is not None:
        if conn.pve_root is not None:
            raise ConfigError("--pve-root and --sim exclude each other (a simulated host has its own)")
        return str(_sim_host(conn).paths.pve)
    return DEFAULT_PVE_ROOT if conn.pve_root is None else conn.pve_root


def require_sim_extra(command: str) -> None:
    """Check that the simulated host can run here: its Proxmox API serves HTTPS with a
    certificate made by the ``cryptography`` package, an optional extra (``gputopo[sim]``)
    that a node install may leave out.

    Raises UnavailableCommand (one line saying what to install) when it cannot be imported;
    ``command`` names what needs it (``sim``, ``demo``, ``--sim``).
    """
    try:
        from cryptography import x509  # noqa: F401  (what gputopo.sim.tls needs)
    except ImportError as e:
        from gputopo.errors import UnavailableCommand

        raise UnavailableCommand(
            command,
            ModuleNotFoundError(
                "the simulated host needs the 'cryptography' package for its HTTPS certificate: "
                "pip install 'gputopo[sim]' (pipx: pipx inject gputopo cryptography)",
                name="cryptography",
            ),
        ) from e
