"""The planner: a pure function of (facts, spec, current state) -> desired state + typed actions.

A plan is data: every action is a pydantic model with a ``kind`` discriminator, a ``phase`` and a
one-line ``describe()``. Apply iterates the actions in order; an empty action list means the host
is converged ("No changes").

Phases, in execution order:

* ``prepare`` -- safe while everything runs: persistence files, PCI mappings, the service drop-in
  (systemd reads it only at the next start);
* ``stop``    -- the service, the container, VMs whose devices change (only what must stop);
* ``switch``  -- one Rebind per IOMMU group; they may run in parallel;
* ``config``  -- the container's device entries (with the digest read at plan time);
* ``start``   -- what was stopped, in reverse.

Decisions recorded here:

* The VM-side ``driver_override`` stays set after binding (``policy.keep_driver_override``), so a
  reprobe, a hot reset or an nvidia module reload cannot hand a VM GPU back to nvidia. Moving a
  GPU back to a container clears it.
* A mapping's ``map`` line names only the GPU function (``path=0000:81:00.0``): Proxmox passes
  the GPU's whole IOMMU group (the audio function included) to the VM anyway, and a line with
  ``path=A;B`` would mean two devices passed together, which Proxmox then checks one by one.
* A GPU whose ``/dev/nvidiaN`` minor is unknown (it is not on nvidia yet) is listed in its
  container's ``UpdateContainer.resolve``: apply reads the minor after the switch phase, once
  nvidia has bound it, and adds the entry in the same stop window (minors do not follow bus
  order and cannot be guessed). In legacy mode it gets its lines in the next plan.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from gputopo.errors import AddressError, PlanRefused, Refusal, SpecError
from gputopo.model.facts import NVIDIA_VENDOR, Facts, Gpu, MemberRole, normalize_address, slot_of
from gputopo.model.state import ContainerState, CurrentState, MappingState, ServiceState
from gputopo.formats.pvefmt import MapEntry, format_dev_value, format_map_entry
from gputopo.plan import placement
from gputopo.plan.render import (
    PERSISTENCE_PATHS,
    dropin_path,
    p2p_must_be_disabled,
    parse_tp,
    render_dropin,
    persistence_files,
)
from gputopo.plan.spec import Container, GpuSelector, Node, Spec, VmMapping, nvidia_gpus, spec_from_split

__all__ = [
    "CurrentState",
    "Plan",
    "plan",
    "expected_after",
    "spec_from_split",
]

VFIO = "vfio-pci"
NVIDIA = "nvidia"
CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvidia-caps/nvidia-cap2",
)
# Character majors of the dynamic nvidia nodes when neither the spec nor the facts give them
# (legacy mode only; devN makes Proxmox stat the node itself). Check /proc/devices on the host.
DEFAULT_LEGACY_MAJORS = {"nvidia-uvm": 511, "nvidia-caps": 510}
DEV_KEY = re.compile(r"^dev(\d+)$")
MAX_DEV_INDEX = 255


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- actions -------------------------------------------------------------------------------

Phase = Literal["prepare", "stop", "switch", "config", "start"]
PHASES: tuple[str, ...] = ("prepare", "stop", "switch", "config", "start")


class WriteHostFile(_M):
    kind: Literal["write_host_file"] = "write_host_file"
    phase: Phase = "prepare"
    path: str
    content: str
    mode: int = 0o644

    def describe(self) -> str:
        return f"write host file /{self.path} ({len(self.content.splitlines())} lines)"


class RemoveHostFile(_M):
    kind: Literal["remove_host_file"] = "remove_host_file"
    phase: Phase = "prepare"
    path: str

    def describe(self) -> str:
        return f"remove host file /{self.path}"


class SetMapping(_M):
    kind: Literal["set_mapping"] = "set_mapping"
    phase: Phase = "prepare"
    id: str
    map: list[str]
    description: str | None = None
    create: bool
    digest: str | None = None

    def describe(self) -> str:
        paths = [_entry_fields(e).get("path", "?") for e in self.map]
        verb = "create" if self.create else "update"
        return f"{verb} PCI mapping {self.id}: {len(self.map)} device(s) {', '.join(paths)}"


class DeleteMapping(_M):
    kind: Literal["delete_mapping"] = "delete_mapping"
    phase: Phase = "prepare"
    id: str
    digest: str | None = None

    def describe(self) -> str:
        return f"delete PCI mapping {self.id}"


class WriteServiceDropin(_M):
    kind: Literal["write_service_dropin"] = "write_service_dropin"
    phase: Phase = "prepare"
    vmid: int
    unit: str
    path: str
    content: str
    tp: int

    def describe(self) -> str:
        return f"CT {self.vmid}: write {self.path} ({self.unit}, tensor parallel {self.tp}; read at next start)"


class StopService(_M):
    kind: Literal["stop_service"] = "stop_service"
    phase: Phase = "stop"
    vmid: int
    unit: str

    def describe(self) -> str:
        return f"CT {self.vmid}: stop {self.unit}"


class StopGuest(_M):
    kind: Literal["stop_guest"] = "stop_guest"
    phase: Phase = "stop"
    guest: Literal["lxc", "qemu"]
    vmid: int

    def describe(self) -> str:
        return f"stop {_guest_name(self.guest, self.vmid)}"


class Rebind(_M):
    """Move one IOMMU group's devices to ``to_driver``.

    To vfio-pci every member goes to vfio-pci (``driver_override`` per address). To nvidia the
    GPU goes to nvidia and the other functions back to their default drivers (override cleared).
    """

    kind: Literal["rebind"] = "rebind"
    phase: Phase = "switch"
    address: str
    members: list[str]
    from_drivers: dict[str, str | None]
    to_driver: Literal["nvidia", "vfio-pci"]
    keep_override: bool = True

    def describe(self) -> str:
        before = sorted({d or "none" for d in self.from_drivers.values()})
        extra = [m for m in self.members if m != self.address]
        with_ = f" with {', '.join(extra)}" if extra else ""
        keep = " (override kept)" if self.to_driver == VFIO and self.keep_override else ""
        if before == [self.to_driver]:
            # already on the driver: only driver_override changes
            what = "set" if self.to_driver == VFIO and self.keep_override else "clear"
            return f"{what} driver_override on {self.address}{with_} (stays on {self.to_driver})"
        return f"rebind {self.address}{with_}: {'/'.join(before)} -> {self.to_driver}{keep}"


class UpdateContainer(_M):
    kind: Literal["update_container"] = "update_container"
    phase: Phase = "config"
    vmid: int
    set: dict[str, str] = Field(default_factory=dict)
    delete: list[str] = Field(default_factory=list)
    digest: str | None = None
    lxc_add: list[list[str]] = Field(default_factory=list, description="raw lxc.* lines to add (legacy)")
    lxc_remove: list[list[str]] = Field(default_factory=list, description="raw lxc.* lines to remove")
    resolve: list[str] = Field(
        default_factory=list,
        description="GPUs coming back to nvidia whose /dev/nvidiaN entries apply adds after the switch "
        "phase: their minors exist only once nvidia has bound them",
    )
    dev_gid: int | None = Field(None, description="gid option of the resolved entries")
    dev_mode: str | None = Field(None, description="mode option of the resolved entries")

    def describe(self) -> str:
        parts = []
        if self.set:
            parts.append("set " + " ".join(f"{k}={v.split(',')[0]}" for k, v in _by_dev_index(self.set)))
        if self.delete:
            parts.append("delete " + ",".join(sorted(self.delete, key=dev_sort)))
        if self.resolve:
            parts.append(f"add /dev/nvidia of {', '.join(self.resolve)} once nvidia has bound them")
        if self.lxc_add:
            parts.append(f"add {len(self.lxc_add)} lxc line(s)")
        if self.lxc_remove:
            parts.append(f"remove {len(self.lxc_remove)} lxc line(s)")
        return f"CT {self.vmid}: " + "; ".join(parts)


class StartGuest(_M):
    kind: Literal["start_guest"] = "start_guest"
    phase: Phase = "start"
    guest: Literal["lxc", "qemu"]
    vmid: int

    def describe(self) -> str:
        return f"start {_guest_name(self.guest, self.vmid)}"


class StartService(_M):
    kind: Literal["start_service"] = "start_service"
    phase: Phase = "start"
    vmid: int
    unit: str

    def describe(self) -> str:
        return f"CT {self.vmid}: start {self.unit} (after systemctl daemon-reload)"


Action = Annotated[
    Union[
        WriteHostFile,
        RemoveHostFile,
        SetMapping,
        DeleteMapping,
        WriteServiceDropin,
        StopService,
        StopGuest,
        Rebind,
        UpdateContainer,
        StartGuest,
        StartService,
    ],
    Field(discriminator="kind"),
]


# --- target ---------------------------------------------------------------------------------


class GpuTarget(_M):
    address: str
    owner: str = Field(description="container:<vmid> | vm:<mapping> | host (left untouched)")
    driver: Literal["nvidia", "vfio-pci"] | None = Field(description="Target driver; null = untouched")
    current_driver: str | None
    companions: list[str] = Field(default_factory=list)
    numa_node: int | None = None
    minor: int | None = None
    iommu_group: int | None = None


class ServiceTarget(_M):
    unit: str
    tp_flag: str
    tp: int
    dropin: str
    command: str | None = Field(None, description="Base command; null when unknown (drop-in not managed)")
    current_tp: int | None = None


class ContainerTarget(_M):
    vmid: int
    gpus: list[str]
    device_mode: Literal["devN", "legacy"]
    devices: dict[str, str] = Field(description="Every devN entry the config will have")
    lxc: list[list[str]] = Field(default_factory=list, description="gputopo's raw lxc.* lines (legacy)")
    mapping: str | None = None
    service: ServiceTarget | None = None


class MappingTarget(_M):
    map: list[str]
    description: str | None = None


class Plan(_M):
    node: str
    target: list[GpuTarget]
    containers: list[ContainerTarget] = Field(default_factory=list)
    mappings: dict[str, MappingTarget] = Field(default_factory=dict, description="Mappings the spec manages")
    kept_mappings: dict[str, MappingTarget] = Field(default_factory=dict, description="Other mappings, untouched")
    p2p_disable: bool = False
    keep_override: bool = True
    warnings: list[str] = Field(default_factory=list)
    actions: list[Action] = Field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.actions

    def vfio_addresses(self) -> list[str]:
        """Every address that the target puts on vfio-pci (VM GPUs and their companions)."""
        out: set[str] = set()
        for t in self.target:
            if t.driver == VFIO:
                out.add(t.address)
                out.update(t.companions)
        return sorted(out)

    def to_text(self) -> str:
        """The plan for humans: target table, warnings, numbered actions or 'No changes'."""
        lines = [f"Node {self.node}"]
        lines.append(f"{'GPU':<14} {'NUMA':<5} {'MINOR':<6} {'GROUP':<6} {'DRIVER':<22} OWNER")
        for t in self.target:
            drv = t.current_driver or "none"
            if t.driver and t.driver != t.current_driver:
                drv = f"{drv} -> {t.driver}"
            comp = f" (+{', '.join(t.companions)})" if t.companions else ""
            lines.append(
                f"{t.address:<14} {_dash(t.numa_node):<5} {_dash(t.minor):<6} {_dash(t.iommu_group):<6} "
                f"{drv:<22} {t.owner}{comp}"
            )
        for ct in self.containers:
            svc = ""
            if ct.service is not None:
                was = f" (now {ct.service.current_tp})" if ct.service.current_tp not in (None, ct.service.tp) else ""
                svc = f", {ct.service.unit} tp {ct.service.tp}{was}"
            lines.append(f"Container {ct.vmid}: {len(ct.gpus)} GPU(s), tp {len(ct.gpus)}, {ct.device_mode}{svc}")
        for mid, m in sorted(self.mappings.items()):
            lines.append(f"Mapping {mid}: {len(m.map)} device(s)")
        if self.warnings:
            lines.append("Warnings:")
            lines += [f"  - {w}" for w in self.warnings]
        if not self.actions:
            lines.append("No changes")
        else:
            lines.append("Actions:")
            for i, a in enumerate(self.actions, 1):
                lines.append(f"  {i:>2}. [{a.phase}] {a.describe()}")
        return "\n".join(lines) + "\n"


def _guest_name(guest: str, vmid: int) -> str:
    return f"{'CT' if guest == 'lxc' else 'VM'} {vmid}"


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def dev_sort(key: str) -> int:
    """Sort key of a config key: N for ``devN``, after every devN for anything else."""
    m = DEV_KEY.match(key)
    return int(m.group(1)) if m else 10_000


def _by_dev_index(d: dict[str, str]) -> list[tuple[str, str]]:
    return sorted(d.items(), key=lambda kv: dev_sort(kv[0]))


# --- map entries -----------------------------------------------------------------------------


def _entry_fields(entry: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in entry.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def normalize_map_entry(entry: str) -> str:
    """A map entry in Proxmox's canonical form: keys sorted, hex lowercase."""
    fields = _entry_fields(entry)
    for k in ("id", "subsystem-id", "path"):
        if k in fields:
            fields[k] = fields[k].lower()
    return ",".join(f"{k}={v}" for k, v in sorted(fields.items()))


