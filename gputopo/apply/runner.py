"""Running a journal's steps forward and backward.

Forward, every step is journaled (``Begin`` with its before-state, then ``Done`` or ``Failed``);
consecutive steps of a parallel kind (rebinds: one IOMMU group each) run at once. Backward, every
begun step whose undo has not completed is undone from its journaled before-state, in the order
:func:`gputopo.actions.undo_order` computes from what each undo needs and restores (newest first
where nothing forces another order; a guest's start waits until its config, mappings and GPUs
are back), then what ran before runs again, and a running container that still sees GPUs
hot-plugged during the apply is restarted. An undo that takes a GPU from nvidia stops the plan's
service that holds it first. Everything a later process needs to finish a rollback is in the
journal, and a recover computes the same order from it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gputopo.actions import ActionModel, RunningBefore, StepContext, stop_window, undo_order
from gputopo.actions.guest import power
from gputopo.apply import signals
from gputopo.apply.journal import (
    Begin,
    Done,
    Failed,
    Journal,
    RestartFailed,
    ServiceChanged,
    StepNote,
    TaskStarted,
    UndoBegin,
    UndoDone,
    UndoFailed,
    UndoIncomplete,
)
from gputopo.apply.progress import Progress, StepResult
from gputopo.apply.stepcontext import step_context  # noqa: F401  (where callers look for it)
from gputopo.errors import ExecError, GputopoError, SysfsTimeout
from gputopo.formats.devn import dev_entries, dev_path, gpu_nodes


class Runner:
    """Runs a journal's steps forward and backward through a :class:`StepContext`."""

    def __init__(self, ctx: StepContext, journal: Journal, progress: Progress):
        self.ctx = ctx
        self.j = journal
        self.progress = progress
        self.results: list[StepResult] = []
        self.failed_at: int | None = None  # the step whose error forward() raised
        self._lock = threading.Lock()
        # a step's warnings, by the thread that runs it (parallel steps run in worker threads)
        self._warnings: dict[int, list[str]] = {}
        self._local = threading.local()
        ctx.warn = self._warn
        ctx.mark, ctx.marks = self._mark, self._marks
        ctx.task_started = self._task_started

    # --- forward -------------------------------------------------------------------------------

    def _mark(self, text: str) -> None:
        step = getattr(self._local, "step", None)
        if step is not None:
            self.j.append(StepNote(step=step, what=text))

    def _marks(self) -> list[str]:
        step = getattr(self._local, "step", None)
        return [r.what for r in self.j.records if isinstance(r, StepNote) and r.step == step]

    def _warn(self, text: str) -> None:
        step = getattr(self._local, "step", None)
        if step is not None:
            self._warnings[step].append(text)
        else:
            self.progress.note(f"warning: {text}")

    def _task_started(self, upid: str, limit: float) -> None:
        # journaled before it is waited for: a rollback or recover waits for it too
        self.j.append(TaskStarted(upid=upid, limit=limit, step=getattr(self._local, "step", None)))

    def _one(self, i: int, a: ActionModel, total: int) -> None:
        self._local.step = i
        try:
            self._run_one(i, a, total)
        finally:
            self._local.step = None

    def _run_one(self, i: int, a: ActionModel, total: int) -> None:
        try:
            before = a.before(self.ctx)
        except BaseException as e:  # nothing changed yet, but the error belongs to this step
            self.j.append(
                Failed(step=i, error=str(signals.as_error(e)), error_type=type(e).__name__, begun=False)
            )
            raise
        self.j.append(Begin(step=i, action=a, before=before.model_dump()))
        self.progress.step_begin(i, total, a)
        t0 = time.monotonic()
        warnings = self._warnings[i] = []
        try:
            a.do(self.ctx)
        except BaseException as e:
            t1 = time.monotonic()
            hung = [e.address] if isinstance(e, SysfsTimeout) and e.address else []
            self.j.append(
                Failed(step=i, error=str(signals.as_error(e)), error_type=type(e).__name__, devices=hung)
            )
            self._result(StepResult(i, a.phase, a.describe(), "failed", t1 - t0, t0, t1))
            self.progress.step_end(i, total, a, "FAILED", t1 - t0)
            raise
        t1 = time.monotonic()
        self.j.append(Done(step=i, seconds=round(t1 - t0, 4), warnings=warnings))
        self._result(StepResult(i, a.phase, a.describe(), "done", t1 - t0, t0, t1, warnings))
        self.progress.step_end(i, total, a, "done", t1 - t0)
        for w in warnings:
            self.progress.note(f"step {i + 1}: warning: {w}")

    def _result(self, r: StepResult) -> None:
        with self._lock:
            self.results.append(r)

    def forward(self, actions: list[ActionModel], skip: set[int] = frozenset()) -> None:
        """Run ``actions`` (index = position) except ``skip``. Raises the first failure after every
        worker of a parallel group ended (a hung device outranks the others: it decides the exit code)."""
        total = len(actions)
        self.ctx.stopped_guests = {g for g in (a.stopped_guest() for a in actions) if g is not None}
        i = 0
        while i < total:
            a = actions[i]
            if not a.parallel:
                if i not in skip:
                    self.failed_at = i
                    self._one(i, a, total)
                    self.failed_at = None
                i += 1
                continue
            k = i
            while k < total and type(actions[k]) is type(a):
                k += 1
            todo = [n for n in range(i, k) if n not in skip]
            if todo:
                # a signal waits until every worker ended: a rollback begun while one still
                # writes to sysfs would race it, and the group would end on whichever driver
                # the last write chose (an interrupt between starting a worker thread and the
                # pool recording it would also let the pool's exit skip waiting for it)
                with (
                    signals.held(self.progress.note),
                    ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix=a.kind) as pool,
                ):
                    futures = [pool.submit(self._one, n, actions[n], total) for n in todo]
                    errors = [f.exception() for f in futures]
                    failures = [(n, e) for n, e in zip(todo, errors) if e is not None]
                    if failures:  # outranks a signal that came meanwhile (both roll back)
                        hung = [f for f in failures if isinstance(f[1], SysfsTimeout)]
                        self.failed_at, first = (hung or failures)[0]
                        raise first
            i = k

    def stop_window(self) -> float | None:
        """Seconds the inference service was down: from the start of the stop window's first
        stop step to the end of its last start step (:func:`gputopo.actions.stop_window`)."""
        bounds = stop_window(self.j.header.actions)
        if bounds is None:
            return None
        inside = [r for r in self.results if bounds[0] <= r.index <= bounds[1]]
        stops = [r.started for r in inside if r.phase == "stop"]
        starts = [r.ended for r in inside if r.phase == "start"]
        if not stops or not starts:
            return None
        return max(starts) - min(stops)

    # --- backward ------------------------------------------------------------------------------

    def restarts(self, running_before: RunningBefore) -> list[str]:
        """What :meth:`_restart` would start, one line each, for ``recover --dry-run``: the guests
        that ran before and do not run now (asked through the API; one it cannot ask about is
        listed with "if it is not running"), then the services that were active."""
        out = []
        for key, status in self._guests_before(running_before).items():
            if status != "running":
                continue
            kind, vmid = key.split("/")
            name = f"{'CT' if kind == 'lxc' else 'VM'} {vmid}"
            try:
                if not self.ctx.running(kind, int(vmid)):
                    out.append(f"start {name}")
            except GputopoError:
                out.append(f"start {name} if it is not running")
        for key, status in running_before.services.items():
            vmid_s, unit = key.split("/", 1)
            if status == "active":
                out.append(f"start {unit} in CT {vmid_s} (restarted if it runs another command line)")
        return out

    def backward(self, running_before: RunningBefore, retry: bool = False) -> tuple[bool, list[str]]:
        """Undo every begun step whose undo has not completed, in :meth:`undo_order`, then restart
        what ran before. ``retry`` (a recover after a human fixed the host) tries the
        devices on which an earlier write hung again instead of leaving them alone.

        Returns (complete, needs_human): ``complete`` is False when an undo failed or had to leave
        a device alone.
        """
        ctx = self.ctx
        steps = self.j.steps()
        order = self.undo_order()
        ctx.stuck = set(ctx.binder.stuck) | ctx.gone
        if not retry:
            ctx.stuck |= self.j.hung_devices()  # a worker of this process may still be blocked there
        journaled = self.j.services_to_restart()
        # a service of the plan that holds a GPU an undo takes back is stopped first (it ran, or
        # was starting, with the GPUs the apply gave it); the final restart starts it again
        ctx.services = {
            (int(vmid), unit) for vmid, unit in (k.split("/", 1) for k in running_before.services)
        } | {s for s in (a.stopped_service() for a in self.j.header.actions) if s is not None}
        complete = True
        for n in order:
            st = steps[n]
            a = st.action
            self.j.append(UndoBegin(step=n))
            try:
                what = a.undo(a.load_before(st.before), ctx)
            except GputopoError as e:
                complete = False
                self.j.append(UndoFailed(step=n, error=str(e)))
                self.progress.note(f"undo of step {n + 1} ({a.describe()}) failed: {e}")
                continue
            finally:
                for vmid in sorted(ctx.service_changed - journaled):
                    self.j.append(ServiceChanged(vmid=vmid))
                    journaled.add(vmid)
            left = (ctx.stuck | ctx.gone | set(ctx.binder.stuck)) & set(a.devices())
            if left:
                # recorded as not undone, so that a later recover tries this group again
                complete = False
                self.j.append(UndoIncomplete(step=n, what=what, devices=sorted(left)))
            else:
                self.j.append(UndoDone(step=n, what=what))
            if what:
                self.progress.note(f"undo {n + 1}: {what}")
        complete = self._restart(running_before, journaled) and complete
        return complete, sorted(ctx.stuck | ctx.gone | set(ctx.binder.stuck))

    def undo_order(self) -> list[int]:
        """The begun steps whose undo has not completed, in the order :meth:`backward` undoes
        them and ``recover --dry-run`` shows (:func:`gputopo.actions.undo_order`; an undo done by
        an earlier process has put its resources back already)."""
        steps = self.j.steps()
        pending = [
            (n, steps[n].action)
            for n in dict.fromkeys(reversed(self.j.begun()))
            if steps[n].status != "undo-done"
        ]
        try:
            return undo_order(pending)
        except ValueError as e:  # a kind declared needs that contradict another's
            self.progress.note(f"warning: {e}; undoing newest first")
            return [n for n, _ in pending]

    def _missing_devices(self, vmid: int) -> list[str]:
        """The device nodes container ``vmid``'s config passes that it does not see: a container
        sees the nodes that existed on the host when it started."""
        cfg = self.ctx.ports.proxmox.lxc_config(vmid)
        wanted = sorted({dev_path(v) for v in dev_entries(cfg).values()})
        seen = set(self.ctx.exec(vmid, ["ls", "/dev"]).stdout.split())
        return [p for p in wanted if p[len("/dev/") :].split("/", 1)[0] not in seen]

    def _extra_devices(self, vmid: int, seen_before: list[str] | None) -> list[str]:
        """The GPU nodes container ``vmid`` sees that it did not see before the apply (None:
        not known, no live change was journaled for it)."""
        if seen_before is None:
            return []
        seen = gpu_nodes(self.ctx.exec(vmid, ["ls", "/dev"]).stdout.split())
        return sorted(set(seen) - set(seen_before), key=lambda p: (len(p), p))

    def _guests_before(self, running_before: RunningBefore) -> dict[str, str]:
        """The guests that ran before (``lxc/101`` -> running|stopped): those a stop step
        recorded, and each container changed live, which ran (a process killed while the
        rollback restarted it for its view left it stopped, and no step recorded it)."""
        guests = dict(running_before.guests)
        for vmid in self._views_before():
            guests.setdefault(f"lxc/{vmid}", "running")
        return guests

    def _views_before(self) -> dict[int, list[str]]:
        """Container vmid -> the GPU nodes it saw before the first begun step that changed its
        devices while it ran (from the journal, so that recover knows it too)."""
        out: dict[int, list[str]] = {}
        steps = self.j.steps()
        for n in sorted(self.j.begun()):
            a = steps[n].action
            view = a.container_view(a.load_before(steps[n].before))
            if view is not None:
                out.setdefault(view[0], view[1])
        return out

    def _fix_device_view(self, vmid: int, seen_before: list[str] | None = None) -> None:
        """Restart a running container whose view of /dev is not the one it had: it lacks some
        of its GPUs' device nodes (it was started during the rollback while a GPU was still
        away), or it still sees GPU nodes hot-plugged during the apply (``seen_before``: what it
        saw before a live change), which Proxmox cannot take out of a running container. Raises
        GputopoError naming what is still wrong afterwards."""
        ctx = self.ctx
        if not ctx.running("lxc", vmid):
            return
        missing = self._missing_devices(vmid)
        extra = self._extra_devices(vmid, seen_before)
        if not missing and not extra:
            return
        power(ctx, "lxc", vmid, "shutdown")  # as a stop step does: its warnings, its longer wait
        power(ctx, "lxc", vmid, "start")
        why = []
        if missing:
            why.append(f"it did not see {', '.join(missing)}")
        if extra:
            why.append(
                f"it still saw {', '.join(extra)}, hot-plugged during the apply (a running "
                "container keeps a hot-plugged device until it restarts)"
            )
        self.progress.note(f"restarted CT {vmid}: {'; '.join(why)}")
        still = self._missing_devices(vmid)
        if still:
            raise ExecError(vmid, ["ls", "/dev"], 1, f"CT {vmid} still does not see {', '.join(still)}")
        still = self._extra_devices(vmid, seen_before)
        if still:
            raise ExecError(vmid, ["ls", "/dev"], 1, f"CT {vmid} still sees {', '.join(still)}")

    def _restart_service(self, vmid: int, unit: str, dropin_restored: bool) -> None:
        """Make ``unit`` run what its unit file says again. A container started during the
        rollback has already started it, maybe with the drop-in that was just put back (it is
        ``activating``, or runs the wrong command line): what runs is compared with the unit, and
        it is restarted when they differ. Raises ExecError."""
        ctx = self.ctx
        if not ctx.running("lxc", vmid):
            raise ExecError(vmid, ["systemctl", "start", unit], 255, f"CT {vmid} is not running")
        ctx.exec(vmid, ["systemctl", "daemon-reload"])
        state, wanted, running = ctx.systemctl().service_commands(vmid, unit)
        if state in ("active", "activating", "reloading") and running is not None and running == wanted:
            ctx.systemctl().wait_active(vmid, unit)
            return
        if state in ("active", "activating", "reloading"):
            why = (
                "it ran another command line"
                if running is not None
                else "its drop-in was put back"
                if dropin_restored
                else "its command line could not be read"
            )
            ctx.systemctl().restart_service(vmid, unit)
            self.progress.note(f"CT {vmid}: restarted {unit} with its previous configuration ({why})")
            return
        ctx.systemctl().start_service(vmid, unit)
        self.progress.note(f"CT {vmid}: started {unit}")

    def _restart(self, running_before: RunningBefore, changed: set[int]) -> bool:
        """Start again what ran before: guests first, then their services (restarted when their
        drop-in was put back). Returns False when something could not be started."""
        ctx = self.ctx
        ok = True
        guests = self._guests_before(running_before)
        for key, status in guests.items():
            kind, vmid = key.split("/")
            try:
                if status == "running" and not ctx.running(kind, int(vmid)):
                    power(ctx, kind, int(vmid), "start")  # its task's warnings are shown
                    self.progress.note(f"started {kind} {vmid}")
            except GputopoError as e:
                ok = False
                self.j.append(RestartFailed(what=key, error=str(e)))
        # the containers that ran before: those a stop step recorded, and those changed live
        views = self._views_before()
        running = [
            int(k.split("/")[1]) for k, st in guests.items() if k.startswith("lxc/") and st == "running"
        ]
        for vmid in dict.fromkeys([*running, *views]):
            try:
                self._fix_device_view(vmid, views.get(vmid))
            except GputopoError as e:
                ok = False
                self.j.append(RestartFailed(what=f"lxc/{vmid}", error=str(e)))
        for key, status in running_before.services.items():
            vmid_s, unit = key.split("/", 1)
            if status != "active":
                continue
            try:
                self._restart_service(int(vmid_s), unit, int(vmid_s) in changed)
            except GputopoError as e:
                ok = False
                self.j.append(RestartFailed(what=key, error=str(e)))
        return ok


def running_before_of(actions: list[ActionModel], current: Any) -> RunningBefore:
    """What ran before the apply and must run again after a rollback, as the steps record it."""
    out = RunningBefore()
    for a in actions:
        a.was_running(current, out)
    return out
