"""A container whose GPUs do not move and whose service already runs the command the spec wants
(tensor-parallel size included) gets its drop-in written for the environment it adds, and its
running service is left alone: the same process (pid, start, argv) before and after, the drop-in
what the spec renders, the plan saying when the environment takes effect. Judged on the
simulated host, from what runs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gputopo.actions import StartService, StopService, WriteServiceDropin
from gputopo.facts.observe import observe
from gputopo.model.state import ContainerState, ServiceState
from gputopo.plan.findings import Findings
from gputopo.plan.planner import plan
from gputopo.plan.reads import spec_reads
from gputopo.plan.restarts import environment_only
from gputopo.plan.spec import parse_spec
from gputopo.sim.container import SimExec
from gputopo.usecases.apply import apply
from gputopo.usecases.verify import verify
from helpers import applysim
from helpers.applysim import (
    running_service,
    template,  # noqa: F401 (fixtures)
)

UNIT = "sglang.service"
DROPIN = f"etc/systemd/system/{UNIT}.d/gputopo.conf"
SPEC = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {count: 8}
        service: {unit: sglang.service}
"""


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-envonly-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    yield h
    h.stop()
    applysim.cleanup(base)


def show(host, *props: str) -> dict[str, str]:
    res = SimExec(host.dir).run(
        101, ["systemctl", "show", *[a for p in props for a in ("-p", p)], UNIT], timeout=5
    )
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


def what_runs(host) -> tuple[str, str, str | None, list[str]]:
    """(MainPID, its start, the main process's real command line, the GPU nodes it holds)."""
    props = show(host, "MainPID", "ActiveEnterTimestampMonotonic")
    return (
        props["MainPID"],
        props["ActiveEnterTimestampMonotonic"],
        *running_service(host.paths.root, 101, UNIT),
    )


@pytest.mark.slow  # applies on a simulated host (seconds)
def test_a_service_whose_gpus_stay_is_not_restarted_for_environment_settings(host):
    spec = parse_spec(SPEC)
    ports = host.ports()
    facts, now = observe(
        str(host.paths.root), spec_reads(spec), proxmox=ports.proxmox, exec=ports.exec, files=ports.files
    )
    assert now.containers[101].service.dropin is None and now.containers[101].service.tp == 8
    p = plan(facts, spec, now)
    # the drop-in only adds environment: written, nothing stops or starts
    (w,) = p.actions
    assert isinstance(w, WriteServiceDropin)
    assert not [a for a in p.actions if isinstance(a, (StopService, StartService))]
    assert (
        "CT 101: sglang.service keeps running, its GPUs do not move: its new drop-in only changes its "
        "environment (CUDA_DEVICE_ORDER, NCCL_P2P_DISABLE), which takes effect at its next start after a "
        "daemon-reload (the next plan that moves its GPUs, a restart of CT 101, or `systemctl daemon-reload && "
        "systemctl restart sglang.service` in it); until then peer-to-peer DMA stays on, which can corrupt data "
        "with SEV-SNP and a translating IOMMU" in p.warnings
    )

    before = what_runs(host)
    assert (
        before[0] != "0"
        and before[2] is not None
        and "--tp 8" in before[2]
        and len([d for d in before[3] if d[11:].isdigit()]) == 8
    )
    res = apply(spec, ports, root=str(host.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    assert res.status == "applied"
    assert what_runs(host) == before  # the same process: pid, start time, argv, GPUs held
    assert (host.paths.rootfs(101) / DROPIN).read_text() == w.content
    assert "NCCL_P2P_DISABLE=1" in w.content
    # systemd has not read it yet: the running service's environment is still the old one
    assert "NCCL_P2P_DISABLE" not in show(host, "Environment").get("Environment", "")
    assert (
        apply(spec, ports, root=str(host.paths.root), timeouts=applysim.FAST_TIMEOUTS).status == "no-changes"
    )
    report = verify(spec, ports, root=str(host.paths.root), only=["converged", "service", "platform"])
    assert [c.status for c in report.checks] == ["PASS", "PASS", "WARN"], report.to_text()
    assert report.check("platform").summary.endswith(
        "fix: its drop-in sets it; systemctl daemon-reload && systemctl restart sglang.service in CT 101"
    )

    # what the plan says takes it into effect does: a new process with the drop-in's environment
    sx = SimExec(host.dir)
    assert sx.run(101, ["systemctl", "daemon-reload"], timeout=5).rc == 0
    assert sx.run(101, ["systemctl", "restart", UNIT], timeout=30).rc == 0
    # a new process: its start moved (the simulator numbers a container's processes from a fixed
    # base, so a restarted server may get its old pid back)
    assert what_runs(host)[1] != before[1]
    assert "NCCL_P2P_DISABLE=1" in show(host, "Environment")["Environment"]
    report = verify(spec, ports, root=str(host.paths.root), only=["platform"])
    assert report.check("platform").status == "PASS", report.to_text()


@pytest.mark.slow
def test_a_drop_in_that_changes_the_command_still_restarts_the_service(host):
    """The same GPUs, but the spec's command differs from what runs: not settings only."""
    spec = parse_spec(
        SPEC.replace(
            "service: {unit: sglang.service}", "service: {unit: sglang.service, command: /opt/srv --tp 8}"
        )
    )
    ports = host.ports()
    facts, now = observe(
        str(host.paths.root), spec_reads(spec), proxmox=ports.proxmox, exec=ports.exec, files=ports.files
    )
    p = plan(facts, spec, now)
    kinds = [type(a) for a in p.actions]
    assert kinds == [WriteServiceDropin, StopService, StartService]
    assert not [w for w in p.warnings if "keeps running" in w]


# --- what counts as settings only (pure) -----------------------------------------------------------

RUNS = "/srv/server --model m --tp 8"
OLD = f"[Service]\nExecStart=\nExecStart={RUNS}\nEnvironment=CUDA_DEVICE_ORDER=PCI_BUS_ID\n"


def only_env(
    new: str, old: str | None = OLD, active: bool = True, runs: str = RUNS
) -> tuple[bool, list[str]]:
    c = parse_spec(SPEC).nodes[0].containers[0]
    state = ContainerState(
        status="running", service=ServiceState(unit=UNIT, active=active, exec_start=runs, tp=8, dropin=old)
    )
    dropin = WriteServiceDropin(vmid=101, unit=UNIT, path="/" + DROPIN, content=new, tp=8)
    found = Findings()
    return environment_only(c, state, dropin, found), found.warnings


def test_only_environment_and_comments_leave_the_service_running():
    ok, (w,) = only_env(OLD.replace("PCI_BUS_ID", "FASTEST_FIRST") + '# why\nEnvironment="A=1 2" B=3\n')
    assert ok and "environment (A, B, CUDA_DEVICE_ORDER)" in w and "peer-to-peer" not in w
    assert only_env("# a comment only\n" + OLD) == (True, [])  # nothing to take effect: no warning


def test_a_command_tp_or_other_directive_change_is_not_settings_only():
    assert only_env(OLD.replace("--tp 8", "--tp 4"))[0] is False
    assert only_env(OLD.replace("--model m", "--model n"))[0] is False
    assert only_env(OLD + "LimitMEMLOCK=infinity\n")[0] is False
    assert only_env(OLD + "Environment=X=1\n", active=False)[0] is False  # a stopped one starts anyway
    # a %-sign is doubled in the file (systemd specifiers) and runs single
    pct = OLD.replace("--model m", "--model 100%%")
    assert only_env(pct, old=None, runs=RUNS.replace("--model m", "--model 100%"))[0] is True
