"""Mapping safety: which VMs a plan must not start again, and the view of the mappings it checks
that with. Pure.

Proxmox chooses among a mapping's ``map`` entries at VM start knowing only its own
reservations (qemu-server ``PCI.pm`` ``choose_hostpci_devices``), not which GPUs a container
uses: a VM whose mapping lists a container's GPU may take it, and a VM whose mapping has no
line for the node it starts on does not start ("PCI device mapping not found"). So a VM is never
started again when one of its ``hostpciN: mapping=`` lines names such a mapping; a running VM
whose mapping's GPUs go to a container is refused (naming VM and mapping) unless the spec says
what to do with its lines (``vms.consumers[].when_gpus_leave``); a plan after which a mapping a
VM of the node names still lists a container's GPU is refused (verify is certain to fail on it),
whether the VM runs or not. A stopped VM whose mapping has no device on this node is only a
warning: Proxmox refuses its start here, but it can run on a node the mapping has lines for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gputopo.errors import PveFormatError
from gputopo.formats.hostpci import hostpci_index, hostpci_number, parse_hostpci
from gputopo.formats.mapline import map_fields, map_node, map_paths
from gputopo.model.owner import Owner
from gputopo.model.state import CurrentState
from gputopo.plan.findings import Findings


@dataclass
class MapView:
    """The mappings before and after a plan, on one node, and who owns each GPU after it."""

    node: str
    before: dict[str, list[str]]  # mapping id -> map entries now
    after: dict[str, list[str]]  # mapping id -> map entries once the plan is applied
    owner_of: dict[str, Owner]  # address -> its container or VM mapping
    to_container: set[str]  # GPUs this plan moves to a container's driver
    managed: set[str] = field(default_factory=set)  # the mappings the spec manages (even without GPUs)

    def find(self, name: str, after: bool = True) -> str | None:
        """The id of mapping ``name`` (ids are case-insensitive), or None when there is none."""
        for mid in self.after if after else self.before:
            if mid.lower() == name.lower():
                return mid
        return None

    def paths(self, mid: str, after: bool = True) -> list[str]:
        """The devices of ``mid``'s entries for this node."""
        entries = (self.after if after else self.before).get(mid, [])
        return [p for e in entries if map_fields(e).get("node") == self.node for p in map_paths(e)]

    def _to_container(self, address: str) -> bool:
        owner = self.owner_of.get(address)
        return owner is not None and owner.is_container

    def container_gpus(self, mid: str) -> dict[str, Owner]:
        """address -> container owner of every GPU ``mid`` lists after the plan."""
        return {a: self.owner_of[a] for a in self.paths(mid) if self._to_container(a)}

    def leaving(self, mid: str, moving: bool = False) -> dict[str, Owner]:
        """address -> container owner of every GPU ``mid`` lists now that a container gets
        (``moving``: only those this plan moves to the container's driver)."""
        found = self.find(mid, after=False)
        return {
            a: self.owner_of[a]
            for a in (self.paths(found, after=False) if found else [])
            if a in self.to_container or (not moving and self._to_container(a))
        }


