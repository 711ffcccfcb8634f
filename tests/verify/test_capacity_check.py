"""Verify closes the loop: the plan's capacity estimate beside what nvidia-smi and the service
report, the difference in percent (figures below are made up to sit on either side of the
tolerance)."""

from __future__ import annotations

from gputopo.capacity.estimate import Capacity
from gputopo.verify.capacity import TOLERANCE_PCT, compare, diff_pct

CAP = Capacity(
    vmid=101,
    model="qwen3",
    engine="sglang",
    tp=4,
    weights_gib=55.1,
    gpu_gib=95.59,
    mem_fraction=0.859,
    budget_gib=82.11,
    kv_gib=27.0,
    kv_tokens=600_000,
    kv_dtype="bf16",
    fits=True,
    text="qwen3 at tp 4",
)


def test_figures_side_by_side_and_their_difference_in_percent():
    d, off = compare(CAP, [79043, 78369], 590_000)
    assert d["predicted_used_mib"] == round(82.11 * 1024) == 84081
    assert d["reported_used_mib"] == 79043 and d["used_diff_pct"] == diff_pct(79043, 84081) == -6.0
    assert d["kv_diff_pct"] == -1.7 and off == []


def test_beyond_the_tolerance_says_which_figure():
    _, off = compare(CAP, [40000], 100_000)
    assert off == ["memory used 40000 MiB vs 84081 predicted", "KV cache 100,000 tokens vs 600,000 predicted"]
    assert TOLERANCE_PCT == 20.0
    d, off = compare(CAP, [], None)  # nothing reported: nothing compared, nothing off
    assert d["used_diff_pct"] is None and d["kv_diff_pct"] is None and off == []
