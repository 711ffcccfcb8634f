"""``gputopo cluster plan | diff | apply | verify``: one spec for every node of a Proxmox cluster.

Each node is reached as the cluster's nodes reach each other: ``ssh root@<node>`` (BatchMode,
host keys checked; ``--ssh-config`` for an ssh_config of your own), where gputopo reads the
node in one round trip (``gputopo cluster node-read``: its facts, services and host files) and
applies (``gputopo apply``, the node's own lock and journal). The shared state (guests, PCI
mappings, HA) comes from the API of any node:
``--api-url``, ``--local`` on a node, or ``--sim DIR`` for a simulated cluster (``gputopo sim
create --nodes 3 DIR``; without ``--ssh-config`` its nodes' shells run here). ``plan`` and
``diff`` can also work offline from ``--facts DIR`` (``<node>.json`` from ``gputopo discover
--json`` or ``<node>.tar.gz`` from ``gputopo snapshot``) and Proxmox's files (``--pve-root``).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from gputopo.cli.connect import Connection, build_ports, connection_options, pve_root
from gputopo.cli.params import Finite
from gputopo.exitcodes import with_exit_codes

DEFAULT_TIMEOUT = 120.0


@dataclass
class _Cluster:
    """What one cluster command works with; ``close()`` stops what was started."""

    spec: Any
    spec_text: str
    nodes: list[str]
    shell: Any = None
    ports: Any = None
    api: Any = None
    members: list[str] | None = None
    inputs: dict = field(default_factory=dict)
    ha: Any = None
    begun: Any = None  # the nodes' own reads, begun while the API is reached (until _read takes them)

    def close(self) -> None:
        if self.begun is not None:
            self.begun.close(abort=True)  # only reads run while they are here: their answers are not wanted
            self.begun = None
        if self.ports is not None:
            self.ports.close()


def _nodes_option(value: str | None) -> list[str] | None:
    return [n.strip() for n in value.split(",") if n.strip()] if value else None


@dataclass(frozen=True)
class Reach:
    """The spec, the node selection and how nodes are reached: what every cluster command takes."""

    spec_file: str
    nodes: str | None
    ssh_config: str | None
    ssh_user: str
    ssh_options: tuple[str, ...]
    ssh_timeout: float
    timeout: float


def cluster_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The spec, the node selection and how nodes are reached (SSH, timeouts), handed to the
    command as one ``reach`` (:class:`Reach`)."""
    names = [fl.name for fl in dataclasses.fields(Reach)]

    @functools.wraps(command)
    def f(*args: Any, **kwargs: Any) -> Any:
        return command(*args, reach=Reach(**{n: kwargs.pop(n) for n in names}), **kwargs)

    f = click.option(
        "--timeout",
        "timeout",
        type=Finite(),
        default=DEFAULT_TIMEOUT,
        show_default=True,
        help="Seconds one command on a node may take (reading it, its verify).",
    )(f)
    f = click.option(
        "--ssh-timeout",
        type=Finite(),
        default=10.0,
        show_default=True,
        help="Seconds to connect to a node over SSH.",
    )(f)
    f = click.option(
        "--ssh-option",
        "-o",
        "ssh_options",
        multiple=True,
        metavar="OPTION",
        help="An ssh -o option for every node (repeatable), e.g. Port=2222.",
    )(f)
    f = click.option("--ssh-user", default="root", show_default=True, help="The user ssh logs in as.")(f)
    f = click.option(
        "--ssh-config",
        type=click.Path(dir_okay=False, exists=True),
        default=None,
        help="An ssh_config (ssh -F) naming the nodes' addresses, keys and known hosts.",
    )(f)
    f = click.option(
        "--nodes", "nodes", default=None, metavar="A,B", help="Only these nodes (default: the spec's)."
    )(f)
    f = click.option(
        "--spec", "spec_file", required=True, type=click.Path(dir_okay=False), help="Spec file."
    )(f)
    return f


