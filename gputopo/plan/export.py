"""The host as it is, as a spec (mig-parted's ``export``): ``plan`` of it says "No changes". Pure.

* every container whose ``devN`` (or legacy ``lxc.mount.entry``) lines grant a GPU's
  ``/dev/nvidiaN`` keeps those GPUs, by address, with the entries' mode and gid;
* every PCI mapping whose lines for this node name only GPUs on vfio-pci is a VM mapping; one
  that names exactly a container's GPUs is that container's ``mapping``;
* the VMs whose ``hostpciN`` uses such a mapping are its ``vms.guests``;
* ``keep_driver_override`` follows the VM GPUs' ``driver_override``;
* the inference unit found inside each container (the unit whose command runs SGLang or vLLM)
  is its service, with the flag its command spells; it is written active only when gputopo
  manages it already (its drop-in is there and current), else as a comment: managing it means
  a drop-in and a restart, which is a change.

What cannot be said in a spec (a GPU passed to a VM by raw address, a mapping mixing GPUs of
both sides, a GPU two containers share) is left to the host, and said in the file's header.
:func:`checked_export` checks the spec by planning it against the state the caller reads for it
(what export reads is :mod:`gputopo.facts.export`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gputopo.errors import PveFormatError
from gputopo.formats.devn import is_devn_key
from gputopo.formats.hostpci import hostpci_refs
from gputopo.formats.lxcdev import parse_dev_value
from gputopo.formats.systemctl import InferenceUnit
from gputopo.model.facts import Facts, Gpu, nvidia_gpus
from gputopo.model.state import CurrentState
from gputopo.plan.planner import plan as make_plan
from gputopo.plan.spec import API_VERSION, KIND, Spec
from gputopo.topo.owners import container_minors, mapping_addresses


@dataclass
class Exported:
    """The spec of the host now, what the file says about it, and what was found inside."""

    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    units: dict[int, InferenceUnit] = field(default_factory=dict)  # container -> its inference unit
    managed: set[int] = field(default_factory=set)  # containers whose unit is in the spec

    @property
    def spec(self) -> Spec:
        return Spec.model_validate(self.data)


def _dev_options(config: dict[str, Any], minors: set[int]) -> tuple[str | None, int | None]:
    """(mode, gid) of the container's GPU ``devN`` entries (the first that parses)."""
    for key, value in sorted(config.items()):
        if not is_devn_key(key):
            continue
        try:
            dev = parse_dev_value(str(value))
        except PveFormatError:
            continue
        if dev["path"] in {f"/dev/nvidia{m}" for m in minors}:
            return dev.get("mode"), dev.get("gid")
    return None, None


def _legacy(config: dict[str, Any]) -> bool:
    """True when the GPUs come in through raw ``lxc.mount.entry`` lines, not ``devN``."""
    return not any(is_devn_key(k) and "/dev/nvidia" in str(v) for k, v in config.items())


def export_spec(
    facts: Facts,
    state: CurrentState,
    node: str,
    units: dict[int, list[InferenceUnit]],
    manage: set[int] | None = None,
) -> Exported:
    """The spec of ``facts`` + ``state`` for ``node``; ``units`` are the inference units found in
    each container, ``manage`` the containers whose unit goes in the spec (default: none)."""
    gpus = nvidia_gpus(facts)
    out = Exported(data={})
    containers = _containers(gpus, state, units, manage or set(), out)
    vfio = {g.address for g in gpus if g.driver == "vfio-pci"}
    mappings, taken = _vm_mappings(gpus, state, node, containers, vfio, out.notes)
    names = {m["name"] for m in mappings}
    guests = sorted(
        vmid for vmid, g in state.guests.items() if any(hostpci_refs(v)[1] in names for v in g.hostpci)
    )
    raw = sorted(a for a in vfio - taken)
    if raw:
        out.notes.append(f"{', '.join(raw)} on vfio-pci without a mapping of this node: left as they are")
    overrides = {g.driver_override for g in gpus if g.address in taken}
    node_data: dict[str, Any] = {
        "name": node,
        "containers": containers,
        "vms": {"mappings": mappings, "guests": guests},
    }
    out.data = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "nodes": [node_data],
        "policy": {"keep_driver_override": overrides != {None}},
    }
    return out


def _containers(
    gpus: list[Gpu],
    state: CurrentState,
    units: dict[int, list[InferenceUnit]],
    manage: set[int],
    out: Exported,
) -> list[dict[str, Any]]:
    """The spec's entry of every container whose devices grant GPUs on nvidia, by vmid; a GPU
    two containers share stays with the first (a note says so). Their units go to ``out``."""
    by_minor = {g.minor: g for g in gpus if g.driver == "nvidia" and g.minor is not None}
    claimed: dict[str, int] = {}
    containers: list[dict[str, Any]] = []
    for vmid, ct in sorted(state.containers.items()):
        minors = container_minors(ct.config)
        mine = sorted(by_minor[m].address for m in minors if m in by_minor)
        for a in mine:
            if a in claimed:
                out.notes.append(
                    f"{a} is in the devices of containers {claimed[a]} and {vmid}: left with {claimed[a]}"
                )
        mine = [a for a in mine if a not in claimed]
        if not mine:
            continue
        claimed.update({a: vmid for a in mine})
        entry: dict[str, Any] = {"vmid": vmid, "gpus": {"addresses": mine}}
        _device_options(entry, ct.config, minors, out.notes)
        _service(entry, units.get(vmid) or [], vmid in manage, out)
        containers.append(entry)
    return containers


