"""The demo: the operator's whole story in one call on a simulated seed host: discover, write
the NUMA split's spec, plan, apply then verify (the composition of :func:`gputopo.usecases.apply.run`),
show both sides' nvidia-smi, and plan again. It ends with VM 201 running on the four GPUs of
NUMA node 1, pinned there, and its guest's own nvidia-smi (through the QEMU guest agent)
listing them. Output goes through the ``show`` callbacks so the CLI decides how it looks.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gputopo.apply import ApplyRequest, ApplyResult, Progress, Timeouts
from gputopo.model.documents import VerifyReport
from gputopo.model.facts import Facts
from gputopo.plan.spec import Spec
from gputopo.ports import Ports
from gputopo.sim.demo import GUEST_NVSMI, NVIDIA_SMI_QUERY, guest_nvidia_smi
from gputopo.sim.host import SimHost
from gputopo.usecases.apply import run
from gputopo.usecases.connect import sim_ports
from gputopo.usecases.readplan import read_and_plan
from gputopo.usecases.verify import verify


@dataclass
class DemoShow:
    """How the demo prints each stage (the CLI supplies rich renderers)."""

    heading: Callable[[str], None]
    facts: Callable[[Facts], None]
    text: Callable[[str], None]
    report: Callable[[VerifyReport], None]
    progress: Progress


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


@dataclass(frozen=True)
class DemoHost:
    """The simulated host the demo runs on, started: its directory, node and API URL."""

    host: SimHost
    dir: Path
    ports: Ports


@contextmanager
def demo_host(workdir: str | None, source: str, pace: float) -> Iterator[DemoHost]:
    """A simulated host made from ``source`` under ``workdir`` (a temporary directory, removed
    afterwards, when None), the GPUs that move slowed to ``pace``; stopped on the way out.
    Raises SimHostError, what creating it raises."""
    from gputopo.facts.discover import discover

    keep = workdir is not None
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="gputopo-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    host = None
    try:
        host = SimHost.create(base / "sim", source=source)
        facts = discover(str(host.paths.root))
        numa = [g.numa_node for g in facts.gpus if g.numa_node is not None]
        lowest = min(numa, default=0)
        host.set_latencies(pace, [g.address for g in facts.gpus if g.numa_node not in (None, lowest)])
        yield DemoHost(host, base, sim_ports(host))
    finally:
        if host is not None:
            host.stop()
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


def _starter(
    before: Facts, workdir: Path, container: int, vm_mapping: str, container_mapping: str, vm: int
) -> tuple[Spec, Path]:
    """The NUMA split's starter spec, written to ``workdir/gputopo.yaml``, and its path."""
    from gputopo.plan.spec import parse_spec
    from gputopo.plan.starter import init_spec

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
    return parse_spec(text, file=str(spec_path)), spec_path


def _apply_then_verify(
    spec: Spec, spec_path: Path, ports: Ports, root: str, show: DemoShow, timeouts: Timeouts
) -> ApplyResult:
    """Apply ``spec`` showing its plan and progress, then verify from fresh facts."""

    def verified() -> VerifyReport:
        show.heading("4. Verify from fresh facts")
        report = verify(spec, ports, root=root)
        show.report(report)
        return report

    req = ApplyRequest(
        spec,
        ports,
        root,
        functools.partial(read_and_plan, spec, ports, root),
        confirm=lambda p: (show.text(p.to_text()), True)[1],
        progress=show.progress,
        timeouts=timeouts,
        spec_path=str(spec_path),
    )
    return run(req, verified)


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
    from gputopo.facts.discover import discover

    show.heading("1. Discover: what the host has")
    before = discover(root)
    show.facts(before)

    show.heading(f"2. Spec: NUMA split, container {container} keeps one node, VMs get the other")
    spec, spec_path = _starter(before, workdir, container, vm_mapping, container_mapping, vm)
    show.text(
        f"wrote {spec_path} (gputopo init --split numa --container {container} "
        f"--vm-mapping {vm_mapping} --container-mapping {container_mapping} --vm {vm})"
    )

    show.heading("3. Plan and apply (journaled, locked, rolled back on any failure)")
    t = timeouts or Timeouts()
    applied = _apply_then_verify(spec, spec_path, ports, root, show, t)

    view = ports.exec.run(container, NVIDIA_SMI_QUERY, timeout=30.0)
    show.text(f"inside CT {container}: {' '.join(NVIDIA_SMI_QUERY)}\n{view.stdout.rstrip()}")
    guest = guest_nvidia_smi(ports, vm)
    show.text(f"inside VM {vm} (QEMU guest agent): {' '.join(GUEST_NVSMI)}\n{guest.rstrip()}")

    _, _, again = read_and_plan(spec, ports, root)
    show.text("a second plan: " + ("No changes" if again.is_empty else again.to_text()))
    return DemoResult(
        spec_path=spec_path,
        before=before,
        applied=applied,
        report=applied.verify,
        second_plan_empty=again.is_empty,
        container_view=view.stdout,
        guest_view=guest,
    )
