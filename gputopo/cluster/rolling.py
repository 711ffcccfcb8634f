"""Rolling apply: node by node over SSH, each node running its own ``gputopo apply``.

Driver binding happens only on the node itself, so each node applies its own plan with its own
lock, journal and rollback: ``gputopo apply --spec /dev/stdin --yes --json --node N
--expect-plan SIGNATURE``, the spec on stdin, the signature the one the cluster plan showed for
that node (a node whose plan changed since refuses, nothing changed there). The order:

* ``canary`` first, alone; then the other nodes in spec order, ``serial`` at a time (the nodes of
  a batch apply concurrently: their mapping writes merge, see :mod:`gputopo.actions.mapping`);
* the first failure stops the run once its batch has ended: that node rolled itself back, the
  nodes done before stay done and are named, the rest are not started.

HA placement is a step of each node's own apply (journaled, rolled back with the node's other
steps: :mod:`gputopo.actions.ha`); ``--no-ha`` is passed on to every node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pydantic import ValidationError

from gputopo.cluster.gather import error_line
from gputopo.cluster.plan import ClusterPlan
from gputopo.errors import ClusterApplyFailed, ConfigError, GputopoError, UnknownNode
from gputopo.model.documents import ApplyDoc
from gputopo.ports import NodeShellPort

DEFAULT_NODE_TIMEOUT = 1800.0


@dataclass
class NodeOutcome:
    """What one node's apply did: ``status`` applied, no-changes, failed or not-started."""

    node: str
    status: str
    seconds: float = 0.0
    reason: str = ""
    rc: int = 0
    steps: int = 0
    verify: str | None = None


@dataclass
class RollingResult:
    outcomes: list[NodeOutcome] = field(default_factory=list)
    wall_s: float = 0.0

    def done(self) -> list[str]:
        return [o.node for o in self.outcomes if o.status in ("applied", "no-changes")]


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


def read_apply_doc(stdout: str) -> tuple[ApplyDoc | None, str | None]:
    """(the apply document a node printed, None), or (None, why it cannot be read). Read with
    the document's own strict model: a field this version does not know is refused, not dropped."""
    try:
        data = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return None, "gputopo apply --json printed no result"
    try:
        return ApplyDoc.model_validate(data), None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the document"
        return (
            None,
            f"gputopo apply --json printed a document this gputopo cannot read ({where}: {first['msg']})",
        )


def apply_node(
    shell: NodeShellPort,
    node: str,
    signature: str,
    spec_text: str,
    timeout: float,
    verify: bool = True,
    ha: bool = True,
) -> NodeOutcome:
    """Run the node's own apply. Returns its outcome (``failed`` with the node's one-line
    reason); raises NodeUnreachable."""
    argv = [
        "gputopo",
        "apply",
        "--spec",
        "/dev/stdin",
        "--yes",
        "--json",
        "--node",
        node,
        "--expect-plan",
        signature,
    ]
    if not verify:
        argv.append("--no-verify")
    if not ha:
        argv.append("--no-ha")
    t0 = time.monotonic()
    res = shell.run(node, argv, timeout, input=spec_text)
    seconds = time.monotonic() - t0
    doc, unread = read_apply_doc(res.stdout)
    verdict = (doc.verify or {}) if doc is not None else {}
    if res.rc != 0:
        reason = error_line(res)
        if verdict and not verdict.get("ok", True):
            reason = f"applied, but its verification failed: {verdict.get('summary', '')}"
        return NodeOutcome(node, "failed", seconds, reason=reason, rc=res.rc)
    if doc is None:
        return NodeOutcome(node, "failed", seconds, reason=unread or "gputopo apply --json printed no result")
    return NodeOutcome(
        node,
        "applied" if doc.status == "applied" else "no-changes",
        seconds,
        steps=len(doc.steps),
        verify=verdict.get("summary"),
    )


def rolling_apply(
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

    Returns the result when every node is done. Raises ClusterApplyFailed naming the node that
    failed, the nodes done and those not started; NodeUnreachable for a node that could not be
    reached (the same way: the run stops).
    """
    t0 = time.monotonic()
    order = [n.node for n in cplan.nodes]
    result = RollingResult()
    plan_of = {n.node: n for n in cplan.nodes}
    for batch in batches(order, serial, canary):

        def one(node: str) -> NodeOutcome:
            try:
                return apply_node(shell, node, plan_of[node].signature, spec_text, timeout, verify, ha)
            except GputopoError as e:
                return NodeOutcome(node, "failed", reason=str(e), rc=e.exit_code)

        with ThreadPoolExecutor(max_workers=len(batch)) as ex:
            outcomes = list(ex.map(one, batch))
        for o in outcomes:
            report(o)
        result.outcomes += outcomes
        failed = [o for o in outcomes if o.status == "failed"]
        if failed:
            started = {o.node for o in result.outcomes}
            f = failed[0]
            cause = GputopoError(f.reason)
            cause.exit_code = f.rc if f.rc in (1, 2, 3, 4) else 1
            raise ClusterApplyFailed(f.node, cause, result.done(), [n for n in order if n not in started])
    result.wall_s = time.monotonic() - t0
    return result