def _open(conn: Connection, reach: Reach, facts_dir: str | None = None) -> _Cluster:
    """Load the spec and reach the cluster as the options say. Raises ConfigError, SpecError,
    UnknownNode, ProxmoxError, SimHostError."""
    from gputopo.adapters.ssh import SshRunner
    from gputopo.errors import ConfigError
    from gputopo.plan.spec import parse_spec, read_spec_text

    text = read_spec_text(reach.spec_file)  # once: the nodes are sent this text, and it may be a pipe
    spec = parse_spec(text, reach.spec_file)
    wanted = _nodes_option(reach.nodes)
    if conn.live and conn.pve_root is not None:
        raise ConfigError(
            "--pve-root reads Proxmox's files; --sim, --api-url and --local read the API instead"
        )
    c = _Cluster(spec=spec, spec_text=text, nodes=[])
    ssh = SshRunner(
        user=reach.ssh_user,
        config_file=reach.ssh_config,
        options=reach.ssh_options,
        connect_timeout=reach.ssh_timeout,
    )
    if conn.sim is not None and (conn.api_url is not None or conn.local):
        raise ConfigError("--sim excludes --api-url and --local (the simulated cluster serves its own API)")
    if not conn.live and facts_dir is None:
        raise ConfigError(
            "reach the cluster with --api-url URL (or --local on a node, --sim DIR), "
            "or plan offline with --facts DIR"
        )
    if conn.live and (conn.sim is None or reach.ssh_config):
        c.shell = ssh  # (a simulated cluster without --ssh-config runs each node's shell here)

    def begin() -> None:
        # each node reads itself (one round trip) while the rest loads and the API is reached;
        # they only read (a node --nodes or the cluster does not know is refused below)
        if facts_dir is None and c.shell is not None and c.begun is None:
            from gputopo.cluster.noderead import NodeReads

            names = [n.name for n in spec.nodes if wanted is None or n.name in wanted]
            c.begun = NodeReads(spec, names, c.shell, reach.timeout)

    try:
        begin()
        if conn.sim is not None:
            from gputopo.cli.connect import require_sim_extra
            from gputopo.sim.cluster import SimCluster

            require_sim_extra("cluster")
            sim = SimCluster(conn.sim)
            c.shell = c.shell or sim.shell()
            begin()
            c.ports = sim.ports()
        elif conn.live:
            c.ports = build_ports(conn, default_node=spec.nodes[0].name)
        if c.ports is not None:
            from gputopo.adapters.clusterapi import ClusterApi

            c.api = ClusterApi(c.ports.proxmox)
            c.members = c.api.members()
        from gputopo.cluster.gather import select_nodes

        c.nodes = select_nodes(spec, wanted, c.members)
    except BaseException:
        c.close()
        raise
    return c


def _read(c: _Cluster, conn: Connection, timeout: float, facts_dir: str | None, with_ha: bool = True) -> None:
    from gputopo.cluster.gather import read_cluster, read_offline
    from gputopo.cluster.ha import read_ha

    if facts_dir is not None:
        c.inputs = read_offline(
            c.spec,
            c.nodes,
            Path(facts_dir),
            pve_root(conn) if c.ports is None else None,
            c.ports.proxmox if c.ports is not None else None,
        )
    else:
        begun, c.begun = c.begun, None
        c.inputs = read_cluster(c.spec, c.nodes, c.shell, c.ports.proxmox, timeout, begun=begun, ha=with_ha)
    if with_ha and c.api is not None:
        c.ha = read_ha(c.api)


def _plan(c: _Cluster):
    from gputopo.cluster.plan import plan_cluster
    from gputopo.errors import PlanRefused

    try:
        return plan_cluster(c.spec, c.inputs, c.nodes, ha=c.ha, members=c.members)
    except PlanRefused as e:
        from gputopo.cli.output import print_refused

        print_refused(e)
        sys.exit(e.exit_code)


@click.group()
@with_exit_codes("cluster")
def cluster() -> None:
    """Plan, apply and verify one spec on every node of a Proxmox cluster (nodes over SSH)."""


@cluster.command("plan")
@cluster_options
@connection_options(pve_root=True, node=False, root=False)
@click.option(
    "--facts",
    "facts_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="Plan offline: <node>.json (gputopo discover --json) or <node>.tar.gz (gputopo snapshot) per node.",
)
@click.option("--json", "as_json", is_flag=True, help="The cluster plan as JSON.")
def plan_cmd(
    conn: Connection,
    reach: Reach,
    facts_dir,
    as_json,
):
    """One section per node, the cluster-wide mappings once, the HA placement.

    Exit codes: 0 a plan (or no changes), 2 bad input, a refused plan, an unreachable node or a
    node running another gputopo version (nothing was changed anywhere).
    """
    c = _open(conn, reach, facts_dir)
    try:
        _read(c, conn, reach.timeout, facts_dir)
        cplan = _plan(c)
    finally:
        c.close()
    if as_json:
        from gputopo.cli.output import print_json

        print_json(cplan.to_data())
    else:
        sys.stdout.write(cplan.to_text())


