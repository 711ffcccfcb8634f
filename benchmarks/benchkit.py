"""What the benchmarks share: discovering simulated hosts once, outside the timing, and timing
several scenarios interleaved (so load on the machine hits them alike), each run after a garbage
collection (the garbage of the run before is not this one's to collect).

Imported by the scripts beside it (``python benchmarks/bench_x.py`` puts this directory first on
``sys.path``); not part of the installed package.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gputopo.facts.discover import discover
from gputopo.model.facts import Facts
from gputopo.sim.hostroot import materialize


def discovered(*presets: str) -> dict[str, Facts]:
    """The facts of each simulated host preset, materialized in a scratch directory (tmpfs where
    there is one) that is gone again when this returns."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="gputopo-bench-", dir=base) as tmp:
        return {name: discover(materialize(name, Path(tmp) / name)) for name in presets}


def interleaved(work: Iterable[tuple[str, Callable[[], object]]], runs: int) -> dict[str, list[float]]:
    """Seconds of each named piece of work in each of ``runs`` rounds; a round runs every piece
    once, in order."""
    work = list(work)
    times: dict[str, list[float]] = {name: [] for name, _ in work}
    for _ in range(runs):
        for name, fn in work:
            gc.collect()
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times
