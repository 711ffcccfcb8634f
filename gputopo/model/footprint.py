"""A served model's footprint as read without loading it: its ``config.json`` (the attention's
shape) and the byte count of every tensor from its safetensors headers, with the serving
engine's memory options from the service's command. Data only: read by
:mod:`gputopo.facts.footprint`, sized by :mod:`gputopo.capacity`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gputopo.model.strict import Strict


class Attention(Strict):
    """What the KV cache per token depends on, from ``config.json``."""

    heads: int = Field(description="num_attention_heads: the tensor-parallel size must divide it")
    kv_heads: int = Field(description="num_key_value_heads (grouped-query attention)")
    head_dim: int
    full_layers: int = Field(description="Layers with full attention: the ones whose cache grows per token")
    sliding_layers: int = Field(0, description="Sliding-window attention layers")
    sliding_window: int | None = None
    linear_layers: int = Field(0, description="Linear-attention layers (a fixed state per request)")
    kv_lora_rank: int | None = Field(None, description="MLA: the compressed latent per token and layer")
    qk_rope_head_dim: int | None = None
    dtype_bytes: float = Field(2, description="Bytes per element of the model's dtype (torch_dtype)")
    dtype: str = "bfloat16"

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None


class Weights(Strict):
    """The checkpoint's tensors in bytes (from the headers' data_offsets: exact for any dtype)."""

    sharded: int = Field(description="Bytes split across the tensor-parallel ranks")
    replicated: int = Field(
        0, description="Bytes every rank holds whole (norms, the MoE router, MLA's down-projections)"
    )
    kv_proj: int = Field(0, description="Bytes of the k/v projections: replicated once kv heads < tp")
    skipped: int = Field(0, description="Bytes the engines do not load (multi-token-prediction layers)")
    files: int = Field(0, description="Safetensors files read")
    tensors: int = 0

    @property
    def total(self) -> int:
        return self.sharded + self.replicated + self.kv_proj


class ModelFootprint(Strict):
    """One container's served model: where it is, how it is served, what it takes."""

    path: str = Field(description="The model directory inside the container")
    engine: Literal["sglang", "vllm"]
    name: str = Field(description="The model's short name (the directory's last part)")
    model_type: str | None = None
    attention: Attention
    weights: Weights
    kv_cache_dtype: str = Field("auto", description="--kv-cache-dtype as the command gives it")
    mem_fraction: float | None = Field(
        None,
        description="--mem-fraction-static (SGLang) or --gpu-memory-utilization (vLLM); null: the default",
    )
    gpu_memory_mib: int | None = Field(
        None, description="The smallest memory.total of the container's GPUs (nvidia-smi); null: unknown"
    )
