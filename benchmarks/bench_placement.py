"""Time placement alone: choosing N of the ``large`` host's 64 GPUs (68 NVIDIA functions with the
VFs of one, 32 network adapters), ``--split auto`` of it, and both for 128 nodes of 8 GPUs (the
seed host's facts under 128 names), as ``gputopo.plan.select`` and ``gputopo.plan.starter`` call
them (``placement.choose`` with the owner's GPUs now and the host's adapters; ``placement.split``).

Each choice of N keeps the owner's GPUs now: half of N, spread over the host (every other GPU of
a stride), so the choice has to weigh keeping them against closeness. Facts are discovered once
(not timed). Each scenario runs ``--runs`` times, interleaved; the median is printed with the
spread. The reference is choosing 4 of the seed host's 8 GPUs in the same run: each scenario's
time per GPU (from its fastest run) is printed as a multiple of it.

    python benchmarks/bench_placement.py [--runs N]

Targets: every N of 64 under 100 ms; the 128 nodes x 8 GPUs (a choice and a split each) under
1 s. Exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

from benchkit import discovered, interleaved

from gputopo.model.facts import Facts, nvidia_gpus
from gputopo.plan import placement


def choice(facts: Facts, n: int) -> Callable[[], object]:
    """Choose ``n`` of the host's GPUs for an owner holding ``n // 2`` spread over the host."""
    gpus = nvidia_gpus(facts)
    stride = max(1, len(gpus) // max(1, n // 2))
    held = {g.address for g in gpus[::stride][: n // 2]}
    return lambda: placement.choose(gpus, n, held, facts.nics)


def split(facts: Facts) -> Callable[[], object]:
    gpus = nvidia_gpus(facts)
    return lambda: placement.split(gpus)


def cluster(facts: Facts, nodes: int) -> Callable[[], object]:
    """A choice of 4 and a split on each of ``nodes`` copies of ``facts``."""
    copies = []
    for i in range(nodes):
        f = facts.model_copy(deep=True)
        f.host.hostname = f"pve{i:03d}"
        copies.append(f)
    work = [(choice(f, 4), split(f)) for f in copies]
    return lambda: [(c(), s()) for c, s in work]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="timed runs of each scenario (default 15)")
    args = ap.parse_args(argv)
    hosts = discovered("seed", "large")
    seed, large = hosts["seed"], hosts["large"]
    n_large = len(nvidia_gpus(large))
    # (name, GPUs looked at, limit in seconds or None, the work)
    scenarios: list[tuple[str, int, float | None, Callable[[], object]]] = [
        ("choose 4 of 8 (ref)", 8, None, choice(seed, 4))
    ]
    scenarios += [
        (f"choose {n} of {n_large}", n_large, 0.1, choice(large, n)) for n in (2, 4, 8, 16, 32, 48, 64)
    ]
    scenarios += [
        (f"split auto of {n_large}", n_large, 0.1, split(large)),
        ("128 nodes x 8: choose+split", 128 * 8, 1.0, cluster(seed, 128)),
    ]
    for _, _, _, work in scenarios:
        work()  # warm

    times = interleaved(((name, work) for name, _, _, work in scenarios), args.runs)

    print(f"{'scenario':30} {'GPUs':>5} {'median':>10} {'(min..max)':>19} {'per GPU (min)':>14} {'x ref':>7}")
    ok = True
    ref = None
    for name, gpus, limit, _ in scenarios:
        med, fastest = statistics.median(times[name]), min(times[name])
        per_gpu = fastest / gpus
        ref = ref or per_gpu
        print(
            f"{name:30} {gpus:5} {med * 1000:8.2f}ms ({fastest * 1000:7.2f}..{max(times[name]) * 1000:7.2f}ms)"
            f" {per_gpu * 1e6:12.1f}us {per_gpu / ref:6.2f}x"
        )
        if limit is not None and med >= limit:
            ok = False
    print(
        "targets (each N of 64 and the split under 100 ms; 128 nodes x 8 under 1 s): "
        + ("met" if ok else "MISSED")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
