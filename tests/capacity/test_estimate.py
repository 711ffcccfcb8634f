"""The capacity estimate of each fixture model beside the figure derived from a real source.

Real figures (each test says which it uses):

* ``config.json`` of each model: fixtures/real/models/<name>/config.json (fixtures/real/SOURCES.md);
* published parameter counts (the models' cards): Qwen3-8B 8.2 B, Qwen3-30B-A3B 30.5 B,
  Qwen3-Next-80B-A3B 80 B, DeepSeek-V3 671 B (without its 14 B MTP module), gpt-oss-20b 21 B,
  Qwen3-235B-A22B 235 B; gpt-oss-20b's checkpoint 13.8 GB (MXFP4 experts: its card);
* the seed host's GPU: 97,887 MiB (fixtures/real/seed-query-gpu.csv);
* the engines' formulas (file and function in :mod:`gputopo.capacity.estimate`), written out
  here by hand with each model's numbers.

Derived (by tests/helpers/modelgen.py): the safetensors headers; their parameter count is
checked against the published one first.
"""

from __future__ import annotations

import json

import pytest

from gputopo import resources
from gputopo.capacity.estimate import GIB, MIB, cell_bytes, estimate, min_gpus, sglang_fraction
from gputopo.formats.modelfiles import attention_of, layer_count, weights_of
from gputopo.model.footprint import ModelFootprint
from helpers.modelgen import nbytes, parameters, tensors_of

GPU_MIB = 97887  # the seed host's RTX PRO 6000 (real)
H200_MIB = 143771  # an H200's memory.total (nvidia-smi); DeepSeek-V3 at tp 8 leaves the seed GPU little KV

# name: (published parameters, bytes per parameter of the checkpoint served, fp8 headers)
MODELS = {
    "Qwen3-8B": (8.2e9, 2, False),
    "Qwen3-30B-A3B": (30.5e9, 2, False),
    "Qwen3-Next-80B-A3B": (80e9, 2, False),
    # FP8, but the embedding and LM head (2 x 129,280 x 7,168, config.json) stay BF16
    "DeepSeek-V3": (671e9, (671e9 + 2 * 129280 * 7168) / 671e9, True),
    "gpt-oss-20b": (21e9, 13.8e9 / 21e9, False),
    "Qwen3-235B-A22B": (235e9, 1, True),
}


def config(name: str) -> dict:
    return json.loads((resources.fixtures_dir() / f"real/models/{name}/config.json").read_text())


def footprint(
    name: str, engine: str = "sglang", kv: str = "auto", gpu: int | None = GPU_MIB
) -> ModelFootprint:
    c = config(name)
    tensors = {k: nbytes(v) for k, v in tensors_of(c, fp8=MODELS[name][2]).items()}
    return ModelFootprint(
        path=f"/models/{name}",
        engine=engine,
        name=name,
        attention=attention_of(c),
        weights=weights_of(tensors, layer_count(c), 1),
        kv_cache_dtype=kv,
        gpu_memory_mib=gpu,
    )


@pytest.mark.parametrize("name", MODELS)
def test_the_synthesized_headers_hold_the_published_parameter_count(name):
    published = MODELS[name][0]
    got = parameters(tensors_of(config(name), fp8=MODELS[name][2]))
    assert abs(got - published) / published < 0.02, f"{name}: {got / 1e9:.2f} B vs {published / 1e9:g} B"


@pytest.mark.parametrize(
    ("name", "tp"),
    [
        ("Qwen3-8B", 1),
        ("Qwen3-30B-A3B", 2),
        ("Qwen3-Next-80B-A3B", 4),
        ("DeepSeek-V3", 8),
        ("gpt-oss-20b", 1),
        ("Qwen3-235B-A22B", 4),
    ],
)
def test_weights_per_gpu_within_5_percent_of_the_published_count(name, tp):
    published, per_param, _ = MODELS[name]
    derived = published * per_param / tp / GIB
    got = estimate(footprint(name), 101, tp).weights_gib
    assert abs(got - derived) / derived < 0.05, f"{name} at tp {tp}: {got} GiB vs {derived:.2f} GiB"


