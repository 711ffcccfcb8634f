"""Time ``gputopo cluster plan`` over SSH against each node's own ``gputopo plan --json`` over
the same SSH.

Sets up a simulated cluster (3 nodes by default, each the seed host with the tests' latencies)
behind one real sshd per node on loopback, as the cluster tests do
(``tests/helpers/clusterharness.py``: generated host and user keys, an ssh_config naming each
node, the node's shell as sshd's ``ForceCommand``, running the gputopo this script imports).
The spec splits every node but the last by NUMA node and gives the last all its GPUs. Each
round runs, in turn:

* each node's own plan, alone: ``ssh -F CONFIG NODE -- gputopo plan --json --spec SPEC`` (the
  node reads itself and its simulated API and plans);
* ``gputopo cluster plan --sim DIR --ssh-config CONFIG --spec SPEC --json`` from here, as an
  operator runs it: every node over SSH, the shared state from the cluster's API.

The ratio of a round is the cluster plan's wall time over the slowest node's plan of that
round; printed are the medians with their spread (min..max) and whether the median ratio meets
the target (at most 1.5x). Needs root and OpenSSH's sshd (``apt-get install openssh-server``).

    python benchmarks/bench_cluster_ssh.py [--runs 9] [--nodes 3]

Exits 1 when the target is not met, 2 when sshd cannot run here.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchkit import interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' helpers

from helpers.applysim import cleanup, fast_tmp
from helpers.clusterharness import (
    SshNodes,
    copy_cluster,
    make_keys,
    make_template,
    spec_text,
    sshd_missing,
)

TARGET = 1.5


def run(argv: list[str]) -> None:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... exited {p.returncode}: {p.stderr.strip()[-400:]}")


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}..{max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args()
    why = sshd_missing()
    if why is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        sys.exit(2)

    base = Path(tempfile.mkdtemp(prefix="gputopo-bench-ssh-", dir=fast_tmp()))
    template = make_template(count=args.nodes)
    cluster = copy_cluster(template, base / "cluster")
    ssh = SshNodes(cluster, base, make_keys(base, cluster.nodes))
    try:
        ssh.start()
        spec = base / "spec.yaml"
        spec.write_text(spec_text(cluster, split=cluster.nodes[:-1], whole=cluster.nodes[-1:]))
        config = str(ssh.config)
        work = [
            (
                n,
                lambda n=n: run(
                    ["ssh", "-F", config, f"root@{n}", "--", "gputopo", "plan", "--json", "--spec", str(spec)]
                ),
            )
            for n in cluster.nodes
        ]
        cluster_cmd = [sys.executable, "-m", "gputopo", "cluster", "plan", "--sim", str(cluster.dir)]
        cluster_cmd += ["--ssh-config", config, "--spec", str(spec), "--json"]
        work.append(("cluster", lambda: run(cluster_cmd)))
        for _, fn in work:  # once untimed: the page cache and the byte-compiled modules
            fn()
        times = interleaved(work, args.runs)
    finally:
        ssh.stop()
        cluster.stop()
        cleanup(base)
        cleanup(template.parent)

    slowest = [max(times[n][i] for n in cluster.nodes) for i in range(args.runs)]
    ratios = [c / s for c, s in zip(times["cluster"], slowest, strict=True)]
    median = statistics.median(ratios)
    print(f"{args.nodes} nodes x 8 GPUs over sshd on loopback, {args.runs} rounds, interleaved")
    for n in cluster.nodes:
        print(f"{n} own plan --json over ssh: {spread(times[n])}")
    print(f"slowest node of each round:  {spread(slowest)}")
    print(f"cluster plan --json:         {spread(times['cluster'])}")
    print(f"ratio to the slowest node:   {median:.2f} ({min(ratios):.2f}..{max(ratios):.2f})")
    met = median <= TARGET
    print(f"target <= {TARGET}x: {'met' if met else 'not met'}")
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
