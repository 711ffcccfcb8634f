"""Render: the files a plan stands for (udev rules, modprobe, drop-ins, configs), by path,
from the read and plan :func:`gputopo.usecases.readplan.planned` makes."""

from __future__ import annotations

from dataclasses import dataclass

from gputopo.usecases.connect import Connection
from gputopo.usecases.readplan import SpecSource, planned


@dataclass(frozen=True)
class RenderRequest:
    """``gputopo render``: the host, the spec source, the templates."""

    conn: Connection
    source: SpecSource
    templates: str | None = None


def render(req: RenderRequest) -> dict[str, str]:
    """Relative path -> text of every file the plan stands for. Raises what the read raises,
    and PlanRefused."""
    from gputopo.plan.render import render as render_files

    got = planned(req.conn, req.source, req.templates)
    return render_files(got.plan, got.spec, got.facts, req.templates)
