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


def test_the_seed_hosts_own_figures_sit_within_the_tolerance_of_sglangs_budget():
    """Real: the seed host's nvidia-smi after its split to tp 4 (fixtures/real/seed-query-gpu.csv:
    78,193-79,043 MiB used of 97,887). Derived: SGLang's default static memory at tp 4 on that GPU
    (server_args.py _handle_gpu_memory_settings), which verify compares the used memory with."""
    from gputopo import resources
    from gputopo.capacity.estimate import sglang_fraction

    rows = (resources.fixtures_dir() / "real/seed-query-gpu.csv").read_text().splitlines()
    used = [int(r.split(",")[1].split()[0]) for r in rows if r.strip()]
    assert max(used) == 79043 and min(used) == 78193
    fraction = sglang_fraction(97887, 4)
    cap = CAP.model_copy(update={"mem_fraction": fraction, "budget_gib": round(97887 * fraction / 1024, 2)})
    d, off = compare(cap, used, None)
    assert d["reported_used_mib"] == 79043 and -TOLERANCE_PCT < d["used_diff_pct"] < 0 and off == []
