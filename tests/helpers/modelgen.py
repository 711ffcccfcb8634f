"""Safetensors headers synthesized from a real ``config.json``: every tensor's name, dtype and
shape as the model's Hugging Face checkpoint lays them out (the transformers modeling files of
each family), and sparse files of the right size (the header, then a hole: no disk).

What is derived here is the tensor list; the tests check it against the published parameter
counts before trusting it. ``fp8`` gives DeepSeek-V3/Qwen3-FP8's block-quantized layout: every
linear weight F8_E4M3 with a ``weight_scale_inv`` of F32 per 128x128 block; gpt-oss's experts
are MXFP4 (``*_blocks`` U8 of 16 bytes per 32 values, ``*_scales`` U8 per 32 values).
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path
from typing import Any

SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1}
Tensor = tuple[str, list[int]]  # (dtype, shape)


def _linear(out: dict[str, Tensor], name: str, rows: int, cols: int, fp8: bool, bias: bool = False) -> None:
    if fp8:
        out[f"{name}.weight"] = ("F8_E4M3", [rows, cols])
        out[f"{name}.weight_scale_inv"] = ("F32", [math.ceil(rows / 128), math.ceil(cols / 128)])
    else:
        out[f"{name}.weight"] = ("BF16", [rows, cols])
    if bias:
        out[f"{name}.bias"] = ("BF16", [rows])


def _attention(out: dict[str, Tensor], p: str, c: dict[str, Any], kind: str, fp8: bool) -> None:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    if c.get("kv_lora_rank"):  # DeepSeek MLA (modeling_deepseek.py DeepseekV3Attention)
        nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        q, kv = c.get("q_lora_rank"), c["kv_lora_rank"]
        if q:
            _linear(out, f"{p}.q_a_proj", q, h, fp8)
            out[f"{p}.q_a_layernorm.weight"] = ("BF16", [q])
            _linear(out, f"{p}.q_b_proj", heads * (nope + rope), q, fp8)
        else:
            _linear(out, f"{p}.q_proj", heads * (nope + rope), h, fp8)
        _linear(out, f"{p}.kv_a_proj_with_mqa", kv + rope, h, fp8)
        out[f"{p}.kv_a_layernorm.weight"] = ("BF16", [kv])
        _linear(out, f"{p}.kv_b_proj", heads * (nope + v), kv, fp8)
        _linear(out, f"{p}.o_proj", h, heads * v, fp8)
        return
    if kind == "linear_attention":  # Qwen3-Next Gated DeltaNet (modeling_qwen3_next.py)
        kh, kd = c["linear_num_key_heads"], c["linear_key_head_dim"]
        vh, vd = c["linear_num_value_heads"], c["linear_value_head_dim"]
        _linear(out, f"{p}.in_proj_qkvz", 2 * kh * kd + 2 * vh * vd, h, fp8)
        _linear(out, f"{p}.in_proj_ba", 2 * vh, h, fp8)
        out[f"{p}.conv1d.weight"] = ("BF16", [2 * kh * kd + vh * vd, 1, c["linear_conv_kernel_dim"]])
        out[f"{p}.A_log"] = ("F32", [vh])
        out[f"{p}.dt_bias"] = ("BF16", [vh])
        out[f"{p}.norm.weight"] = ("F32", [vd])
        _linear(out, f"{p}.out_proj", h, vh * vd, fp8)
        return
    hd = c.get("head_dim") or h // heads
    kvh = c.get("num_key_value_heads") or heads
    gated = 2 if c.get("model_type") == "qwen3_next" else 1  # its full attention's output gate
    bias = bool(c.get("attention_bias"))
    _linear(out, f"{p}.q_proj", heads * hd * gated, h, fp8, bias)
    _linear(out, f"{p}.k_proj", kvh * hd, h, fp8, bias)
    _linear(out, f"{p}.v_proj", kvh * hd, h, fp8, bias)
    _linear(out, f"{p}.o_proj", h, heads * hd, fp8, bias)
    if c.get("model_type", "").startswith("qwen3"):
        out[f"{p}.q_norm.weight"] = ("BF16", [hd])
        out[f"{p}.k_norm.weight"] = ("BF16", [hd])
    if c.get("model_type") == "gpt_oss":
        out[f"{p}.sinks"] = ("BF16", [heads])


def _mlp(out: dict[str, Tensor], p: str, h: int, inter: int, fp8: bool) -> None:
    _linear(out, f"{p}.gate_proj", inter, h, fp8)
    _linear(out, f"{p}.up_proj", inter, h, fp8)
    _linear(out, f"{p}.down_proj", h, inter, fp8)


def _moe(out: dict[str, Tensor], p: str, c: dict[str, Any], fp8: bool) -> None:
    h = c["hidden_size"]
    if c.get("model_type") == "gpt_oss":  # MXFP4 experts (modeling_gpt_oss.py, the checkpoint's names)
        e, inter = c["num_local_experts"], c["intermediate_size"]
        out[f"{p}.router.weight"] = ("BF16", [e, h])
        out[f"{p}.router.bias"] = ("BF16", [e])
        out[f"{p}.experts.gate_up_proj_blocks"] = ("U8", [e, 2 * inter, h // 32, 16])
        out[f"{p}.experts.gate_up_proj_scales"] = ("U8", [e, 2 * inter, h // 32])
        out[f"{p}.experts.gate_up_proj_bias"] = ("BF16", [e, 2 * inter])
        out[f"{p}.experts.down_proj_blocks"] = ("U8", [e, h, inter // 32, 16])
        out[f"{p}.experts.down_proj_scales"] = ("U8", [e, h, inter // 32])
        out[f"{p}.experts.down_proj_bias"] = ("BF16", [e, h])
        return
    experts = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_routed_experts")
    inter = c["moe_intermediate_size"]
    out[f"{p}.gate.weight"] = ("BF16", [experts, h])
    if c.get("topk_method") == "noaux_tc":
        out[f"{p}.gate.e_score_correction_bias"] = ("F32", [experts])
    for i in range(experts):
        _mlp(out, f"{p}.experts.{i}", h, inter, fp8)
    shared = c.get("n_shared_experts") or c.get("num_shared_experts")
    if shared:
        _mlp(out, f"{p}.shared_experts", h, inter * shared, fp8)
    if c.get("shared_expert_intermediate_size"):
        _mlp(out, f"{p}.shared_expert", h, c["shared_expert_intermediate_size"], fp8)
        out[f"{p}.shared_expert_gate.weight"] = ("BF16", [1, h])


def _kinds(c: dict[str, Any]) -> list[str]:
    n = c["num_hidden_layers"]
    if c.get("layer_types"):
        return list(c["layer_types"])
    every = c.get("full_attention_interval")
    if every:
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    return ["full_attention"] * n


def tensors_of(config: dict[str, Any], fp8: bool = False) -> dict[str, Tensor]:
    """Every tensor of the checkpoint ``config`` describes (the decoder layers the engines load;
    no multi-token-prediction layer)."""
    c, out = config, {}
    h = c["hidden_size"]
    out["model.embed_tokens.weight"] = ("BF16", [c["vocab_size"], h])
    for i, kind in enumerate(_kinds(c)):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = ("BF16", [h])
        out[f"{p}.post_attention_layernorm.weight"] = ("BF16", [h])
        attn = "linear_attn" if kind == "linear_attention" else "self_attn"
        _attention(out, f"{p}.{attn}", c, kind, fp8)
        dense = i < c.get("first_k_dense_replace", 0) or not (
            c.get("num_experts")
            or c.get("n_routed_experts")
            or c.get("num_routed_experts")
            or c.get("num_local_experts")
        )
        if dense:
            _mlp(out, f"{p}.mlp", h, c["intermediate_size"], fp8)
        else:
            _moe(out, f"{p}.mlp", c, fp8)
    out["model.norm.weight"] = ("BF16", [h])
    if not c.get("tie_word_embeddings"):
        out["lm_head.weight"] = ("BF16", [c["vocab_size"], h])
    return out


def nbytes(t: Tensor) -> int:
    return math.prod(t[1]) * SIZES[t[0]]


def parameters(tensors: dict[str, Tensor]) -> int:
    """Parameters as a model card counts them: every weight's elements, MXFP4 blocks as two values
    per byte, quantization scales left out."""
    n = 0
    for name, (_dtype, shape) in tensors.items():
        if "scale" in name:
            continue
        n += math.prod(shape) * (2 if name.endswith("_blocks") else 1)
    return n


def write_model(directory: Path, config: dict[str, Any], shards: int = 4, fp8: bool = False) -> int:
    """``config.json``, ``model.safetensors.index.json`` and ``shards`` sparse safetensors files
    in ``directory`` (made afresh: a simulated container's model directory there, whose shards
    are links into the machine's shared store, is removed first, never written through). Returns
    the weight bytes."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = tensors_of(config, fp8)
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header, offset = {}, 0
        for name in names[s * per : (s + 1) * per]:
            size = nbytes(tensors[name])
            header[name] = {
                "dtype": tensors[name][0],
                "shape": tensors[name][1],
                "data_offsets": [offset, offset + size],
            }
            offset += size
            weight_map[name] = fname
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
        with open(directory / fname, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # sparse: the weights are a hole
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total
