"""Option types shared by the commands."""

from __future__ import annotations

import math
from typing import Any

import click


class Finite(click.ParamType):
    """A finite number above 0 (or at least 0 with ``allow_zero``): timeouts, the demo's pace.

    ``nan`` and ``inf`` parse as floats, and click's FloatRange lets them through, but a
    timeout of either would make a wait never end or never start.
    """

    name = "number"

    def __init__(self, allow_zero: bool = False):
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        low_ok = number >= 0 if self.allow_zero else number > 0
        if not (math.isfinite(number) and low_ok):
            self.fail(
                f"{value!r} is not a finite number {'0 or more' if self.allow_zero else 'above 0'}",
                param,
                ctx,
            )
        return number


TIMEOUT_KINDS = ("sysfs", "guest", "exec", "service")


class StepTimeout(click.ParamType):
    """``SECONDS`` (a sysfs write, as before) or ``KIND=SECONDS`` for a kind of step: ``sysfs``
    (one write), ``guest`` (a start or shutdown task), ``exec`` (a command in a container),
    ``service`` (until a service is active). Converts to (kind, seconds)."""

    name = "[KIND=]SECONDS"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, float]:
        if isinstance(value, tuple):
            return value
        kind, sep, number = str(value).partition("=")
        if not sep:
            kind, number = "sysfs", kind
        elif kind not in TIMEOUT_KINDS:
            self.fail(f"{kind!r} is not a kind of step ({', '.join(TIMEOUT_KINDS)})", param, ctx)
        return kind, Finite().convert(number, param, ctx)


def timeout_option(what: str = "apply"):
    """``--timeout [KIND=]SECONDS``, repeatable: the steps' timeouts (over the spec's policy.timeouts)."""
    return click.option(
        "--timeout",
        "timeouts",
        type=StepTimeout(),
        multiple=True,
        metavar="[KIND=]SECONDS",
        help=f"Seconds a step of {what} may wait, per kind (repeatable): sysfs (one write, default 30; a bare "
        "number sets it), guest (start/shutdown task, 300), exec (a command in a container, 60), "
        "service (until active, 900). A sysfs write that takes longer leaves its device to a human.",
    )


class PciAddress(click.ParamType):
    """A PCI address (``0000:81:00.0`` or ``81:00.0``), normalised to ``dddd:bb:dd.f``."""

    name = "ADDRESS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from gputopo.errors import AddressError
        from gputopo.model.facts import normalize_address

        try:
            return normalize_address(str(value))
        except AddressError as e:
            self.fail(str(e), param, ctx)