def _device_options(
    entry: dict[str, Any], config: dict[str, Any], minors: set[int], notes: list[str]
) -> None:
    """Add the container's device mode (legacy), or its GPU entries' mode and gid, to ``entry``."""
    if _legacy(config):
        entry["device_mode"] = "legacy"
        return
    mode, gid = _dev_options(config, minors)
    if mode:
        entry["mode"] = mode
    else:
        notes.append(
            f"container {entry['vmid']}: its GPU entries have no mode; the spec's default 0666 will be set"
        )
    if gid is not None:
        entry["gid"] = gid


def _service(entry: dict[str, Any], found: list[InferenceUnit], manage: bool, out: Exported) -> None:
    """Record the container's first inference unit in ``out``, and add it to ``entry`` as its
    service when ``manage``; a note names the others."""
    if not found:
        return
    vmid = entry["vmid"]
    out.units[vmid] = found[0]
    if len(found) > 1:
        out.notes.append(
            f"container {vmid}: also runs {', '.join(u.unit for u in found[1:])}; {found[0].unit} is the one listed"
        )
    if manage:
        entry["service"] = {"unit": found[0].unit, "tp_flag": found[0].tp_flag}
        out.managed.add(vmid)


def _vm_mappings(
    gpus: list[Gpu],
    state: CurrentState,
    node: str,
    containers: list[dict[str, Any]],
    vfio: set[str],
    notes: list[str],
) -> tuple[list[dict[str, Any]], set[str]]:
    """(the spec's VM mappings, the addresses they take): every mapping whose lines for ``node``
    name only GPUs on vfio-pci no other mapping took. One naming exactly a container's GPUs
    becomes that container's ``mapping`` instead; one mixing both sides is left, with a note."""
    ct_sets = {c["vmid"]: set(c["gpus"]["addresses"]) for c in containers}
    mappings: list[dict[str, Any]] = []
    taken: set[str] = set()
    for mid, m in sorted(state.mappings.items()):
        addrs = mapping_addresses(m.map, node) & {g.address for g in gpus}
        if not addrs:
            continue
        owner = next((v for v, s in ct_sets.items() if s == addrs), None)
        if owner is not None:
            c = next(c for c in containers if c["vmid"] == owner)
            c.setdefault("mapping", mid)
            continue
        if addrs <= vfio and not addrs & taken:
            taken |= addrs
            vm: dict[str, Any] = {"name": mid, "gpus": {"addresses": sorted(addrs)}}
            if m.description:
                vm["description"] = m.description
            mappings.append(vm)
        else:
            notes.append(f"mapping {mid} mixes GPUs of both sides (or of another mapping): left as it is")
    return mappings, taken


def _steps(facts: Facts, ex: Exported, node: str, read: Callable[[Spec], CurrentState]) -> list[str]:
    spec = ex.spec
    p = make_plan(facts, spec, read(spec), node=node)
    return [a.describe() for a in p.actions]


def checked_export(
    facts: Facts,
    state: CurrentState,
    node: str,
    units: dict[int, list[InferenceUnit]],
    read: Callable[[Spec], CurrentState],
) -> tuple[Exported, list[str]]:
    """(the exported spec, the steps a plan of it would still take: [] when it converges).

    ``read(spec)`` is the node's current state as a plan of ``spec`` sees it (the caller reads
    it). A container's unit goes into the spec only when planning with it changes nothing more
    than planning without it (gputopo manages it already). Raises PlanRefused when the host as
    it is cannot be planned, and what ``read`` raises.
    """
    base = export_spec(facts, state, node, units)
    steps = _steps(facts, base, node, read)
    manage = set()
    for vmid in sorted(units):
        if units[vmid] and len(
            _steps(facts, export_spec(facts, state, node, units, {vmid}), node, read)
        ) <= len(steps):
            manage.add(vmid)
    ex = export_spec(facts, state, node, units, manage) if manage else base
    return ex, _steps(facts, ex, node, read) if manage else steps


def _dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        """Quotes every text with a colon: a PCI address reads as text in any YAML reader."""

    def text(dumper, value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="'" if ":" in value else None)

    Dumper.add_representer(str, text)
    return Dumper


def export_yaml(ex: Exported, facts: Facts) -> str:
    """The exported spec as commented YAML; it parses back into ``ex.spec``."""
    import yaml

    lines = [
        f"# gputopo export of {facts.host.hostname or 'this host'}: the host as it is now.",
        "# 'gputopo plan --spec FILE' of it says \"No changes\"; edit it to plan a change.",
    ]
    lines += [f"# note: {n}" for n in ex.notes]
    for vmid, u in sorted(ex.units.items()):
        state = "active" if u.active else "not active"
        lines.append(
            f"# container {vmid} runs {u.server} in {u.unit} ({state}), {u.tp_flag} {u.tp}: {u.command}"
        )
        if vmid not in ex.managed:
            lines += [
                f"#   not managed by gputopo yet; to let tensor parallelism follow the GPUs, add to container {vmid}:",
                f'#     service: {{unit: {u.unit}, tp_flag: "{u.tp_flag}"}}',
                "#   (plan then writes a drop-in; the service restarts only when that changes its command)",
            ]
    Spec.model_validate(ex.data)  # what is written must be a spec: checked before a word of it is
    return (
        "\n".join(lines)
        + "\n"
        + yaml.dump(ex.data, Dumper=_dumper(), sort_keys=False, default_flow_style=False)
    )
