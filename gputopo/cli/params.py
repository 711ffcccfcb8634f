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
            self.fail(f"{value!r} is not a finite number {'0 or more' if self.allow_zero else 'above 0'}", param, ctx)
        return number