def map_entry(gpu: Gpu, node: str) -> str:
    """``id=vvvv:dddd,iommugroup=N,node=<node>,path=<addr>,subsystem-id=vvvv:dddd`` for a GPU.

    Raises PveFormatError when the GPU's ids cannot form a valid entry.
    """
    subsystem = None
    if gpu.subsystem_vendor and gpu.subsystem_device:
        subsystem = f"{_hex(gpu.subsystem_vendor)}:{_hex(gpu.subsystem_device)}"
    return format_map_entry(
        MapEntry(
            id=f"{_hex(gpu.vendor)}:{_hex(gpu.device)}",
            node=node,
            path=gpu.address,
            iommugroup=gpu.iommu_group,
            subsystem_id=subsystem,
        )
    )


def _hex(value: str | None) -> str:
    text = (value or "").lower()
    return text[2:] if text.startswith("0x") else text


# --- device entries ----------------------------------------------------------------------------


def format_dev(path: str, gid: int | None, mode: str | None) -> str:
    """A devN value in Proxmox's canonical form: the path, then the options sorted by key."""
    return format_dev_value(path, gid=gid, mode=mode or None)


def _dev_path(value: str) -> str:
    first = str(value).split(",", 1)[0]
    return first[5:] if first.startswith("path=") else first


