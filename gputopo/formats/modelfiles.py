"""A served model's files, parsed without loading a weight: the service's command (which model,
which engine, its memory options), ``config.json`` (the attention's shape), the safetensors index
and each file's header. Pure.

The safetensors format (huggingface/safetensors ``README.md``, "Format"): 8 bytes, a
little-endian unsigned 64-bit N, then N bytes of JSON: ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}}`` plus an optional ``__metadata__``; the weights follow. A
tensor's bytes are ``end - begin``, exact for every dtype (packed FP4 blocks and their scales
included). The format caps N at 100,000,000 bytes (``MAX_HEADER_SIZE`` in its Rust crate).
"""

from __future__ import annotations

import json
import re
import shlex
import struct
from dataclasses import dataclass
from typing import Any

from gputopo.model.footprint import Attention, Weights

MAX_HEADER = 100_000_000
CONFIG_MAX = 4 * 1024 * 1024  # bytes of config.json read at most
# bytes of model.safetensors.index.json read at most: one line per tensor, some MiB for a large
# MoE (tens of thousands of expert tensors and their scales)
INDEX_MAX = 64 * 1024 * 1024

# bytes per element of config.json's torch_dtype
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float": 4, "half": 2}

# tensors every tensor-parallel rank holds whole. SGLang and vLLM build them as
# ReplicatedLinear or plain parameters: the RMSNorm weights, the MoE router (``mlp.gate`` in
# Qwen3-MoE/DeepSeek, ``mlp.router`` in gpt-oss) and its bias, and DeepSeek's MLA
# down-projections (vllm model_executor/models/deepseek_v2.py DeepseekV2MLAAttention:
# q_a_proj and kv_a_proj_with_mqa are ReplicatedLinear); attention sinks are per head (sharded)
_REPLICATED = re.compile(
    r"(norm\.|norm$|layernorm|\.mlp\.gate\.|\.mlp\.router\.|e_score_correction_bias"
    r"|q_a_proj|kv_a_proj_with_mqa|shared_expert_gate)"
)
_KV_PROJ = re.compile(r"\.(k_proj|v_proj)\.")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class ServedArgs:
    """What the service's command says of its model: the engine, the model's path and the
    memory options (None: the engine's default)."""

    engine: str
    path: str
    kv_cache_dtype: str = "auto"
    mem_fraction: float | None = None
    served_name: str | None = None


def _flag(words: list[str], *names: str) -> str | None:
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(n + "="):
                return w[len(n) + 1 :]
    return None


def served_args(command: str) -> ServedArgs | None:
    """The served model of a service command, None when it names none (or is neither engine).

    SGLang: ``--model-path`` (or its alias ``--model``), ``--mem-fraction-static``,
    ``--kv-cache-dtype``, ``--served-model-name`` (sglang ``python/sglang/srt/server_args.py`` add_cli_args). vLLM:
    ``vllm serve MODEL`` or ``--model``, ``--gpu-memory-utilization``, ``--kv-cache-dtype``
    (vllm ``vllm/engine/arg_utils.py``).
    """
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    text = " ".join(words)
    engine = "sglang" if "sglang" in text else "vllm" if "vllm" in text else None
    if engine is None:
        return None
    path = _flag(words, "--model-path", "--model")
    if path is None and engine == "vllm":
        for i, w in enumerate(words[:-1]):
            if w.endswith("vllm") and words[i + 1] == "serve" and i + 2 < len(words):
                if not words[i + 2].startswith("-"):
                    path = words[i + 2]
    if not path:
        return None
    fraction_flag = "--mem-fraction-static" if engine == "sglang" else "--gpu-memory-utilization"
    raw = _flag(words, fraction_flag)
    try:
        fraction = float(raw) if raw is not None else None
    except ValueError:
        fraction = None
    name = _flag(words, "--served-model-name")
    return ServedArgs(engine, path, _flag(words, "--kv-cache-dtype") or "auto", fraction, name)


