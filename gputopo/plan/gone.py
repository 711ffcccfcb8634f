"""GPUs that left the PCI bus: listed by a PCI mapping of this node, no longer on the host. Pure.

A GPU that falls off the bus (surprise removal, a dead link) leaves no directory in sysfs, so
the facts hold one GPU fewer and every count-based check would talk about its consequences (a
tensor-parallel size that is no power of two, a mapping one device short). What still names it
is Proxmox's PCI mappings (``path=`` of this node's ``map`` lines); the container that had it
still maps its ``/dev/nvidiaN``, a minor no GPU on the host has now. The planner refuses with one
line per such GPU before anything else is checked.
"""

from __future__ import annotations

from gputopo.formats.devn import dev_path, is_devn_key
from gputopo.formats.mapline import map_fields, map_node, map_paths
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.findings import Findings
from gputopo.plan.spec import Node

NVIDIA_VENDOR = "10de"
NODE_PREFIX = "/dev/nvidia"
FIX = (
    "check the card and its slot, bring it back (echo 1 > /sys/bus/pci/rescan, or a reboot), then plan again"
)


def _present(facts: Facts) -> set[str]:
    """Every PCI address the facts hold: the GPUs, their functions and group members, and the
    other devices read (NVSwitches, network adapters, NVMe)."""
    out = {d.address for d in (*facts.gpus, *facts.nvswitches, *facts.nics, *facts.nvme)}
    for g in facts.gpus:
        out.update(g.functions)
        out.update(m.address for m in g.iommu_members)
    return out


def gone_addresses(facts: Facts, current: CurrentState, node: str) -> dict[str, list[str]]:
    """{address: the mappings listing it} of the NVIDIA devices that node ``node``'s lines of
    the PCI mappings name and the host does not have (any more)."""
    present = _present(facts)
    out: dict[str, list[str]] = {}
    for mid, m in sorted(current.mappings.items()):
        for entry in m.map:
            if map_node(entry) not in (node, None):
                continue
            if not map_fields(entry).get("id", "").lower().startswith(NVIDIA_VENDOR + ":"):
                continue
            for path in map_paths(entry):
                if path not in present and mid not in out.setdefault(path, []):
                    out[path].append(mid)
    return out


def orphan_nodes(facts: Facts, current: CurrentState, spec_node: Node) -> dict[int, list[str]]:
    """{vmid: its /dev/nvidiaN of no GPU} for the spec's containers: device nodes whose minor no
    GPU on the host has (empty when the nvidia driver tells no GPU's minor)."""
    minors = {g.minor for g in facts.gpus if g.minor is not None}
    if not minors:
        return {}
    out: dict[int, list[str]] = {}
    for c in spec_node.containers:
        state = current.containers.get(c.vmid)
        config = state.config if state is not None else {}
        for key, value in config.items():
            path = dev_path(str(value)) if is_devn_key(key) else ""
            tail = path[len(NODE_PREFIX) :] if path.startswith(NODE_PREFIX) else ""
            if tail.isdigit() and int(tail) not in minors:
                out.setdefault(c.vmid, []).append(path)
    return {vmid: sorted(paths) for vmid, paths in out.items()}


def _all_numbered(facts: Facts) -> bool:
    """True when every GPU of the host is on nvidia with the minor its driver gave it: a device
    node of no GPU is then one whose GPU is gone, not one of a GPU on another driver."""
    return bool(facts.gpus) and all(g.driver == "nvidia" and g.minor is not None for g in facts.gpus)


def refuse_gone_gpus(facts: Facts, current: CurrentState, spec_node: Node, found: Findings) -> None:
    """Refuse, one line per GPU, every NVIDIA device a PCI mapping of this node lists that has
    left the bus, naming its address and its owner (the container still mapping a device node
    of no GPU when there is one such container, and the mappings listing it). Where no mapping
    names it and every GPU left is on nvidia with its minor, a container of the spec that maps
    a /dev/nvidiaN of no GPU is refused the same way, by its device node. Raises PlanRefused
    when there is any: every other finding would follow from the missing GPU."""
    gone = gone_addresses(facts, current, spec_node.name)
    orphans = orphan_nodes(facts, current, spec_node)
    for address, mappings in gone.items():
        listed = f"in mapping {', '.join(mappings)}"
        if len(orphans) == 1:
            ((vmid, paths),) = orphans.items()
            whose = f"container {vmid}'s GPU ({', '.join(paths)}, {listed})"
        else:
            whose = f"the GPU {listed}"
        found.refuse(address, f"{whose} left the bus: the host no longer has it; {FIX}", "gpu-left-bus")
    if not gone and _all_numbered(facts):
        # no mapping names it: the device nodes its container still maps are all that is left
        for vmid, paths in orphans.items():
            found.refuse(
                None,
                f"container {vmid}'s GPU ({', '.join(paths)}) left the bus: no GPU on the host has "
                f"{'that minor' if len(paths) == 1 else 'those minors'} any more; {FIX}",
                "gpu-left-bus",
            )
    found.raise_if_refused()