def is_nvidia_dev(value: str) -> bool:
    """True when a devN value passes an nvidia node (``/dev/nvidia*``, ``path=`` spelled or not)."""
    return _dev_path(value).startswith("/dev/nvidia")


def is_nvidia_lxc(key: str, value: str, majors: set[int]) -> bool:
    """True when the raw ``lxc.*`` line ``key: value`` is an nvidia mount entry or a device rule
    for one of the char ``majors``: a line gputopo manages."""
    if key == "lxc.mount.entry":
        return value.strip().startswith("/dev/nvidia")
    if key.startswith("lxc.cgroup2.devices.allow") or key.startswith("lxc.cgroup.devices.allow"):
        m = re.match(r"^c\s+(\d+):", value.strip())
        return bool(m) and int(m.group(1)) in majors
    return False


def _dev_paths(gpus: list[Gpu]) -> list[str]:
    return [f"/dev/nvidia{g.minor}" for g in gpus if g.minor is not None] + (list(CONTROL_NODES) if gpus else [])


def _legacy_lines(paths: list[str], majors: dict[str, int]) -> list[list[str]]:
    lines = [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]
    lines.append(["lxc.cgroup2.devices.allow", f"c {majors['nvidia-uvm']}:* rwm"])
    lines.append(["lxc.cgroup2.devices.allow", f"c {majors['nvidia-caps']}:* rwm"])
    for p in paths:
        lines.append(["lxc.mount.entry", f"{p} {p[1:]} none bind,optional,create=file"])
    return lines


