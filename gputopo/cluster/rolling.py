"""Rolling apply: node by node over SSH, each node running its own ``gputopo apply``.

Driver binding happens only on the node itself, so each node applies its own plan with its own
lock, journal and rollback (:mod:`gputopo.cluster.noderun`). The order:

* ``canary`` first, alone; then the other nodes in spec order, ``serial`` at a time (the nodes of
  a batch apply concurrently: their mapping writes merge, see :mod:`gputopo.actions.mapping`);
* the first failure stops the run once its batch has ended; the nodes not reached are not
  started.

HA placement is a step of each node's own apply (journaled, rolled back with the node's other
steps: :mod:`gputopo.actions.ha`); ``--no-ha`` is passed on to every node.

Every run ends with an account (:class:`gputopo.cluster.account.RollingResult`): one outcome per
node, told from what the node's own apply printed. Ctrl-C, SIGTERM and SIGHUP end it with the
account too (130, 143, 129; the caller turns SIGTERM and SIGHUP into a KeyboardInterrupt that
carries its ``signum``, :class:`gputopo.apply.signals.Signalled`): the nodes applying then are
told from what they answer within :data:`CTRL_C_GRACE` (a node's apply that got the same signal
rolls back and says so), else unknown.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gputopo.cluster.account import NodeOutcome, Outcome, RollingResult, look_at
from gputopo.cluster.noderun import DEFAULT_NODE_TIMEOUT, apply_node
from gputopo.cluster.plan import ClusterPlan
from gputopo.errors import ConfigError, GputopoError, UnknownNode
from gputopo.exitcodes import signal_name
from gputopo.ports import NodeShellPort

CTRL_C_GRACE = 30.0  # seconds the nodes applying get to answer after Ctrl-C (SIGTERM, SIGHUP)


def batches(order: list[str], serial: int, canary: str | None) -> list[list[str]]:
    """The nodes in the order they apply: ``canary`` alone first, then ``serial`` at a time.
    Raises UnknownNode for a canary outside ``order``, ConfigError for ``serial`` < 1."""
    if serial < 1:
        raise ConfigError(f"--serial {serial}: at least 1 node at a time")
    rest = list(order)
    out: list[list[str]] = []
    if canary is not None:
        if canary not in rest:
            raise UnknownNode(canary, "one of the nodes of this run", order)
        rest.remove(canary)
        out.append([canary])
    out += [rest[i : i + serial] for i in range(0, len(rest), serial)]
    return out


def _after_ctrl_c(batch: list[str], futures: list[Future[NodeOutcome]], signum: int) -> list[NodeOutcome]:
    """The outcomes of ``batch`` once ``signum`` (Ctrl-C, SIGTERM, SIGHUP) stopped the wait: each
    node's own, when its apply (whose ssh got the same signal: a terminal's Ctrl-C, systemd's stop
    of the unit, a dropped session's hangup reach the whole process group) answers within
    :data:`CTRL_C_GRACE`, else unknown. A second signal stops the wait."""
    deadline = time.monotonic() + CTRL_C_GRACE
    out = []
    for node, f in zip(batch, futures, strict=True):
        try:
            out.append(f.result(timeout=max(0.0, deadline - time.monotonic())))
        except (KeyboardInterrupt, TimeoutError):
            deadline = 0.0
            out.append(
                NodeOutcome(
                    node,
                    Outcome.UNKNOWN,
                    reason=f"interrupted ({signal_name(signum)}) while its apply ran",
                    failed=True,
                    next_step=look_at(node),
                )
            )
    return out


def _run_batch(batch: list[str], one: Callable[[str], NodeOutcome]) -> tuple[list[NodeOutcome], int | None]:
    """The outcomes of the nodes of ``batch``, applying at the same time, and the signal that
    stopped the wait for them (None: none did)."""
    ex = ThreadPoolExecutor(max_workers=len(batch))
    futures = [ex.submit(one, n) for n in batch]
    try:
        return [f.result() for f in futures], None
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        return _after_ctrl_c(batch, futures, signum), signum
    finally:
        ex.shutdown(wait=False)


def _not_started(result: RollingResult, order: list[str], stop: str) -> None:
    """The nodes of ``order`` the rollout stopped at ``stop`` before, not started."""
    started = {o.node for o in result.outcomes}
    result.outcomes += [
        NodeOutcome(n, Outcome.NOT_STARTED, reason=f"the rollout stopped at {stop}")
        for n in order
        if n not in started
    ]


def rollout(
    cplan: ClusterPlan,
    spec_text: str,
    shell: NodeShellPort,
    ha: bool = True,
    *,
    serial: int = 1,
    canary: str | None = None,
    timeout: float = DEFAULT_NODE_TIMEOUT,
    verify: bool = True,
    report: Callable[[NodeOutcome], None] = lambda o: None,
) -> RollingResult:
    """Apply ``cplan`` node by node (see the module docstring); ``report`` sees each outcome.
    Returns the account, however the rollout ended (:attr:`RollingResult.failed`: a node failed
    or a signal stopped it; the nodes not reached are not started). Raises UnknownNode and
    ConfigError (:func:`batches`) before any node's apply."""
    t0 = time.monotonic()
    order = [n.node for n in cplan.nodes]
    signature = {n.node: n.signature for n in cplan.nodes}
    result = RollingResult()

    def one(node: str) -> NodeOutcome:
        try:
            return apply_node(shell, node, signature[node], spec_text, timeout, verify, ha)
        except GputopoError as e:  # no ssh client here: the command never ran
            return NodeOutcome(node, Outcome.NOT_STARTED, reason=str(e), failed=True)

    for batch in batches(order, serial, canary):
        outcomes: list[NodeOutcome] = []
        try:
            outcomes, result.signum = _run_batch(batch, one)
            for o in outcomes:
                report(o)
        except KeyboardInterrupt as e:  # while the outcomes were shown, or between two batches
            result.signum = getattr(e, "signum", signal.SIGINT)
        result.outcomes += outcomes
        if any(o.failed for o in outcomes) or result.interrupted:
            # the failed node; else the last node told (a signal between two batches: the next
            # batch never started, so it is not where the rollout stopped)
            last = result.outcomes[-1].node if result.outcomes else batch[0]
            stop = next((o.node for o in outcomes if o.failed), last)
            _not_started(result, order, stop)
            break
    result.wall_s = time.monotonic() - t0
    return result


def rolling_apply(
    cplan: ClusterPlan,
    spec_text: str,
    shell: NodeShellPort,
    ha: bool = True,
    **options: Any,
) -> RollingResult:
    """:func:`rollout` for a caller that wants only the account of a rollout where every node
    is done. Raises ClusterApplyFailed carrying the account (``account``) when a node failed
    or a signal stopped the rollout (exit 130, 143, 129), its exit code the rollout's
    (:attr:`RollingResult.exit_code`)."""
    result = rollout(cplan, spec_text, shell, ha, **options)
    if result.failed:
        raise result.error()
    return result
