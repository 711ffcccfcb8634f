"""The operator's whole story in one call: discover, plan the NUMA split, apply it, verify; it
ends with VM 201 running on the four GPUs of NUMA node 1, pinned there, and its guest's own
nvidia-smi (through the QEMU guest agent) listing them.

:func:`run_demo` works on whatever ports it is given; ``gputopo demo`` hands it a simulated
seed host (``gputopo.sim``), so the same apply and verify code a real host runs is what the
demo shows. Output goes through the ``show`` callbacks so the CLI decides how it looks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gputopo.apply import ApplyResult, Progress, Timeouts, apply
from gputopo.facts.discover import discover
from gputopo.model.facts import Facts
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import init_spec
from gputopo.ports import Ports
from gputopo.verify import VerifyReport, verify

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,pci.bus_id,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader",
]


@dataclass
class DemoShow:
    """How the demo prints each stage (the CLI supplies rich renderers)."""

    heading: Callable[[str], None]
    facts: Callable[[Facts], None]
    text: Callable[[str], None]
    report: Callable[[VerifyReport], None]
    progress: Progress


GUEST_NVSMI = ["nvidia-smi", "--query-gpu=index,pci.bus_id,name,memory.total", "--format=csv,noheader"]


@dataclass
class DemoResult:
    spec_path: Path
    before: Facts
    applied: ApplyResult
    report: VerifyReport | None
    second_plan_empty: bool
    container_view: str = ""
    guest_view: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.applied.status == "applied"
            and self.report is not None
            and self.report.ok
            and self.second_plan_empty
        )


def run_demo(
    ports: Ports,
    root: str,
    workdir: Path,
    show: DemoShow,
    *,
    container: int = 101,
    vm_mapping: str = "pro6000-vm",
    container_mapping: str = "pro6000",
    vm: int = 201,
    timeouts: Timeouts | None = None,
) -> DemoResult:
    """Discover the host, write a starter spec for the NUMA split (VM ``vm`` taking the VM
    mapping's GPUs), plan, apply and verify it, and show both sides' nvidia-smi.

    Returns a :class:`DemoResult`; ``.ok`` is True when the split applied, verification passed
    and a second plan is empty. Raises what apply and verify raise for a broken host.
    """
    show.heading("1. Discover: what the host has")
    before = discover(root)
    show.facts(before)

    show.heading(f"2. Spec: NUMA split, container {container} keeps one node, VMs get the other")
    text = init_spec(
        before,
        split="numa",
        container=container,
        vm_mapping=vm_mapping,
        container_mapping=container_mapping,
        vm=vm,
    )
    spec_path = workdir / "gputopo.yaml"
    spec_path.write_text(text)
    spec = parse_spec(text, file=str(spec_path))
    show.text(
        f"wrote {spec_path} (gputopo init --split numa --container {container} "
        f"--vm-mapping {vm_mapping} --container-mapping {container_mapping} --vm {vm})"
    )

    show.heading("3. Plan and apply (journaled, locked, rolled back on any failure)")
    applied = apply(
        spec,
        ports,
        root=root,
        confirm=lambda p: (show.text(p.to_text()), True)[1],
        progress=show.progress,
        timeouts=timeouts or Timeouts(),
        spec_path=str(spec_path),
        verify=None,
    )

    show.heading("4. Verify from fresh facts")
    report = verify(spec, ports, root=root)
    show.report(report)

    view = ports.exec.run(container, NVIDIA_SMI_QUERY, timeout=30.0)
    show.text(f"inside CT {container}: {' '.join(NVIDIA_SMI_QUERY)}\n{view.stdout.rstrip()}")
    guest = _guest_nvidia_smi(ports, vm)
    show.text(f"inside VM {vm} (QEMU guest agent): {' '.join(GUEST_NVSMI)}\n{guest.rstrip()}")

    again = apply(spec, ports, root=root, dry_run=True, timeouts=timeouts or Timeouts())
    second_empty = again.plan is not None and again.plan.is_empty
    show.text("a second plan: " + ("No changes" if second_empty else again.plan.to_text()))
    return DemoResult(
        spec_path=spec_path,
        before=before,
        applied=applied,
        report=report,
        second_plan_empty=second_empty,
        container_view=view.stdout,
        guest_view=guest,
    )


def _guest_nvidia_smi(ports: Ports, vm: int, timeout: float = 60.0) -> str:
    """What ``nvidia-smi`` prints in VM ``vm``'s guest, run through its QEMU guest agent."""
    px = ports.proxmox
    pid = px.agent_exec(vm, GUEST_NVSMI)
    deadline = time.monotonic() + timeout
    while True:
        st = px.agent_exec_status(vm, pid)
        if st.get("exited") or time.monotonic() >= deadline:
            return str(st.get("out-data") or st.get("err-data") or "")
        time.sleep(0.1)
