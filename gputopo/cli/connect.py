"""How a command reaches a host: one set of options and the :class:`Connection` they fill (the
:class:`gputopo.ports.Ports` a connection builds are :mod:`gputopo.usecases.connect`'s).

Every command that reads or changes a host takes its options from :func:`connection_options`
and receives them as one ``conn: Connection``. A command asks only for the option groups it
uses, so an option that makes no sense for it is left off by construction: ``--help`` does not
offer it and click refuses it in one line (``No such option: --pve-root``).

======================  ==========================  ==========  =====  ======  ======
command                 ``--root``                  --pve-root  --sim  API(*)  --node
======================  ==========================  ==========  =====  ======  ======
plan, render, diff      a directory or a snapshot   yes         yes    yes     yes
init                    a directory or a snapshot   -           yes    yes     yes
export                  a directory or a snapshot   yes         yes    yes     yes
apply, recover, verify  a directory                 -           yes    yes     yes
watch                   a directory                 -           yes    yes     yes
topo                    a directory or a snapshot   yes         yes    -       yes
history                 a directory                 -           yes    -       -
discover                a directory or a snapshot   -           -      -       -
snapshot                a directory                 -           -      -       -
cluster plan, diff      -                           yes         yes    yes     -
cluster apply, verify   -                           -           yes    yes     -
======================  ==========================  ==========  =====  ======  ======

(*) ``--api-url`` (or ``GPUTOPO_PVE_URL``), ``--local``, ``--user``, ``--token-name``,
``--secret-file``, ``--ca-bundle``, ``--fingerprint``, ``--insecure``, ``--api-timeout``.

Where the options lead:

* ``--sim DIR``: a simulated host (``gputopo sim create DIR``); its Proxmox API and inference
  endpoint are served from this process on loopback, its root is ``DIR/root``;
* ``--api-url https://HOST[:PORT]``: the Proxmox API over HTTPS (API token with ``--token-name``,
  ``gputopo`` or the full ``root@pam!gputopo`` the web UI shows, else a password); secrets only
  from ``GPUTOPO_PVE_PASSWORD`` / ``GPUTOPO_PVE_TOKEN`` / ``GPUTOPO_PVE_TOKEN_SECRET`` or
  ``--secret-file``. The node's certificate is checked against the system CAs, ``--ca-bundle``,
  or pinned by its SHA-256 fingerprint with ``--fingerprint`` (as Proxmox's own clients pin a
  node: :mod:`gputopo.adapters.pinning`); ``--insecure`` checks nothing and says so on stderr.
  The three exclude each other. The node the API calls name is ``--node``, else the spec's
  only node, else this host's name (:func:`node_for`);
* ``--local``: ``pvesh`` and ``pct`` on the node itself; the default of apply, recover and
  verify without ``--api-url``;
* neither (plan, render, diff): Proxmox's files under ``--pve-root`` (default ``/etc/pve``).

An option that the chosen source would silently ignore is refused with a one-line
:class:`gputopo.errors.ConfigError` naming it (``--root`` with ``--sim``, ``--pve-root`` with an
API, ``--user`` without ``--api-url``, ...). ``GPUTOPO_PVE_URL`` is a default only: ``--sim``,
``--local`` or ``--pve-root`` on the command line set it aside.

On a real host sysfs writes, host files and ``pct exec`` work on ``--root`` (default ``/``).
The use cases build the ports from the connection and close them when done.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import click

from gputopo.cli.complete import complete_nodes
from gputopo.cli.params import Finite
from gputopo.usecases.connect import (
    DEFAULT_API_TIMEOUT,
    DEFAULT_PVE_ROOT,
    DEFAULT_USER,
    ENV_API_URL,
    HTTPS_ONLY,
    Connection,
)

_API = ("api_url", "local", *HTTPS_ONLY, "api_timeout")


def _option(field: str, snapshot: bool, sim: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The one definition of each connection option (``snapshot``/``sim`` shape ``--root``)."""
    if field == "root":
        archive = ", or a 'gputopo snapshot' .tar.gz" if snapshot else ""
        default = "/, or DIR/root with --sim" if sim else "/"
        return click.option(
            "--root",
            default=None,
            type=click.Path(file_okay=snapshot),
            help=f"Host root holding sys/, proc/, dev/, etc/{archive} (default: {default}).",
        )
    return {**_source_options(), **_https_options()}[field]


