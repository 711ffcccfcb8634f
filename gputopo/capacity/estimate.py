"""The capacity of a served model at a tensor-parallel size, as SGLang and vLLM size it. Pure.

Formulas and where each comes from:

* **weights per GPU** = sharded bytes / tp + replicated bytes + the k/v projections' bytes x
  max(1/tp, 1/kv_heads). Every linear layer, the vocabulary embedding and the LM head are split
  by the tensor-parallel rank, MoE experts included (both engines shard each expert's
  intermediate size under plain TP: sglang ``layers/moe/fused_moe_triton/layer.py`` FusedMoE,
  vllm ``model_executor/layers/fused_moe/layer.py``); norms, the MoE router and MLA's
  down-projections are replicated (:mod:`gputopo.formats.modelfiles`); with fewer KV heads than
  ranks each rank holds one head whole (vllm ``model_executor/layers/linear.py``
  QKVParallelLinear: ``num_kv_head_replicas = tp_size // total_num_kv_heads``).
* **SGLang's budget** = total x ``--mem-fraction-static``; its default (sglang
  ``python/sglang/srt/server_args.py`` _handle_gpu_memory_settings, the heuristic of PR #10975):
  reserved MiB = 512 + max(chunked_prefill_size, 2048) x 1.5 + cuda_graph_max_bs x 2
  + tp x pp / 8 x 1024, at least 10 GiB on a GPU over 60 GiB; fraction = round((total -
  reserved) / total, 3); chunked_prefill_size 2048 under 35 GiB, 8192 under 160 GiB, else 16384;
  cuda_graph_max_bs taken as 256 (its bucket for GPUs of 35-160 GiB).
* **SGLang's KV cache** (``model_executor/model_runner_kv_cache_mixin.py`` profile_max_num_token):
  rest = free after loading - total x (1 - fraction), that is budget - weights (less the CUDA
  context, not modelled: "about"); tokens = rest // cell, where the cell per token is
  get_cell_size_per_token: MHA/GQA: kv_heads_per_rank x (head_dim + v_head_dim) x full layers x
  dtype bytes, kv_heads_per_rank = max(1, kv_heads // tp) (``configs/model_config.py``
  get_num_kv_heads); MLA: (kv_lora_rank + qk_rope_head_dim) x layers x dtype bytes, not split
  by tp; hybrid sliding window (gpt-oss): full layers plus swa_full_tokens_ratio (0.8) x the
  sliding layers (set_num_tokens_hybrid_swa); linear attention (Qwen3-Next): full-attention
  layers only, the rest shared with the linear layers' state as 1 : mamba_full_memory_ratio
  (0.9) (handle_max_mamba_cache).
* **vLLM's budget** = total x ``--gpu-memory-utilization`` (default 0.9, ``vllm/config/cache.py``);
  KV cache = budget - weights - peak activations (``v1/worker/gpu_worker.py``
  determine_available_memory; activations not modelled: "about"); the page per token: 2 x
  kv_heads_per_rank x head_size x dtype bytes per attention layer (``v1/kv_cache_interface.py``
  FullAttentionSpec), MLA (kv_lora_rank + qk_rope_head_dim) x dtype bytes (MLAAttentionSpec);
  sliding-window layers counted as full ones (fewer tokens than vLLM may fit: the safe side).
* **KV dtype**: ``--kv-cache-dtype auto`` is the model's dtype (``torch_dtype``); fp8 variants
  1 byte, fp4 half a byte.
"""

from __future__ import annotations

from pydantic import Field

from gputopo.model.footprint import Attention, ModelFootprint, Weights
from gputopo.model.strict import Strict

GIB = 1 << 30
MIB = 1 << 20
VLLM_DEFAULT_UTILIZATION = 0.9
SWA_FULL_TOKENS_RATIO = 0.8  # sglang server_args.py swa_full_tokens_ratio
MAMBA_FULL_MEMORY_RATIO = 0.9  # sglang server_args.py mamba_full_memory_ratio
SGLANG_GRAPH_MAX_BS = 256


class Capacity(Strict):
    """One container's model at one tensor-parallel size."""

    vmid: int
    model: str
    engine: str
    tp: int
    weights_gib: float = Field(description="Weight bytes per GPU, GiB")
    gpu_gib: float | None = Field(None, description="Memory of one GPU, GiB; null: unknown")
    mem_fraction: float | None = Field(None, description="The engine's fraction of it (default as computed)")
    budget_gib: float | None = Field(None, description="What the engine takes for weights and KV cache, GiB")
    kv_gib: float | None = Field(None, description="KV cache per GPU left after the weights, GiB")
    kv_tokens: int | None = Field(None, description="Tokens the KV cache holds (the pool's size)")
    kv_dtype: str = "bf16"
    fits: bool | None = Field(None, description="Whether the weights fit the budget; null: unknown")
    heads_divide: bool = Field(
        True, description="Whether tp divides the attention heads (both engines assert it)"
    )
    text: str = Field(description="The plan's line")


def kv_bytes_per_element(kv_cache_dtype: str, att: Attention) -> float:
    """Bytes per cached element for ``--kv-cache-dtype``: auto is the model's dtype."""
    d = kv_cache_dtype.lower()
    if d.startswith("fp8"):
        return 1
    if d.startswith("fp4"):
        return 0.5
    if d in ("bfloat16", "bf16", "float16", "fp16", "half"):
        return 2
    if d in ("float32", "fp32"):
        return 4
    return att.dtype_bytes


