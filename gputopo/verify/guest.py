"""Check ``guest`` (optional: ``verify --start-vms``, or ``verify_guest: true`` on a VM of
``vms.consumers``): what the VM's own guest sees.

For each such VM: start it when it is stopped, wait for its QEMU guest agent
(``POST .../agent/ping`` until it answers or ``verify.guest_timeout`` passes), run
``nvidia-smi`` through the agent (``POST .../agent/exec``, then ``GET .../agent/exec-status``
until ``exited``) and compare the GPUs it lists with the plan's count for that VM; read the CPUs
its QEMU process may run on (``Cpus_allowed_list``) against the planned affinity; stop it again
if this check started it. Guest PCI addresses are the VM's own, and a GPU on vfio-pci shows the
host no UUID, so GPUs are compared by number and model: a GPU the firmware gave no BAR is one
the guest driver cannot use, and nvidia-smi leaves it out.
"""

from __future__ import annotations

import time
from typing import Any

from gputopo.errors import GputopoError, NvsmiParseError, ProxmoxError
from gputopo.facts.vmproc import read_vm_cpus
from gputopo.formats.nvsmi import parse_query_gpu
from gputopo.plan.model import VmTarget
from gputopo.plan.vm.spec import VmConsumer
from gputopo.verify.context import Context
from gputopo.verify.report import FAIL, Check, verdict

NAME = "guest"
FIELDS = ["index", "pci.bus_id", "name", "uuid", "memory.total"]
GUEST_NVSMI = ["nvidia-smi", "--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader,nounits"]
START_TIMEOUT = 300.0
POLL = 0.2


def check(ctx: Context) -> Check | None:
    """Each asked-for VM's guest lists its planned GPUs; None when no VM is to be checked."""
    vms = [c for c in ctx.spec_node.vms.consumers if c.verify_guest or ctx.start_vms]
    if not vms:
        return None
    if ctx.plan is None:
        return Check(
            name=NAME,
            status=FAIL,
            summary="no plan: cannot tell which GPUs the VMs should have",
            details={"refusals": ctx.plan_error},
        )
    problems: list[str] = []
    passed: list[str] = []
    details: dict[str, Any] = {}
    for c in vms:
        target = next((t for t in ctx.plan.vms if t.vmid == c.vmid), None)
        try:
            seen = _guest(ctx, c, target)
        except GputopoError as e:
            problems.append(f"VM {c.vmid}: {e}")
            details[str(c.vmid)] = {"error": str(e)}
            continue
        details[str(c.vmid)] = seen
        want = target.gpus if target else 0
        rows = seen["gpus"]
        if len(rows) != want:
            hint = (
                " (a GPU the firmware gave no BAR is not usable: is the VM's 64-bit MMIO window large enough?)"
                if len(rows) < want
                else ""
            )
            problems.append(
                f"VM {c.vmid}: nvidia-smi in the guest lists {len(rows)} GPU(s), the plan gives it "
                f"{want}{hint}"
            )
            continue
        pinned = ""
        planned = target.config.get("affinity") if target else None
        if planned and seen["cpus"] and seen["cpus"] != planned:
            problems.append(
                f"VM {c.vmid}: its QEMU runs on CPUs {seen['cpus']}, the plan pins it to {planned}"
            )
            continue
        if planned and seen["cpus"]:
            pinned = f", pinned to CPUs {planned} (NUMA node {','.join(map(str, target.numa_nodes))})"
        names = sorted({r["name"] for r in rows})
        passed.append(
            f"VM {c.vmid}: the guest's nvidia-smi lists its {len(rows)} GPU(s) ({', '.join(names) or '-'})"
            f"{pinned}"
        )
    return verdict(NAME, details, "; ".join(passed), problems)


def _guest(ctx: Context, c: VmConsumer, target: VmTarget | None) -> dict[str, Any]:
    """What VM ``c.vmid``'s guest shows: ``gpus`` (nvidia-smi rows), ``cpus`` (its QEMU's CPU
    list). Raises GputopoError (ProxmoxError) when it cannot be asked."""
    px = ctx.ports.proxmox
    started = False
    if px.guest_status("qemu", c.vmid) != "running":
        px.guest_action("qemu", c.vmid, "start", START_TIMEOUT)
        started = True
    try:
        _wait_agent(ctx, c.vmid)
        out = _run(ctx, c.vmid, GUEST_NVSMI)
        cpus = read_vm_cpus(ctx.root, c.vmid)
    finally:
        if started:
            px.guest_action("qemu", c.vmid, "shutdown", START_TIMEOUT)
    return {"gpus": out, "cpus": cpus, "started_here": started}


def _wait_agent(ctx: Context, vmid: int) -> None:
    deadline = time.monotonic() + ctx.spec.verify.guest_timeout
    while True:
        try:
            ctx.ports.proxmox.agent_ping(vmid)
            return
        except ProxmoxError as e:
            # without an agent configured there is nothing to wait for
            if "No QEMU guest agent configured" in str(e) or time.monotonic() >= deadline:
                if "not running" in str(e):
                    raise ProxmoxError(
                        e.call,
                        e.status,
                        f"its guest agent did not answer within "
                        f"{ctx.spec.verify.guest_timeout:g} s ({e.pve_message})",
                    ) from None
                raise
        time.sleep(POLL)


def _run(ctx: Context, vmid: int, argv: list[str]) -> list[dict[str, Any]]:
    px = ctx.ports.proxmox
    pid = px.agent_exec(vmid, argv)
    deadline = time.monotonic() + ctx.spec.verify.guest_timeout
    while True:
        st = px.agent_exec_status(vmid, pid)
        if st.get("exited"):
            break
        if time.monotonic() >= deadline:
            raise ProxmoxError(
                "agent exec-status",
                None,
                f"{argv[0]} did not exit within {ctx.spec.verify.guest_timeout:g} s",
            )
        time.sleep(POLL)
    if st.get("exitcode") == 6:  # nvidia-smi: "No devices were found"
        return []
    if st.get("exitcode") != 0:
        text = str(st.get("err-data") or st.get("out-data") or "").strip().splitlines()
        raise ProxmoxError(
            "agent exec", None, f"{argv[0]} exited {st.get('exitcode')}" + (f": {text[-1]}" if text else "")
        )
    try:
        return parse_query_gpu(str(st.get("out-data") or ""), FIELDS)
    except NvsmiParseError as e:
        raise ProxmoxError("agent exec", None, f"nvidia-smi output not understood: {e}") from None