def header_length(first8: bytes) -> int:
    """N of a safetensors file's first 8 bytes. Raises ValueError when they are not 8 bytes or N
    is past the format's limit."""
    if len(first8) != 8:
        raise ValueError(f"{len(first8)} bytes where the header length takes 8")
    (n,) = struct.unpack("<Q", first8)
    if n > MAX_HEADER:
        raise ValueError(f"a header of {n} bytes (the format allows {MAX_HEADER})")
    return n


def header_tensors(text: str) -> dict[str, int]:
    """Tensor name -> bytes of one safetensors header. Raises ValueError when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"its header is not JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError("its header is not a JSON object")
    out: dict[str, int] = {}
    for name, t in data.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = t["data_offsets"]
            out[name] = int(end) - int(begin)
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"tensor {name} has no data_offsets") from None
    return out


def index_files(text: str) -> list[str]:
    """The files of ``model.safetensors.index.json``'s weight_map, in order. Raises ValueError."""
    try:
        data = json.loads(text)
        files = data["weight_map"].values()
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise ValueError("model.safetensors.index.json has no weight_map") from None
    return list(dict.fromkeys(str(f) for f in files))


def weights_of(tensors: dict[str, int], layers: int, files: int) -> Weights:
    """The tensors split as tensor parallelism splits them (see ``_REPLICATED``); layers at or
    past ``layers`` (DeepSeek's and Qwen3-Next's multi-token-prediction layers, ``mtp.*``) are
    skipped, as the engines skip them unless speculative decoding loads them (vllm
    ``deepseek_v2.py`` load_weights: get_spec_layer_idx_from_weight_name)."""
    sharded = replicated = kv = skipped = 0
    for name, size in tensors.items():
        m = _LAYER.match(name)
        if name.startswith("mtp.") or (m and int(m.group(1)) >= layers):
            skipped += size
        elif _REPLICATED.search(name):
            replicated += size
        elif _KV_PROJ.search(name):
            kv += size
        else:
            sharded += size
    return Weights(
        sharded=sharded, replicated=replicated, kv_proj=kv, skipped=skipped, files=files, tensors=len(tensors)
    )


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's language model part (``text_config``), else the config itself."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def _layer_kinds(c: dict[str, Any], layers: int) -> list[str]:
    """Each layer's attention: ``layer_types`` when given (gpt-oss, Qwen3.5), else Qwen3-Next's
    ``full_attention_interval`` (every Nth layer full, the rest linear: transformers
    ``configuration_qwen3_next.py``), else all full."""
    kinds = c.get("layer_types")
    if isinstance(kinds, list) and len(kinds) == layers:
        return [str(k) for k in kinds]
    every = c.get("full_attention_interval")
    if isinstance(every, int) and every > 0:
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
    return ["full_attention"] * layers


def attention_of(config: dict[str, Any]) -> Attention:
    """The attention's shape from ``config.json``. Raises ValueError naming a missing field."""
    c = _text_config(config)
    try:
        heads = int(c["num_attention_heads"])
        layers = int(c["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"config.json has no usable {e}") from None
    kinds = _layer_kinds(c, layers)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    head_dim = c.get("head_dim") or int(c.get("hidden_size", 0)) // heads
    mla = c.get("kv_lora_rank")
    return Attention(
        heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        full_layers=sum(1 for k in kinds if k == "full_attention"),
        sliding_layers=sum(1 for k in kinds if k == "sliding_attention"),
        sliding_window=c.get("sliding_window") if any(k == "sliding_attention" for k in kinds) else None,
        linear_layers=sum(1 for k in kinds if k == "linear_attention"),
        kv_lora_rank=int(mla) if mla else None,
        qk_rope_head_dim=int(c.get("qk_rope_head_dim") or 0) if mla else None,
        dtype_bytes=_DTYPE_BYTES.get(dtype, 2),
        dtype=dtype,
    )


def layer_count(config: dict[str, Any]) -> int:
    """``num_hidden_layers`` (0 when absent)."""
    return int(_text_config(config).get("num_hidden_layers") or 0)
