"""``gputopo cluster apply``: the cluster plan shown, confirmed, then applied node by node.

The flow: read every node and plan (a refused plan changes nothing anywhere), check the order
(``--serial``, ``--canary``), show the plan, ask (unless ``yes``), then the rollout
(:func:`gputopo.cluster.rolling.rollout`: node by node, stop at the first failure). Ctrl-C,
SIGTERM (systemd stopping the unit it runs in, ``kill``) and SIGHUP (the SSH session to the
machine it runs on dropped) during the rollout end it alike: the nodes applying then answer or
are unknown, and the account is printed with exit 130, 143 or 129
(:func:`gputopo.apply.signals.interruptible`, each signal raising). However it ends, the result
holds the rollout's document (:class:`gputopo.model.documents.ClusterApplyDoc`): every node's
outcome, or ``refused``, ``dry-run``, ``no-changes`` when no node's apply started; and the error
it ends with, if any.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gputopo.apply import signals
from gputopo.cluster.account import RollingResult
from gputopo.cluster.noderun import DEFAULT_NODE_TIMEOUT
from gputopo.cluster.plan import ClusterPlan
from gputopo.cluster.rolling import batches, rollout
from gputopo.errors import ApplyCancelled, ConfigError, GputopoError, PlanRefused
from gputopo.model.documents import ClusterApplyDoc
from gputopo.usecases.cluster_connect import (
    ClusterReach,
    ClusterSource,
    OpenCluster,
    open_cluster,
    plan_of,
    read_inputs,
)


def _say_nothing(text: str) -> None:
    """Where a caller does not show what :class:`ClusterApplyRequest` reports."""


@dataclass(frozen=True)
class ClusterApplyRequest:
    """What a rollout runs and how it talks to its operator.

    ``serial`` nodes at a time after ``canary`` alone; ``node_timeout`` seconds per node's
    apply; ``verify``/``ha``: passed on to each node's apply; ``dry_run`` stops once the plan
    is shown. ``show`` gets the plan's text before anything runs, ``progress`` each node's line
    as it ends; ``confirm`` asks its question unless ``yes`` (None: nobody to ask, refused)."""

    reach: ClusterReach
    source: ClusterSource
    serial: int = 1
    canary: str | None = None
    node_timeout: float = DEFAULT_NODE_TIMEOUT
    dry_run: bool = False
    yes: bool = False
    verify: bool = True
    ha: bool = True
    show: Callable[[str], None] = _say_nothing
    progress: Callable[[str], None] = _say_nothing
    confirm: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class ClusterApplyResult:
    """How a cluster apply ended: its document; the account's text when a node's apply ran
    (None otherwise); the error it ends with (None: every node done, or nothing to do)."""

    doc: ClusterApplyDoc
    account: str | None = None
    error: GputopoError | None = None

    @property
    def exit_code(self) -> int:
        return self.doc.exit_code


def _refused(nodes: list[str], error: GputopoError, shown: GputopoError | None = None) -> ClusterApplyResult:
    """No node's apply started: every node not started, ``error`` what it ends with (``shown``:
    the error the document names instead)."""
    return ClusterApplyResult(RollingResult.unstarted(nodes).to_doc("refused", shown or error), error=error)


def _plan_refused(nodes: list[str], e: PlanRefused) -> ClusterApplyResult:
    """A refused plan: its refusals are what the command ends with (one line each); the
    document says the plan was refused, with its exit code."""
    shown = GputopoError("the plan was refused (its refusals are on stderr)")
    shown.exit_code = e.exit_code
    return _refused(nodes, e, shown)


def _confirmed(req: ClusterApplyRequest, nodes: list[str]) -> None:
    """Raises ConfigError when there is nobody to ask and no ``yes``, ApplyCancelled when the
    operator declines."""
    if req.yes:
        return
    if req.confirm is None:
        raise ConfigError(
            "refusing to change the cluster without confirmation: pass --yes (stdin is not a terminal)"
        )
    if not req.confirm(f"Apply on {len(nodes)} node(s), {req.serial} at a time?"):
        raise ApplyCancelled()


def _run(req: ClusterApplyRequest, c: OpenCluster, cplan: ClusterPlan) -> ClusterApplyResult:
    """Show the plan, ask, roll it out: the result of a cluster that was read and planned."""
    batches(c.nodes, req.serial, req.canary)  # a bad --canary or --serial is refused before anything runs
    req.show(cplan.to_text())
    if cplan.is_empty or req.dry_run:
        empty = {n.node for n in cplan.nodes if n.plan.is_empty}
        return ClusterApplyResult(
            RollingResult.unstarted(c.nodes, empty).to_doc("dry-run" if req.dry_run else "no-changes")
        )
    _confirmed(req, c.nodes)
    # Ctrl-C, SIGTERM, SIGHUP: the rollout ends with its account (each one raises)
    with signals.interruptible(again="raise"):
        result = rollout(
            cplan,
            c.spec_text,
            c.shell,
            req.ha,
            serial=req.serial,
            canary=req.canary,
            timeout=req.node_timeout,
            verify=req.verify,
            report=lambda o: req.progress(o.progress()),
        )
    error = result.error() if result.failed else None
    return ClusterApplyResult(result.to_doc(), result.to_text(), error)


def cluster_apply(req: ClusterApplyRequest) -> ClusterApplyResult:
    """Read, plan, show, confirm and roll out (see the module docstring). Returns how it ended,
    also when it failed (``error``: ClusterApplyFailed with the account, PlanRefused, or what
    refused before any node's apply: ConfigError, SpecError, UnknownNode, NodeUnreachable,
    VersionMismatch, ProxmoxError, ApplyCancelled). Raises only what is no GputopoError (click's
    Abort from a prompt, KeyboardInterrupt before the rollout)."""
    nodes: list[str] = []
    try:
        c = open_cluster(req.reach, req.source)
        nodes = c.nodes
        with c:
            read_inputs(c, req.source, req.reach.timeout, None, with_ha=req.ha)
            try:
                cplan = plan_of(c, req.reach.spec_file)
            except PlanRefused as e:
                return _plan_refused(nodes, e)
            return _run(req, c, cplan)
    except GputopoError as e:
        # refused before any node's apply: nothing was changed anywhere
        return _refused(nodes, e)
