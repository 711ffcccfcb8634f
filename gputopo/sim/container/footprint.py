"""What the simulated inference server's model weighs and what its start leaves for the KV cache.

The server reads its model directory like the engines do before they allocate anything: the
``config.json`` (layers, KV heads, head size, dtype) and the safetensors shards, whose weights are
each file's size less its 8-byte length and JSON header (the safetensors layout). This reader is
the simulator's own: it shares nothing with gputopo's planner.

A start then follows the engine's own arithmetic, per GPU (MiB and GiB as the engines count them):

* both: the CUDA context takes :data:`CUDA_CONTEXT_MIB` before anything is measured; weights are
  split evenly over the tensor-parallel ranks; weights larger than what is left fail the load in
  torch's words (``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...``,
  c10/cuda/CUDACachingAllocator.cpp).
* SGLang (``python/sglang/srt/model_executor/model_runner.py`` ``profile_max_num_token``, in
  recent releases ``model_runner_kv_cache_mixin.py``):
  ``rest = available_after_weights - total_at_start * (1 - mem_fraction_static)``;
  ``max_total_num_tokens = rest_bytes // cell_size`` with ``cell_size = kv_heads_per_gpu *
  head_dim * layers * 2 * dtype_bytes``; ``rest <= 0`` raises ``RuntimeError: Not enough memory.
  Please try to increase --mem-fraction-static. Current value: mem_fraction_static=F``
  (``init_memory_pool``). ``mem_fraction_static``
  defaults as ``python/sglang/srt/server_args.py`` computes it: ``(gpu_mem - reserved) /
  gpu_mem`` with ``reserved`` by the GPU's memory and ``tp_size`` (:func:`sglang_mem_fraction`).
* vLLM (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``): ``kv = total *
  gpu_memory_utilization - (weights + peak activation + non-torch memory)``; blocks of 16 tokens
  of ``2 * 16 * kv_heads_per_gpu * head_size * dtype_bytes`` per layer; ``kv <= 0`` raises
  ``ValueError: No available memory for the cache blocks. ...`` and a KV cache smaller than one
  request of ``max_model_len`` raises ``... is larger than the available KV cache memory ...``
  (``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``).

Memory used, as nvidia-smi shows it once the server runs: everything but what the engine leaves
free (``total_at_start * (1 - fraction)`` for SGLang, ``total * (1 - utilization)`` for vLLM) plus
what it allocates after the KV cache (CUDA graphs, NCCL buffers): :data:`SEED_RESIDUE_MIB`, the
residue of the seed host's log (78,193-79,043 of 97,887 MiB at tp 4) over that formula with the
seed unit's ``--mem-fraction-static 0.79``.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gputopo.sim.container.gpus import SEED_LOAD_MIB, SEED_TOTAL_MIB
from gputopo.sim.container.paths import inside
from gputopo.sim.container.server_args import _flag, model_path, service_flavor

MIB = 1 << 20
GIB = 1 << 30
CUDA_CONTEXT_MIB = 500  # a CUDA context with the engine's kernels loaded (simulator constant)
VLLM_ACTIVATION_MIB = 2048  # vLLM's profile run: peak activations at its default batch (simulator constant)
VLLM_BLOCK = 16  # vLLM CacheConfig.block_size default
SEED_FRACTION = 0.79  # the seed unit's --mem-fraction-static / --gpu-memory-utilization
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _seed_residue() -> tuple[int, ...]:
    base = SEED_TOTAL_MIB - (SEED_TOTAL_MIB - CUDA_CONTEXT_MIB) * (1 - SEED_FRACTION)
    return tuple(round(u - base) for u in SEED_LOAD_MIB)


SEED_RESIDUE_MIB = _seed_residue()  # per rank (cycled): what each rank holds beyond the pool


@dataclass(frozen=True)
class Footprint:
    """A model as its directory gives it: weight bytes and the figures of its KV cache."""

    weight_bytes: int
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_model_len: int
    architecture: str


def read_footprint(rootfs: Path, path: str) -> Footprint | None:
    """The footprint of the model directory ``path`` inside the container root ``rootfs``; None
    when it has no readable ``config.json`` or no safetensors shard. A directory read before
    with the same files (names, sizes, times) is not read again."""
    try:
        d = inside(rootfs, path)
        shards = sorted((e.name, e.stat()) for e in os.scandir(d) if e.name.endswith(".safetensors"))
        cfg_stat = (d / "config.json").stat()
    except (OSError, ValueError):
        return None
    key = (str(d), cfg_stat.st_mtime_ns, cfg_stat.st_size) + tuple(
        (n, st.st_size, st.st_mtime_ns, st.st_ino) for n, st in shards
    )
    if key not in _READ:
        _READ.clear()  # one model at a time is what a host serves: keep the cache small
        _READ[key] = _read(d, [d / n for n, _ in shards])
    return _READ[key]


_READ: dict[tuple, Footprint | None] = {}


def _read(d: Path, shards: list[Path]) -> Footprint | None:
    try:
        cfg = json.loads((d / "config.json").read_text())
        weights = 0
        for s in shards:
            with open(s, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
            weights += s.stat().st_size - 8 - n
    except (OSError, ValueError, struct.error):
        return None
    cfg = cfg.get("text_config", cfg)
    heads = int(cfg.get("num_attention_heads", 1))
    if not shards or weights <= 0 or int(cfg.get("num_hidden_layers", 0)) <= 0:
        return None
    return Footprint(
        weight_bytes=weights,
        layers=int(cfg.get("num_hidden_layers", 0)),
        kv_heads=int(cfg.get("num_key_value_heads", heads)),
        head_dim=int(cfg.get("head_dim") or int(cfg.get("hidden_size", 0)) // max(heads, 1)),
        dtype_bytes=_DTYPE_BYTES.get(str(cfg.get("torch_dtype", "bfloat16")), 2),
        max_model_len=int(cfg.get("max_position_embeddings", 0)),
        architecture=(cfg.get("architectures") or ["?"])[0],
    )


@dataclass
class Load:
    """How a start went: memory used per rank (MiB), KV tokens, journal lines, the error if any."""

    used_mib: list[int] = field(default_factory=list)
    kv_tokens: int = 0
    journal: list[str] = field(default_factory=list)
    error: str | None = None


def sglang_mem_fraction(gpu_mem_mib: float, tp: int) -> float:
    """SGLang's default ``mem_fraction_static`` (server_args.py ``_handle_gpu_memory_settings``)."""
    if gpu_mem_mib < 35 * 1024:
        reserved = (2.8 + tp / 10) * 1024
    elif gpu_mem_mib < 90 * 1024:
        reserved = (9.5 + tp / 2) * 1024
    elif gpu_mem_mib < 160 * 1024:
        reserved = (12 + tp / 2) * 1024
    else:
        reserved = 32 * 1024
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def kv_dtype_bytes(argv: list[str], fp: Footprint) -> int:
    """Bytes per KV element: ``--kv-cache-dtype`` fp8* is 1, ``auto`` is the model's dtype."""
    value = (_flag(argv, ("--kv-cache-dtype",)) or "auto").lower()
    return 1 if value.startswith("fp8") else fp.dtype_bytes