def _device_changes(config: dict[str, Any], wanted: list[str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(full desired devN dict, set, delete): keep entries already right, reuse free indices."""
    existing = {k: str(v) for k, v in config.items() if DEV_KEY.match(k)}
    keep: dict[str, str] = {}
    unwanted: list[str] = []
    missing = list(wanted)
    for k, v in sorted(existing.items(), key=lambda kv: dev_sort(kv[0])):
        if not is_nvidia_dev(v):
            keep[k] = v
        elif v in missing:
            keep[k] = v
            missing.remove(v)
        else:
            unwanted.append(k)
    used = set(keep)
    free = [f"dev{i}" for i in range(MAX_DEV_INDEX + 1) if f"dev{i}" not in used]
    to_set = dict(zip(free, missing))
    final = {**keep, **to_set}
    delete = [k for k in unwanted if k not in to_set]
    return final, to_set, delete


def resolve_devices(config: dict[str, Any], update: UpdateContainer, minors: dict[str, int | None]) -> dict[str, str]:
    """The devN entries to set, besides ``update.set``, for ``update.resolve`` GPUs whose
    ``minors`` are now known: each new value at the lowest devN index that ``config`` (after
    ``update``'s own set and delete) leaves free. Values already present are not added again.

    Raises KeyError naming a GPU whose minor is still unknown (it is not on nvidia).
    """
    after = {k: str(v) for k, v in config.items() if DEV_KEY.match(k) and k not in update.delete}
    after.update(update.set)
    present = set(after.values())
    out: dict[str, str] = {}
    for address in update.resolve:
        minor = minors.get(address)
        if minor is None:
            raise KeyError(address)
        value = format_dev(f"/dev/nvidia{minor}", update.dev_gid, update.dev_mode)
        if value in present:
            continue
        key = next(f"dev{i}" for i in range(MAX_DEV_INDEX + 1) if f"dev{i}" not in after)
        after[key] = value
        out[key] = value
        present.add(value)
    return out


# --- planning -------------------------------------------------------------------------------


def pick_node(spec: Spec, facts: Facts, node: str | None) -> Node:
    """The spec's node for this host: ``node`` if given, the only one, or the host's name.

    Raises SpecError when none fits, or when the chosen node is not this host (a host whose
    name is unknown is not checked).
    """
    # Proxmox names a node after the short hostname; a spec node of another name would write
    # mapping lines and guest configs for a node this host is not
    host = (facts.host.hostname or "").split(".")[0]
    if node is None and len(spec.nodes) > 1 and host:
        node = host
    chosen = spec.node(node)
    if host and chosen.name != host:
        raise SpecError("spec", f"nodes[{spec.nodes.index(chosen)}].name",
                        f"node {chosen.name!r} is not this host, which is {host!r}")
    return chosen


def _select(
    sel: GpuSelector, candidates: list[Gpu], facts: Facts, owner: str, refusals: list[Refusal]
) -> list[Gpu]:
    if sel.numa is not None:
        # a node the host does not have is a typo that would silently select no GPU at all
        have = sorted(n.id for n in facts.host.numa_nodes)
        for n in sel.numa:
            if have and n not in have:
                refusals.append(Refusal(None, f"{owner}: this host has no NUMA node {n} "
                                              f"(it has {', '.join(map(str, have))})", "no-such-numa-node"))
        return [g for g in candidates if g.numa_node in sel.numa]
    if sel.addresses is not None:
        out = []
        switches = {s.address for s in facts.nvswitches}
        for a in sel.addresses:
            g = facts.gpu(a)
            if g is not None:
                out.append(g)
            elif a in switches:
                refusals.append(Refusal(a, f"is an NVSwitch, not a GPU ({owner})", "nvswitch"))
            else:
                refusals.append(Refusal(a, f"no such GPU on this host ({owner})", "no-such-gpu"))
        return out
    return []  # count: resolved after the explicit selectors


def _assign(
    facts: Facts,
    cts: dict[str, Container],
    vms: dict[str, VmMapping],
    refusals: list[Refusal],
    warnings: list[str],
) -> tuple[dict[str, list[Gpu]], dict[str, str]]:
    """(owner -> its GPUs, address -> its owner): numa and address selectors first, then counts
    from what is left, then ``rest``. A GPU claimed twice is refused; its first owner is kept."""
    candidates = nvidia_gpus(facts)
    owners: dict[str, list[str]] = {}
    selected: dict[str, list[Gpu]] = {}

    def claim(owner: str, gpus: list[Gpu]) -> None:
        selected.setdefault(owner, [])
        for g in gpus:
            if g not in selected[owner]:
                selected[owner].append(g)
                owners.setdefault(g.address, []).append(owner)

    explicit = [(o, c.gpus) for o, c in cts.items()] + [(o, m.gpus) for o, m in vms.items() if m.gpus != "rest"]
    for owner, sel in explicit:
        claim(owner, _select(sel, candidates, facts, owner, refusals))
    for owner, sel in explicit:
        if sel.count is not None:
            free = [g for g in candidates if g.address not in owners and not (owner.startswith("vm:") and g.boot_vga)]
            if len(free) < sel.count:
                refusals.append(
                    Refusal(None, f"{owner} wants {sel.count} GPU(s), only {len(free)} unclaimed", "count")
                )
            claim(owner, placement.choose(free, sel.count))  # closest together first
    for owner, m in vms.items():
        if m.gpus == "rest":
            rest = []
            for g in candidates:
                if g.address in owners:
                    continue
                if g.boot_vga:
                    warnings.append(f"{g.address}: boot VGA device; left with the host, not in {m.name}")
                    continue
                rest.append(g)
            claim(owner, rest)

    for addr, who in sorted(owners.items()):
        if len(who) > 1:
            refusals.append(Refusal(addr, f"claimed by both {who[0]} and {who[1]}", "double-claim"))
    if any(isinstance(sel, GpuSelector) and sel.numa is not None for _, sel in explicit):
        for g in candidates:
            if g.numa_node is None and g.address not in owners:
                warnings.append(f"{g.address}: NUMA node unknown; no numa selector matches it (left with the host)")
    return selected, {addr: who[0] for addr, who in owners.items()}


def _check_vm_gpus(facts: Facts, vm_addresses: set[str], refusals: list[Refusal], warnings: list[str]) -> None:
    """Refuse every VM GPU that cannot be passed through safely."""
    if vm_addresses and not facts.host.modules.vfio_pci:
        warnings.append("vfio-pci module is not loaded; apply will refuse until it is (modprobe vfio-pci)")
    for g in (facts.gpu(a) for a in sorted(vm_addresses)):
        assert g is not None
        if not facts.host.iommu_enabled:
            refusals.append(Refusal(g.address, "IOMMU is off; VM passthrough needs it (amd_iommu/intel_iommu=on)", "iommu-off"))
            continue
        if g.boot_vga:
            refusals.append(Refusal(g.address, "is the boot VGA device; it cannot go to a VM", "boot-vga"))
        if g.is_nvswitch:
            refusals.append(Refusal(g.address, "is an NVSwitch, not a GPU", "nvswitch"))
        if g.sriov_numvfs:
            refusals.append(Refusal(g.address, f"has {g.sriov_numvfs} SR-IOV VFs enabled; it must not be unbound", "sriov"))
        if g.iommu_group is None:
            refusals.append(Refusal(g.address, "has no IOMMU group; it cannot be passed to a VM", "no-group"))
        for m in g.foreign_members:
            if m.address not in vm_addresses:
                refusals.append(
                    Refusal(
                        g.address,
                        f"IOMMU group {g.iommu_group} also holds {m.address} (class {m.class_ or '?'}), "
                        "which is not moving with it",
                        "shared-group",
                    )
                )


def _check_container(
    c: Container, owner: str, gpus: list[Gpu], spec: Spec, owner_of: dict[str, str],
    refusals: list[Refusal], warnings: list[str],
) -> None:
    """Refuse or warn about what container ``c`` gets: non-NVIDIA GPUs, NUMA spread, unknown
    minors, guessed legacy majors, a tensor-parallel size the service cannot use."""
    for g in gpus:
        if g.vendor != NVIDIA_VENDOR:
            refusals.append(Refusal(g.address, f"is not an NVIDIA GPU; {owner} needs the nvidia driver", "not-nvidia"))
    nodes = {g.numa_node for g in gpus} - {None}
    if len(nodes) > 1 and not spec.policy.allow_cross_numa:
        warnings.append(placement.spread_warning(c.vmid, gpus))
    for g in gpus:
        if g.numa_node is None:
            warnings.append(f"{g.address}: NUMA node unknown (container {c.vmid})")
        for m in g.iommu_members:
            if m.role != MemberRole.BRIDGE and m.driver == VFIO and m.address not in owner_of:
                warnings.append(f"{g.address}: group member {m.address} is on vfio-pci (container {c.vmid})")
        if g.minor is None and c.device_mode == "devN":
            warnings.append(
                f"{g.address}: /dev/nvidia minor unknown until nvidia binds it; apply adds its device "
                f"to container {c.vmid} after the switch"
            )
        elif g.minor is None:
            warnings.append(
                f"{g.address}: /dev/nvidia minor unknown until nvidia binds it; plan again after apply "
                f"to add its device to container {c.vmid}"
            )
    if c.device_mode == "legacy" and gpus:
        guessed = sorted(set(DEFAULT_LEGACY_MAJORS) - set(c.legacy_majors or {}))
        if guessed:
            # these majors are dynamic: a wrong one silently denies the node inside the container
            warnings.append(
                f"container {c.vmid}: legacy device lines use guessed char majors for "
                f"{', '.join(f'{k} {DEFAULT_LEGACY_MAJORS[k]}' for k in guessed)}; "
                "set legacy_majors from /proc/devices"
            )
    tp = len(gpus)
    if c.service is None or tp == 0:
        return
    problems = []
    if tp & (tp - 1):
        problems.append("is not a power of two")
    heads = c.service.attention_heads
    if heads and heads % tp:
        problems.append(f"does not divide the {heads} attention heads")
    if problems:
        text = f"container {c.vmid}: tensor parallel {tp} {' and '.join(problems)}"
        if spec.policy.tp_check == "error":
            refusals.append(Refusal(None, text, "tp"))
        else:
            warnings.append(text)


def _targets(facts: Facts, owner_of: dict[str, str]) -> list[GpuTarget]:
    """Every GPU of ``facts`` with its owner and target driver (None: left with the host)."""
    target = []
    for g in facts.gpus:
        owner = owner_of.get(g.address, "host")
        drv = NVIDIA if owner.startswith("container:") else VFIO if owner.startswith("vm:") else None
        target.append(
            GpuTarget(
                address=g.address,
                owner=owner,
                driver=drv,
                current_driver=g.driver,
                companions=g.companions,
                numa_node=g.numa_node,
                minor=g.minor,
                iommu_group=g.iommu_group,
            )
        )
    return target


def _persistence_actions(
    vfio_addresses: list[str], current: CurrentState, templates: str | None
) -> list[WriteHostFile | RemoveHostFile]:
    """Writes of the persistence files that differ, removals of those no longer wanted."""
    want = persistence_files(vfio_addresses, templates)
    actions: list[WriteHostFile | RemoveHostFile] = []
    for path in PERSISTENCE_PATHS:
        have = current.files.get(path)
        if path in want:
            if have != want[path]:
                actions.append(WriteHostFile(path=path, content=want[path]))
        elif have is not None:
            actions.append(RemoveHostFile(path=path))
    return actions


def _rebinds(facts: Facts, target: list[GpuTarget], keep_override: bool) -> list[Rebind]:
    """One Rebind per IOMMU group that is not yet where the target wants it."""
    rebinds: list[Rebind] = []
    seen_groups: set[Any] = set()
    for t in target:
        if t.driver is None:
            continue
        g = facts.gpu(t.address)
        assert g is not None
        gkey = g.iommu_group if g.iommu_group is not None else g.address
        if gkey in seen_groups or not _needs_rebind(g, t.driver, keep_override):
            continue
        seen_groups.add(gkey)
        members = {g.address: g.driver, **{m.address: m.driver for m in g.iommu_members if m.role != MemberRole.BRIDGE}}
        rebinds.append(
            Rebind(
                address=g.address,
                members=sorted(members),
                from_drivers=dict(sorted(members.items())),
                to_driver=t.driver,
                keep_override=keep_override,
            )
        )
    return rebinds


def _needs_rebind(g: Gpu, to: str, keep_override: bool) -> bool:
    others = [m for m in g.iommu_members if m.role != MemberRole.BRIDGE]
    if to == VFIO:
        if g.driver != VFIO or any(m.driver != VFIO for m in others):
            return True
        return keep_override and g.driver_override != VFIO
    if g.driver != NVIDIA or g.driver_override == VFIO:
        return True
    return any(m.driver == VFIO and m.role == MemberRole.FUNCTION for m in others)


def _mapping_changes(
    node_name: str,
    cts: dict[str, Container],
    vms: dict[str, VmMapping],
    selected: dict[str, list[Gpu]],
    current: CurrentState,
) -> tuple[dict[str, MappingTarget], list[SetMapping | DeleteMapping], set[str]]:
    """(every managed mapping's target, the actions, the ids whose ``map`` changes).

    Entries of other nodes are kept; a description set outside the spec is kept too.
    """
    managed: list[tuple[str, list[Gpu], str | None, str]] = [
        (m.name, selected.get(o, []), m.description, "VM passthrough") for o, m in vms.items()
    ] + [(c.mapping, selected.get(o, []), None, f"container {c.vmid}") for o, c in cts.items() if c.mapping]
    mappings: dict[str, MappingTarget] = {}
    actions: list[SetMapping | DeleteMapping] = []
    changed: set[str] = set()
    for mid, gpus, description, purpose in managed:
        cur = current.mappings.get(mid)
        other_nodes = [e for e in (cur.map if cur else []) if _entry_fields(e).get("node") != node_name]
        ours = [map_entry(g, node_name) for g in sorted(gpus, key=lambda g: g.address)]
        want = other_nodes + ours
        desc = description or (cur.description if cur and cur.description else None)
        if desc is None and ours:
            desc = f"{len(ours)} GPU(s) for {purpose} (gputopo)"
        mappings[mid] = MappingTarget(map=want, description=desc if want else None)
        if not want:
            if cur is not None:
                actions.append(DeleteMapping(id=mid, digest=cur.digest))
                changed.add(mid)
        elif cur is None:
            actions.append(SetMapping(id=mid, map=want, description=desc, create=True))
            changed.add(mid)
        else:
            same_map = sorted(map(normalize_map_entry, cur.map)) == sorted(map(normalize_map_entry, want))
            if not same_map or (cur.description or None) != desc:
                actions.append(SetMapping(id=mid, map=want, description=desc, create=False, digest=cur.digest))
            if not same_map:
                changed.add(mid)
    return mappings, actions, changed


def _device_update(
    c: Container, gpus: list[Gpu], config: dict[str, Any]
) -> tuple[dict[str, str], list[list[str]], UpdateContainer | None]:
    """(every devN entry the config will have, gputopo's lxc lines, the update or None)."""
    paths = _dev_paths(gpus)
    majors = _legacy_majors(c)
    ours_lxc = current_nvidia_lxc(config, c)
    if c.device_mode == "devN":
        wanted = [format_dev(p, c.gid, c.mode) for p in paths]
        want_lxc: list[list[str]] = []
        # GPUs coming back from vfio-pci: apply resolves their entries after the switch
        resolve = [g.address for g in gpus if g.minor is None]
    else:
        wanted = []
        want_lxc = _legacy_lines(paths, majors) if gpus else []
        resolve = []
    devices, to_set, delete = _device_changes(config, wanted)
    lxc_add = [x for x in want_lxc if x not in ours_lxc]
    lxc_remove = [x for x in ours_lxc if x not in want_lxc]
    if not (to_set or delete or lxc_add or lxc_remove or resolve):
        return devices, want_lxc, None
    return devices, want_lxc, UpdateContainer(
        vmid=c.vmid,
        set=to_set,
        delete=delete,
        digest=config.get("digest"),
        lxc_add=lxc_add,
        lxc_remove=lxc_remove,
        resolve=resolve,
        dev_gid=c.gid if resolve else None,
        dev_mode=(c.mode or None) if resolve else None,
    )


def _service_target(
    c: Container, tp: int, state: ContainerState, p2p: bool, templates: str | None, warnings: list[str]
) -> tuple[ServiceTarget | None, WriteServiceDropin | None]:
    """(the service's target, the drop-in to write or None) for container ``c`` with ``tp`` GPUs.

    Without GPUs, or without a known command, the drop-in is not managed (a warning says why).
    """
    if c.service is None:
        return None, None
    svc_state = state.service
    command = c.service.command or (svc_state.exec_start if svc_state else None)
    svc_target = ServiceTarget(
        unit=c.service.unit, tp_flag=c.service.tp_flag, tp=tp, dropin=c.service.dropin,
        command=command, current_tp=_running_tp(svc_state),
    )
    if tp == 0:
        warnings.append(f"container {c.vmid}: no GPUs left; {c.service.unit} is left alone")
        svc_target.command = None
        return svc_target, None
    if command is None:
        warnings.append(
            f"container {c.vmid}: {c.service.unit} has no known command (set service.command); "
            "its drop-in is not managed"
        )
        return svc_target, None
    content = render_dropin(command, c.service.tp_flag, tp, p2p, templates)
    if svc_state is not None and svc_state.dropin == content:
        return svc_target, None
    return svc_target, WriteServiceDropin(
        vmid=c.vmid,
        unit=c.service.unit,
        path=dropin_path(c.service.unit, c.service.dropin),
        content=content,
        tp=tp,
    )


def _running_tp(svc: ServiceState | None) -> int | None:
    if svc is None:
        return None
    if svc.tp is not None:
        return svc.tp
    return parse_tp(svc.exec_start) if svc.exec_start else None


def _maps_a_moving_gpu(config: dict[str, Any], facts: Facts, rebinds: list[Rebind]) -> bool:
    """True when a devN entry of ``config`` is the /dev/nvidiaN of a device being rebound: the
    container must stop before that GPU is unbound under it."""
    used_paths = {_dev_path(v) for k, v in config.items() if DEV_KEY.match(k)}
    for r in rebinds:
        for a in r.members:
            g = facts.gpu(a)
            if g is not None and g.minor is not None and f"/dev/nvidia{g.minor}" in used_paths:
                return True
    return False


def _container_restarts(
    spec_node: Node, current: CurrentState, touched: set[int], restart_services: set[int]
) -> tuple[list[StopService | StopGuest], list[StartGuest | StartService]]:
    """(stops, starts) of the containers and services: only what must stop, and what the spec
    says serves but is not running."""
    stops: list[StopService | StopGuest] = []
    starts: list[StartGuest | StartService] = []
    for c in spec_node.containers:
        state = current.containers.get(c.vmid) or ContainerState()
        running = state.status == "running"
        svc = c.service
        svc_active = bool(state.service and state.service.active)
        if c.vmid in touched and running:
            if svc is not None and svc_active:
                stops.append(StopService(vmid=c.vmid, unit=svc.unit))
            stops.append(StopGuest(guest="lxc", vmid=c.vmid))
            starts.append(StartGuest(guest="lxc", vmid=c.vmid))
            if svc is not None:
                starts.append(StartService(vmid=c.vmid, unit=svc.unit))
        elif c.vmid in restart_services and running and svc is not None:
            if svc_active:
                stops.append(StopService(vmid=c.vmid, unit=svc.unit))
            starts.append(StartService(vmid=c.vmid, unit=svc.unit))
        elif c.vmid in current.containers and not running:
            # The spec says this container serves its GPUs: a stopped one is not converged.
            starts.append(StartGuest(guest="lxc", vmid=c.vmid))
            if svc is not None:
                starts.append(StartService(vmid=c.vmid, unit=svc.unit))
        elif svc is not None and state.service is not None and not svc_active:
            # The service state was read (pct exec) and it is not running.
            starts.append(StartService(vmid=c.vmid, unit=svc.unit))
    return stops, starts


def hostpci_devices(value: str) -> tuple[str | None, list[str]]:
    """(mapping id, host devices) of a VM's ``hostpciN`` value.

    ``mapping=ID[,...]`` names a mapping; ``host=A;B[,...]`` or a bare ``A;B[,...]`` names
    devices, each a full address (``0000:81:00.0``) or a slot (``81:00``: every function of the
    card), returned normalised (``0000:81:00.0``, ``0000:81:00``). Devices that are not PCI
    addresses are left out (Proxmox refuses such a value).
    """
    first = value.split(",")[0]
    fields = _entry_fields(value if "=" in first else f"host={value}")
    hosts: list[str] = []
    for text in filter(None, fields.get("host", "").split(";")):
        try:
            hosts.append(normalize_address(text) if "." in text else slot_of(normalize_address(text + ".0")))
        except AddressError:
            continue
    return fields.get("mapping"), hosts


def _guest_restarts(
    spec_node: Node,
    current: CurrentState,
    mappings: dict[str, MappingTarget],
    changed_mappings: set[str],
    rebinding: set[str],
) -> tuple[list[StopGuest], list[StartGuest]]:
    """(stops, starts) of the running VMs that use a changed mapping, a mapping holding a device
    being rebound, or such a device directly (``host=``)."""
    affected = set(changed_mappings)
    for mid, m in {**mappings, **current.mappings}.items():
        paths = [p for e in m.map for p in _entry_fields(e).get("path", "").split(";")]
        if any(p in rebinding for p in paths):
            affected.add(mid)
    stops: list[StopGuest] = []
    starts: list[StartGuest] = []
    for vmid in spec_node.vms.guests or sorted(current.guests):
        gs = current.guests.get(vmid)
        if gs is None or gs.status != "running":
            continue
        hit = False
        for value in gs.hostpci:
            mapping, hosts = hostpci_devices(value)
            hit = hit or mapping in affected or any(a in hosts or slot_of(a) in hosts for a in rebinding)
        if hit:
            stops.append(StopGuest(guest="qemu", vmid=vmid))
            starts.append(StartGuest(guest="qemu", vmid=vmid))
    return stops, starts


def plan(
    facts: Facts,
    spec: Spec,
    current: CurrentState | None = None,
    *,
    node: str | None = None,
    templates: str | None = None,
) -> Plan:
    """Plan the changes that bring the host from ``current`` to what ``spec`` asks.

    Returns a :class:`Plan` (no actions when converged). Raises :class:`PlanRefused` with every
    :class:`Refusal` when the spec cannot be carried out safely, SpecError when the spec names no
    node for this host, ConfigError for a broken user template.
    """
    current = current or CurrentState()
    spec_node = pick_node(spec, facts, node)
    node_name = spec_node.name
    refusals: list[Refusal] = []
    warnings: list[str] = []
    cts = {f"container:{c.vmid}": c for c in spec_node.containers}
    vms = {f"vm:{m.name}": m for m in spec_node.vms.mappings}

    selected, owner_of = _assign(facts, cts, vms, refusals, warnings)
    _check_vm_gpus(facts, {a for a, o in owner_of.items() if o.startswith("vm:")}, refusals, warnings)
    for owner, c in cts.items():
        _check_container(c, owner, selected.get(owner, []), spec, owner_of, refusals, warnings)
    if facts.host.sev_snp and facts.host.iommu_mode == "pt":
        warnings.append(
            "SEV-SNP is on but the IOMMU is in passthrough (iommu=pt); SEV-SNP needs it translating: "
            "drop iommu=pt from the kernel command line"
        )
    if refusals:
        raise PlanRefused(refusals)

    keep_override = spec.policy.keep_driver_override
    target = _targets(facts, owner_of)
    vfio_all = sorted({a for t in target if t.driver == VFIO for a in [t.address, *t.companions]})
    rebinds = _rebinds(facts, target, keep_override)
    mappings, mapping_actions, changed_mappings = _mapping_changes(node_name, cts, vms, selected, current)

    containers: list[ContainerTarget] = []
    updates: list[UpdateContainer] = []
    dropins: list[WriteServiceDropin] = []
    touched: set[int] = set()
    p2p = p2p_must_be_disabled(facts)
    for owner, c in cts.items():
        gpus = sorted(selected.get(owner, []), key=lambda g: g.address)
        state = current.containers.get(c.vmid)
        if state is None:
            warnings.append(f"container {c.vmid}: no configuration found on node {node_name}")
            state = ContainerState()
        devices, lxc, update = _device_update(c, gpus, state.config)
        if update is not None:
            updates.append(update)
        if update is not None or _maps_a_moving_gpu(state.config, facts, rebinds):
            touched.add(c.vmid)
        svc_target, dropin = _service_target(c, len(gpus), state, p2p, templates, warnings)
        if dropin is not None:
            dropins.append(dropin)
        containers.append(
            ContainerTarget(
                vmid=c.vmid, gpus=[g.address for g in gpus], device_mode=c.device_mode, devices=devices,
                lxc=lxc, mapping=c.mapping, service=svc_target,
            )
        )

    ct_stops, ct_starts = _container_restarts(spec_node, current, touched, {d.vmid for d in dropins})
    rebinding = {m for r in rebinds for m in r.members}
    vm_stops, vm_starts = _guest_restarts(spec_node, current, mappings, changed_mappings, rebinding)
    actions: list[Any] = [
        *_persistence_actions(vfio_all, current, templates), *mapping_actions, *dropins,
        *ct_stops, *vm_stops, *rebinds, *updates, *ct_starts, *vm_starts,
    ]
    order = {p: i for i, p in enumerate(PHASES)}
    actions.sort(key=lambda a: order[a.phase])  # stable: keeps the order within a phase
    return Plan(
        node=node_name,
        target=target,
        containers=containers,
        mappings=mappings,
        kept_mappings={
            mid: MappingTarget(map=list(m.map), description=m.description)
            for mid, m in current.mappings.items()
            if mid not in mappings
        },
        p2p_disable=p2p,
        keep_override=keep_override,
        warnings=warnings,
        actions=actions,
    )


def _legacy_majors(c: Container) -> dict[str, int]:
    """The char majors of nvidia-uvm and nvidia-caps for legacy lines: the spec's, else the defaults."""
    majors = dict(DEFAULT_LEGACY_MAJORS)
    majors.update({k: v for k, v in (c.legacy_majors or {}).items() if k in majors})
    return majors


def current_nvidia_lxc(config: dict[str, Any], c: Container) -> list[list[str]]:
    """The raw ``lxc.*`` lines of ``config`` that gputopo manages for container ``c``: nvidia
    mount entries and device rules for nvidia's majors (195 and the spec's or default legacy
    ones). Other lxc lines are the operator's and are never touched."""
    majors = {195, *DEFAULT_LEGACY_MAJORS.values(), *_legacy_majors(c).values()}
    return [list(x) for x in config.get("lxc", []) or [] if is_nvidia_lxc(x[0], x[1], majors)]


# --- the world after a plan -------------------------------------------------------------------


def expected_after(p: Plan, facts: Facts, current: CurrentState) -> tuple[Facts, CurrentState]:
    """What facts and current state look like once ``p`` has been applied successfully.

    GPUs that reach nvidia without a known minor get the lowest free one, as the driver does.
    Used to rehearse a plan and to check that a converged host plans nothing.
    """
    facts = facts.model_copy(deep=True)
    current = current.model_copy(deep=True)
    drivers: dict[str, str | None] = {}
    overrides: dict[str, str | None] = {}
    for a in p.actions:
        if isinstance(a, Rebind):
            for m in a.members:
                if a.to_driver == VFIO:
                    drivers[m] = VFIO
                    overrides[m] = VFIO if a.keep_override else None
                else:
                    drivers[m] = NVIDIA if m == a.address else None
                    overrides[m] = None
    used_minors = {g.minor for g in facts.gpus if g.minor is not None and drivers.get(g.address, g.driver) == NVIDIA}
    for g in facts.gpus:
        if g.address in drivers:
            g.driver = drivers[g.address]
            g.driver_override = overrides[g.address]
            if g.driver == NVIDIA and g.minor is None:
                g.minor = min(set(range(256)) - used_minors)
                used_minors.add(g.minor)
            elif g.driver != NVIDIA:
                g.minor = None
        for m in g.iommu_members:
            if m.address in drivers:
                m.driver = drivers[m.address]
    for a in p.actions:
        if isinstance(a, WriteHostFile):
            current.files[a.path] = a.content
        elif isinstance(a, RemoveHostFile):
            current.files[a.path] = None
        elif isinstance(a, SetMapping):
            current.mappings[a.id] = MappingState(map=list(a.map), description=a.description, digest="new")
        elif isinstance(a, DeleteMapping):
            current.mappings.pop(a.id, None)
        elif isinstance(a, WriteServiceDropin):
            ct = current.containers.setdefault(a.vmid, ContainerState())
            svc = ct.service or ServiceState(unit=a.unit)
            svc.dropin = a.content
            svc.tp = a.tp
            for line in a.content.splitlines():
                if line.startswith("ExecStart=") and line != "ExecStart=":
                    svc.exec_start = line[len("ExecStart="):].replace("%%", "%")
            ct.service = svc
        elif isinstance(a, UpdateContainer):
            ct = current.containers.setdefault(a.vmid, ContainerState())
            extra = resolve_devices(ct.config, a, {g.address: g.minor for g in facts.gpus}) if a.resolve else {}
            for k in a.delete:
                ct.config.pop(k, None)
            ct.config.update(a.set)
            ct.config.update(extra)
            lxc = [list(x) for x in ct.config.get("lxc", []) if list(x) not in a.lxc_remove] + a.lxc_add
            if lxc or "lxc" in ct.config:
                ct.config["lxc"] = lxc
            ct.config["digest"] = "new"
        elif isinstance(a, StartService):
            ct = current.containers.setdefault(a.vmid, ContainerState())
            if ct.service is not None:
                ct.service.active = True
        elif isinstance(a, StartGuest) and a.guest == "lxc" and a.vmid in current.containers:
            current.containers[a.vmid].status = "running"
    return facts, current

