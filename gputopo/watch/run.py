"""One pass of the drift watch: ``diff`` and the quick checks of ``verify`` against the node's
spec, read-only, as one :class:`WatchResult`.

The pass reads what ``gputopo verify`` reads (fresh facts, the current state through the ports,
a fresh plan: one :class:`gputopo.verify.context.Context`, read by the use case's reader), makes ``gputopo diff``'s report from
those same reads, runs the checks of :data:`QUICK_CHECKS` and names each GPU's owner. It writes
nothing and starts nothing: the checks that act or cost the service time are left out (the
inference probe sends a prompt to the model, the guest check starts VMs).

While an apply or a recover holds the host lock (:class:`gputopo.apply.lock.HostLock`) the host
is a middle state by design: the pass reads nothing, and the result says an apply is in
progress instead of showing its half-done steps as drift. The lock is looked at again after the
reads; an apply that began meanwhile turns the result into the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from gputopo.apply.history import history
from gputopo.apply.lock import HostLock
from gputopo.errors import GputopoError, LockHeld
from gputopo.exitcodes import NOTHING_CHANGED
from gputopo.model.documents import FAIL, Outcome
from gputopo.model.strict import Strict
from gputopo.plan.diff import AREAS
from gputopo.plan.diff import diff as make_diff
from gputopo.plan.spec import Spec, load_spec
from gputopo.ports import Ports
from gputopo.topo.owners import owners_now
from gputopo.verify import REGISTRY, Check
from gputopo.verify.context import ReadForChecks, checks_context

#: the checks of verify a watch pass runs, in verify's order: all but the inference probe (a
#: prompt to the model) and the guest check (it starts VMs)
QUICK_CHECKS = tuple(n for n in REGISTRY if n not in ("inference", "guest", "capacity"))
#: run after them, reported only where the plan has a served model's capacity estimate (the
#: memory used beside it; the KV tokens need the inference probe, which the watch does not run)
WHERE_ESTIMATED = ("capacity",)

#: the diff's areas as the metrics name them (``gputopo diff --json``'s keys)
DRIFT_AREAS = tuple(a.replace(" ", "_") for a in AREAS)

#: the drift area of a spec that no longer fits the host: the planner refuses it (a GPU it
#: places is gone, a tensor-parallel size that the GPUs left cannot make)
SPEC_AREA = "spec"

DEFAULT_SPEC = "/etc/gputopo/spec.yaml"


class LastApply(Strict):
    """The newest apply under the host root, as ``gputopo history`` lists it."""

    id: str
    outcome: Outcome
    ended: float | None = Field(None, description="Unix time of its journal's last record")


class WatchResult(Strict):
    """What one pass saw. ``up``: the spec was read and the host checked against it (False:
    ``error`` says why not); ``apply_in_progress``: an apply held the lock, nothing was read."""

    time: float = Field(description="Unix time the pass began")
    seconds: float = Field(0.0, description="How long the pass took")
    node: str | None = None
    up: bool = True
    error: str | None = None
    error_code: int = Field(0, description="The exit code of the error that kept the pass from checking")
    apply_in_progress: bool = False
    lock_holder: str | None = None
    drift: dict[str, bool] = Field(default_factory=dict, description="area -> differs from the spec")
    drift_lines: dict[str, list[str]] = Field(default_factory=dict, description="area -> what differs")
    checks: dict[str, Check] = Field(default_factory=dict)
    owners: dict[str, str] = Field(default_factory=dict, description="GPU address -> its owner now")
    last_apply: LastApply | None = None

    @property
    def drifted(self) -> list[str]:
        """The areas that differ from the spec."""
        return [a for a, d in self.drift.items() if d]

    @property
    def failed(self) -> list[str]:
        """The checks that FAILed."""
        return [n for n, c in self.checks.items() if c.status == FAIL]


def last_apply(root: str | Path) -> LastApply | None:
    """The newest apply recorded under ``root`` (an unreadable journal counts, as ``unreadable``);
    None when none is."""
    records = history(root)
    if not records:
        return None
    r = records[-1]
    ended = r.started + r.wall_s if r.started is not None and r.wall_s is not None else None
    return LastApply(id=r.id, outcome=r.outcome, ended=ended)


def readable_spec(path: str | Path) -> Spec | None:
    """The spec at ``path``, or None when it cannot be read (the pass then says why)."""
    try:
        return load_spec(path)
    except GputopoError:
        return None


def not_checked(error: GputopoError, clock: Callable[[], float] = time.time) -> WatchResult:
    """The result of a pass that could not begin (the ports could not be built): ``error``."""
    return _failed(WatchResult(time=clock()), error)


def _failed(out: WatchResult, error: GputopoError) -> WatchResult:
    out.up, out.error, out.error_code = False, str(error), error.exit_code
    return out


def _held(root: str | Path) -> str | None:
    """The lock's holder while an apply or a recover holds it; None when free."""
    try:
        HostLock(root).check()
    except LockHeld as e:
        return e.holder
    return None