def _source_options() -> dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """The options that choose where the host and its Proxmox state are read."""
    return {
        "pve_root": click.option(
            "--pve-root",
            default=None,
            type=click.Path(file_okay=False),
            help=f"Proxmox's config tree to read the current state from when no API is given "
            f"(default: {DEFAULT_PVE_ROOT}; a missing one means nothing is configured yet).",
        ),
        "sim": click.option(
            "--sim",
            default=None,
            type=click.Path(file_okay=False),
            help="Work on the simulated host in DIR (gputopo sim create DIR).",
        ),
        "api_url": click.option(
            "--api-url",
            default=None,
            envvar=ENV_API_URL,
            show_envvar=True,
            help="Proxmox API over HTTPS, e.g. https://pve1:8006.",
        ),
        "local": click.option(
            "--local",
            is_flag=True,
            help="Reach Proxmox through pvesh and pct on this node (what apply, recover and "
            "verify do anyway without --api-url).",
        ),
        "node": click.option(
            "--node",
            default=None,
            shell_complete=complete_nodes,
            help="Proxmox node name (default: the spec's only node, else the host's name).",
        ),
    }


def _https_options() -> dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """The options of ``--api-url``'s login and certificate, and the API's timeout."""
    return {
        "user": click.option(
            "--user",
            default=None,
            help=f"Proxmox user of --api-url, password from GPUTOPO_PVE_PASSWORD or "
            f"--secret-file (default: {DEFAULT_USER}).",
        ),
        "token_name": click.option(
            "--token-name",
            default=None,
            help="API token id of --user, or the full id root@pam!gputopo as the web UI "
            "shows it; secret from GPUTOPO_PVE_TOKEN_SECRET or --secret-file "
            "(GPUTOPO_PVE_TOKEN=user@realm!id=secret replaces both).",
        ),
        "secret_file": click.option(
            "--secret-file",
            default=None,
            type=click.Path(dir_okay=False),
            help="Owner-only file holding the password or token secret.",
        ),
        "ca_bundle": click.option(
            "--ca-bundle",
            default=None,
            type=click.Path(dir_okay=False),
            help="CA certificate(s) to check the API's TLS certificate with.",
        ),
        "fingerprint": click.option(
            "--fingerprint",
            default=None,
            metavar="SHA256",
            help="Trust only the API certificate with this SHA-256 fingerprint "
            "(AA:BB:..., as the node's certificate view and GET /nodes show it).",
        ),
        "insecure": click.option(
            "--insecure",
            is_flag=True,
            help="Do not check the API's TLS certificate (prints a warning; --fingerprint pins it instead).",
        ),
        "api_timeout": click.option(
            "--api-timeout",
            default=None,
            type=Finite(),
            help=f"Seconds per Proxmox API call, --api-url or --local (default: {DEFAULT_API_TIMEOUT:g}).",
        ),
    }


def connection_options(
    *,
    snapshot: bool = False,
    pve_root: bool = False,  # noqa: F811  (the option group; the function is re-exported below)
    sim: bool = True,
    api: bool = True,
    node: bool = True,
    root: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Click decorator: add ``--root`` and the option groups asked for, and pass them to the
    command as one ``conn: Connection``.

    ``snapshot``: ``--root`` may be a snapshot archive; ``pve_root``: ``--pve-root``; ``sim``:
    ``--sim``; ``api``: ``--api-url`` and its companions; ``node``: ``--node``; ``root``: False
    leaves ``--root`` off (a cluster's nodes are read over SSH, not from a root here).
    """
    names = ["root"] * root + ["pve_root"] * pve_root + ["sim"] * sim + list(_API) * api + ["node"] * node

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            conn = Connection(**{name: kwargs.pop(name) for name in names})
            return f(*args, conn=_env_yields(conn), **kwargs)

        for name in reversed(names):
            wrapper = _option(name, snapshot, sim)(wrapper)
        return wrapper

    return decorate


def _env_yields(conn: Connection) -> Connection:
    """``conn`` without an ``--api-url`` that came from the environment when the command line
    chose another source: the environment is a default, the command line a decision."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if (
        conn.api_url is not None
        and (conn.sim is not None or conn.local or conn.pve_root is not None)
        and ctx is not None
        and ctx.get_parameter_source("api_url") == ParameterSource.ENVIRONMENT
    ):
        return dataclasses.replace(conn, api_url=None)
    return conn


# what the cluster and sim commands import from here: the ports a connection builds are the use
# cases' (gputopo.usecases.connect)
from gputopo.usecases.connect import build_ports, pve_root, require_sim_extra  # noqa: E402, F401
