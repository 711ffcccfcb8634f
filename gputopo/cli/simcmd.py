"""``gputopo sim``: create and serve a simulated Proxmox VE host (rehearsal and demos)."""

from __future__ import annotations

import re
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import click

from gputopo.cli.connect import require_sim_extra
from gputopo.exitcodes import with_exit_codes


@click.group()
@with_exit_codes("sim")
def sim() -> None:
    """A simulated Proxmox VE host: kernel sysfs, Proxmox API, containers and their service."""
    # Checked for every subcommand, 'create' too: a host made here is only of use served
    # (sim serve, or --sim DIR on the other commands), and that needs the certificate.
    require_sim_extra("sim")


@sim.command("create")
@click.argument("dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--from",
    "source",
    default="seed",
    show_default=True,
    help="Fixture name, fixture .yaml or a 'gputopo snapshot' .tar.gz.",
)
@click.option("--node", default=None, help="Node name (default: the host's hostname).")
@click.option(
    "--service",
    type=click.Choice(["sglang", "vllm"]),
    default="sglang",
    show_default=True,
    help="The inference server running in the container.",
)
@click.option(
    "--pve-version",
    type=click.Choice(["8.4.1", "9.1.2"]),
    default="8.4.1",
    show_default=True,
    help="Proxmox VE release to behave as (9: new devN are hot-plugged into a running container).",
)
@click.option(
    "--nodes",
    "count",
    type=click.IntRange(2, 64),
    default=None,
    help="A cluster of this many nodes (pve1..pveN) sharing one /etc/pve instead of one host.",
)
@click.option(
    "--ha",
    "ha",
    multiple=True,
    metavar="SID",
    help="Make a guest an HA resource (ct:101, vm:201; repeatable): its start and stop go through "
    "the HA manager, which moves it seconds after the task ends.",
)
def create(
    dir: Path,
    source: str,
    node: str | None,
    service: str,
    pve_version: str,
    count: int | None,
    ha: tuple[str, ...] = (),
) -> None:
    """Create a simulated host in DIR (the seed story: container 101 serving on every GPU), or
    with --nodes N a cluster of N such hosts (containers 101.., VMs 201.., one /etc/pve)."""
    if count is not None:
        from gputopo.errors import ConfigError
        from gputopo.sim.cluster import SimCluster, create_cluster

        if node is not None:
            raise ConfigError("--node names one host; a cluster's nodes are pve1..pveN")
        create_cluster(dir, count, source=source, service=service, pve_version=pve_version)
        c = SimCluster(dir)
        members = ", ".join(f"{n} ({c.addresses[n]}, CT {c.container(n)}, VM {c.vm(n)})" for n in c.nodes)
        click.echo(f"created simulated cluster of {len(c.nodes)} nodes in {dir}: {members}")
        return
    from gputopo.errors import ConfigError
    from gputopo.sim.host import SimHost

    for sid in ha:
        if not re.fullmatch(r"(ct|vm):\d+", sid):
            raise ConfigError(f"--ha {sid}: an HA resource id is ct:<vmid> or vm:<vmid>")
    existed = dir.exists()
    host = SimHost.create(dir, source=source, node=node, service=service, pve_version=pve_version)
    try:
        for sid in ha:
            host.make_ha_managed(sid)
    except BaseException:
        _undo_create(dir, existed)
        raise
    click.echo(f"created simulated host {host.node} in {dir} (container {host.container})")


def _undo_create(dir: Path, existed: bool) -> None:
    """Leave ``dir`` as it was before ``sim create`` made a host in it: absent, or empty."""
    if not existed:
        shutil.rmtree(dir, ignore_errors=True)
        return
    for p in dir.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


@sim.command("serve")
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
    from gputopo.sim.host import SimHost

    if dir_ is not None and root is not None:
        raise ConfigError("--dir and --root exclude each other")
    if pve_root is not None and root is None:
        raise ConfigError("--pve-root needs --root")
    scratch = None
    if dir_ is None:
        scratch = Path(tempfile.mkdtemp(prefix="gputopo-sim-"))
        dir_ = scratch / "host"
    try:
        from gputopo.sim.cluster.peers import cluster_info

        if cluster_info(dir_).get("nodes"):
            # a simulated cluster: its first node's API answers for every node
            from gputopo.sim.cluster import SimCluster

            host = SimCluster(dir_).member(next(iter(cluster_info(dir_)["nodes"])))
        elif (dir_ / "run" / "host.json").is_file():
            host = SimHost.open(dir_)
        else:
            host = SimHost.create(dir_, source=source, root=root)
            if pve_root is not None:
                shutil.rmtree(host.paths.pve)
                shutil.copytree(pve_root, host.paths.pve, symlinks=True)
        from gputopo.sim.serving import claim

        # before anything is started or written: a second server would replace the secret files
        # the running one's clients read
        record = claim(host.paths.run, str(dir_))
        try:
            host.start(port=port, tls=not plain_http)
            record.announce(host.api.url)
            files = _secret_files(host)
            if as_json:
                _announce_json(host, plain_http, files)
            else:
                _announce(host, plain_http)
            stop = threading.Event()
            # Set both explicitly: a server started from a background job inherits SIGINT ignored.
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            while not stop.wait(0.5):
                pass
            host.stop()
        finally:
            record.release()
        click.echo("stopped", err=True)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


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


