"""The served model's directory in a simulated container: ``config.json``, the safetensors index
and sparse safetensors shards (the real size, no disk).

The configs are Qwen/Qwen3-235B-A22B-FP8's (the seed's) and Qwen/Qwen3-30B-A3B-FP8's (a model
that fits one GPU), package data in ``gputopo/sim/models/``, their sources in
``fixtures/real/SOURCES.md``. The shards' headers are derived from it: the tensor names and
shapes of the Qwen3-MoE architecture (transformers ``models/qwen3_moe/modeling_qwen3_moe.py``:
per layer q/k/v/o projections, q_norm/k_norm, the router ``mlp.gate`` and every expert's
gate/up/down projections), the linear weights as ``F8_E4M3`` with a ``weight_scale_inv`` per
128x128 block (the config's ``quantization_config.weight_block_size``, as DeepSeek-V3's FP8
checkpoints lay them out), everything else in the config's ``torch_dtype``. Shards are filled in
tensor order up to 5 GB each (transformers' ``save_pretrained`` default ``max_shard_size``).

A safetensors file is an 8-byte little-endian header length, the JSON header (``dtype``,
``shape``, ``data_offsets`` per tensor), then the data: the simulator writes the first two and
extends the file to its full size, so the data is a hole. The shards live once per machine in a
store (:func:`model_store`, under the temporary directory) and the container's model directory
links to them, the way a model directory is usually a bind mount of the host's (``mpN:``): a
copy of a simulated host (``cp -a``, ``shutil.copytree(symlinks=True)``) copies the links, never
236 GB of zeros.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
from pathlib import Path

from gputopo.errors import SimHostError

MODELS_DATA = Path(__file__).resolve().parent.parent / "models"
SEED_MODEL = "Qwen3-235B-A22B-FP8"
# the models a simulated container can serve: the seed's, and one that fits a single GPU
SMALL_MODEL = "Qwen3-30B-A3B-FP8"
MODELS = (SEED_MODEL, SMALL_MODEL)
SEED_MODEL_PATH = f"/models/{SEED_MODEL}"
MAX_SHARD_BYTES = 5_000_000_000  # transformers PreTrainedModel.save_pretrained max_shard_size="5GB"
LAYOUT_VERSION = "2"  # bump when the derived layout changes: the store is rebuilt under a new key
DTYPE_BYTES = {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4}
_TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def shipped_config(name: str = SEED_MODEL) -> str:
    """The text of model ``name``'s shipped ``config.json``. Raises SimHostError when absent."""
    path = MODELS_DATA / f"{name}.config.json"
    try:
        return path.read_text()
    except OSError as e:
        raise SimHostError(str(path), f"the simulator's model config is missing: {e.strerror}") from None


def _linear(prefix: str, out_dim: int, in_dim: int, block: list[int] | None, dtype: str) -> list[tuple]:
    """A linear layer's weight (FP8 with its block scales when ``block``, else ``dtype``)."""
    if not block:
        return [(f"{prefix}.weight", dtype, [out_dim, in_dim])]
    scale = [math.ceil(out_dim / block[0]), math.ceil(in_dim / block[1])]
    return [(f"{prefix}.weight", "F8_E4M3", [out_dim, in_dim]), (f"{prefix}.weight_scale_inv", "F32", scale)]


