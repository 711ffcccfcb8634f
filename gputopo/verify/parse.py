"""The pure parsers verify reads its evidence with, each tested with literal strings: nvidia-smi
rows, ``systemctl show`` properties and the unit's environment, the PCI root complex of a device
path, Proxmox's mapping check and container interfaces, the inference server's port, answer and
KV-cache figures."""

from __future__ import annotations

import re
import shlex
from typing import Any

from gputopo.errors import AddressError, NvsmiParseError
from gputopo.formats.nvsmi import parse_query_gpu
from gputopo.model.facts import normalize_address
from gputopo.model.strict import Strict

QUERY_FIELDS = ["index", "pci.bus_id", "memory.used", "memory.total", "utilization.gpu"]
P2P_VAR = "NCCL_P2P_DISABLE"
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}


# --- nvidia-smi ------------------------------------------------------------------------------


class GpuRow(Strict):
    """One GPU as nvidia-smi shows it inside a container (MiB; None when not reported)."""

    index: int | None
    address: str
    used: int | None
    total: int | None
    utilization: int | None

    @property
    def headroom(self) -> int | None:
        return None if self.used is None or self.total is None else self.total - self.used


def parse_gpu_rows(text: str) -> list[GpuRow]:
    """Rows of ``nvidia-smi --query-gpu=index,pci.bus_id,memory.used,memory.total,utilization.gpu
    --format=csv,noheader[,nounits]`` (with or without units or a header).

    Bus ids are normalised (``00000000:01:00.0`` -> ``0000:01:00.0``). Raises
    :class:`gputopo.errors.NvsmiParseError` for a line of another shape.
    """
    rows = []
    for r in parse_query_gpu(text, QUERY_FIELDS):
        try:
            address = normalize_address(str(r["pci.bus_id"]))
        except AddressError:
            raise NvsmiParseError(str(r["pci.bus_id"]), "pci.bus_id is not a PCI address") from None
        rows.append(
            GpuRow(
                index=r["index"],
                address=address,
                used=_int(r["memory.used"]),
                total=_int(r["memory.total"]),
                utilization=_int(r["utilization.gpu"]),
            )
        )
    return rows


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def memory_spread_pct(used: list[int]) -> float:
    """(max - min) / max of ``used`` in percent; 0 for fewer than two values or all zero."""
    if len(used) < 2 or max(used) <= 0:
        return 0.0
    return (max(used) - min(used)) / max(used) * 100


# --- systemd ---------------------------------------------------------------------------------


def parse_environment(value: str) -> dict[str, str]:
    """systemd's ``Environment=`` property (``A=1 "B=two words"``) as a dict.

    Words that are not ``NAME=value`` are skipped; unbalanced quotes fall back to plain
    splitting on blanks.
    """
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    out = {}
    for w in words:
        name, sep, v = w.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            out[name] = v
    return out


def p2p_disabled(environment: dict[str, str], command: str | None) -> bool:
    """True when NCCL peer-to-peer is disabled: ``NCCL_P2P_DISABLE`` set to 1 in the unit's
    environment or as an ``env NCCL_P2P_DISABLE=1`` word in its command."""
    if environment.get(P2P_VAR, "").strip() == "1":
        return True
    words = (command or "").split()
    return f"{P2P_VAR}=1" in words


# --- sysfs and Proxmox -----------------------------------------------------------------------


def parse_root_complex(device_path: str) -> str | None:
    """The PCI root complex (host bridge domain:bus, ``0000:60``) of a resolved sysfs device path
    such as ``.../sys/devices/pci0000:60/0000:60:01.1/0000:61:00.0``; None when it has none."""
    m = re.search(r"/devices/pci([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2})(?:/|$)", device_path)
    return f"{m.group(1).lower()}:{m.group(2).lower()}" if m else None


def mapping_checks(items: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Mapping id -> its ``checks`` (``{severity, message}``) from ``GET /cluster/mapping/pci``
    with ``check-node``; messages stripped to one line."""
    out: dict[str, list[dict[str, str]]] = {}
    for m in items:
        checks = []
        for c in m.get("checks") or []:
            checks.append(
                {
                    "severity": str(c.get("severity", "error")),
                    "message": " ".join(str(c.get("message", "")).split()),
                }
            )
        out[str(m.get("id"))] = checks
    return out


def container_address(interfaces: list[dict[str, Any]]) -> str | None:
    """The first IPv4 address of a container's non-loopback interface, from Proxmox's
    ``GET .../lxc/{vmid}/interfaces`` (``inet`` is ``10.0.0.5/24``); None when it has none."""
    for itf in interfaces or []:
        if itf.get("name") == "lo":
            continue
        inet = str(itf.get("inet") or "")
        if inet:
            return inet.split("/", 1)[0]
    return None


# --- the inference server --------------------------------------------------------------------


def server_flavor(command: str | None) -> str | None:
    """``sglang`` or ``vllm`` by the service's command line; None when it names neither."""
    if not command:
        return None
    if "sglang" in command:
        return "sglang"
    if "vllm" in command:
        return "vllm"
    return None


def service_port(command: str | None) -> int | None:
    """The port the inference server listens on: its ``--port N`` (or ``--port=N``), else the
    server's default (SGLang 30000, vLLM 8000); None for an unknown server without the flag."""
    if command:
        m = re.search(r"(?:^|\s)--port(?:=|\s+)(\d+)(?:\s|$)", command)
        if m:
            return int(m.group(1))
    return DEFAULT_PORTS.get(server_flavor(command) or "")


def base_url(url: str) -> str:
    """The scheme and host part of ``url`` (``http://10.0.0.5:30000/health`` ->
    ``http://10.0.0.5:30000``); anything else without its trailing slashes."""
    m = re.match(r"^(https?://[^/]+)", url.strip())
    return m.group(1) if m else url.strip().rstrip("/")


def answer_matches(content: str, expect: str) -> bool:
    """True when ``expect`` occurs in ``content`` as a whole word or number (``91`` in
    ``The answer is 91.``, not in ``191`` or ``91.5``), ignoring case."""
    # a full stop ends a sentence but not a number: "91." matches, "91.5" and "0.91" do not
    pattern = r"(?<![0-9A-Za-z])(?<![0-9]\.)" + re.escape(expect.strip()) + r"(?![0-9A-Za-z])(?!\.[0-9])"
    return re.search(pattern, content, re.IGNORECASE) is not None


def parse_sglang_kv_tokens(info: Any) -> int | None:
    """``max_total_num_tokens`` from SGLang's ``/get_server_info`` JSON (top level, or under
    ``internal_states``); None when absent or not a positive number."""
    if not isinstance(info, dict):
        return None
    value = info.get("max_total_num_tokens")
    if value is None:
        states = info.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], dict):
            value = states[0].get("max_total_num_tokens")
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


_LABELS_RE = re.compile(r'(\w+)="([^"]*)"')


def parse_vllm_kv_tokens(metrics: str) -> int | None:
    """KV-cache capacity in tokens from vLLM's Prometheus ``/metrics``: ``num_gpu_blocks`` x
    ``block_size`` of the ``vllm:cache_config_info`` labels; None when not there."""
    for line in metrics.splitlines():
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = dict(_LABELS_RE.findall(line[line.index("{") : line.rindex("}") + 1]))
        try:
            blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
        except (KeyError, ValueError):
            return None
        return blocks * size if blocks > 0 and size > 0 else None
    return None