def watch_once(
    spec_path: str | Path,
    ports: Ports,
    *,
    root: str | Path,
    read: ReadForChecks,
    node: str | None = None,
    clock: Callable[[], float] = time.time,
) -> WatchResult:
    """One pass over the host under ``root`` (through ``ports``) against the spec at
    ``spec_path``, read afresh each pass so an edit of it counts from the next one; ``read``
    makes the one read of the host (:func:`gputopo.usecases.readplan.read_for_checks`).

    Never raises an expected error: a spec that cannot be read, a root without sysfs or a spec
    without this node come back as ``up=False`` with the error's line.
    """
    started = clock()
    out = WatchResult(time=started)
    try:
        out.last_apply = last_apply(root)
    except GputopoError as e:  # the journal directory itself cannot be listed
        _failed(out, e)
    holder = _held(root)
    if holder is None and out.up:
        try:
            _check(out, load_spec(spec_path), ports, str(root), node, read)
        except GputopoError as e:
            _failed(out, e)
        holder = _held(root)  # an apply that began while the pass read is what the host is in now
    if holder is not None:
        out = WatchResult(
            time=started,
            node=out.node,
            apply_in_progress=True,
            lock_holder=holder,
            last_apply=out.last_apply,
        )
    out.seconds = max(clock() - started, 0.0)
    return out


def _check(out: WatchResult, spec, ports: Ports, root: str, node: str | None, read: ReadForChecks) -> None:
    """Fill ``out`` with the diff, the quick checks and the owners of one read of the host."""
    ctx = checks_context(spec, ports, root, node, float(spec.verify.timeout), read)
    out.node = ctx.node
    if ctx.current is None:
        out.up, out.error = False, f"cannot read the current state: {ctx.current_error}"
        out.error_code = NOTHING_CHANGED
    elif ctx.plan is None:
        out.drift = {SPEC_AREA: True}
        out.drift_lines = {SPEC_AREA: list(ctx.plan_error)}
    else:
        report = make_diff(ctx.facts, spec, ctx.current, node=ctx.node)
        out.drift = {SPEC_AREA: False}
        for title, key in zip(AREAS, DRIFT_AREAS, strict=True):
            area = report.areas.get(title)
            lines = (area.lines + [f"{path}: differs" for path in area.files]) if area else []
            out.drift[key] = bool(lines)
            if lines:
                out.drift_lines[key] = lines
    for name in (*QUICK_CHECKS, *WHERE_ESTIMATED):
        try:
            got = REGISTRY[name](ctx)
        except GputopoError as e:
            got = Check(name=name, status=FAIL, summary=str(e), details={"error": str(e)})
        if got is not None:
            out.checks[name] = got
    if ctx.current is not None:
        out.owners = {a: v.key for a, v in sorted(owners_now(ctx.facts, ctx.current, ctx.node).items())}