@cluster.command("node-read", hidden=True)
@click.option(
    "--reads",
    "reads_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="What to read here, as JSON (/dev/stdin: what the cluster side sends).",
)
@connection_options(api=False, node=False, root=False)
def node_read_cmd(conn: Connection, reads_file):
    """This node's facts and the reads a cluster command asked for, as one JSON document: what
    the cluster commands run on each node over SSH (internal; the same gputopo on both ends).

    Exit codes: 0 read, 2 bad input (the reads, the host root).
    """
    import json

    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.cluster.noderead import node_facts, read_node, read_reads

    if conn.sim is not None:
        from gputopo.sim.container import SimExec, SimPaths

        root = str(SimPaths(Path(conn.sim)).root)
        exec_port = SimExec(conn.sim)
    else:
        from gputopo.adapters.pct import PctExec

        root, exec_port = "/", PctExec()
    facts = node_facts(root)  # first: the cluster side sends the reads meanwhile
    reads = read_reads(reads_file)  # no spec here: the node's part costs about what discover does
    doc = read_node(facts, reads, exec_port, RealHostFiles(root))
    sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")


@cluster.command("diff")
@cluster_options
@connection_options(pve_root=True, node=False, root=False)
@click.option(
    "--facts",
    "facts_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="Offline: <node>.json or <node>.tar.gz per node.",
)
@click.option(
    "--exit-code", "exit_code", is_flag=True, help="Exit 0: no difference, 2: differences, 1: error."
)
@click.option("--json", "as_json", is_flag=True, help="The differences as JSON.")
def diff_cmd(
    conn: Connection,
    reach: Reach,
    facts_dir,
    exit_code,
    as_json,
):
    """How every node (and the HA placement) differs from the spec.

    Exit codes: 0, or 2 for bad input; with --exit-code 0 no difference anywhere, 2 differences,
    1 any error.
    """
    from gputopo.cli.output import exit_with_error, print_diff
    from gputopo.cluster.diff import diff_cluster
    from gputopo.errors import GputopoError

    try:
        c = _open(conn, reach, facts_dir)
        try:
            _read(c, conn, reach.timeout, facts_dir)
            cplan = _plan(c)
            report = diff_cluster(c.spec, c.inputs, c.nodes, cplan.ha, c.ha)
        finally:
            c.close()
    except GputopoError as e:
        if not exit_code:
            raise
        exit_with_error(e, 1)
    print_diff(report, as_json, exit_code)


