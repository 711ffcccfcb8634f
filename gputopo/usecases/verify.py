"""Verify a host against its spec: the checks of :mod:`gputopo.verify` over the one read
:func:`gputopo.usecases.readplan.read_for_checks` makes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gputopo.model.documents import VerifyReport
from gputopo.plan.spec import Spec, load_spec
from gputopo.ports import Ports
from gputopo.usecases.connect import Connection, build_ports, host_root, node_for, this_host
from gputopo.usecases.notes import warn_unfinished
from gputopo.usecases.readplan import read_for_checks


@dataclass(frozen=True)
class VerifyRequest:
    """``gputopo verify``: the spec file, the host the connection reaches, how strict."""

    conn: Connection
    spec_file: str
    http_timeout: float | None = None
    strict: bool = False
    start_vms: bool = False


def verify(
    spec: Spec,
    ports: Ports,
    *,
    root: str | Path,
    http_timeout: float | None = None,
    strict: bool = False,
    node: str | None = None,
    only: list[str] | None = None,
    start_vms: bool = False,
) -> VerifyReport:
    """Check the host under ``root`` (through ``ports``) against ``spec`` from one fresh read
    (:func:`gputopo.verify.verify`, whose arguments these are). Returns the report; raises
    RootError, SpecError, ValueError as it does."""
    from gputopo.verify import verify as run_checks

    return run_checks(
        spec,
        ports,
        root=root,
        read=read_for_checks,
        http_timeout=http_timeout,
        strict=strict,
        node=node,
        only=only,
        start_vms=start_vms,
    )


def run(req: VerifyRequest) -> VerifyReport:
    """``gputopo verify``: the spec read, the ports built, the report made, the ports closed.
    Raises SpecError, ConfigError, ProxmoxError, RootError."""
    spec = load_spec(req.spec_file)
    root = host_root(req.conn)
    warn_unfinished(root)
    ports = build_ports(req.conn, default_node=node_for(req.conn, spec, this_host(root)))
    try:
        return verify(
            spec,
            ports,
            root=root,
            http_timeout=req.http_timeout,
            strict=req.strict,
            node=req.conn.node,
            start_vms=req.start_vms,
        )
    finally:
        ports.close()
