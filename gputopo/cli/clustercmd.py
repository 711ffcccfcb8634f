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

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from gputopo.cli.connect import Connection, build_ports, connection_options, require_sim_extra
from gputopo.cli.params import Finite
from gputopo.exitcodes import with_exit_codes
from gputopo.usecases.cluster_connect import DEFAULT_TIMEOUT, ClusterReach, ClusterSource


def cluster_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The spec, the node selection and how nodes are reached (SSH, timeouts), handed to the
    command as one ``reach`` (:class:`ClusterReach`)."""
    names = list(ClusterReach.model_fields)

    @functools.wraps(command)
    def f(*args: Any, **kwargs: Any) -> Any:
        return command(*args, reach=ClusterReach(**{n: kwargs.pop(n) for n in names}), **kwargs)

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


def _source(conn: Connection) -> ClusterSource:
    """Where the connection options say the shared state comes from: ``--sim``, the API of
    ``--api-url`` or ``--local`` (built when the cluster is reached), else Proxmox's files."""
    api = None
    if conn.api_url is not None or conn.local:
        api = functools.partial(_api_ports, conn)
    return ClusterSource(
        sim=conn.sim,
        api=api,
        pve_root=conn.pve_root,
        sim_ready=functools.partial(require_sim_extra, "cluster"),
    )


def _api_ports(conn: Connection, default_node: str):
    return build_ports(conn, default_node=default_node)


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
def plan_cmd(conn: Connection, reach: ClusterReach, facts_dir, as_json):
    """One section per node, the cluster-wide mappings once, the HA placement.

    Exit codes: 0 a plan (or no changes), 2 bad input, a refused plan, an unreachable node or a
    node running another gputopo version (nothing was changed anywhere).
    """
    from gputopo.cli.output import print_json
    from gputopo.usecases.cluster_plan import ClusterPlanRequest, cluster_plan

    cplan = cluster_plan(ClusterPlanRequest(reach, _source(conn), facts_dir))
    if as_json:
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

    from gputopo.usecases.cluster_noderead import NodeReadRequest, node_read

    doc = node_read(NodeReadRequest(reads_file=reads_file, sim=conn.sim))
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
def diff_cmd(conn: Connection, reach: ClusterReach, facts_dir, exit_code, as_json):
    """How every node (and the HA placement) differs from the spec.

    Exit codes: 0, or 2 for bad input; with --exit-code 0 no difference anywhere, 2 differences,
    1 any error.
    """
    from gputopo.cli.output import exit_with_error, print_diff
    from gputopo.errors import GputopoError
    from gputopo.usecases.cluster_diff import cluster_diff
    from gputopo.usecases.cluster_plan import ClusterPlanRequest

    try:
        report = cluster_diff(ClusterPlanRequest(reach, _source(conn), facts_dir))
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
    reach: ClusterReach,
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
    from gputopo.cli.clusterview import print_applied
    from gputopo.usecases.cluster_apply import ClusterApplyRequest, cluster_apply

    def confirm(question: str) -> bool:
        return click.confirm(question, default=False, err=as_json)

    result = cluster_apply(
        ClusterApplyRequest(
            reach=reach,
            source=_source(conn),
            serial=serial,
            canary=canary,
            node_timeout=node_timeout,
            dry_run=dry_run,
            yes=yes,
            verify=not no_verify,
            ha=not no_ha,
            show=lambda text: click.echo(text, nl=False, err=as_json),
            progress=lambda line: click.echo(line, err=as_json),
            confirm=confirm if sys.stdin.isatty() else None,
        )
    )
    print_applied(result, as_json)
    if result.error is not None:
        raise result.error


@cluster.command("verify")
@cluster_options
@connection_options(node=False, root=False)
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def verify_cmd(conn: Connection, reach: ClusterReach, as_json):
    """Every node's own verify (Proxmox's mapping check for that node included) and the
    cluster's checks: converged, offline migration to nodes without the mapping.

    Exit codes: 0 all clear, 1 any FAIL, 2 bad input or an unreachable node.
    """
    from gputopo.cli.clusterview import print_cluster_report
    from gputopo.cli.output import print_json
    from gputopo.errors import VerifyFailed
    from gputopo.usecases.cluster_verify import ClusterVerifyRequest, cluster_verify

    report = cluster_verify(ClusterVerifyRequest(reach, _source(conn)))
    if as_json:
        print_json(report)
    else:
        print_cluster_report(report)
    if not report.ok:
        raise VerifyFailed(report.summary_line())
