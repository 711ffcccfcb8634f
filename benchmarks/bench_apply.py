"""Apply the seed NUMA split on a simulated host with realistic latencies and compare the apply's
wall time and stop window (service down -> service up) with the critical path.

Latencies at --scale 1 (seconds): nvidia unbind 1-3 per GPU (spread over the GPUs), vfio-pci
bind 0.3, container stop 4 / start 6, service stop 3 / start 20. The critical path is the serial
steps plus the slowest parallel rebind:

    service stop + container stop + max(unbind + bind) + container start + service start

Run: ``python benchmarks/bench_apply.py [--scale 0.5]`` (the default finishes in well under a
minute). The target is both ratios within 1.1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gputopo.apply import Timeouts, apply
from gputopo.facts.discover import discover
from gputopo.sim.host import SimHost
from gputopo.plan.starter import init_spec
from gputopo.plan.spec import parse_spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.5, help="multiply every latency (default 0.5)")
    ap.add_argument("--keep", action="store_true", help="keep the simulated host directory")
    args = ap.parse_args(argv)
    s = args.scale

    base = Path(tempfile.mkdtemp(prefix="gputopo-bench-apply-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        host = SimHost.create(base / "sim")
        root = host.paths.root
        facts = discover(str(root))
        spec = parse_spec(init_spec(facts))
        moving = [g.address for g in facts.gpus if g.numa_node == 1]
        lat = host.set_latencies(s, moving)
        ports = host.ports()
        ports.proxmox._cfg.poll_interval = 0.02  # a tighter task poll than a real node needs
        slowest_unbind = max(v for k, v in lat.items() if k.startswith("unbind:"))
        critical = s * (lat["service.stop"] + lat["ct.stop"] + slowest_unbind + lat["vfio-pci.bind"]
                        + lat["ct.start"] + lat["service.start"])

        t0 = time.monotonic()
        res = apply(spec, ports, root=str(root), timeouts=Timeouts(poll=0.02))
        wall = time.monotonic() - t0
        host.stop()
        if res.status != "applied":
            print(f"apply did not apply: {res.status}", file=sys.stderr)
            return 1
        window = res.stop_window_s or 0.0
        print(f"scale            {s:g}")
        print(f"steps            {len(res.steps)} ({sum(1 for r in res.steps if r.phase == 'switch')} rebinds in parallel)")
        for r in sorted(res.steps, key=lambda r: r.index):
            print(f"  {r.index + 1:>2}. [{r.phase:<7}] {r.seconds:6.2f} s  {r.text[:90]}")
        print(f"critical path    {critical:6.2f} s")
        print(f"apply wall time  {wall:6.2f} s  ({wall / critical:.3f}x critical path)")
        print(f"stop window      {window:6.2f} s  ({window / critical:.3f}x critical path)")
        ok = wall / critical <= 1.1 and window / critical <= 1.1
        print("target 1.1x      " + ("met" if ok else "MISSED"))
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"kept {base}")


if __name__ == "__main__":
    sys.exit(main())
