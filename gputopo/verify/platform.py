"""Check ``platform``: on a host with SEV-SNP on and the IOMMU translating, a service whose GPUs
sit under more than one PCIe root complex needs peer-to-peer DMA disabled
(``NCCL_P2P_DISABLE=1``); without it a WARN with the fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gputopo.plan.render import p2p_must_be_disabled
from gputopo.verify.context import Context
from gputopo.verify.parse import (
    P2P_VAR,
    p2p_disabled,
    parse_environment,
    parse_root_complex,
)
from gputopo.verify.report import PASS, Check, skipped, verdict

NAME = "platform"


def read_root_complexes(root: str | Path, addresses: list[str]) -> dict[str, str | None]:
    """Address -> root complex, from where ``<root>/sys/bus/pci/devices/<addr>`` resolves."""
    out = {}
    for a in addresses:
        path = os.path.realpath(os.path.join(str(root), "sys/bus/pci/devices", a))
        out[a] = parse_root_complex(path)
    return out


def check(ctx: Context) -> Check:
    """SEV-SNP with a translating IOMMU and GPUs under several root complexes needs
    NCCL_P2P_DISABLE=1; without it WARN with the fix."""
    host = ctx.facts.host
    details: dict[str, Any] = {
        "sev_snp": host.sev_snp,
        "iommu_enabled": host.iommu_enabled,
        "iommu_mode": host.iommu_mode or ("translated" if host.iommu_enabled else None),
    }
    if not host.sev_snp:
        return Check(
            name=NAME,
            status=PASS,
            summary=f"SEV-SNP {'off' if host.sev_snp is False else 'unknown'}; GPU peer-to-peer is safe",
            details=details,
        )
    if not p2p_must_be_disabled(ctx.facts):
        return Check(
            name=NAME,
            status=PASS,
            summary=f"SEV-SNP on, IOMMU {host.iommu_mode or 'off'} (not translating); peer-to-peer is safe",
            details=details,
        )
    if ctx.no_plan:  # which services span several GPUs is the plan's to say
        return skipped(
            NAME,
            f"{ctx.no_plan}; SEV-SNP is on with the IOMMU translating, so each multi-GPU service needs {P2P_VAR}=1",
            details,
        )
    warnings: list[str] = []
    parts: list[str] = []
    for c, svc, t in ctx.services(min_gpus=2):
        _one_service(ctx, c.vmid, svc.unit, t.gpus, details, parts, warnings)
    return verdict(
        NAME,
        details,
        "SEV-SNP on, IOMMU translating; " + ("; ".join(parts) or "no multi-GPU service"),
        warnings=warnings,
    )


def _one_service(
    ctx: Context,
    vmid: int,
    unit: str,
    gpus: list[str],
    details: dict[str, Any],
    parts: list[str],
    warnings: list[str],
) -> None:
    """One multi-GPU service under SEV-SNP with the IOMMU translating: its GPUs' root complexes
    and whether it runs with peer-to-peer off; a line in ``parts``, or a warning with the fix."""
    complexes = read_root_complexes(ctx.root, gpus)
    distinct = sorted({rc for rc in complexes.values() if rc})
    props, err = ctx.service_props(vmid, unit)
    env = parse_environment(props.get("Environment", "")) if props else {}
    disabled = p2p_disabled(env, ctx.service_command(vmid, unit))
    details[str(vmid)] = {
        "root_complexes": complexes,
        "p2p_disabled": disabled,
        "environment": env,
        "error": err,
    }
    if len(distinct) <= 1:
        parts.append(f"CT {vmid}: GPUs under one root complex")
    elif disabled:
        parts.append(f"CT {vmid}: {P2P_VAR}=1 across {len(distinct)} root complexes")
    elif props is None:
        warnings.append(f"CT {vmid}: cannot read {unit}'s environment ({err}); make sure {P2P_VAR}=1 is set")
    else:
        # a drop-in that sets it but was not loaded: a plan leaves a running service whose GPUs
        # stay alone for environment settings, so applying again would change nothing
        ct = ctx.current.containers.get(vmid) if ctx.current else None
        dropin = ct.service.dropin if ct and ct.service else None
        fix = (
            f"its drop-in sets it; systemctl daemon-reload && systemctl restart {unit} in CT {vmid}"
            if p2p_disabled(parse_environment(" ".join(_env_lines(dropin))), None)
            else f"gputopo apply --spec FILE (its drop-in sets {P2P_VAR}=1)"
        )
        warnings.append(
            f"CT {vmid}: SEV-SNP on, IOMMU translating, {len(distinct)} root complexes "
            f"({', '.join(distinct)}) and {unit} has no {P2P_VAR}=1: peer-to-peer DMA can "
            f"corrupt data; fix: {fix}"
        )


def _env_lines(dropin: str | None) -> list[str]:
    """The values of a drop-in's ``Environment=`` lines."""
    return [
        line.strip()[len("Environment=") :]
        for line in (dropin or "").splitlines()
        if line.strip().startswith("Environment=")
    ]
