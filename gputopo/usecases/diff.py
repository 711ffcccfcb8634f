"""Diff: how the host differs from the spec, by area, files as unified diffs, from the read
:func:`gputopo.usecases.readplan.read_inputs` makes."""

from __future__ import annotations

from dataclasses import dataclass

from gputopo.plan.diff import DiffReport
from gputopo.usecases.connect import Connection
from gputopo.usecases.readplan import SpecSource, read_inputs


@dataclass(frozen=True)
class DiffRequest:
    """``gputopo diff``: the host, the spec source, the templates."""

    conn: Connection
    source: SpecSource
    templates: str | None = None


def diff(req: DiffRequest) -> DiffReport:
    """The difference report. Raises what the read raises, and PlanRefused."""
    from gputopo.plan.diff import diff as make_diff

    got = read_inputs(req.conn, req.source)
    return make_diff(got.facts, got.spec, got.current, node=req.conn.node, templates=req.templates)