def per_token_bytes(argv: list[str], fp: Footprint, tp: int) -> int:
    """KV bytes one token takes on one GPU (both engines: ``max(1, kv_heads // tp)`` heads each)."""
    return max(1, fp.kv_heads // tp) * fp.head_dim * fp.layers * 2 * kv_dtype_bytes(argv, fp)


def _fraction(argv: list[str], flavor: str, total_mib: int, tp: int) -> float:
    """The engine's memory fraction; ValueError (argparse's words) for one that is no number."""
    name = "--mem-fraction-static" if flavor == "sglang" else "--gpu-memory-utilization"
    raw = _flag(argv, (name,))
    if raw is not None:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"error: argument {name}: invalid float value: '{raw}'") from None
    return sglang_mem_fraction(total_mib, tp) if flavor == "sglang" else 0.9


def _size(mib: float) -> str:
    """A size as torch's ``format_size`` prints it (MiB below 1 GiB, else GiB)."""
    return f"{mib:.2f} MiB" if mib < 1024 else f"{mib / 1024:.2f} GiB"


def _oom(rank: int, total_mib: int, avail_mib: float, layer_mib: float) -> str:
    """torch's message when the weights, loaded one layer at a time, outgrow GPU ``rank``
    (c10/cuda/CUDACachingAllocator.cpp ``OutOfMemoryError``)."""
    free = avail_mib - layer_mib * int(avail_mib // layer_mib)
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {_size(layer_mib)}. GPU {rank} has a "
        f"total capacity of {_size(total_mib)} of which {_size(free)} is free. Including non-PyTorch memory, "
        f"this process has {_size(total_mib - free)} memory in use. If reserved but unallocated memory is "
        "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


def start(argv: list[str], totals_mib: list[int], fp: Footprint) -> Load:
    """Load model ``fp`` with server command ``argv`` on GPUs of ``totals_mib`` (one per rank)."""
    flavor = service_flavor(argv) or "sglang"
    tp = max(len(totals_mib), 1)
    load = Load()
    weights_mib = fp.weight_bytes / tp / MIB
    per_token = per_token_bytes(argv, fp, tp)
    tokens: list[int] = []
    for rank, total in enumerate(totals_mib):
        avail = total - CUDA_CONTEXT_MIB
        try:
            frac = _fraction(argv, flavor, total, tp)
        except ValueError as e:
            return _failed(load, str(e))
        if rank == 0 and flavor == "sglang":
            load.journal.append(f"Load weight begin. avail mem={avail / 1024:.2f} GB")
        if weights_mib > avail:
            return _failed(load, _oom(rank, total, avail, weights_mib / max(fp.layers, 1)))
        if flavor == "sglang":
            rest_mib = avail * frac - weights_mib
            if rest_mib <= 0:
                # the pool's check (model_runner_kv_cache_mixin.py MemoryPoolConfig.__post_init__)
                return _failed(
                    load,
                    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                    f"Current value: mem_fraction_static={frac}",
                )
            tokens.append(int(rest_mib * MIB // per_token))
            used = total - avail * (1 - frac)
        else:
            kv_mib = total * frac - (weights_mib + CUDA_CONTEXT_MIB + VLLM_ACTIVATION_MIB)
            error = _vllm_check(kv_mib, per_token, fp, argv)
            if error:
                return _failed(load, error)
            page = 2 * VLLM_BLOCK * max(1, fp.kv_heads // tp) * fp.head_dim * kv_dtype_bytes(argv, fp)
            tokens.append(int(kv_mib * MIB // (page * fp.layers)) * VLLM_BLOCK)
            used = total * frac
        load.used_mib.append(round(used + SEED_RESIDUE_MIB[rank % len(SEED_RESIDUE_MIB)]))
    load.kv_tokens = min(tokens) if tokens else 0
    load.journal += _loaded_lines(flavor, fp, weights_mib, totals_mib[0], load.kv_tokens, per_token)
    return load


def _loaded_lines(
    flavor: str, fp: Footprint, weights_mib: float, total: int, tokens: int, per_token: int
) -> list[str]:
    """What the engine logs once the model and the KV cache are in (SGLang's model_runner.py,
    vLLM's gpu_model_runner.py ``load_model`` and kv_cache_utils.py ``_report_kv_cache_config``)."""
    kv_gib = tokens * per_token / GIB
    if flavor == "sglang":
        return [
            f"Load weight end. type={fp.architecture}, avail mem={(total - CUDA_CONTEXT_MIB - weights_mib) / 1024:.2f}"
            f" GB, mem usage={weights_mib / 1024:.2f} GB.",
            f"KV Cache is allocated. #tokens: {tokens}, KV size: {kv_gib:.2f} GB",
            f"max_total_num_tokens={tokens}",
        ]
    return [
        f"Model loading took {weights_mib / 1024:.4f} GiB",
        f"Available KV cache memory: {kv_gib:.2f} GiB",
        f"GPU KV cache size: {tokens:,} tokens",
    ]


def _vllm_check(kv_mib: float, per_token: int, fp: Footprint, argv: list[str]) -> str | None:
    """vLLM's refusals of a KV cache (kv_cache_utils.py ``check_enough_kv_cache_memory``)."""
    if kv_mib <= 0:
        return (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    raw = _flag(argv, ("--max-model-len",))
    max_len = int(raw) if raw and raw.isdigit() else fp.max_model_len
    needed = max_len * per_token
    if needed > kv_mib * MIB:
        return (
            f"ValueError: To serve at least one request with the models's max seq len ({max_len}), "
            f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({kv_mib / 1024:.2f} GiB). Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
    return None


def _failed(load: Load, error: str) -> Load:
    load.error = error
    load.journal += ["Traceback (most recent call last):", error]
    return load


def model_of(argv: list[str]) -> str | None:
    """The model directory a server command names (absolute paths only: a hub id is not a dir)."""
    path = model_path(argv)
    return path if path and path.startswith("/") else None
