"""The plan's capacity check, pure: the footprint in the current state decides the refusals, the
warning under verify.min_kv_tokens, and the GPUs --split auto gives the container.

Real figures: the seed host's GPUs (97,887 MiB, fixtures/real/seed-query-gpu.csv). Derived: the
footprints below are made up to sit on either side of the budget (no real model is claimed)."""

from __future__ import annotations

import pytest

from gputopo.errors import PlanRefused, SpecError
from gputopo.model.footprint import Attention, ModelFootprint, Weights
from gputopo.model.state import ContainerState, CurrentState
from gputopo.plan.planner import plan
from gputopo.plan.starter import spec_from_split
from helpers.hosts import SEED_SPEC, gpu, host, seed_current, seed_facts, seed_spec

GIB = 1 << 30


def footprint(heads: int, sharded_gib: float) -> ModelFootprint:
    return ModelFootprint(
        path="/models/m",
        engine="sglang",
        name="m",
        attention=Attention(heads=heads, kv_heads=8, head_dim=128, full_layers=60),
        weights=Weights(sharded=int(sharded_gib * GIB)),
        gpu_memory_mib=97887,
    )


def with_model(fp: ModelFootprint):
    current = seed_current()
    current.containers[101].footprint = fp
    return current


def test_auto_gives_the_container_the_gpus_its_model_needs():
    # two GPUs on NUMA node 0, six on node 1: the closest split gives the container node 0's two
    facts = host([gpu(f"{0x10 * (i + 1):02x}", 0 if i < 2 else 1, i, 10 + i) for i in range(8)])
    free = CurrentState(containers={101: ContainerState(status="running")})
    plain = spec_from_split(facts, "auto", container=101, vm_mapping="pro6000-vm", current=free)
    assert plain.nodes[0].containers[0].gpus.numa == [0]
    # 64 heads; 200 GiB: 100 per GPU at tp 2 is over the ~82 GiB budget, 50 at tp 4 fits
    need4 = CurrentState(containers={101: ContainerState(status="running", footprint=footprint(64, 200))})
    spec = spec_from_split(
        facts, "auto", container=101, vm_mapping="pro6000-vm", service_unit="sglang.service", current=need4
    )
    sel = spec.nodes[0].containers[0].gpus
    assert len(sel.addresses or []) == 4, sel


def test_auto_refuses_a_model_that_leaves_the_vm_nothing():
    with pytest.raises(SpecError, match="needs 8 or more of the 8 GPUs: none would be left for the VM"):
        spec_from_split(
            seed_facts(),
            "auto",
            container=101,
            vm_mapping="pro6000-vm",
            current=with_model(footprint(64, 500)),
        )


def test_auto_refuses_a_model_no_split_holds():
    with pytest.raises(SpecError, match="does not fit the 8 GPUs at any tensor-parallel size"):
        spec_from_split(
            seed_facts(),
            "auto",
            container=101,
            vm_mapping="pro6000-vm",
            current=with_model(footprint(64, 900)),
        )


def test_weights_over_the_budget_and_a_tp_that_splits_no_heads_are_refused():
    with pytest.raises(PlanRefused) as e:
        plan(seed_facts(), seed_spec(), with_model(footprint(64, 400)))
    (r,) = e.value.refusals
    assert r.code == "capacity"
    assert r.reason.startswith(
        "container 101: m does not fit 4 GPU(s): weights 100.0 GiB per GPU, budget 82.1 GiB"
    )
    assert r.reason.endswith("it needs at least 8 GPUs")
    three = SEED_SPEC.replace("gpus: {numa: [0]}", "gpus: {count: 3}")
    with pytest.raises(PlanRefused) as e:
        plan(seed_facts(), seed_spec(three), with_model(footprint(64, 40)))
    assert any(
        r.code == "capacity"
        and "tp 3 does not divide m's 64 attention heads" in r.reason
        and "give it 1, 2, 4, 8 GPU(s)" in r.reason
        for r in e.value.refusals
    )


def test_a_kv_cache_under_the_floor_warns_and_the_text_shows_the_line():
    text = SEED_SPEC + "verify:\n  min_kv_tokens: 10000000\n"
    p = plan(seed_facts(), seed_spec(text), with_model(footprint(64, 200)))
    cap = p.capacity[0]
    assert cap.fits and cap.kv_tokens < 10_000_000
    assert any(
        w.startswith(
            f"container 101: KV cache about {cap.kv_tokens:,} tokens at tp 4, under verify.min_kv_tokens 10,000,000"
        )
        for w in p.warnings
    )
    assert (
        "  - m at tp 4: weights 50.0 GiB per GPU of 95.6 (mem fraction 0.859: 82.1 GiB); KV cache about"
        in p.to_text()
    )
