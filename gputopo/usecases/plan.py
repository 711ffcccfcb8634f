"""Plan: the target state and the ordered actions of a spec (or quick mode) on a host, its
one-line summary, and on request the plan saved for ``gputopo apply FILE`` or its steps as shell
commands. The read is :func:`gputopo.usecases.readplan.planned`'s."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from gputopo.errors import ConfigError
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.model import Plan
from gputopo.plan.spec import Spec
from gputopo.usecases.connect import Connection, host_root
from gputopo.usecases.readplan import Planned, SpecSource, planned


@dataclass(frozen=True)
class PlanRequest:
    """``gputopo plan``: the host, the spec source, the templates; ``save`` reads the state as
    apply will (``--local`` by default) and makes the saved plan; ``commands`` makes the steps'
    shell commands; ``ha`` False: the plan of ``apply --no-ha``, without the HA placement step
    (the step counts of plan, apply and history then agree)."""

    conn: Connection
    source: SpecSource
    templates: str | None = None
    save: bool = False
    commands: bool = False
    ha: bool = True


@dataclass(frozen=True)
class PlanResult:
    """The plan and what it was made from; ``summary`` None when it changes nothing;
    ``saved``: the saved plan's JSON text; ``commands``: the shell commands' text."""

    planned: Planned
    conn: Connection
    summary: dict[str, Any] | None
    saved: str | None = None
    commands: str | None = None


def saving_connection(conn: Connection) -> Connection:
    """The connection ``plan -o`` reads through: the one apply will use (``--local`` by default).
    Raises ConfigError for a source apply cannot use (Proxmox's files, a snapshot)."""
    from gputopo.facts.snapshot import is_snapshot

    if conn.pve_root is not None:
        raise ConfigError(
            "-o: a saved plan is made from what apply reads (--sim, --api-url or --local), not from --pve-root"
        )
    if conn.root is not None and is_snapshot(conn.root):
        raise ConfigError(
            f"-o: {conn.root} is a snapshot; a saved plan is made on the host it will be applied to"
        )
    return conn if conn.live else dataclasses.replace(conn, local=True)


def _saved(conn: Connection, source: SpecSource, got: Planned, summary: dict[str, Any] | None) -> str:
    """The saved plan's JSON text (``gputopo schema saved-plan``)."""
    from gputopo import __version__
    from gputopo.plan.saved import save_plan, spec_digest

    where = f"sim {conn.sim}" if conn.sim else f"api {conn.api_url}" if conn.api_url else "local"
    saved = save_plan(
        got.plan,
        got.spec,
        got.facts,
        got.current,
        version=__version__,
        spec_file=source.spec_file,
        spec_sha256=spec_digest(got.spec, source.spec_file),
        node=conn.node,
        source=where,
        summary=summary,
    )
    return saved.model_dump_json(indent=2) + "\n"


def commands_text(p: Plan, facts: Facts, current: CurrentState, root: str) -> str:
    """A plan as the shell commands of its steps and of their undo
    (:func:`gputopo.actions.script.script`), made from the ``facts`` and ``current`` state it was
    planned from; a GPU function's native driver, a host file's mode and which of its directories
    exist are read under ``root``."""
    from gputopo.actions.script import script
    from gputopo.actions.shell import CommandContext
    from gputopo.facts.modalias import native_driver
    from gputopo.facts.pci import read_pci_function

    def file_mode(path: str) -> int | None:
        try:
            return os.stat(os.path.join(root, path.lstrip("/"))).st_mode & 0o7777
        except OSError:
            return None

    def absent_dirs(path: str) -> list[str]:
        parts = path.strip("/").split("/")[:-1]
        dirs = ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]
        return [d for d in dirs if not os.path.isdir(os.path.join(root, d))]

    ctx = CommandContext(
        facts,
        current,
        p.node,
        native_driver=lambda address: native_driver(root, address),
        file_mode=file_mode,
        absent_dirs=absent_dirs,
        read_override=lambda address: getattr(read_pci_function(root, address), "driver_override", None),
    )
    return script(p.actions, ctx).text(p.node)


def summary_of(spec: Spec, p: Plan, root: str) -> dict[str, Any] | None:
    """The plan's summary document (None: no changes), with the times the last apply here took."""
    from gputopo.apply.estimate import plan_summary

    return None if p.is_empty else plan_summary(spec, p, root).to_data()


def without_ha(p: Plan) -> Plan:
    """``p`` as ``apply --no-ha`` plans it: the cluster's HA placement left alone, no step for it."""
    return p.model_copy(update={"actions": [a for a in p.actions if a.kind != "ha_placement"]})


def plan(req: PlanRequest) -> PlanResult:
    """``gputopo plan``. Raises what :func:`gputopo.usecases.readplan.planned` raises
    (PlanRefused among them) and ConfigError for a source a saved plan cannot come from."""
    if req.save and not req.ha:
        raise ConfigError("-o and --no-ha: a saved plan is applied as saved; give --no-ha to apply instead")
    conn = saving_connection(req.conn) if req.save else req.conn
    got = planned(conn, req.source, req.templates)
    if not req.ha:
        got = dataclasses.replace(got, plan=without_ha(got.plan))
    root = host_root(conn)
    summary = summary_of(got.spec, got.plan, root)
    saved = _saved(conn, req.source, got, summary) if req.save else None
    commands = commands_text(got.plan, got.facts, got.current, root) if req.commands else None
    return PlanResult(got, conn, summary, saved, commands)