def kv_dtype_name(kv_cache_dtype: str, att: Attention) -> str:
    """How the line names the KV dtype: fp8, bf16..."""
    d = kv_cache_dtype.lower()
    if d == "auto":
        return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(att.dtype, att.dtype)
    return "fp8" if d.startswith("fp8") else d


def cell_bytes(fp: ModelFootprint, tp: int) -> float:
    """KV cache bytes per token on one GPU (the engines' cell or page per token, see above)."""
    att = fp.attention
    b = kv_bytes_per_element(fp.kv_cache_dtype, att)
    if att.mla:
        return (int(att.kv_lora_rank or 0) + int(att.qk_rope_head_dim or 0)) * att.full_layers * b
    per_layer = max(1, att.kv_heads // tp) * att.head_dim * 2 * b
    swa = SWA_FULL_TOKENS_RATIO if fp.engine == "sglang" else 1.0
    return per_layer * (att.full_layers + swa * att.sliding_layers)


def weights_per_gpu(w: Weights, att: Attention, tp: int) -> float:
    """Weight bytes one rank holds at ``tp`` (see above)."""
    return w.sharded / tp + w.replicated + w.kv_proj * max(1 / tp, 1 / max(att.kv_heads, 1))


def sglang_fraction(gpu_mib: int, tp: int) -> float:
    """SGLang's default ``--mem-fraction-static`` for one GPU of ``gpu_mib`` at ``tp`` (above)."""
    chunked = 2048 if gpu_mib < 35 * 1024 else 8192 if gpu_mib < 160 * 1024 else 16384
    reserved = 512 + max(chunked, 2048) * 1.5 + SGLANG_GRAPH_MAX_BS * 2 + tp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def mem_fraction(fp: ModelFootprint, gpu_mib: int, tp: int) -> float:
    """The command's fraction, else the engine's default."""
    if fp.mem_fraction is not None:
        return fp.mem_fraction
    return sglang_fraction(gpu_mib, tp) if fp.engine == "sglang" else VLLM_DEFAULT_UTILIZATION


def kv_cache_bytes(fp: ModelFootprint, budget: float, weights: float) -> float:
    """The KV pool's bytes per GPU once the weights are in (SGLang's linear-attention models
    share the rest with the linear layers' state)."""
    rest = budget - weights
    if fp.engine == "sglang" and fp.attention.linear_layers:
        rest = rest / (1 + MAMBA_FULL_MEMORY_RATIO)
    return rest


def estimate(fp: ModelFootprint, vmid: int, tp: int) -> Capacity:
    """``fp`` at ``tp`` on its GPUs (``fp.gpu_memory_mib``); the budget and KV cache unknown when
    the GPUs' memory is."""
    att = fp.attention
    weights = weights_per_gpu(fp.weights, att, tp)
    common = dict(
        vmid=vmid,
        model=fp.name,
        engine=fp.engine,
        tp=tp,
        weights_gib=round(weights / GIB, 2),
        kv_dtype=kv_dtype_name(fp.kv_cache_dtype, att),
        heads_divide=tp > 0 and att.heads % tp == 0,
    )
    head = f"{fp.name} at tp {tp}: weights {weights / GIB:.1f} GiB per GPU"
    if not fp.gpu_memory_mib:
        return Capacity(
            **common, text=f"{head}; the GPUs' memory is unknown (nvidia-smi in the container gave none)"
        )
    total = fp.gpu_memory_mib * MIB
    frac = mem_fraction(fp, fp.gpu_memory_mib, tp)
    budget = total * frac
    kv = kv_cache_bytes(fp, budget, weights)
    tokens = max(0, int(kv // cell_bytes(fp, tp))) if kv > 0 else 0
    fits = weights < budget
    text = f"{head} of {total / GIB:.1f} ({_budget_name(fp)} {frac:g}: {budget / GIB:.1f} GiB); " + (
        f"KV cache about {kv / GIB:.1f} GiB per GPU, about {tokens:,} tokens at {common['kv_dtype']}"
        if fits
        else f"does not fit: {(weights - budget) / GIB:.1f} GiB over"
    )
    return Capacity(
        **common,
        gpu_gib=round(total / GIB, 2),
        mem_fraction=frac,
        budget_gib=round(budget / GIB, 2),
        kv_gib=round(kv / GIB, 2),
        kv_tokens=tokens if fits else 0,
        fits=fits,
        text=text,
    )


def _budget_name(fp: ModelFootprint) -> str:
    return "mem fraction" if fp.engine == "sglang" else "gpu-memory-utilization"


def min_gpus(fp: ModelFootprint, most: int) -> int | None:
    """The fewest GPUs (at most ``most``) at a tensor-parallel size that divides the attention
    heads and whose weights fit; None when none does, 1 when the GPUs' memory is unknown."""
    if not fp.gpu_memory_mib:
        return 1
    for tp in range(1, most + 1):
        if fp.attention.heads % tp:
            continue
        if estimate(fp, 0, tp).fits:
            return tp
    return None
