"""Verify: an independent health check of a host against its spec, the operator's "all clear".

Everything is read fresh (a new :func:`gputopo.facts.discover.discover` and
:func:`gputopo.facts.current.read_current`), never taken from what an apply remembers. Seven checks,
each PASS / WARN / FAIL with the numbers behind it:

1. ``converged``  -- a fresh plan is empty (drivers, container devices, mappings, persistence
   files, service drop-in); a FAIL lists the pending actions;
2. ``vm``         -- every VM GPU and its IOMMU group companions on vfio-pci (sysfs ``driver``
   links), ``/dev/vfio/<group>`` present, Proxmox's own mapping check
   (``GET /cluster/mapping/pci?check-node=<node>``) clean: an ``error`` fails, a ``warning`` warns;
3. ``container``  -- inside each container ``nvidia-smi --query-gpu`` lists exactly its planned
   GPUs, matched by bus id (missing and extra ones named);
4. ``memory``     -- per GPU used/total and headroom; the spread of memory used across the
   service's GPUs ((max-min)/max) within ``verify.memory_spread_pct`` as the sign of a balanced
   tensor-parallel load; headroom per GPU at least ``verify.min_headroom_mib`` when set;
5. ``service``    -- the unit active and running with the planned tensor-parallel size (from
   its effective ``ExecStart``);
6. ``inference``  -- an OpenAI-compatible chat completion answers ``verify.prompt`` with
   ``verify.expect`` within the timeout (a hung endpoint fails, never hangs the tool), plus the
   server's KV-cache capacity in tokens when it reports one (a WARN when it does not);
7. ``platform``   -- SEV-SNP on with the IOMMU translating and peer-to-peer DMA not disabled for a
   service whose GPUs sit under more than one PCIe root complex: a WARN with the fix.

:func:`verify` returns a :class:`VerifyReport`; ``report.ok`` is False for any FAIL (and for
any WARN when ``strict``), ``report.exit_code`` is 0 or 1. Parsing is done by the pure
``parse_*`` functions here, tested with literal strings.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import threading
import time
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from gputopo.facts.current import parse_systemctl_show, read_current
from gputopo.facts.discover import discover
from gputopo.errors import AddressError, GputopoError, HttpError, PlanRefused
from gputopo.model.facts import Facts, normalize_address
from gputopo.formats.nvsmi import parse_query_gpu
from gputopo.errors import NvsmiParseError
from gputopo.model.state import CurrentState
from gputopo.actions import VFIO
from gputopo.plan.model import ContainerTarget, Plan
from gputopo.plan.select import pick_node
from gputopo.plan.planner import plan as make_plan
from gputopo.ports import HttpPort, Ports
from gputopo.plan.render import p2p_must_be_disabled, parse_tp
from gputopo.plan.spec import Container, Node, Spec

Status = Literal["PASS", "WARN", "FAIL"]
PASS: Status = "PASS"
WARN: Status = "WARN"
FAIL: Status = "FAIL"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}

CHECKS = ("converged", "vm", "container", "memory", "service", "inference", "platform")
QUERY_FIELDS = ["index", "pci.bus_id", "memory.used", "memory.total", "utilization.gpu"]
NVSMI_ARGV = ["nvidia-smi", "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]
EXEC_TIMEOUT = 30.0
P2P_VAR = "NCCL_P2P_DISABLE"


# --- the report ------------------------------------------------------------------------------


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Check(_M):
    """One check's verdict: ``summary`` is one line with the numbers, ``details`` the data."""

    name: str
    status: Status
    summary: str
    details: dict[str, Any] = Field(default_factory=dict)


