"""Pure parsers for ``nvidia-smi`` output (no I/O: callers run the command and hand over text).

* :func:`parse_query_gpu` -- ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]``
* :func:`parse_list_gpus` -- ``nvidia-smi -L``
* :func:`parse_nvidia_smi_q` -- the essentials of ``nvidia-smi -q``
* :func:`normalize_bus_id` -- NVML's ``00000000:2A:00.0`` to ``0000:2a:00.0``

The CSV form separates values with ``", "``; with units a memory value reads ``79043 MiB`` and a
utilisation ``0 %``; ``nounits`` drops the unit from values but the header keeps it in brackets
(``memory.used [MiB]``). Values nvidia-smi cannot give read ``[N/A]`` or ``[Not Supported]``.
"""

from __future__ import annotations

import re

from gputopo.errors import AddressError, NvsmiParseError
from gputopo.model.facts import normalize_address

# nvidia-smi accepts aliases in --query-gpu and prints the canonical name in the header.
ALIASES: dict[str, str] = {
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
    "gpu_uuid": "uuid",
    "gpu_serial": "serial",
}

# Units nvidia-smi attaches to each field, for the header (``[MiB]``) and the values.
UNITS: dict[str, str] = {
    "memory.used": "MiB",
    "memory.total": "MiB",
    "memory.free": "MiB",
    "memory.reserved": "MiB",
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "fan.speed": "%",
    "power.draw": "W",
    "power.limit": "W",
    "clocks.sm": "MHz",
    "clocks.mem": "MHz",
    "clocks.gr": "MHz",
}

_INT_FIELDS = {
    "index",
    "minor_number",
    "count",
    "temperature.gpu",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
}
_MISSING = {
    "[N/A]",
    "[Not Supported]",
    "N/A",
    "[Unknown Error]",
    "[Insufficient Permissions]",
    "[GPU requires reset]",
    "[GPU is lost]",
}
_NUMBER_RE = re.compile(r"^(-?\d+(?:\.\d+)?)(?:\s*(MiB|%|W|MHz|C))?$")


def canonical_field(field: str) -> str:
    """The name nvidia-smi prints in the CSV header for a --query-gpu field (aliases resolved)."""
    f = field.strip()
    return ALIASES.get(f, f)


def header_cell(field: str) -> str:
    """The header cell for ``field``: ``memory.used [MiB]``, ``index``, ``name``."""
    name = canonical_field(field)
    unit = UNITS.get(name)
    return f"{name} [{unit}]" if unit else name


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:01:00.0`` (NVML form) -> ``0000:01:00.0``.

    Raises :class:`gputopo.errors.AddressError` when ``bus_id`` is not a PCI address.
    """
    return normalize_address(bus_id)


def _is_numeric_field(name: str) -> bool:
    return name in _INT_FIELDS or name in UNITS or name.startswith(("memory.", "utilization."))


def _value(name: str, raw: str, line: str) -> object:
    text = raw.strip()
    if text in _MISSING:
        return None
    if not _is_numeric_field(name):
        return text
    m = _NUMBER_RE.match(text)
    if not m:
        raise NvsmiParseError(line, f"{name} is not a number")
    number = m.group(1)
    return float(number) if "." in number else int(number)


def parse_query_gpu(text: str, fields: list[str]) -> list[dict]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`` output.

    Returns one dict per GPU line, keyed by the names in ``fields`` as given. Numeric fields
    (index, minor_number, memory.*, utilization.*, ...) become int (float when they carry a
    decimal point), with or without units; ``[N/A]``/``[Not Supported]`` become None; every
    other field stays text as printed (``pci.bus_id`` keeps NVML's form: see
    :func:`normalize_bus_id`). A header line, when present, must name the same fields.

    Raises :class:`NvsmiParseError` for a line with the wrong number of values, a header that
    names other fields, or a numeric field that is not a number.
    """
    names = [canonical_field(f) for f in fields]
    rows: list[dict] = []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.split(", ")]
        if i == 0 and cells and re.sub(r"\s*\[[^\]]*\]$", "", cells[0]) == names[0] and names[0] != "":
            got = [re.sub(r"\s*\[[^\]]*\]$", "", c) for c in cells]
            if got != names:
                raise NvsmiParseError(line, f"header names {got}, expected {names}")
            continue
        if len(cells) != len(names):
            raise NvsmiParseError(line, f"{len(cells)} values for {len(names)} fields")
        rows.append({f: _value(n, c, line) for f, n, c in zip(fields, names, cells)})
    return rows


_LIST_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)$")


def parse_list_gpus(text: str) -> list[dict]:
    """Parse ``nvidia-smi -L``: ``GPU 0: NVIDIA A40 (UUID: GPU-...)`` lines.

    Returns ``[{"index": 0, "name": "NVIDIA A40", "uuid": "GPU-..."}, ...]``; indented MIG
    device lines are skipped. Raises :class:`NvsmiParseError` for any other line.
    """
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith((" ", "\t")):
            continue
        m = _LIST_RE.match(line.rstrip())
        if not m:
            raise NvsmiParseError(line, "not a 'GPU <n>: <name> (UUID: ...)' line")
        out.append({"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3)})
    return out


_KV_RE = re.compile(r"^(?P<indent> *)(?P<key>\S.*?)\s*:\s(?P<value>.*)$")
_SECTION_RE = re.compile(r"^(?P<indent> *)(?P<key>\S.*?)\s*$")
_MIB_RE = re.compile(r"^(\d+) MiB$")


def _mib(value: str | None) -> int | None:
    if value is None:
        return None
    m = _MIB_RE.match(value.strip())
    return int(m.group(1)) if m else None


def parse_nvidia_smi_q(text: str) -> list[dict]:
    """Parse the essentials of ``nvidia-smi -q`` per GPU, in the order printed.

    Returns dicts with ``address`` (normalised, from the ``GPU 00000000:18:00.0`` heading),
    ``bus_id`` (as printed under PCI), ``name`` (Product Name), ``uuid``, ``minor`` (int, None
    when ``N/A``), and ``memory_total``/``memory_used``/``memory_free`` in MiB from "FB Memory
    Usage" (None when not a ``<n> MiB`` value).

    Raises :class:`NvsmiParseError` when the heading's address is not a PCI address.
    """
    gpus: list[dict] = []
    cur: dict | None = None
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("GPU "):
            try:
                address = normalize_address(line[4:].strip())
            except AddressError:
                raise NvsmiParseError(line, "GPU heading without a PCI address") from None
            cur = {
                "address": address,
                "bus_id": None,
                "name": None,
                "uuid": None,
                "minor": None,
                "memory_total": None,
                "memory_used": None,
                "memory_free": None,
            }
            gpus.append(cur)
            stack = []
            continue
        if cur is None:
            continue
        m = _KV_RE.match(line)
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not m:
            s = _SECTION_RE.match(line)
            if s:
                stack.append((indent, s.group("key")))
            continue
        key, value = m.group("key"), m.group("value").strip()
        section = stack[-1][1] if stack else None
        if section is None:
            if key == "Product Name":
                cur["name"] = value
            elif key == "GPU UUID":
                cur["uuid"] = value
            elif key == "Minor Number":
                cur["minor"] = int(value) if value.isdigit() else None
        elif section == "PCI" and key == "Bus Id":
            cur["bus_id"] = value
        elif section == "FB Memory Usage" and key in ("Total", "Used", "Free"):
            cur[f"memory_{key.lower()}"] = _mib(value)
    return gpus
