"""``nvidia-smi`` in a simulated container: ``--query-gpu`` CSV and ``-L``.

Its messages and exit codes are those of the real tool (9: no driver, 6: no devices, 2: bad
arguments); the fields and units come from :mod:`gputopo.formats.nvsmi`.
"""

from __future__ import annotations

from gputopo.facts.host import parse_nvidia_version
from gputopo.formats.nvsmi import UNITS, canonical_field, header_cell
from gputopo.ports import ExecResult
from gputopo.sim.container.faults import faults_of
from gputopo.sim.container.lifecycle import Container
from gputopo.sim.container.paths import read_text
from gputopo.sim.container.shell import result

NVSMI_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
NVSMI_NO_DEVICES = "No devices were found\n"
QUERY_FIELDS = (
    "index",
    "pci.bus_id",
    "name",
    "memory.used",
    "memory.total",
    "memory.free",
    "utilization.gpu",
    "uuid",
    "minor_number",
    "driver_version",
    "count",
)


def nvidia_smi(ct: Container, args: list[str]) -> ExecResult:
    """Run ``nvidia-smi ARGS`` in container ``ct``."""
    fault = faults_of(ct.sim_dir, ct.vmid).get("nvidia_smi_fails")
    if fault is not None:
        return result(int(fault.get("rc", 9)), fault.get("message", NVSMI_NO_DRIVER))
    if not ct.has_control():
        return result(9, NVSMI_NO_DRIVER)
    gpus = ct.gpus()
    if not gpus:
        return result(6, NVSMI_NO_DEVICES)
    used = ct.gpu_memory_used()
    driver = parse_nvidia_version(read_text(ct.paths.root / "proc/driver/nvidia/version")) or "[N/A]"
    rows = [
        {
            "index": idx,
            "pci.bus_id": g.nvml_bus_id,
            "name": g.name,
            "memory.used": used[g.address],
            "memory.total": g.memory_total,
            "memory.free": g.memory_total - used[g.address],
            "utilization.gpu": 0,
            "uuid": g.uuid,
            "minor_number": g.minor,
            "driver_version": driver,
            "count": len(gpus),
        }
        for idx, g in enumerate(gpus)
    ]
    return answer(args, rows)


def answer(args: list[str], rows: list[dict]) -> ExecResult:
    """What ``nvidia-smi ARGS`` prints for GPUs whose values are ``rows`` (``-L``, or
    ``--query-gpu=... --format=csv[,noheader][,nounits]``); rc 2 for arguments it refuses."""
    if args in (["-L"], ["--list-gpus"]):
        return result(0, "".join(f"GPU {i}: {r['name']} (UUID: {r['uuid']})\n" for i, r in enumerate(rows)))
    query = fmt = None
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--query-gpu="):
            query = a.split("=", 1)[1]
        elif a == "--query-gpu" and i + 1 < len(args):
            i += 1
            query = args[i]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format" and i + 1 < len(args):
            i += 1
            fmt = args[i]
        else:
            return result(2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
        i += 1
    if query is None:
        return result(2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
    opts = (fmt or "").split(",")
    if not fmt or opts[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in opts):
        return result(2, f"\"{fmt}\" is not a valid format. Please run 'nvidia-smi -h' for help.\n")
    fields = [f.strip() for f in query.split(",")]
    for f in fields:
        if canonical_field(f) not in QUERY_FIELDS:
            return result(2, f'Field "{f}" is not a valid field to query.\n\n')
    units = "nounits" not in opts
    lines = [] if "noheader" in opts else [", ".join(header_cell(f) for f in fields)]
    for values in rows:
        cells = []
        for f in fields:
            name = canonical_field(f)
            v = values[name]
            unit = UNITS.get(name)
            cells.append(f"{v} {unit}" if unit and units else str(v))
        lines.append(", ".join(cells))
    return result(0, "".join(line + "\n" for line in lines))