def mapping_lines(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(``hostpciN``, mapping id) of every line of a VM config that names a mapping."""
    out = []
    for key, value in config.items():
        if hostpci_index(key) is None:
            continue
        try:
            props = parse_hostpci(str(value))
        except PveFormatError:
            continue
        if "mapping" in props:
            out.append((key, props["mapping"]))
    return sorted(out, key=lambda kv: hostpci_number(kv[0]))


def owners_text(gpus: dict[str, Owner]) -> str:
    """``A, B to container 101`` for address -> owner."""
    by: dict[str, list[str]] = {}
    for a, o in sorted(gpus.items()):
        by.setdefault(o.label, []).append(a)
    return "; ".join(f"{', '.join(a)} to {o}" for o, a in by.items())


def no_device(name: str, view: MapView) -> str | None:
    """``mapping X, which has no device on NODE after the plan (why)`` when mapping ``name`` (as a
    VM's line spells it) has no line for the view's node once the plan is applied, else None."""
    mid = view.find(name)
    if mid is not None and view.paths(mid):
        return None
    head = f"mapping {mid or name}, which has no device on {view.node} after the plan"
    if mid is not None:
        others = sorted({n for e in view.after[mid] if (n := map_node(e)) and n != view.node})
        # the other nodes' lines as they are now: in a cluster their own plans may change them
        return head + (
            f" (as the other nodes are now, it lists devices of {', '.join(others)} only)" if others else ""
        )
    if view.find(name, after=False) is not None:
        return head + " (the plan deletes it)"
    # none exists now; in a cluster another node's plan may create it with that node's lines
    return head


def unsafe_start(config: dict[str, Any], view: MapView) -> str | None:
    """Why a VM with ``config`` must not start once the plan is applied (``hostpciN names ...``),
    or None: a mapping with no device on this node (qemu-server ``PCI.pm`` ``parse_hostpci``:
    ``find_on_current_node`` finds no line for the node and the start dies "PCI device mapping
    not found for '<id>'"), or one that lists a container's GPU (``choose_hostpci_devices`` may
    pick it)."""
    for key, name in mapping_lines(config):
        missing = no_device(name, view)
        if missing:
            return f"{key} names {missing}: Proxmox refuses to start it there"
        mid = view.find(name)
        assert mid is not None  # no_device is None only for a mapping that exists
        taken = view.container_gpus(mid)
        if taken:
            return (
                f"{key} names mapping {mid}, which lists container GPU(s) ({owners_text(taken)}): "
                "Proxmox could give it one of them"
            )
    return None


def check_guests(
    current: CurrentState, view: MapView, handled: set[int], restarts: set[int], found: Findings
) -> set[int]:
    """Refuse running VMs (outside ``handled``, the consumers) whose mappings' GPUs this plan
    moves to a container, and warn about stopped ones that cannot start on this node after it
    (their mapping has no device here: Proxmox refuses the start, the VM can still run on a node
    the mapping has lines for). Returns the VMs refused."""
    refused: set[int] = set()
    for vmid, g in sorted(current.guests.items()):
        if vmid in handled:
            continue
        for key, name in mapping_lines(g.config):
            mid = view.find(name, after=False)
            leaving = view.leaving(mid, moving=True) if mid else {}
            if g.status == "running" and leaving:
                refused.add(vmid)
                verb = "would be stopped and could not start again" if vmid in restarts else "holds them"
                runs = (
                    "is running"
                    if current.guest_status_known
                    else "may be running (Proxmox's files cannot tell: plan with --local or --api-url to know)"
                )
                found.refuse(
                    None,
                    (
                        f"VM {vmid} {runs} with mapping {mid} ({key}), whose GPU(s) go to a container "
                        f"({owners_text(leaving)}): it {verb}; list it in vms.consumers with when_gpus_leave: "
                        "remove or repoint, or shut it down and change its hostpci lines"
                    ),
                    "vm-mapping",
                )
                break
            missing = no_device(name, view) if g.status != "running" else None
            if missing:
                found.warn(
                    f"VM {vmid} (stopped) cannot start on {view.node}: its {key} names "
                    f"{missing}; Proxmox refuses its start here (PCI device mapping not found)"
                )
    return refused


def check_listed(
    current: CurrentState,
    configs: dict[int, dict[str, Any]],
    view: MapView,
    skip: set[int],
    found: Findings,
) -> None:
    """Refuse the plan when, once it is applied, a mapping still lists a GPU of this node that a
    container gets and a VM of this node names that mapping: verify's ``vm`` check fails on
    exactly that (:mod:`gputopo.verify.vm`), running VM or stopped, since Proxmox could hand the VM
    the container's GPU at its next start. One refusal per mapping, naming its VMs, the GPUs and
    the way out. ``configs``: the VMs' configs after the plan (the consumers' as planned);
    ``skip``: VMs another check refused or that the plan starts (:func:`check_restarts` says why
    those cannot start)."""
    users: dict[str, list[str]] = {}
    for vmid, g in sorted(current.guests.items()):
        if vmid in skip:
            continue
        for key, name in mapping_lines(configs.get(vmid, g.config)):
            mid = view.find(name)
            if mid is not None and view.container_gpus(mid):
                # read from Proxmox's files, whether it runs is not known (nor does it matter here)
                status = f", {g.status}" if current.guest_status_known else ""
                users.setdefault(mid, []).append(f"VM {vmid} ({key}{status})")
    for mid, vms in sorted(users.items()):
        found.refuse(
            None,
            (
                f"mapping {mid} would still list GPU(s) of {view.node} that a container gets "
                f"({owners_text(view.container_gpus(mid))}) while {', '.join(vms)} uses it: verify fails "
                "on it, as Proxmox could give the VM one of them at its start; list it under vms.mappings "
                f"of {view.node} with the GPUs it keeps (gpus: {{addresses: []}} for none), or remove the mapping"
            ),
            "mapping-lists-container-gpus",
        )


def check_restarts(
    starts: list[int], configs: dict[int, dict[str, Any]], view: MapView, found: Findings
) -> None:
    """Refuse the plan when a VM it starts (again) has a mapping line that is unsafe after it."""
    for vmid in starts:
        why = unsafe_start(configs.get(vmid, {}), view)
        if why:
            found.refuse(
                None,
                f"VM {vmid} would be started, but its {why}; the plan never starts such a VM",
                "vm-restart",
            )