@sim.group("guest")
def guest() -> None:
    """Start, stop or show a simulated host's containers and VMs through its Proxmox API, as
    'pct start' or 'qm stop' would on a node: no curl, no login ticket."""


def _sim_option(f):
    return click.option(
        "--sim",
        "sim_dir",
        required=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Simulated host directory (gputopo sim create DIR).",
    )(f)


def _guests(proxmox, vmid: int | None) -> list[tuple[str, int, str]]:
    """(kind, vmid, status) of every guest on the node, or of ``vmid`` alone. Raises
    SimGuestError with Proxmox's words for a vmid that is neither a container nor a VM:
    "no such VM ('999')" (pve-firewall src/PVE/API2/Firewall/VM.pm, get_options: the vmid looked
    up in the cluster's vmlist, whatever its kind)."""
    from gputopo.errors import SimGuestError

    found = [
        (kind, int(g["vmid"]), str(g.get("status") or "unknown"))
        for kind in ("lxc", "qemu")
        for g in proxmox.list_guests(kind)
        if vmid is None or str(g.get("vmid")) == str(vmid)
    ]
    if vmid is not None and not found:
        raise SimGuestError(f"no such VM ('{vmid}')", bad_input=True)
    return sorted(found, key=lambda g: g[1])


def _label(kind: str, vmid: int) -> str:
    return f"{'CT' if kind == 'lxc' else 'VM'} {vmid}"


def _power(sim_dir: Path, vmid: int, action: str) -> None:
    """POST the guest's status/{action} to the simulated host's API and wait for its task, as
    gputopo's own apply does (the ProxmoxClient over HTTPS with a root@pam ticket)."""
    from gputopo.errors import ProxmoxError, SimGuestError, TaskFailed
    from gputopo.sim.host import SimHost

    ports = SimHost.open(sim_dir).ports()
    try:
        ((kind, _, _),) = _guests(ports.proxmox, vmid)
        try:
            ports.proxmox.guest_action(kind, vmid, action, timeout=300.0)
        except TaskFailed as e:
            # the task's own last word, as pct/qm print it ("VM 201 already running")
            raise SimGuestError(str(e.exitstatus or e).strip()) from None
        except ProxmoxError as e:
            # refused before a task began: Proxmox's message ("CT 101 already running", 500),
            # and nothing was changed
            raise SimGuestError(str(e.pve_message or e).strip(), bad_input=True) from None
        status = ports.proxmox.guest_status(kind, vmid)
    finally:
        ports.close()
    click.echo(f"{_label(kind, vmid)}: {status}")


@guest.command("start")
@click.argument("vmid", type=click.IntRange(100, 999999999))
@_sim_option
def guest_start(vmid: int, sim_dir: Path) -> None:
    """Start container or VM VMID (its start hooks run: a VM's GPUs go to vfio-pci)."""
    _power(sim_dir, vmid, "start")


@guest.command("stop")
@click.argument("vmid", type=click.IntRange(100, 999999999))
@_sim_option
def guest_stop(vmid: int, sim_dir: Path) -> None:
    """Stop container or VM VMID at once (Proxmox's stop, not a shutdown)."""
    _power(sim_dir, vmid, "stop")


@guest.command("status")
@click.argument("vmid", type=click.IntRange(100, 999999999), required=False)
@_sim_option
def guest_status(vmid: int | None, sim_dir: Path) -> None:
    """Each container's and VM's status (or VMID's alone), one line each: 'CT 101: running'."""
    from gputopo.sim.host import SimHost

    ports = SimHost.open(sim_dir).ports()
    try:
        rows = _guests(ports.proxmox, vmid)
    finally:
        ports.close()
    for kind, n, status in rows:
        click.echo(f"{_label(kind, n)}: {status}")