def qwen3_moe_tensors(cfg: dict) -> list[tuple[str, str, list[int]]]:
    """(name, safetensors dtype, shape) of every tensor of a Qwen3-MoE checkpoint, in file order."""
    dtype = _TORCH_DTYPES.get(cfg.get("torch_dtype", "bfloat16"), "BF16")
    quant = cfg.get("quantization_config") or {}
    block = quant.get("weight_block_size") if quant.get("quant_method") == "fp8" else None
    hidden, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    inter = cfg["moe_intermediate_size"]
    out: list[tuple] = [("model.embed_tokens.weight", dtype, [cfg["vocab_size"], hidden])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", dtype, [hidden])]
        out += [(f"{p}.post_attention_layernorm.weight", dtype, [hidden])]
        out += _linear(f"{p}.self_attn.q_proj", heads * head_dim, hidden, block, dtype)
        out += _linear(f"{p}.self_attn.k_proj", kv * head_dim, hidden, block, dtype)
        out += _linear(f"{p}.self_attn.v_proj", kv * head_dim, hidden, block, dtype)
        out += _linear(f"{p}.self_attn.o_proj", hidden, heads * head_dim, block, dtype)
        out += [
            (f"{p}.self_attn.q_norm.weight", dtype, [head_dim]),
            (f"{p}.self_attn.k_norm.weight", dtype, [head_dim]),
        ]
        out += [(f"{p}.mlp.gate.weight", dtype, [cfg["num_experts"], hidden])]  # the router: never quantized
        for e in range(cfg["num_experts"]):
            q = f"{p}.mlp.experts.{e}"
            out += _linear(f"{q}.gate_proj", inter, hidden, block, dtype)
            out += _linear(f"{q}.up_proj", inter, hidden, block, dtype)
            out += _linear(f"{q}.down_proj", hidden, inter, block, dtype)
    out += [("model.norm.weight", dtype, [hidden]), ("lm_head.weight", dtype, [cfg["vocab_size"], hidden])]
    return out


def tensor_bytes(dtype: str, shape: list[int]) -> int:
    return DTYPE_BYTES[dtype] * math.prod(shape)


def shard(tensors: list[tuple]) -> list[list[tuple]]:
    """The tensors split into shards of at most :data:`MAX_SHARD_BYTES`, in order."""
    shards: list[list[tuple]] = [[]]
    size = 0
    for t in tensors:
        n = tensor_bytes(t[1], t[2])
        if shards[-1] and size + n > MAX_SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += n
    return shards


def header_bytes(tensors: list[tuple]) -> tuple[bytes, int]:
    """A safetensors header for ``tensors`` (padded with spaces to 8 bytes) and the data's size."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in tensors:
        n = tensor_bytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8), offset


def write_sparse_safetensors(path: Path, tensors: list[tuple]) -> int:
    """Write ``path`` as a safetensors file whose data is a hole; return its size."""
    head, data = header_bytes(tensors)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        f.truncate(8 + len(head) + data)
    return 8 + len(head) + data


def _build(dest: Path, config_text: str) -> None:
    """Write the index and the sparse shards of the model whose config is ``config_text``."""
    shards = shard(qwen3_moe_tensors(json.loads(config_text)))
    weight_map, total = {}, 0
    for i, part in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_sparse_safetensors(dest / fname, part)
        for name, dtype, shape in part:
            weight_map[name] = fname
            total += tensor_bytes(dtype, shape)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dest / "config.json").write_text(config_text)
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")  # last: "built"


def model_store(name: str = SEED_MODEL) -> Path:
    """This machine's store of model ``name``'s index and sparse shards, built on first use.

    Keyed by the config and :data:`LAYOUT_VERSION`; built in a private directory renamed into
    place, so concurrent builders agree. Raises SimHostError when the store cannot be made.
    """
    config_text = shipped_config(name)
    key = hashlib.sha256((LAYOUT_VERSION + config_text).encode()).hexdigest()[:16]
    base = Path(tempfile.gettempdir()) / f"gputopo-sim-models-{os.getuid()}"
    dest = base / f"{name}-{key}"
    if (dest / "model.safetensors.index.json").is_file():
        return dest
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        if base.stat().st_uid != os.getuid():
            raise SimHostError(str(base), "the model store belongs to another user")
        work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
        _build(work, config_text)
        try:
            work.rename(dest)
        except OSError:  # another process put it in place first
            shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise SimHostError(
            str(base), f"cannot build the simulated model's files: {e.strerror or e}"
        ) from None
    return dest


def install_model(rootfs: Path, name: str = SEED_MODEL) -> Path:
    """Create ``/models/<name>`` in the container root ``rootfs``: ``config.json`` and the index
    (files of the container's own, which a change in the container may rewrite) and the shards
    (links into :func:`model_store`: the sparse files of every simulated host of this machine).
    Return the directory."""
    store = model_store(name)
    d = rootfs / "models" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(shipped_config(name))
    for f in sorted(store.iterdir()):
        if f.name.endswith(".index.json"):
            shutil.copyfile(f, d / f.name)
        elif f.name.endswith(".safetensors"):
            os.symlink(f, d / f.name)
    return d