class VerifyReport(_M):
    """Every check of one verification. Its JSON form (``gputopo verify --json``) is stable."""

    node: str | None = None
    strict: bool = False
    checks: list[Check] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check FAILed (and, when ``strict``, none WARNed)."""
        worst = WARN if self.strict else FAIL
        return not any(c.status == FAIL or c.status == worst for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def check(self, name: str) -> Check | None:
        for c in self.checks:
            if c.name == name:
                return c
        return None

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, WARN: 0, FAIL: 0}
        for c in self.checks:
            out[c.status] += 1
        return out

    def summary_line(self) -> str:
        """``all clear: 7 PASS`` or ``verification failed: 2 FAIL (memory, inference), 1 WARN (platform)``."""
        n = self.counts()
        parts = []
        for status in (FAIL, WARN):
            if n[status]:
                names = ", ".join(c.name for c in self.checks if c.status == status)
                parts.append(f"{n[status]} {status} ({names})")
        if self.ok:
            head = "all clear"
            parts.insert(0, f"{n[PASS]} PASS")
        else:
            head = "verification failed" + (" (strict)" if self.strict and not n[FAIL] else "")
        return f"{head}: " + ", ".join(parts)

    def to_json(self) -> str:
        data = self.model_dump()
        data["ok"] = self.ok
        data["exit_code"] = self.exit_code
        data["summary"] = self.summary_line()
        return json.dumps(data, indent=2, default=str)

    def to_text(self) -> str:
        lines = [f"{c.status:<4}  {c.name:<10} {c.summary}" for c in self.checks]
        return "\n".join(lines + [self.summary_line()]) + "\n"


# --- pure parsers ----------------------------------------------------------------------------


class GpuRow(_M):
    """One GPU as nvidia-smi shows it inside a container (MiB; None when not reported)."""

    index: int | None
    address: str
    used: int | None
    total: int | None
    utilization: int | None

    @property
    def headroom(self) -> int | None:
        return None if self.used is None or self.total is None else self.total - self.used


def parse_gpu_rows(text: str) -> list[GpuRow]:
    """Rows of ``nvidia-smi --query-gpu=index,pci.bus_id,memory.used,memory.total,utilization.gpu
    --format=csv,noheader[,nounits]`` (with or without units or a header).

    Bus ids are normalised (``00000000:01:00.0`` -> ``0000:01:00.0``). Raises
    :class:`gputopo.errors.NvsmiParseError` for a line of another shape.
    """
    rows = []
    for r in parse_query_gpu(text, QUERY_FIELDS):
        try:
            address = normalize_address(str(r["pci.bus_id"]))
        except AddressError:
            raise NvsmiParseError(str(r["pci.bus_id"]), "pci.bus_id is not a PCI address") from None
        rows.append(GpuRow(index=r["index"], address=address, used=_int(r["memory.used"]),
                           total=_int(r["memory.total"]), utilization=_int(r["utilization.gpu"])))
    return rows


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def memory_spread_pct(used: list[int]) -> float:
    """(max - min) / max of ``used`` in percent; 0 for fewer than two values or all zero."""
    if len(used) < 2 or max(used) <= 0:
        return 0.0
    return (max(used) - min(used)) / max(used) * 100


def parse_show_properties(text: str) -> dict[str, str]:
    """``systemctl show -p A -p B UNIT`` output (``Key=value`` lines) as a dict (first wins)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key not in out:
            out[key] = value
    return out


def parse_environment(value: str) -> dict[str, str]:
    """systemd's ``Environment=`` property (``A=1 "B=two words"``) as a dict.

    Words that are not ``NAME=value`` are skipped; unbalanced quotes fall back to plain
    splitting on blanks.
    """
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    out = {}
    for w in words:
        name, sep, v = w.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            out[name] = v
    return out


def p2p_disabled(environment: dict[str, str], command: str | None) -> bool:
    """True when NCCL peer-to-peer is disabled: ``NCCL_P2P_DISABLE`` set to 1 in the unit's
    environment or as an ``env NCCL_P2P_DISABLE=1`` word in its command."""
    if environment.get(P2P_VAR, "").strip() == "1":
        return True
    words = (command or "").split()
    return f"{P2P_VAR}=1" in words


def parse_root_complex(device_path: str) -> str | None:
    """The PCI root complex (host bridge domain:bus, ``0000:60``) of a resolved sysfs device path
    such as ``.../sys/devices/pci0000:60/0000:60:01.1/0000:61:00.0``; None when it has none."""
    m = re.search(r"/devices/pci([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2})(?:/|$)", device_path)
    return f"{m.group(1).lower()}:{m.group(2).lower()}" if m else None


def answer_matches(content: str, expect: str) -> bool:
    """True when ``expect`` occurs in ``content`` as a whole word or number (``91`` in
    ``The answer is 91.``, not in ``191`` or ``91.5``), ignoring case."""
    # a full stop ends a sentence but not a number: "91." matches, "91.5" and "0.91" do not
    pattern = r"(?<![0-9A-Za-z])(?<![0-9]\.)" + re.escape(expect.strip()) + r"(?![0-9A-Za-z])(?!\.[0-9])"
    return re.search(pattern, content, re.IGNORECASE) is not None


def parse_sglang_kv_tokens(info: Any) -> int | None:
    """``max_total_num_tokens`` from SGLang's ``/get_server_info`` JSON (top level, or under
    ``internal_states``); None when absent or not a positive number."""
    if not isinstance(info, dict):
        return None
    value = info.get("max_total_num_tokens")
    if value is None:
        states = info.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], dict):
            value = states[0].get("max_total_num_tokens")
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


_LABELS_RE = re.compile(r'(\w+)="([^"]*)"')


def parse_vllm_kv_tokens(metrics: str) -> int | None:
    """KV-cache capacity in tokens from vLLM's Prometheus ``/metrics``: ``num_gpu_blocks`` x
    ``block_size`` of the ``vllm:cache_config_info`` labels; None when not there."""
    for line in metrics.splitlines():
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = dict(_LABELS_RE.findall(line[line.index("{"): line.rindex("}") + 1]))
        try:
            blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
        except (KeyError, ValueError):
            return None
        return blocks * size if blocks > 0 and size > 0 else None
    return None