@cluster.command("apply")
@cluster_options
@connection_options(node=False, root=False)
@click.option(
    "--serial",
    type=click.IntRange(1, None),
    default=1,
    show_default=True,
    help="How many nodes apply at the same time.",
)
@click.option("--canary", default=None, metavar="NODE", help="Apply this node first, alone.")
@click.option(
    "--node-timeout",
    type=Finite(),
    default=1800.0,
    show_default=True,
    help="Seconds one node's apply may take.",
)
@click.option("--dry-run", is_flag=True, help="Show the cluster plan; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before changing the cluster.")
@click.option("--no-verify", is_flag=True, help="The nodes do not run verify after applying.")
@click.option("--no-ha", is_flag=True, help="Leave the HA placement alone (passed on to each node's apply).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document on stdout (gputopo schema cluster-apply): every node's outcome and its "
    "own apply document; the plan and progress go to stderr.",
)
def apply_cmd(
    conn: Connection,
    reach: Reach,
    serial,
    canary,
    node_timeout,
    dry_run,
    yes,
    no_verify,
    no_ha,
    as_json,
):
    """Apply node by node over SSH, each node its own apply (lock, journal, rollback); stop at
    the first failure. Each node's apply makes its part of the HA placement. It ends with an account, also when it fails: per node
    applied-and-kept, no-changes, applied-then-rolled-back, failed-verify-kept (its changes stay),
    needs-human, not-started, unknown (the connection was lost during its apply: the next step
    is named) or refused (nothing changed there).

    Exit codes: 0 every node applied (or no changes); 2 (4: a node's lock) only when nothing
    was changed anywhere; 1 a node failed and rolled back, or failed after another node was
    changed and kept; 3 a node needs a human or its outcome is unknown.
    """
    from gputopo.cli.output import print_json
    from gputopo.cluster.rolling import RollingResult, batches, rolling_apply
    from gputopo.errors import ClusterApplyFailed, ConfigError, GputopoError

    nodes: list[str] = []
    try:
        c = _open(conn, reach)
        nodes = c.nodes
        try:
            _read(c, conn, reach.timeout, None, with_ha=not no_ha)
            try:
                cplan = _plan(c)
            except SystemExit as stop:  # a refused plan: its refusals are on stderr
                if as_json:
                    refused = GputopoError("the plan was refused (its refusals are on stderr)")
                    refused.exit_code = stop.code if isinstance(stop.code, int) else 2
                    print_json(RollingResult.unstarted(nodes).to_doc("refused", refused))
                raise
            batches(c.nodes, serial, canary)  # a bad --canary or --serial is refused before anything runs
            click.echo(cplan.to_text(), nl=False, err=as_json)
            empty = {n.node for n in cplan.nodes if n.plan.is_empty}
            if cplan.is_empty or dry_run:
                if as_json:
                    print_json(
                        RollingResult.unstarted(nodes, empty).to_doc("dry-run" if dry_run else "no-changes")
                    )
                return
            if not yes:
                if not sys.stdin.isatty():
                    raise ConfigError(
                        "refusing to change the cluster without confirmation: pass --yes "
                        "(stdin is not a terminal)"
                    )
                if not click.confirm(
                    f"Apply on {len(c.nodes)} node(s), {serial} at a time?", default=False, err=as_json
                ):
                    from gputopo.errors import ApplyCancelled

                    raise ApplyCancelled()

            def report(o) -> None:
                click.echo(o.progress(), err=as_json)

            try:
                result = rolling_apply(
                    cplan,
                    c.spec_text,
                    c.shell,
                    not no_ha,
                    serial=serial,
                    canary=canary,
                    timeout=node_timeout,
                    verify=not no_verify,
                    report=report,
                )
            except ClusterApplyFailed as e:
                # the account, also (above all) when the rollout stopped
                if as_json:
                    print_json(e.account.to_doc())
                else:
                    click.echo(e.account.to_text(), nl=False)
                raise
        finally:
            c.close()
    except ClusterApplyFailed:
        raise
    except GputopoError as e:
        # refused before any node's apply: nothing was changed anywhere
        if as_json:
            print_json(RollingResult.unstarted(nodes).to_doc("refused", e))
        raise
    if as_json:
        print_json(result.to_doc())
    else:
        click.echo(result.to_text(), nl=False)


@cluster.command("verify")
@cluster_options
@connection_options(node=False, root=False)
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def verify_cmd(conn: Connection, reach: Reach, as_json):
    """Every node's own verify (Proxmox's mapping check for that node included) and the
    cluster's checks: converged, offline migration to nodes without the mapping.

    Exit codes: 0 all clear, 1 any FAIL, 2 bad input or an unreachable node.
    """
    from gputopo.cluster.verify import verify_cluster
    from gputopo.errors import VerifyFailed

    c = _open(conn, reach)
    try:
        _read(c, conn, reach.timeout, None)
        cplan = _plan(c)
        vms = [(n, vmid) for n in c.nodes for vmid in c.inputs[n].current.guests]
        # a node's verify waits for its inference probe (verify.timeout) on top of its checks
        report = verify_cluster(
            cplan,
            c.spec_text,
            c.shell,
            c.api,
            c.ha,
            vms,
            max(reach.timeout, c.spec.verify.timeout + DEFAULT_TIMEOUT),
        )
    finally:
        c.close()
    if as_json:
        from gputopo.cli.output import print_json

        print_json(report)
    else:
        _print_report(report)
    if not report.ok:
        raise VerifyFailed(report.summary_line())


def _print_report(report) -> None:
    from rich.table import Table
    from rich.text import Text

    from gputopo.cli.output import STYLE, console

    table = Table(title="gputopo cluster verify", title_justify="left")
    for col in ("NODE", "CHECK", "STATUS", "RESULT"):
        table.add_column(col, no_wrap=col != "RESULT", overflow="fold")
    for n in report.nodes:
        for ch in n.checks:
            table.add_row(n.node, ch.name, Text(ch.status, style=STYLE[ch.status]), ch.summary)
    for ch in report.checks:
        table.add_row("cluster", ch.name, Text(ch.status, style=STYLE[ch.status]), ch.summary)
    out = console()
    out.print(table)
    out.print(Text(report.summary_line(), style="bold green" if report.ok else "bold red"))
