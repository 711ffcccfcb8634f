"""The guests' tasks an apply left running: a task Proxmox accepted is the node's (pve-common
RESTEnvironment.pm fork_worker detaches the worker; pve-container API2/LXC/Status.pm and
qemu-server API2/Qemu.pm vm_start, vm_stop, vm_shutdown return its UPID at once) and runs on
when the process that asked for it is interrupted or killed. A rollback or recover waits for
them (:func:`wait_tasks`) before any undo decides on a guest's status."""

from __future__ import annotations

import time

from gputopo.actions.base import StepContext
from gputopo.actions.guest import SHUTDOWN_TIMEOUT
from gputopo.errors import ProxmoxError, TaskFailed, TaskTimeout


def task_guest(upid: str) -> tuple[str | None, str]:
    """(``lxc``, ``qemu`` or None where its type does not say, the id) of a guest's task:
    ``UPID:node:pid:pstart:starttime:type:id:user:`` (pve-common ProcFSTools/RESTEnvironment)."""
    parts = upid.split(":")
    kind, id = (parts[5], parts[6]) if len(parts) > 7 else ("", "")
    return ("lxc" if kind.startswith("vz") else "qemu" if kind.startswith("qm") else None), id


def task_name(upid: str) -> str:
    """``CT 101 shutdown`` of ``UPID:pve1:...:vzshutdown:101:root@pam:``; ``HA resource 101
    stop`` of a ``hastop`` task; ``task UPID`` of any other."""
    parts = upid.split(":")
    guest, id = task_guest(upid)
    if not id.isdigit() or not (guest or parts[5].startswith("ha")):
        return f"task {upid}"
    what = {"lxc": "CT", "qemu": "VM", None: "HA resource"}[guest]
    return f"{what} {id} {parts[5][2:]}"


# the tasks a step of gputopo's starts on a guest (pve-container API2/LXC/Status.pm, qemu-server
# API2/Qemu.pm: vzstart/vzstop/vzshutdown, qmstart/qmstop/qmshutdown; hastart/hastop for an HA
# resource); a backup or a migration someone else runs is not one to wait for
POWER_TASKS = frozenset(
    {"vzstart", "vzstop", "vzshutdown", "qmstart", "qmstop", "qmshutdown", "hastart", "hastop"}
)


def running_tasks(ctx: StepContext, vmids: set[int], known: set[str]) -> list[tuple[str, float]]:
    """(UPID, until when: ``time.time()``) of the node's tasks of ``vmids`` still running that
    are not in ``known`` (the journaled ones): a task whose UPID no journal kept (the process
    was killed between Proxmox's answer and the journal's write), each given as long as a step
    gives one from its start (a shutdown's longer limit for a shutdown). Only the start, stop and
    shutdown tasks a step starts (:data:`POWER_TASKS`): a backup running for an hour is not
    waited for. A guest whose tasks cannot be listed is left out: the undos that need the API
    say so."""
    out = []
    for vmid in sorted(vmids):
        try:
            upids = ctx.ports.proxmox.active_tasks(vmid)
        except ProxmoxError:
            continue
        for upid in upids:
            parts = upid.split(":")
            if upid in known or len(parts) < 6 or parts[5] not in POWER_TASKS:
                continue
            try:
                started = float(int(parts[4], 16))  # the UPID's starttime, hex epoch seconds
            except ValueError:
                started = time.time()
            shutdown = parts[5].endswith("shutdown")
            limit = ctx.timeouts.shutdown(SHUTDOWN_TIMEOUT) if shutdown else ctx.timeouts.guest
            out.append((upid, started + limit))
    return out


def wait_tasks(ctx: StepContext, tasks: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """Wait for each of ``tasks`` (UPID, until when: ``time.time()``) to stop: a task Proxmox
    accepted runs on when the process that asked for it is interrupted or killed (pve-common
    RESTEnvironment.pm fork_worker detaches the worker), so a guest's status decides nothing
    until the tasks gputopo started on it are over. A task that failed is over too. Returns
    (UPID, one line) per task still running at its deadline."""
    late = []
    for upid, until in tasks:
        name = task_name(upid)
        try:
            try:
                ctx.ports.proxmox.wait_task(upid, 0, name)  # one look: most ended long ago
                continue
            except TaskTimeout:
                ctx.note(f"waiting for {name} (task {upid}): Proxmox carries it out to its end")
            ctx.ports.proxmox.wait_task(upid, max(0.0, until - time.time()), name)
        except TaskTimeout:
            late.append((upid, f"{name} (task {upid}) still running at the end of its step's limit"))
        except TaskFailed:
            continue  # it ended; the guest's status says what it did
        except ProxmoxError as e:
            # the API does not answer: no undo can read a guest's status either, and those that
            # need it fail naming the API
            ctx.note(f"warning: {name} (task {upid}): its status could not be read: {e}")
    return late