def mapping_checks(items: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Mapping id -> its ``checks`` (``{severity, message}``) from ``GET /cluster/mapping/pci``
    with ``check-node``; messages stripped to one line."""
    out: dict[str, list[dict[str, str]]] = {}
    for m in items:
        checks = []
        for c in m.get("checks") or []:
            checks.append({"severity": str(c.get("severity", "error")),
                           "message": " ".join(str(c.get("message", "")).split())})
        out[str(m.get("id"))] = checks
    return out


# --- reading ---------------------------------------------------------------------------------


def read_root_complexes(root: str | Path, addresses: list[str]) -> dict[str, str | None]:
    """Address -> root complex, from where ``<root>/sys/bus/pci/devices/<addr>`` resolves."""
    out = {}
    for a in addresses:
        path = os.path.realpath(os.path.join(str(root), "sys/bus/pci/devices", a))
        out[a] = parse_root_complex(path)
    return out


class _Ctx:
    """What the checks share: fresh facts, current state, the plan (or why there is none)."""

    def __init__(self, spec: Spec, ports: Ports, root: str, node: str | None, http_timeout: float):
        self.spec = spec
        self.ports = ports
        self.root = root
        self.http_timeout = http_timeout
        self.facts: Facts = discover(root)
        self.spec_node: Node = pick_node(spec, self.facts, node)
        self.node = self.spec_node.name
        self.current: CurrentState | None = None
        self.current_error: str | None = None
        try:
            self.current = read_current(spec, self.facts, proxmox=ports.proxmox, exec=ports.exec,
                                        files=ports.files, node=self.node)
        except GputopoError as e:
            self.current_error = str(e)
        self.plan: Plan | None = None
        self.plan_error: list[str] = []
        try:
            self.plan = make_plan(self.facts, spec, self.current or CurrentState(), node=self.node)
        except PlanRefused as e:
            self.plan_error = [f"refused: {r}" for r in e.refusals]
        self._smi: dict[int, tuple[list[GpuRow] | None, str | None]] = {}
        self._show: dict[int, tuple[dict[str, str] | None, str | None]] = {}

    def target(self, vmid: int) -> ContainerTarget | None:
        if self.plan is None:
            return None
        for ct in self.plan.containers:
            if ct.vmid == vmid:
                return ct
        return None

    def nvidia_smi(self, vmid: int) -> tuple[list[GpuRow] | None, str | None]:
        """(rows, None) or (None, why not), run once per container."""
        if vmid not in self._smi:
            self._smi[vmid] = self._run_smi(vmid)
        return self._smi[vmid]

    def _run(self, vmid: int, argv: list[str], what: str) -> tuple[str | None, str | None]:
        """(stdout, None) of ``argv`` in the container, or (None, why not: the error, or
        ``<what> exited N: <last line of stderr, else of stdout>``)."""
        try:
            res = self.ports.exec.run(vmid, argv, EXEC_TIMEOUT)
        except GputopoError as e:
            return None, str(e)
        if res.rc != 0:
            text = (res.stderr.strip() or res.stdout.strip()).splitlines()
            return None, f"{what} exited {res.rc}" + (f": {text[-1]}" if text else "")
        return res.stdout, None

    def _run_smi(self, vmid: int) -> tuple[list[GpuRow] | None, str | None]:
        out, err = self._run(vmid, list(NVSMI_ARGV), "nvidia-smi")
        if out is None:
            return None, err
        try:
            return parse_gpu_rows(out), None
        except NvsmiParseError as e:
            return None, str(e)

    def service_props(self, vmid: int, unit: str) -> tuple[dict[str, str] | None, str | None]:
        """(``systemctl show`` properties, None) or (None, why not), read once per container."""
        if vmid not in self._show:
            argv = ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "ExecStart",
                    "-p", "Environment", unit]
            out, err = self._run(vmid, argv, f"systemctl show {unit}")
            self._show[vmid] = (None, err) if out is None else (parse_show_properties(out), None)
        return self._show[vmid]

    def service_command(self, vmid: int, unit: str) -> str | None:
        """The unit's effective ExecStart command line; None when it cannot be read."""
        props, _ = self.service_props(vmid, unit)
        if props is None:
            return None
        _, command = parse_systemctl_show("ExecStart=" + props.get("ExecStart", ""))
        return command


# --- the checks ------------------------------------------------------------------------------


def check_converged(ctx: _Ctx) -> Check:
    """A fresh plan is empty: PASS; pending actions, an unreadable current state or a refused plan: FAIL.

    Returns the Check; a GputopoError raised here becomes a FAIL in :func:`verify`.
    """
    if ctx.current_error:
        return Check(name="converged", status=FAIL, summary=f"cannot read the current state: {ctx.current_error}",
                     details={"error": ctx.current_error})
    if ctx.plan is None:
        return Check(name="converged", status=FAIL,
                     summary=f"the spec cannot be planned on this host ({len(ctx.plan_error)} refusal(s))",
                     details={"refusals": ctx.plan_error})
    actions = [a.describe() for a in ctx.plan.actions]
    placed = {"nvidia": 0, VFIO: 0}
    for t in ctx.plan.target:
        if t.driver in placed:
            placed[t.driver] += 1
    details = {"pending": actions, "gpus_nvidia": placed["nvidia"], "gpus_vfio": placed[VFIO]}
    if actions:
        return Check(name="converged", status=FAIL,
                     summary=f"{len(actions)} pending action(s): " + "; ".join(actions[:3])
                     + (" ..." if len(actions) > 3 else ""), details=details)
    return Check(name="converged", status=PASS,
                 summary=f"fresh plan is empty ({placed['nvidia']} GPU(s) on nvidia, {placed[VFIO]} on vfio-pci)",
                 details=details)


def check_vm(ctx: _Ctx) -> Check:
    """VM GPUs and their companions on vfio-pci with /dev/vfio/<group>, and Proxmox's mapping check clean:
    an error on a managed mapping FAILs, one on another mapping or a warning WARNs.

    Returns the Check; a GputopoError raised here becomes a FAIL in :func:`verify`.
    """
    if ctx.plan is None:
        return Check(name="vm", status=FAIL, summary="no plan: cannot tell which GPUs belong to VMs",
                     details={"refusals": ctx.plan_error})
    vm_targets = [t for t in ctx.plan.target if t.driver == VFIO]
    problems: list[str] = []
    warnings: list[str] = []
    gpus: list[dict[str, Any]] = []
    for t in vm_targets:
        g = ctx.facts.gpu(t.address)
        if g is None:
            problems.append(f"{t.address} is gone from the bus")
            continue
        members = {m.address: m.driver for m in g.iommu_members if m.address in g.companions}
        vfio_dev = g.iommu_group is not None and g.iommu_group in ctx.facts.host.vfio_groups
        gpus.append({"address": g.address, "driver": g.driver, "group": g.iommu_group,
                     "companions": members, "dev_vfio": vfio_dev})
        if g.driver != VFIO:
            problems.append(f"{g.address} on {g.driver or 'no driver'}, not vfio-pci")
        for a, drv in members.items():
            if drv != VFIO:
                problems.append(f"{a} (group {g.iommu_group} of {g.address}) on {drv or 'no driver'}, not vfio-pci")
        if not vfio_dev:
            problems.append(f"/dev/vfio/{g.iommu_group if g.iommu_group is not None else '?'} missing for {g.address}")
    managed = set(ctx.plan.mappings)
    details: dict[str, Any] = {"gpus": gpus, "mappings": {}}
    try:
        checks = mapping_checks(ctx.ports.proxmox.mappings(check_node=ctx.node))
    except GputopoError as e:
        problems.append(f"mapping check failed: {e}")
        checks = {}
    details["mappings"] = checks
    for mid in sorted(managed):
        if mid not in checks and ctx.plan.mappings[mid].map:
            problems.append(f"mapping {mid} does not exist")
    for mid, items in sorted(checks.items()):
        for c in items:
            line = f"mapping {mid}: {c['severity']}: {c['message']}"
            if c["severity"] == "error" and mid in managed:
                problems.append(line)
            elif c["severity"] in ("error", "warning"):
                # a broken mapping the spec does not manage is not gputopo's to fix
                warnings.append(line + ("" if mid in managed else " (not managed by the spec)"))
    details["problems"], details["warnings"] = problems, warnings
    n = len(vm_targets)
    groups = len({t.iommu_group for t in vm_targets})
    if problems:
        return Check(name="vm", status=FAIL, summary="; ".join(problems), details=details)
    if warnings:
        return Check(name="vm", status=WARN, summary="; ".join(warnings), details=details)
    if not n:
        return Check(name="vm", status=PASS, summary="no VM GPUs in the spec; mappings check clean", details=details)
    return Check(name="vm", status=PASS,
                 summary=f"{n} GPU(s) in {groups} group(s) on vfio-pci with their companions, /dev/vfio present, "
                 f"mapping check clean ({', '.join(sorted(managed)) or 'none'})", details=details)


def _containers(ctx: _Ctx) -> list[Container]:
    return list(ctx.spec_node.containers)


def check_container(ctx: _Ctx) -> Check:
    """Inside each container nvidia-smi lists exactly its planned GPUs; missing or extra ones FAIL.

    Returns the Check; a GputopoError raised here becomes a FAIL in :func:`verify`.
    """
    problems: list[str] = []
    parts: list[str] = []
    details: dict[str, Any] = {}
    for c in _containers(ctx):
        t = ctx.target(c.vmid)
        if t is None:
            problems.append(f"CT {c.vmid}: no plan for it")
            continue
        planned = list(t.gpus)
        if not planned:
            parts.append(f"CT {c.vmid}: no GPUs planned")
            details[str(c.vmid)] = {"planned": [], "seen": []}
            continue
        rows, err = ctx.nvidia_smi(c.vmid)
        if rows is None:
            problems.append(f"CT {c.vmid}: {err}")
            details[str(c.vmid)] = {"planned": planned, "error": err}
            continue
        seen = [r.address for r in rows]
        missing = [a for a in planned if a not in seen]
        extra = [a for a in seen if a not in planned]
        details[str(c.vmid)] = {"planned": planned, "seen": seen, "missing": missing, "extra": extra}
        if missing:
            problems.append(f"CT {c.vmid}: missing {', '.join(missing)} ({len(seen)} of {len(planned)} seen)")
        if extra:
            problems.append(f"CT {c.vmid}: extra {', '.join(extra)} (not planned)")
        if not missing and not extra:
            parts.append(f"CT {c.vmid}: nvidia-smi lists exactly the {len(planned)} planned GPU(s)")
    if problems:
        return Check(name="container", status=FAIL, summary="; ".join(problems), details=details)
    return Check(name="container", status=PASS, summary="; ".join(parts) or "no containers in the spec",
                 details=details)


def assess_memory(rows: list[GpuRow], spread_limit_pct: float,
                  min_headroom_mib: int | None = None) -> tuple[Status, str, dict[str, Any]]:
    """The verdict on one service's GPUs: (PASS or FAIL, one line with the numbers, details).

    FAIL when a GPU reports no memory figures, when the spread of memory used
    ((max - min) / max) exceeds ``spread_limit_pct`` (an unbalanced tensor-parallel load), or when
    a GPU's headroom (total - used) is below ``min_headroom_mib``.
    """
    per_gpu = [{"address": r.address, "used_mib": r.used, "total_mib": r.total, "headroom_mib": r.headroom}
               for r in rows]
    details: dict[str, Any] = {"gpus": per_gpu}
    unknown = [r.address for r in rows if r.headroom is None]
    known = [r for r in rows if r.headroom is not None]
    if not rows:
        return FAIL, "no GPUs to measure", details
    if unknown:
        return FAIL, f"memory not reported for {', '.join(unknown)}", details
    used = [int(r.used) for r in known]  # type: ignore[arg-type]
    spread = memory_spread_pct(used)
    low = min(known, key=lambda r: int(r.headroom))  # type: ignore[arg-type]
    details.update(spread_pct=round(spread, 2), max_used_mib=max(used), min_used_mib=min(used),
                   min_headroom_mib=low.headroom)
    totals = sorted({int(r.total) for r in known})  # type: ignore[arg-type]
    figures = (f"used {'/'.join(str(u) for u in used)} of {'/'.join(str(t) for t in totals)} MiB, "
               f"spread {spread:.1f} % (limit {spread_limit_pct:g} %), headroom >= {low.headroom} MiB")
    if spread > spread_limit_pct:
        busiest = max(known, key=lambda r: int(r.used))  # type: ignore[arg-type]
        idlest = min(known, key=lambda r: int(r.used))  # type: ignore[arg-type]
        return FAIL, (f"unbalanced: {figures}; {busiest.address} {busiest.used} MiB vs "
                      f"{idlest.address} {idlest.used} MiB"), details
    if min_headroom_mib is not None and int(low.headroom) < min_headroom_mib:  # type: ignore[arg-type]
        return FAIL, (f"{low.address} headroom {low.headroom} MiB < {min_headroom_mib} MiB for the KV cache; "
                      f"{figures}"), details
    return PASS, figures, details


def check_memory(ctx: _Ctx) -> Check:
    """Memory of each service's GPUs balanced and with headroom (see :func:`assess_memory`).

    Returns the Check; a GputopoError raised here becomes a FAIL in :func:`verify`.
    """
    v = ctx.spec.verify
    problems: list[str] = []
    parts: list[str] = []
    details: dict[str, Any] = {"spread_limit_pct": v.memory_spread_pct, "min_headroom_mib": v.min_headroom_mib}
    for c in _containers(ctx):
        t = ctx.target(c.vmid)
        if t is None or not t.gpus or c.service is None:
            continue
        rows, err = ctx.nvidia_smi(c.vmid)
        if rows is None:
            problems.append(f"CT {c.vmid}: no memory figures ({err})")
            continue
        status, line, d = assess_memory([r for r in rows if r.address in t.gpus], v.memory_spread_pct,
                                        v.min_headroom_mib)
        details[str(c.vmid)] = d
        (problems if status == FAIL else parts).append(f"CT {c.vmid}: {line}")
    if problems:
        return Check(name="memory", status=FAIL, summary="; ".join(problems), details=details)
    return Check(name="memory", status=PASS, summary="; ".join(parts) or "no service with GPUs to check",
                 details=details)


def check_service(ctx: _Ctx) -> Check:
    """Each service active and running with the planned tensor-parallel size; anything else FAILs.

    Returns the Check; a GputopoError raised here becomes a FAIL in :func:`verify`.
    """
    problems: list[str] = []
    parts: list[str] = []
    details: dict[str, Any] = {}
    for c in _containers(ctx):
        t = ctx.target(c.vmid)
        if c.service is None or t is None or not t.gpus:
            continue
        unit, want = c.service.unit, len(t.gpus)
        try:
            res = ctx.ports.exec.run(c.vmid, ["systemctl", "is-active", unit], EXEC_TIMEOUT)
        except GputopoError as e:
            problems.append(f"CT {c.vmid}: {e}")
            continue
        if not res.stdout.strip():
            # pct itself failed (container stopped or gone): its message says why
            why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.rc}"
            problems.append(f"CT {c.vmid}: systemctl is-active {unit}: {why}")
            details[str(c.vmid)] = {"unit": unit, "error": why, "planned_tp": want}
            continue
        state = res.stdout.strip().splitlines()[-1]
        props, err = ctx.service_props(c.vmid, unit)
        command = ctx.service_command(c.vmid, unit)
        tp = parse_tp(command) if command else None
        details[str(c.vmid)] = {"unit": unit, "state": state, "exec_start": command, "tp": tp, "planned_tp": want}
        if state != "active":
            problems.append(f"CT {c.vmid}: {unit} is {state}")
            continue
        if props is None:
            problems.append(f"CT {c.vmid}: {err}")
        elif tp is None:
            problems.append(f"CT {c.vmid}: {unit} runs without a readable {c.service.tp_flag} (planned {want})")
        elif tp != want:
            problems.append(f"CT {c.vmid}: {unit} runs with tp {tp}, planned tp {want}")
        else:
            parts.append(f"CT {c.vmid}: {unit} active, tp {tp} as planned")
    if problems:
        return Check(name="service", status=FAIL, summary="; ".join(problems), details=details)
    return Check(name="service", status=PASS, summary="; ".join(parts) or "no service in the spec", details=details)