@sim.command("cluster-ssh")
@click.argument("dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def cluster_ssh(dir: Path) -> None:
    """Serve each node of the simulated cluster in DIR (gputopo sim create --nodes N DIR) over
    real SSH on loopback, as a real cluster's nodes are reached: one sshd per node on its own
    address (127.0.0.11, .12, ...), generated host and user keys, and DIR/ssh_config for
    'gputopo cluster ... --ssh-config'. Runs in the foreground until Ctrl-C or SIGTERM (put it
    in the background with '&', as 'sim serve'); DIR/ssh_config goes with it. Needs
    /usr/sbin/sshd and root (exit 2 otherwise)."""
    from gputopo.sim.cluster import SimCluster
    from gputopo.sim.cluster.sshd import serve
    from gputopo.sim.serving import claim

    cluster = SimCluster(dir.resolve())
    record = claim(cluster.dir / "run", str(dir), "cluster-ssh.json", "gputopo sim cluster-ssh")
    try:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())

        def ready(nodes) -> None:
            record.announce(str(cluster.dir / "ssh_config"))
            config = dir / "ssh_config"
            lines = [f"simulated cluster {dir}: {len(cluster.nodes)} nodes over SSH"]
            lines += [f"  {n}: root@{cluster.addresses[n]} port {nodes.ports[n]}" for n in cluster.nodes]
            lines += [
                f"ssh_config: {config}",
                "try:",
                f"  ssh -F {config} {cluster.nodes[0]} -- gputopo --version",
                f"  gputopo init --sim {dir} -o spec.yaml",
                f"  gputopo cluster plan --sim {dir} --ssh-config {config} --spec spec.yaml",
                "Ctrl-C stops it.",
            ]
            click.echo("\n".join(lines))
            sys.stdout.flush()

        serve(cluster, stop, on_ready=ready)
    finally:
        record.release()
    click.echo("stopped", err=True)


_node_option = click.option(
    "--node", default=None, help="The cluster's node to act on (DIR made with --nodes N)."
)


@sim.command("break")
@click.argument("fault", required=False)
@click.argument("dir", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@_node_option
@click.option(
    "--address", default=None, help="gpu-missing: the GPU that falls off (default: the last on nvidia)."
)
@click.option(
    "--seconds", type=click.FloatRange(0), default=None, help="hung-endpoint, slow-shutdown: how long."
)
@click.option(
    "--list", "list_", is_flag=True, help="List the faults, what each breaks and how gputopo sees it."
)
def break_(
    fault: str | None,
    dir: Path | None,
    node: str | None,
    address: str | None,
    seconds: float | None,
    list_: bool,
) -> None:
    """Put FAULT into the simulated host in DIR (or, with --node, into a node of the simulated
    cluster in DIR) until 'gputopo sim heal'. 'gputopo sim break --list' lists the faults."""
    from gputopo.errors import ConfigError
    from gputopo.sim import faults

    if list_:
        width = max(map(len, faults.FAULTS))
        for f in faults.FAULTS.values():
            where = " (a cluster's node)" if f.cluster_only else ""
            click.echo(f"{f.name:<{width}}  {f.what}{where}\n{'':<{width}}  seen: {f.seen}")
        return
    if fault is None or dir is None:
        raise ConfigError("usage: gputopo sim break FAULT [--node NODE] DIR (gputopo sim break --list)")
    opts = {k: v for k, v in (("address", address), ("seconds", seconds)) if v is not None}
    did = faults.put(dir, fault, node, **opts)
    click.echo(f"broke {fault}: {did} (gputopo sim heal {fault}{f' --node {node}' if node else ''} {dir})")


@sim.command("heal")
@click.argument("words", nargs=-1, required=True, metavar="[FAULT] DIR")
@_node_option
def heal(words: tuple[str, ...], node: str | None) -> None:
    """Take FAULT (every fault when none is named) out of the simulated host in DIR, or out of
    a simulated cluster's nodes (--node: that one alone)."""
    from gputopo.errors import ConfigError
    from gputopo.sim import faults

    if len(words) > 2:
        raise ConfigError("usage: gputopo sim heal [FAULT] [--node NODE] DIR")
    name, dir = (words[0], Path(words[1])) if len(words) == 2 else (None, Path(words[0]))
    if name is not None:
        faults.fault(name)  # an unknown name is refused before anything is read
    healed = faults.take(dir, name, node)
    click.echo(f"healed: {', '.join(healed)}" if healed else "nothing to heal")