# the cell per token of each engine's formula, by hand (bytes), with (tp, kv dtype)
CELLS = {
    # sglang get_cell_size_per_token: kv_heads_per_rank x (head_dim + v_head_dim) x layers x bytes
    ("Qwen3-8B", "sglang", 2, "auto"): 4 * (128 + 128) * 36 * 2,
    # 4 KV heads over 8 ranks: one each (max(1, 4 // 8)), replicated
    ("Qwen3-30B-A3B", "sglang", 8, "auto"): 1 * (128 + 128) * 48 * 2,
    # 12 of 48 layers have full attention (full_attention_interval 4)
    ("Qwen3-Next-80B-A3B", "sglang", 4, "auto"): 1 * (256 + 256) * 12 * 2,
    # MLA: (kv_lora_rank + qk_rope_head_dim) x 61 layers x 1 byte, the same at every tp
    ("DeepSeek-V3", "sglang", 8, "fp8_e4m3"): (512 + 64) * 61 * 1,
    ("DeepSeek-V3", "sglang", 1, "fp8_e4m3"): (512 + 64) * 61 * 1,
    # hybrid SWA: 12 full layers + swa_full_tokens_ratio 0.8 x 12 sliding ones
    ("gpt-oss-20b", "sglang", 1, "auto"): 8 * (64 + 64) * 2 * (12 + 0.8 * 12),
    # vLLM FullAttentionSpec: 2 x kv_heads_per_rank x head_size x bytes per layer, sliding ones counted
    ("gpt-oss-20b", "vllm", 1, "auto"): 2 * 8 * 64 * 2 * 24,
    ("Qwen3-235B-A22B", "vllm", 4, "fp8"): 2 * 1 * 128 * 1 * 94,
}


@pytest.mark.parametrize(("key", "want"), list(CELLS.items()), ids=[f"{k[0]}-{k[1]}-tp{k[2]}" for k in CELLS])
def test_the_kv_cell_per_token_is_the_engines(key, want):
    name, engine, tp, kv = key
    assert cell_bytes(footprint(name, engine, kv), tp) == pytest.approx(want)


def test_sglang_default_mem_fraction_on_the_seed_gpu():
    # reserved MiB = 512 + 8192 x 1.5 + 256 x 2 + tp / 8 x 1024 (chunked prefill 8192 under 160 GiB)
    assert sglang_fraction(GPU_MIB, 1) == round((GPU_MIB - (512 + 12288 + 512 + 128)) / GPU_MIB, 3) == 0.863
    assert sglang_fraction(GPU_MIB, 8) == round((GPU_MIB - (512 + 12288 + 512 + 1024)) / GPU_MIB, 3) == 0.854
    # under 35 GiB: chunked prefill 2048 (a 24 GiB card)
    assert sglang_fraction(24564, 1) == round((24564 - (512 + 3072 + 512 + 128)) / 24564, 3)


@pytest.mark.parametrize(
    ("name", "engine", "tp", "kv"), [k for k in CELLS if k[0] != "DeepSeek-V3" or k[2] == 8]
)
def test_kv_tokens_within_5_percent_of_the_engines_figure(name, engine, tp, kv):
    """Tokens from the engine's formula with the published parameter count's weights."""
    published, per_param, _ = MODELS[name]
    gpu = H200_MIB if name == "DeepSeek-V3" else GPU_MIB
    fraction = sglang_fraction(gpu, tp) if engine == "sglang" else 0.9
    rest = gpu * MIB * fraction - published * per_param / tp
    if engine == "sglang" and name == "Qwen3-Next-80B-A3B":
        rest /= 1 + 0.9  # handle_max_mamba_cache: mamba_full_memory_ratio 0.9
    derived = rest // CELLS[(name, engine, tp, kv)]
    got = estimate(footprint(name, engine, kv, gpu), 101, tp).kv_tokens
    assert abs(got - derived) / derived < 0.05, f"{name} {engine} tp {tp}: {got} vs {derived:.0f}"


def test_qwen3_235b_fp8_needs_four_of_the_seed_gpus():
    fp = footprint("Qwen3-235B-A22B")
    two, four = estimate(fp, 101, 2), estimate(fp, 101, 4)
    assert two.fits is False and "does not fit" in two.text and two.kv_tokens == 0
    assert four.fits is True and four.kv_tokens > 0
    assert four.text.startswith(
        "Qwen3-235B-A22B at tp 4: weights 55.1 GiB per GPU of 95.6 (mem fraction 0.859: "
    )
    assert min_gpus(fp, 8) == 4


def test_tp_must_divide_the_heads_and_unknown_memory_says_so():
    fp = footprint("Qwen3-8B")  # 32 heads
    assert estimate(fp, 101, 3).heads_divide is False
    assert estimate(fp, 101, 4).heads_divide is True
    blind = footprint("Qwen3-8B", gpu=None)
    cap = estimate(blind, 101, 2)
    assert cap.fits is None and cap.kv_tokens is None and "memory is unknown" in cap.text
    assert min_gpus(blind, 8) == 1


def test_kv_heads_fewer_than_ranks_are_replicated_in_the_weights():
    fp = footprint("Qwen3-30B-A3B")  # 4 KV heads: at tp 8 each rank holds one whole head's k/v
    w = fp.weights
    got = estimate(fp, 101, 8).weights_gib * GIB
    assert got == pytest.approx(w.sharded / 8 + w.replicated + w.kv_proj / 4, rel=1e-3)