def _base_url(url: str) -> str:
    m = re.match(r"^(https?://[^/]+)", url.strip())
    return m.group(1) if m else url.strip().rstrip("/")


DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}


def service_port(command: str | None) -> int | None:
    """The port the inference server listens on: its ``--port N`` (or ``--port=N``), else the
    server's default (SGLang 30000, vLLM 8000); None for an unknown server without the flag."""
    if command:
        m = re.search(r"(?:^|\s)--port(?:=|\s+)(\d+)(?:\s|$)", command)
        if m:
            return int(m.group(1))
    return DEFAULT_PORTS.get(_flavor(command) or "")


def container_address(interfaces: list[dict[str, Any]]) -> str | None:
    """The first IPv4 address of a container's non-loopback interface, from Proxmox's
    ``GET .../lxc/{vmid}/interfaces`` (``inet`` is ``10.0.0.5/24``); None when it has none."""
    for itf in interfaces or []:
        if itf.get("name") == "lo":
            continue
        inet = str(itf.get("inet") or "")
        if inet:
            return inet.split("/", 1)[0]
    return None


def endpoint_url(ctx: _Ctx, c: Container) -> tuple[str | None, str]:
    """(the service's base URL, where it came from): the spec's ``health_url``; else the
    container's address (Proxmox's interfaces of the running container) and the server's port.
    (None, why) when neither is known."""
    if c.service is not None and c.service.health_url:
        return _base_url(c.service.health_url), "service.health_url"
    command = ctx.service_command(c.vmid, c.service.unit) if c.service is not None else None
    port = service_port(command)
    if port is None:
        return None, "no --port in the service's command (set service.health_url in the spec)"
    try:
        address = container_address(ctx.ports.proxmox.lxc_interfaces(c.vmid))
    except GputopoError as e:
        return None, f"cannot read the container's address ({e}); set service.health_url in the spec"
    if address is None:
        return None, "the container reports no IPv4 address (set service.health_url in the spec)"
    return f"http://{address}:{port}", "container address and the service's port"


