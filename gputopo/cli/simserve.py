"""``gputopo sim serve``: run a simulated host's Proxmox API and inference endpoint in the
foreground, and say how to reach them."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import click


@click.command("serve")
@click.option(
    "--dir",
    "dir_",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Simulated host directory (created when missing or empty).",
)
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Serve a copy of this host root (e.g. an unpacked snapshot).",
)
@click.option(
    "--pve-root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="With --root: use a copy of this /etc/pve tree instead of the seed story's.",
)
@click.option(
    "--from",
    "source",
    default="seed",
    show_default=True,
    help="Fixture name, fixture .yaml or snapshot .tar.gz for a new host.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="API port (default: any free port).")
@click.option("--http", "plain_http", is_flag=True, help="Serve plain HTTP instead of HTTPS.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Say how to reach it as one JSON line (gputopo schema sim-serve): URL, CA file, the files "
    "holding the password and the token secret.",
)
def serve(
    dir_: Path | None,
    root: Path | None,
    pve_root: Path | None,
    source: str,
    port: int,
    plain_http: bool,
    as_json: bool,
) -> None:
    """Run a simulated host (or the API of a simulated cluster's first node, which answers for
    every node) in the foreground until Ctrl-C or SIGTERM; print how to reach it. The password
    and the token secret are also written to owner-only files in DIR/run, for --secret-file."""
    from gputopo.errors import ConfigError

    if dir_ is not None and root is not None:
        raise ConfigError("--dir and --root exclude each other")
    if pve_root is not None and root is None:
        raise ConfigError("--pve-root needs --root")
    scratch = None
    if dir_ is None:
        scratch = Path(tempfile.mkdtemp(prefix="gputopo-sim-"))
        dir_ = scratch / "host"
    try:
        host = _open_or_create(dir_, source, root, pve_root)
        from gputopo.sim.serving import claim

        # before anything is started or written: a second server would replace the secret files
        # the running one's clients read
        record = claim(host.paths.run, str(dir_))
        # taken before the server is announced: a client that stops it as soon as it read the
        # announcement gets a clean stop (the record released), not the default SIGTERM death
        stop = _stop_on_signal()
        try:
            host.start(port=port, tls=not plain_http)
            record.announce(host.api.url)
            files = _secret_files(host)
            if as_json:
                _announce_json(host, plain_http, files)
            else:
                _announce(host, plain_http)
            while not stop.wait(0.5):
                pass
            host.stop()
        finally:
            record.release()
        click.echo("stopped", err=True)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _open_or_create(dir_: Path, source: str, root: Path | None, pve_root: Path | None):
    """The host to serve from ``dir_``: a simulated cluster's first node (its API answers for
    every node), the host already there, or a new one from ``source`` or a copy of ``root``
    (with ``pve_root``'s /etc/pve instead of the seed story's)."""
    from gputopo.sim.cluster.peers import cluster_info
    from gputopo.sim.host import SimHost

    if cluster_info(dir_).get("nodes"):
        from gputopo.sim.cluster import SimCluster

        return SimCluster(dir_).member(next(iter(cluster_info(dir_)["nodes"])))
    if (dir_ / "run" / "host.json").is_file():
        return SimHost.open(dir_)
    host = SimHost.create(dir_, source=source, root=root)
    if pve_root is not None:
        shutil.rmtree(host.paths.pve)
        shutil.copytree(pve_root, host.paths.pve, symlinks=True)
    return host


def _stop_on_signal() -> threading.Event:
    """An event that SIGINT or SIGTERM sets from now on."""
    stop = threading.Event()
    # Set both explicitly: a server started from a background job inherits SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _secret_files(host) -> dict[str, str]:
    """Write the password and the token secret to owner-only files (``--secret-file`` refuses
    any other mode); returns their paths."""
    import os

    creds = host.credentials()
    out = {}
    for name, value in (("password_file", creds["password"]), ("token_secret_file", creds["token_value"])):
        path = host.paths.run / ("root-password" if name == "password_file" else "token-secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        os.chmod(path, 0o600)
        out[name] = str(path)
    return out


def _announce_json(host, plain_http: bool, files: dict[str, str]) -> None:
    import json

    from gputopo.model.documents import SimServeDoc

    creds = host.credentials()
    doc = SimServeDoc(
        node=host.node,
        pve_version=host.version,
        dir=str(host.dir),
        api_url=host.api.url,
        ca_file=None if plain_http else str(host.api.ca_cert_path),
        user=creds["user"],
        token_name=creds["token_name"],
        endpoint=host.endpoint.url if host.endpoint else None,
        container=host.container,
        **files,
    )
    # one line: a script reads it and goes on while the host serves
    click.echo(json.dumps(doc.model_dump(mode="json")))
    sys.stdout.flush()


def _announce(host, plain_http: bool) -> None:
    creds = host.credentials()
    api = host.api
    ca = None if plain_http else api.ca_cert_path
    token_header = f"PVEAPIToken={creds['token_id']}={creds['token_value']}"
    cacert = f"--cacert {ca} " if ca else ""
    lines = [
        f"simulated Proxmox VE {host.version} node {host.node} in {host.dir}",
        f"API:       {api.url}",
        f"CA file:   {ca}" if ca else "CA file:   (plain HTTP)",
        f"password:  {creds['user']} / {creds['password']}",
        f"token:     {creds['token_id']} = {creds['token_value']}",
        f"endpoint:  {host.endpoint.url} (container {host.container})" if host.endpoint else "",
        "try:",
        f"  curl {cacert}-H 'Authorization: {token_header}' {api.url}/version",
        "Ctrl-C stops it.",
    ]
    click.echo("\n".join(line for line in lines if line))
    sys.stdout.flush()
