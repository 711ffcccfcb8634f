"""The simulated container's model directory, and a service that loads by the model's footprint.

Figures from real sources: the model card's (Qwen3-235B-A22B-FP8: 235B parameters, 234B without
the embeddings; 94 layers, 64 Q and 4 KV heads, 128 experts), the seed host's log (78,193-79,043
of 97,887 MiB used per GPU at tp 4, 18-20 GiB judged left for the KV cache), SGLang's default
``mem_fraction_static`` table (server_args.py). Derived: the checkpoint's bytes (its headers are
synthesized from the config) and the KV tokens (the engines' formulas, written out below with
their numbers).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gputopo.sim.container import SimExec, break_container, write_unit
from gputopo.sim.container.footprint import read_footprint, sglang_mem_fraction
from gputopo.sim.container.lifecycle import Container
from gputopo.sim.container.modelfiles import MODELS, MODELS_DATA, SEED_MODEL_PATH, SMALL_MODEL
from gputopo.sim.host import SimHost
from gputopo.sim.seed import SERVICE_COMMANDS
from helpers.applysim import host, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # builds and copies simulated hosts

REPO = Path(__file__).resolve().parents[2]
MIB, GIB = 1 << 20, 1 << 30
CHECKPOINT_BYTES = 236_445_455_360  # the synthesized shards' tensor bytes (index metadata.total_size)


def _headers(model_dir: Path) -> dict[str, dict]:
    """Every tensor of the safetensors shards in ``model_dir``, read by the file layout."""
    tensors = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        with open(shard, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        end = max(t["data_offsets"][1] for t in header.values())
        assert shard.stat().st_size == 8 + n + end, shard
        tensors.update(header)
    return tensors


def _used(sx: SimExec) -> list[int]:
    r = sx.run(101, ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=5)
    return [int(x) for x in r.stdout.split()]


def _serve(host_: SimHost, command: str, unit: str = "sglang.service") -> tuple[SimExec, int]:
    """Run the container's service as ``command``; (the exec port, systemctl's exit status)."""
    sx = host_.ports().exec
    write_unit(host_.dir, 101, unit, f"[Service]\nExecStart={command}\n")
    assert sx.run(101, ["systemctl", "daemon-reload"], timeout=5).rc == 0
    return sx, sx.run(101, ["systemctl", "restart", unit], timeout=5).rc


def test_the_shipped_configs_are_the_fixtures_and_say_what_the_model_card_says():
    for name in MODELS:
        shipped = (MODELS_DATA / f"{name}.config.json").read_text()
        assert shipped == (REPO / f"fixtures/real/models/{name}/config.json").read_text()
        assert name in (REPO / "fixtures/real/SOURCES.md").read_text()
    cfg = json.loads((MODELS_DATA / "Qwen3-235B-A22B-FP8.config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (94, 64, 4)
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["max_position_embeddings"]) == (128, 8, 40960)
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]


def test_the_container_serves_a_model_whose_headers_give_the_published_parameter_counts(host):
    d = host.paths.rootfs(101) / SEED_MODEL_PATH.lstrip("/")
    assert (d / "config.json").is_file() and not (d / "config.json").is_symlink()
    tensors = _headers(d)
    params = sum(_prod(t["shape"]) for n, t in tensors.items() if not n.endswith("weight_scale_inv"))
    embeddings = sum(_prod(tensors[n]["shape"]) for n in ("model.embed_tokens.weight", "lm_head.weight"))
    assert abs(params - 235e9) / 235e9 < 0.01  # model card: 235B
    assert abs(params - embeddings - 234e9) / 234e9 < 0.01  # model card: 234B non-embedding
    layer = {n.split(".", 3)[3] for n in tensors if n.startswith("model.layers.7.")}
    assert {"self_attn.q_proj.weight", "self_attn.k_norm.weight", "mlp.gate.weight"} <= layer
    assert "mlp.experts.127.down_proj.weight_scale_inv" in layer
    assert tensors["model.layers.0.self_attn.q_proj.weight"] == {
        "dtype": "F8_E4M3",
        "shape": [8192, 4096],
        "data_offsets": tensors["model.layers.0.self_attn.q_proj.weight"]["data_offsets"],
    }
    assert tensors["model.layers.0.self_attn.q_proj.weight_scale_inv"]["shape"] == [64, 32]
    index = json.loads((d / "model.safetensors.index.json").read_text())
    data = sum(t["data_offsets"][1] - t["data_offsets"][0] for t in tensors.values())
    assert index["metadata"]["total_size"] == data == CHECKPOINT_BYTES
    assert set(index["weight_map"]) == set(tensors)


def _disk_bytes(top: Path) -> int:
    """Bytes the files under ``top`` take on disk (links are not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for f in files:
            total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def test_the_model_takes_no_disk_and_copies_of_a_host_stay_small(host, tmp_path):
    d = host.paths.rootfs(101) / SEED_MODEL_PATH.lstrip("/")
    shards = sorted(d.glob("*.safetensors"))
    assert len(shards) == 48
    for s in shards:
        assert os.stat(s).st_blocks * 512 < 4 * MIB < s.stat().st_size  # a hole, not data
    for copy in (tmp_path / "tree", tmp_path / "cp"):
        if copy.name == "tree":
            shutil.copytree(host.dir, copy, symlinks=True)
        else:
            subprocess.run(["cp", "-a", str(host.dir), str(copy)], check=True)
        assert _disk_bytes(copy) < 200 * MIB
        fp = read_footprint(copy / "ct/101/rootfs", SEED_MODEL_PATH)
        assert fp is not None and fp.weight_bytes == CHECKPOINT_BYTES


def test_at_tp4_sglang_shows_the_seed_logs_memory_and_the_engines_kv_tokens(host):
    sx, rc = _serve(host, SERVICE_COMMANDS["sglang"].format(tp=4))
    assert rc == 0
    assert _used(sx) == [79043, 78369, 78369, 78193, 1, 1, 1, 1]  # the seed host's log at tp 4
    svc = Container(host.dir, 101).service("sglang.service")
    # model_runner.py profile_max_num_token: rest = avail * fraction - weights per GPU (after the
    # 500 MiB CUDA context); cell = 1 KV head per GPU * 128 * 94 layers * 2 (K and V) * 2 (bf16)
    rest_mib = (97887 - 500) * 0.79 - CHECKPOINT_BYTES / 4 / MIB
    assert svc["kv_tokens"] == int(rest_mib * MIB // (1 * 128 * 94 * 2 * 2))
    assert 18 <= svc["kv_tokens"] * 48128 / GIB <= 21  # the operator's 18-20 GiB per GPU
    journal = sx.run(101, ["journalctl", "-u", "sglang.service", "--no-pager"], timeout=5).stdout
    assert f"max_total_num_tokens={svc['kv_tokens']}" in journal and "mem usage=55.05 GB" in journal


def test_at_tp2_the_weights_do_not_fit_and_the_start_fails_in_torchs_words(host):
    sx, rc = _serve(host, SERVICE_COMMANDS["sglang"].format(tp=2))
    assert rc == 1
    assert sx.run(101, ["systemctl", "is-active", "sglang.service"], timeout=5).stdout == "failed\n"
    journal = sx.run(101, ["journalctl", "-xeu", "sglang.service"], timeout=5).stdout.splitlines()
    assert journal[-6:-3] == [
        "Started sglang.service.",
        "sglang[210100]: Load weight begin. avail mem=95.10 GB",
        "sglang[210100]: Traceback (most recent call last):",
    ]
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in journal[-3]
    assert "GPU 0 has a total capacity of 95.59 GiB" in journal[-3]
    assert journal[-2:] == [
        "sglang.service: Main process exited, code=exited, status=1/FAILURE",
        "sglang.service: Failed with result 'exit-code'.",
    ]
    assert _used(sx) == [1] * 8 and Container(host.dir, 101).host_pids() == []


def test_a_static_fraction_below_the_weights_is_sglangs_not_enough_memory(host):
    # 0.55 of the 97,387 MiB left after the context is 53,563 MiB: less than 56,373 MiB of weights
    sx, rc = _serve(host, SERVICE_COMMANDS["sglang"].format(tp=4).replace("0.79", "0.55"))
    assert rc == 1
    journal = sx.run(101, ["journalctl", "-u", "sglang.service"], timeout=5).stdout
    assert (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.55\n"
    ) in journal


def test_sglangs_default_fraction_follows_its_server_args_table(host):
    assert sglang_mem_fraction(97887, 4) == 0.854  # (97887 - (12 + 4/2) * 1024) / 97887
    assert sglang_mem_fraction(81559, 2) == 0.868  # (81559 - (9.5 + 2/2) * 1024) / 81559
    sx, rc = _serve(host, SERVICE_COMMANDS["sglang"].format(tp=4).replace(" --mem-fraction-static 0.79", ""))
    assert rc == 0
    # rank 0 holds 1,607 MiB beyond what the engine leaves free: the seed log's 79,043 MiB over
    # 97,887 - 97,387 * (1 - 0.79)
    assert round(97887 - 97387 * 0.21) + 1607 == 79043
    assert _used(sx)[0] == round(97887 - 97387 * (1 - 0.854) + 1607)


def test_vllm_loads_by_its_utilization_and_refuses_a_cache_too_small(host):
    base = SERVICE_COMMANDS["vllm"].format(tp=4)
    sx, rc = _serve(host, base, "vllm.service")
    # vLLM leaves total * (1 - utilization) free: its ranks hold the seed log's residue beyond that
    assert rc == 0 and _used(sx)[:4] == [round(97887 * 0.79 + r) for r in (1607, 933, 933, 757)]
    # gpu_worker.py: kv = total * 0.79 - (weights + context + activations); 16-token blocks
    kv_mib = 97887 * 0.79 - (CHECKPOINT_BYTES / 4 / MIB + 500 + 2048)
    blocks = int(kv_mib * MIB // (2 * 16 * 1 * 128 * 2 * 94))
    assert Container(host.dir, 101).service("vllm.service")["kv_tokens"] == blocks * 16
    journal = sx.run(101, ["journalctl", "-u", "vllm.service"], timeout=5).stdout
    assert f"GPU KV cache size: {blocks * 16:,} tokens" in journal
    sx, rc = _serve(host, base.replace("0.79", "0.6"), "vllm.service")
    journal = sx.run(101, ["journalctl", "-u", "vllm.service"], timeout=5).stdout
    assert rc == 1 and "ValueError: No available memory for the cache blocks." in journal
    sx, rc = _serve(host, base.replace("0.79", "0.62"), "vllm.service")
    journal = sx.run(101, ["journalctl", "-u", "vllm.service"], timeout=5).stdout
    assert (
        rc == 1 and "(40960), (1.84 GiB KV cache is needed, which is larger than the available KV" in journal
    )


def test_the_unbalanced_memory_fault_still_shows_over_a_loaded_model(host):
    sx, rc = _serve(host, SERVICE_COMMANDS["sglang"].format(tp=4))
    break_container(host.dir, 101, "unbalanced_memory", index=2, used_mib=30000)
    assert _used(sx)[:4] == [79043, 78369, 30000, 78193]


def _prod(shape: list[int]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


@pytest.mark.parametrize("service", ["sglang", "vllm"])
def test_a_fresh_host_serves_at_every_gpu_with_the_model_loaded(tmp_path, service):
    h = SimHost.create(tmp_path / "sim", service=service)
    svc = Container(h.dir, 101).service(f"{service}.service")
    assert svc["state"] == "active" and svc["kv_tokens"] > 0 and len(svc["used_mib"]) == 8


def test_the_small_model_has_its_published_size_and_loads_on_two_gpus(tmp_path):
    h = SimHost.create(tmp_path / "sim", model=SMALL_MODEL)
    tensors = _headers(h.paths.rootfs(101) / f"models/{SMALL_MODEL}")
    params = sum(_prod(t["shape"]) for n, t in tensors.items() if not n.endswith("weight_scale_inv"))
    assert abs(params - 30.5e9) / 30.5e9 < 0.01  # model card: 30.5B
    sx, rc = _serve(h, SERVICE_COMMANDS["sglang"].format(tp=2).replace("Qwen3-235B-A22B-FP8", SMALL_MODEL))
    assert rc == 0 and _used(sx)[:3] == [79043, 78369, 1]


def test_a_fraction_that_is_no_number_fails_as_argparse_says(host):
    sx, rc = _serve(host, SERVICE_COMMANDS["sglang"].format(tp=4).replace("0.79", "most"))
    journal = sx.run(101, ["journalctl", "-u", "sglang.service"], timeout=5).stdout
    assert rc == 1 and "error: argument --mem-fraction-static: invalid float value: 'most'\n" in journal


def test_a_host_whose_gpus_cannot_hold_the_seed_model_serves_the_small_one(tmp_path):
    # 4x RTX 6000 Ada (49,140 MiB): 59 GB of FP8 weights per GPU at tp 4 do not fit
    h = SimHost.create(tmp_path / "sim", source="esc8000a")
    svc = Container(h.dir, 101).service("sglang.service")
    assert svc["state"] == "active" and f"/models/{SMALL_MODEL}" in svc["argv"]
    assert (h.paths.rootfs(101) / f"models/{SMALL_MODEL}/config.json").is_file()
    assert not (h.paths.rootfs(101) / SEED_MODEL_PATH.lstrip("/")).exists()
