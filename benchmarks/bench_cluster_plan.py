"""Time ``gputopo cluster plan`` for 128 nodes x 8 GPUs from snapshots, against 128 single-node plans.

Builds the seed host (8 GPUs, two NUMA nodes), takes one ``gputopo snapshot`` of it and gives
each of the N nodes its own copy of that archive (identical servers, as in a rack). The state is
what a cluster of them has: per node a container holding every GPU with the cluster-wide
container mapping ``pro6000`` (one line per GPU and node: N x 8 lines), and a stopped VM on
``pro6000-vm``. The spec splits every node by NUMA node. It prints:

* loading: ``--load`` of the snapshots read as ``cluster plan --facts DIR`` reads them (the
  facts recorded in each archive when it was taken; an archive from another gputopo version
  would be unpacked and discovered); the other nodes reuse those facts;
* single: one node planned alone (a one-node spec, a one-node mapping), times N;
* cluster: all N nodes planned as one cluster (``plan_cluster``: every node against the shared
  mappings, merged once), and its ratio to single x N; the target is under 1 s;
* from snapshots: the N nodes' snapshot archives read (as ``cluster plan --facts DIR`` reads
  them) and planned, all in one timed run; the target is under 1 s;
* from discover --json: the same from ``<node>.json`` files, which ``--facts DIR`` also takes.

    python benchmarks/bench_cluster_plan.py [--nodes 128] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from gputopo.cluster.gather import NodeInput, load_facts
from gputopo.cluster.plan import plan_cluster
from gputopo.facts.snapshot import snapshot
from gputopo.formats.devn import format_dev
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState
from gputopo.plan.mappings import map_entry
from gputopo.plan.planner import plan
from gputopo.plan.spec import parse_spec
from gputopo.sim.hostroot import materialize

NODE = """\
  - name: {name}
    containers:
      - vmid: {ct}
        mapping: pro6000
        gpus: {{numa: [0]}}
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {{numa: [1]}}
          description: GPUs for VM passthrough
      guests: [{vm}]
"""


def spec_of(names: list[str]):
    nodes = "".join(NODE.format(name=n, ct=101 + i, vm=201 + i) for i, n in enumerate(names))
    return parse_spec(f"apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n{nodes}")


def current_of(facts, names: list[str]) -> dict[str, CurrentState]:
    """Each node's state: its container with every GPU, the shared mapping with every node's lines."""
    gpus = sorted(facts.gpus, key=lambda g: g.address)
    shared = MappingState(
        map=[map_entry(g, n) for n in names for g in gpus], description="all GPUs", digest="d" * 40
    )
    out = {}
    for i, n in enumerate(names):
        config = {f"dev{k}": format_dev(f"/dev/nvidia{g.minor}", None, "0666") for k, g in enumerate(gpus)}
        config["digest"] = "c" * 40
        out[n] = CurrentState(
            containers={101 + i: ContainerState(config=config, status="running")},
            mappings={"pro6000": shared},
            guests={201 + i: GuestState(status="stopped", hostpci=["mapping=pro6000-vm,pcie=1"])},
        )
    return out


def best(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--load", type=int, default=8, help="How many snapshots to unpack and discover (timed)")
    args = ap.parse_args()
    names = [f"pve{i}" for i in range(1, args.nodes + 1)]
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="gputopo-bench-", dir=base) as tmp:
        root = materialize("seed", Path(tmp) / "root")
        snaps = Path(tmp) / "snapshots"
        snaps.mkdir()
        snapshot(str(root), str(snaps / f"{names[0]}.tar.gz"))
        for n in names[1:]:
            os.link(snaps / f"{names[0]}.tar.gz", snaps / f"{n}.tar.gz")
        loaded = names[: max(1, min(args.load, len(names)))]
        t = time.perf_counter()
        first = [load_facts(snaps / f"{n}.tar.gz") for n in loaded]
        loading = time.perf_counter() - t
        facts = {n: first[i % len(first)].model_copy(deep=True) for i, n in enumerate(names)}
        for n, f in facts.items():
            f.host.hostname = n  # each server names itself (what its own snapshot would say)
        # the same facts as 'gputopo discover --json' files, one per node (cluster plan --facts DIR
        # reads <node>.json as readily as <node>.tar.gz): all of them are read, then planned
        jsons = Path(tmp) / "json"
        jsons.mkdir()
        for n, f in facts.items():
            (jsons / f"{n}.json").write_text(f.to_json())
        json_spec = spec_of(names)
        json_current = current_of(first[0], names)

        def from_json() -> None:
            read = {n: load_facts(jsons / f"{n}.json") for n in names}
            plan_cluster(json_spec, {n: NodeInput(n, read[n], json_current[n]) for n in names}, names)

        from_json_s = best(from_json, args.runs)

        def from_snapshots() -> None:
            read = {n: load_facts(snaps / f"{n}.tar.gz") for n in names}
            for n, f in read.items():
                f.host.hostname = n  # the archives are links to one: each node's own names itself
            plan_cluster(json_spec, {n: NodeInput(n, read[n], json_current[n]) for n in names}, names)

        from_snap_s = best(from_snapshots, args.runs)
    one = facts[names[0]]
    assert len(one.gpus) == 8, "the seed host has 8 GPUs"
    current = current_of(one, names)
    inputs = {n: NodeInput(n, facts[n], current[n]) for n in names}

    spec1 = spec_of(names[:1])
    current1 = current_of(one, names[:1])[names[0]]
    single = best(lambda: plan(one, spec1, current1, node=names[0]), max(args.runs, 20))
    spec_n = spec_of(names)
    cluster = best(lambda: plan_cluster(spec_n, inputs, names), args.runs)
    cplan = plan_cluster(spec_n, inputs, names)
    actions = sum(len(n.plan.actions) for n in cplan.nodes)
    lines = len(cplan.mappings["pro6000-vm"].map)
    print(f"nodes x GPUs:           {args.nodes} x 8 ({actions} actions, pro6000-vm {lines} lines)")
    each = loading / len(loaded)
    print(
        f"loading snapshots:      {each * 1000:8.1f} ms each ({len(loaded)} timed; {args.nodes}: ~{each * args.nodes:.1f} s; "
        "the facts recorded in each archive, before the plan)"
    )
    print(f"single-node plan:       {single * 1000:8.2f} ms; x {args.nodes} = {single * args.nodes:.3f} s")
    print(f"cluster plan:           {cluster:8.3f} s (target < 1 s: {'met' if cluster < 1 else 'NOT met'})")
    print(f"ratio to single x {args.nodes}:  {cluster / (single * args.nodes):8.2f}")
    print(
        f"from snapshots:         {from_snap_s:8.3f} s ({args.nodes} snapshot archives read + the cluster plan; "
        f"target < 1 s: {'met' if from_snap_s < 1 else 'NOT met'})"
    )
    print(
        f"from discover --json:   {from_json_s:8.3f} s ({args.nodes} facts files read + the cluster plan; "
        f"target < 1 s: {'met' if from_json_s < 1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
