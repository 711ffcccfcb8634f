"""The served model's files parsed: the service command, config.json of real models
(fixtures/real/models, SOURCES.md), safetensors headers and index."""

from __future__ import annotations

import json
import struct

import pytest

from gputopo import resources
from gputopo.formats.modelfiles import (
    attention_of,
    header_length,
    header_tensors,
    index_files,
    served_args,
    weights_of,
)


def config(name: str) -> dict:
    return json.loads((resources.fixtures_dir() / f"real/models/{name}/config.json").read_text())


def test_sglang_and_vllm_commands_name_their_model_and_memory_options():
    a = served_args(
        "/opt/sglang/.venv/bin/python -m sglang.launch_server --model-path /models/Q --served-model-name qwen3 "
        "--tp 8 --mem-fraction-static 0.82 --kv-cache-dtype fp8_e4m3"
    )
    assert (a.engine, a.path, a.mem_fraction, a.kv_cache_dtype, a.served_name) == (
        "sglang",
        "/models/Q",
        0.82,
        "fp8_e4m3",
        "qwen3",
    )
    v = served_args(
        "/usr/local/bin/vllm serve /models/Q --tensor-parallel-size 4 --gpu-memory-utilization=0.85"
    )
    assert (v.engine, v.path, v.mem_fraction, v.kv_cache_dtype) == ("vllm", "/models/Q", 0.85, "auto")
    assert served_args("python -m vllm.entrypoints.openai.api_server --model /m/x").path == "/m/x"
    assert served_args("/usr/bin/python3 -m http.server") is None
    assert served_args("python -m sglang.launch_server --tp 2") is None


def test_header_length_and_tensors():
    assert header_length(struct.pack("<Q", 1234)) == 1234
    with pytest.raises(ValueError, match="header length takes 8"):
        header_length(b"\x01\x02")
    with pytest.raises(ValueError, match="the format allows"):
        header_length(struct.pack("<Q", 10**9))
    text = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            "a.weight": {"dtype": "F8_E4M3", "shape": [4, 8], "data_offsets": [0, 32]},
            "a.weight_scale_inv": {"dtype": "F32", "shape": [1, 1], "data_offsets": [32, 36]},
        }
    )
    assert header_tensors(text) == {"a.weight": 32, "a.weight_scale_inv": 4}
    with pytest.raises(ValueError, match="no data_offsets"):
        header_tensors('{"x": {"dtype": "F32"}}')
    assert index_files('{"weight_map": {"a": "f1", "b": "f2", "c": "f1"}}') == ["f1", "f2"]
    with pytest.raises(ValueError, match="no weight_map"):
        index_files("{}")


def test_tensors_split_as_tensor_parallelism_splits_them():
    w = weights_of(
        {
            "model.embed_tokens.weight": 100,
            "model.layers.0.input_layernorm.weight": 1,
            "model.layers.0.self_attn.k_proj.weight": 10,
            "model.layers.0.mlp.gate.weight": 5,  # the MoE router: replicated
            "model.layers.0.mlp.experts.0.gate_proj.weight": 50,
            "model.layers.1.mlp.experts.0.up_proj.weight": 70,  # past num_hidden_layers: MTP
            "mtp.fc.weight": 9,
        },
        layers=1,
        files=1,
    )
    assert (w.sharded, w.replicated, w.kv_proj, w.skipped) == (150, 6, 10, 79)


def test_attention_of_real_configs():
    dense = attention_of(config("Qwen3-8B"))
    assert (dense.heads, dense.kv_heads, dense.head_dim, dense.full_layers) == (32, 8, 128, 36)
    nxt = attention_of(config("Qwen3-Next-80B-A3B"))  # full_attention_interval 4
    assert (nxt.full_layers, nxt.linear_layers, nxt.kv_heads, nxt.head_dim) == (12, 36, 2, 256)
    oss = attention_of(config("gpt-oss-20b"))  # layer_types: sliding and full alternate
    assert (oss.full_layers, oss.sliding_layers, oss.sliding_window) == (12, 12, 128)
    mla = attention_of(config("DeepSeek-V3"))
    assert mla.mla and (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.full_layers) == (512, 64, 61)
    with pytest.raises(ValueError, match="num_attention_heads"):
        attention_of({"num_hidden_layers": 2})
