"""Who owns each GPU now, from the facts and the current state; and after a plan. Pure.

* container N: the GPU is on nvidia and its ``/dev/nvidia<minor>`` is one of container N's
  ``devN`` paths (or a legacy ``lxc.mount.entry`` source);
* VM mapping NAME: the GPU is on vfio-pci and a ``map`` line of mapping NAME for this node
  names its address (the VMs whose ``hostpciN`` uses the mapping are listed with it); a GPU on
  vfio-pci named by a VM's raw ``hostpciN`` address belongs to that VM;
* free: anything else (a mapping that names a GPU still on nvidia does not own it yet).
"""

from __future__ import annotations

import re
from typing import Any

from gputopo.errors import PveFormatError
from gputopo.formats.devn import is_devn_key
from gputopo.formats.hostpci import hostpci_refs
from gputopo.formats.lxcconf import parse_dev_value
from gputopo.formats.pcicfg import parse_map_entry
from gputopo.model.facts import Facts, Gpu, normalize_address, slot_of
from gputopo.model.owner import Owner, OwnerKind
from gputopo.model.state import CurrentState
from gputopo.topo.model import FREE, OwnerView

_MINOR_RE = re.compile(r"^/dev/nvidia(\d+)$")


def container_minors(config: dict[str, Any]) -> set[int]:
    """The ``/dev/nvidia<N>`` minors a container config grants: ``devN`` paths and legacy
    ``lxc.mount.entry`` sources (``/dev/nvidia0 dev/nvidia0 none bind,optional,create=file``).
    Values that do not parse are skipped."""
    minors: set[int] = set()
    for key, value in config.items():
        if not is_devn_key(key):
            continue
        try:
            path = parse_dev_value(str(value))["path"]
        except PveFormatError:
            continue
        m = _MINOR_RE.match(path)
        if m:
            minors.add(int(m.group(1)))
    for pair in config.get("lxc") or []:
        if len(pair) == 2 and pair[0] == "lxc.mount.entry":
            m = _MINOR_RE.match(str(pair[1]).split()[0] if str(pair[1]).split() else "")
            if m:
                minors.add(int(m.group(1)))
    return minors


def mapping_addresses(maps: list[str], node: str | None) -> set[str]:
    """Addresses the ``map`` lines name for ``node`` (any node when None); bad lines skipped."""
    out: set[str] = set()
    for text in maps:
        try:
            entry = parse_map_entry(text)
        except PveFormatError:
            continue
        if node is not None and entry.node != node:
            continue
        # a path without its function maps the whole device (pve-guest-common Mapping/PCI.pm
        # ``path``): its function 0, the GPU, is among them
        out.update(normalize_address(p if "." in p else f"{p}.0") for p in entry.paths)
    return out


def mapping_users(state: CurrentState) -> dict[str, list[int]]:
    """mapping name -> the VMs whose ``hostpciN`` uses it, by vmid."""
    out: dict[str, list[int]] = {}
    for vmid, guest in sorted(state.guests.items()):
        for value in guest.hostpci:
            mapping = hostpci_refs(value)[1]
            if mapping and vmid not in out.setdefault(mapping, []):
                out[mapping].append(vmid)
    return out


def owners_now(facts: Facts, state: CurrentState, node: str | None = None) -> dict[str, OwnerView]:
    """address -> :class:`OwnerView` for every GPU of ``facts`` under the current ``state``.

    ``node`` limits mapping lines to that Proxmox node (default: the host's short name).
    """
    node = node or ((facts.host.hostname or "").split(".")[0] or None)
    minors_of = {vmid: container_minors(ct.config) for vmid, ct in state.containers.items()}
    mapped = {name: mapping_addresses(m.map, node) for name, m in state.mappings.items()}
    vm_maps = mapping_users(state)
    vm_raw: dict[int, set[str]] = {}
    for vmid, guest in sorted(state.guests.items()):
        for value in guest.hostpci:
            vm_raw.setdefault(vmid, set()).update(hostpci_refs(value)[0])
    out: dict[str, OwnerView] = {}
    for g in facts.gpus:
        out[g.address] = _owner(g, minors_of, mapped, vm_maps, vm_raw)
    return out


def _owner(
    g: Gpu,
    minors_of: dict[int, set[int]],
    mapped: dict[str, set[str]],
    vm_maps: dict[str, list[int]],
    vm_raw: dict[int, set[str]],
) -> OwnerView:
    if g.driver == "nvidia" and g.minor is not None:
        cts = sorted(v for v, minors in minors_of.items() if g.minor in minors)
        if cts:
            return OwnerView(kind="container", containers=cts)
    if g.driver == "vfio-pci":
        names = sorted(n for n, addrs in mapped.items() if g.address in addrs)
        if names:
            return OwnerView(kind="vm", mapping=names[0], vms=vm_maps.get(names[0], []))
        vms = sorted(v for v, raw in vm_raw.items() if g.address in raw or slot_of(g.address) in raw)
        if vms:
            return OwnerView(kind="vm", vms=vms)
    return FREE.model_copy()


def owner_from_target(
    owner: Owner, before: OwnerView, users: dict[str, list[int]] | None = None
) -> OwnerView:
    """A plan target's owner as the picture shows it; the host (left untouched) keeps ``before``.
    ``users``: :func:`mapping_users` of the state."""
    if owner.kind == OwnerKind.HOST:
        return before
    return OwnerView.of(owner, (users or {}).get(owner.name, []))
