"""Time ``gputopo discover --json`` against ``lspci -vmm`` on the same built host roots.

Builds the seed and large fixtures (on tmpfs when there is one), runs each command several
times and prints the median wall time of each and their ratio; then ``gputopo --version``
against ``python3 -c pass`` (the cost of starting the CLI).

    python benchmarks/bench_discover.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gputopo.sim.fixtures import materialize


def median_time(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    gputopo = [sys.executable, "-m", "gputopo"]
    lspci = shutil.which("lspci")
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="gputopo-bench-", dir=base) as tmp:
        print(f"{'host':8} {'functions':>9} {'gputopo discover --json':>24} {'lspci -vmm':>11} {'ratio':>6}")
        for host in ("seed", "large"):
            root = materialize(host, Path(tmp) / host)
            n = len(os.listdir(root / "sys/bus/pci/devices"))
            ours = median_time([*gputopo, "discover", "--json", "--root", str(root)], args.runs)
            if lspci:
                theirs = median_time([lspci, "-D", "-nn", "-vmm", "-A", "linux-sysfs",
                                      "-O", f"sysfs.path={root}/sys/bus/pci"], args.runs)
                print(f"{host:8} {n:9} {ours * 1000:22.0f}ms {theirs * 1000:9.0f}ms {ours / theirs:6.2f}")
            else:
                print(f"{host:8} {n:9} {ours * 1000:22.0f}ms {'(no lspci)':>11}")
    v = median_time([*gputopo, "--version"], args.runs)
    p = median_time([sys.executable, "-c", "pass"], args.runs)
    print(f"gputopo --version {v * 1000:.0f}ms vs python3 -c pass {p * 1000:.0f}ms (ratio {v / p:.1f})")


if __name__ == "__main__":
    main()