def _within(seconds: float, work: Callable[[float], Any]) -> tuple[bool, Any, BaseException | None]:
    """Run ``work(deadline)`` in a daemon thread; (finished, result, error). Never waits longer
    than ``seconds`` (plus a hair): a server that trickles bytes cannot stretch it."""
    box: dict[str, Any] = {}
    deadline = time.monotonic() + seconds

    def run() -> None:
        try:
            box["result"] = work(deadline)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    th = threading.Thread(target=run, name="verify http", daemon=True)
    th.start()
    th.join(seconds + 0.05)
    if th.is_alive():
        return False, None, None
    return True, box.get("result"), box.get("error")


def _probe(http: HttpPort, base: str, prompt: str, flavor: str | None) -> Callable[[float], dict[str, Any]]:
    def left(deadline: float) -> float:
        return max(0.01, deadline - time.monotonic())

    def work(deadline: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        model = "default"
        try:
            r = http.request("GET", f"{base}/v1/models", timeout=left(deadline))
            if r.ok:
                data = r.json().get("data") or []
                if data and data[0].get("id"):
                    model = str(data[0]["id"])
        except (HttpError, ValueError, AttributeError):
            pass  # the completion below reports what is wrong
        started = time.monotonic()
        r = http.request("POST", f"{base}/v1/chat/completions", timeout=left(deadline), json={
            "model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 64, "temperature": 0})
        out["latency_s"] = round(time.monotonic() - started, 3)
        out["model"] = model
        out["status"] = r.status
        if not r.ok:
            out["error"] = f"HTTP {r.status}: {r.text.strip()[:200]}"
            return out
        try:
            out["content"] = str(r.json()["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            out["error"] = f"not a chat completion: {r.text.strip()[:200]}"
            return out
        kv = None
        if flavor in (None, "sglang") and kv is None:
            try:
                rr = http.request("GET", f"{base}/get_server_info", timeout=left(deadline))
                if rr.ok:
                    kv = parse_sglang_kv_tokens(rr.json())
                    out["kv_source"] = "sglang /get_server_info max_total_num_tokens"
            except (HttpError, ValueError):
                pass
        if flavor in (None, "vllm") and kv is None:
            try:
                rr = http.request("GET", f"{base}/metrics", timeout=left(deadline))
                if rr.ok:
                    kv = parse_vllm_kv_tokens(rr.text)
                    out["kv_source"] = "vllm /metrics num_gpu_blocks x block_size"
            except HttpError:
                pass
        out["kv_tokens"] = kv
        if kv is None:
            out.pop("kv_source", None)
        return out

    return work


def _flavor(command: str | None) -> str | None:
    if not command:
        return None
    if "sglang" in command:
        return "sglang"
    if "vllm" in command:
        return "vllm"
    return None


def check_inference(ctx: _Ctx) -> Check:
    """Each service answers the smoke-test prompt within the timeout; no KV-cache figure WARNs.

    Returns the Check; a GputopoError raised here becomes a FAIL in :func:`verify`.
    """
    v = ctx.spec.verify
    problems: list[str] = []
    warnings: list[str] = []
    parts: list[str] = []
    details: dict[str, Any] = {"prompt": v.prompt, "expect": v.expect, "timeout_s": ctx.http_timeout}
    for c in _containers(ctx):
        t = ctx.target(c.vmid)
        if c.service is None or t is None or not t.gpus:
            continue
        ct_state = ctx.current.containers.get(c.vmid) if ctx.current is not None else None
        if ct_state is not None and ct_state.status != "running":
            problems.append(f"CT {c.vmid} is not running: nothing can answer")
            continue
        base, source = endpoint_url(ctx, c)
        if base is None:
            warnings.append(f"CT {c.vmid}: no endpoint URL: {source}")
            continue
        command = ctx.service_command(c.vmid, c.service.unit)
        started = time.monotonic()
        finished, out, error = _within(ctx.http_timeout, _probe(ctx.ports.http, base, v.prompt, _flavor(command)))
        wall = round(time.monotonic() - started, 3)
        d: dict[str, Any] = {"url": base, "url_source": source, "wall_s": wall}
        details[str(c.vmid)] = d
        if not finished:
            problems.append(f"CT {c.vmid}: {base} gave no answer within {ctx.http_timeout:g} s")
            continue
        if error is not None:
            reason = error.reason if isinstance(error, HttpError) else type(error).__name__
            if reason == "timed out":
                reason = f"no answer within {ctx.http_timeout:g} s"
            problems.append(f"CT {c.vmid}: {base}: {reason}")
            d["error"] = str(error).splitlines()[0] if str(error) else type(error).__name__
            continue
        d.update(out)
        if "error" in out:
            problems.append(f"CT {c.vmid}: {base}/v1/chat/completions: {out['error']}")
            continue
        content = " ".join(out["content"].split())
        if not answer_matches(content, v.expect):
            problems.append(f"CT {c.vmid}: wrong answer to {v.prompt!r}: {content[:120]!r} (expected {v.expect!r})")
            continue
        kv = out.get("kv_tokens")
        kv_text = f"KV cache {kv} tokens" if kv else "KV cache size not reported"
        if kv is None:
            warnings.append(f"CT {c.vmid}: answered {v.expect!r} in {out['latency_s']:.2f} s; {kv_text}")
        else:
            parts.append(f"CT {c.vmid}: answered {v.expect!r} in {out['latency_s']:.2f} s; {kv_text}")
    if problems:
        return Check(name="inference", status=FAIL, summary="; ".join(problems), details=details)
    if warnings:
        return Check(name="inference", status=WARN, summary="; ".join(warnings + parts), details=details)
    return Check(name="inference", status=PASS, summary="; ".join(parts) or "no service in the spec",
                 details=details)


def check_platform(ctx: _Ctx) -> Check:
    """SEV-SNP with a translating IOMMU and GPUs under several root complexes needs
    NCCL_P2P_DISABLE=1; without it WARN with the fix.

    Returns the Check; a GputopoError raised here becomes a FAIL in :func:`verify`.
    """
    host = ctx.facts.host
    details: dict[str, Any] = {"sev_snp": host.sev_snp, "iommu_enabled": host.iommu_enabled,
                               "iommu_mode": host.iommu_mode or ("translated" if host.iommu_enabled else None)}
    if not host.sev_snp:
        return Check(name="platform", status=PASS,
                     summary=f"SEV-SNP {'off' if host.sev_snp is False else 'unknown'}; GPU peer-to-peer is safe",
                     details=details)
    if not p2p_must_be_disabled(ctx.facts):
        return Check(name="platform", status=PASS,
                     summary=f"SEV-SNP on, IOMMU {host.iommu_mode or 'off'} (not translating); peer-to-peer is safe",
                     details=details)
    warnings: list[str] = []
    parts: list[str] = []
    for c in _containers(ctx):
        t = ctx.target(c.vmid)
        if c.service is None or t is None or len(t.gpus) < 2:
            continue
        complexes = read_root_complexes(ctx.root, t.gpus)
        distinct = sorted({rc for rc in complexes.values() if rc})
        props, err = ctx.service_props(c.vmid, c.service.unit)
        env = parse_environment(props.get("Environment", "")) if props else {}
        disabled = p2p_disabled(env, ctx.service_command(c.vmid, c.service.unit))
        details[str(c.vmid)] = {"root_complexes": complexes, "p2p_disabled": disabled,
                                "environment": env, "error": err}
        if len(distinct) <= 1:
            parts.append(f"CT {c.vmid}: GPUs under one root complex")
        elif disabled:
            parts.append(f"CT {c.vmid}: {P2P_VAR}=1 across {len(distinct)} root complexes")
        elif props is None:
            warnings.append(f"CT {c.vmid}: cannot read {c.service.unit}'s environment ({err}); "
                            f"make sure {P2P_VAR}=1 is set")
        else:
            warnings.append(
                f"CT {c.vmid}: SEV-SNP on, IOMMU translating, {len(distinct)} root complexes "
                f"({', '.join(distinct)}) and {c.service.unit} has no {P2P_VAR}=1: peer-to-peer DMA can "
                f"corrupt data; fix: gputopo apply --spec FILE (its drop-in sets {P2P_VAR}=1)")
    if warnings:
        return Check(name="platform", status=WARN, summary="; ".join(warnings), details=details)
    return Check(name="platform", status=PASS,
                 summary="SEV-SNP on, IOMMU translating; " + ("; ".join(parts) or "no multi-GPU service"),
                 details=details)


_CHECK_FUNCS: dict[str, Callable[[_Ctx], Check]] = {
    "converged": check_converged,
    "vm": check_vm,
    "container": check_container,
    "memory": check_memory,
    "service": check_service,
    "inference": check_inference,
    "platform": check_platform,
}


def verify(
    spec: Spec,
    ports: Ports,
    *,
    root: str | Path,
    http_timeout: float | None = None,
    strict: bool = False,
    node: str | None = None,
    only: list[str] | None = None,
) -> VerifyReport:
    """Check the host under ``root`` (through ``ports``) against ``spec`` from fresh facts.

    ``http_timeout`` bounds the whole inference probe (default: ``spec.verify.timeout``);
    ``only`` limits the checks to those names (default all of :data:`CHECKS`, in that order).
    Returns the :class:`VerifyReport`; a check that cannot be made is a FAIL in it, not an
    exception. Raises RootError when ``root`` holds no sysfs tree, SpecError when the spec names
    no node for this host, ValueError for an unknown name in ``only``.
    """
    names = list(only) if only else list(CHECKS)
    unknown = [n for n in names if n not in _CHECK_FUNCS]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)} (known: {', '.join(CHECKS)})")
    timeout = float(http_timeout if http_timeout is not None else spec.verify.timeout)
    ctx = _Ctx(spec, ports, str(root), node, timeout)
    report = VerifyReport(node=ctx.node, strict=strict)
    for name in names:
        try:
            report.checks.append(_CHECK_FUNCS[name](ctx))
        except GputopoError as e:
            report.checks.append(Check(name=name, status=FAIL, summary=str(e), details={"error": str(e)}))
    return report
