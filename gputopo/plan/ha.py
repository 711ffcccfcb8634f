"""HA placement of VMs whose GPUs come from a mapping that spans several nodes: the rules, pure.

A VM with ``hostpciN: mapping=NAME`` starts only on a node where that mapping has enough
devices; the HA manager, recovering it after a node failure, does not know that. So each
HA-managed VM whose mappings have enough devices on at least two nodes gets a strict placement
on exactly those nodes (the ones with as many mapped GPUs as it uses):

* PVE 9: a node-affinity rule ``gputopo-vm<vmid>`` (``/cluster/ha/rules``: ``type
  node-affinity``, ``resources vm:<vmid>``, ``nodes``, ``strict 1``);
* PVE 8: a restricted HA group ``gputopo-vm<vmid>`` and the resource's ``group`` set to it.

Rules and groups named ``gputopo-*`` are ours: updated when the nodes change, removed when no
longer wanted. A VM that is not HA-managed, or that another rule or group already places, is
left alone with a warning. The changes are :class:`gputopo.actions.ha.HaChange` data.

A node places the VMs of its scope (:func:`node_scope`: the VMs anywhere in the cluster that use
a mapping its spec manages, and its own VMs) from its planned map lines and the other nodes'
lines as they are (:func:`plan_placement`); :func:`ha_step` makes its plan's step
(:class:`gputopo.actions.ha.PlaceHa`), which plans again with the same rules right before it
writes (from what :mod:`gputopo.facts.ha` reads then). ``gputopo cluster`` uses them too
(:mod:`gputopo.cluster.ha`): one set of rules. The files before and after are
:func:`gputopo.formats.hacfg.ha_files`.

On a member of a cluster whose HA configuration was read (``CurrentState.ha_config``), the
node's step places its scope's VMs on the nodes whose map lines hold their GPUs: this node's
lines as planned, every other node's as they are now, this node's VMs with their configs as
planned. A node outside a cluster gets no step and no word; one whose login may not read the
HA configuration gets no step and a warning.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gputopo.actions.ha import HaChange, PlaceHa
from gputopo.formats.hacfg import PREFIX, format_node_list, node_list, resource_list, vm_sid
from gputopo.formats.hostpci import hostpci_keys, hostpci_refs
from gputopo.formats.mapline import map_node
from gputopo.model.state import CurrentState, HaConfig
from gputopo.model.strict import Strict
from gputopo.plan.findings import Findings
from gputopo.plan.hamove import held_moves
from gputopo.plan.model import MappingTarget


class Placement(Strict):
    """Where a VM can run: the nodes with as many devices of each of its mappings as it uses."""

    vmid: int
    node: str
    needs: dict[str, int]
    nodes: list[str]


def placements(
    vms: dict[int, tuple[str, list[str]]], mappings: dict[str, list[str]], order: list[str]
) -> list[Placement]:
    """Where each VM (vmid -> (its node, its ``hostpciN`` values)) can run, from the mappings as
    they will be (``mappings``: id -> every node's map lines) over the nodes in ``order``. VMs
    without a mapped device are left out."""
    per_node = {mid: Counter(map_node(e) for e in lines) for mid, lines in mappings.items()}
    out = []
    for vmid, (node, hostpci) in sorted(vms.items()):
        needs = Counter(m for m in (hostpci_refs(h)[1] for h in hostpci) if m)
        if not needs:
            continue
        nodes = [n for n in order if all(per_node.get(m, Counter())[n] >= k for m, k in needs.items())]
        out.append(Placement(vmid=vmid, node=node, needs=dict(needs), nodes=nodes))
    return out


def node_scope(node: str, managed: set[str], vms: dict[int, tuple[str, list[str]]]) -> set[int]:
    """The VMs a node's HA step places: those anywhere that use a mapping of ``managed`` (the
    mappings its spec manages), and its own VMs with a mapped device."""
    out = set()
    for vmid, (where, hostpci) in vms.items():
        used = {m for m in (hostpci_refs(h)[1] for h in hostpci) if m}
        if used and (where == node or used & managed):
            out.add(vmid)
    return out


def plan_placement(
    node: str,
    managed: set[str],
    mappings: dict[str, list[str]],
    config: HaConfig,
    own: dict[int, list[str]] | None = None,
) -> tuple[list[HaChange], list[str], set[int]]:
    """(changes, warnings, the VMs in scope) of ``node``'s HA step: the placement of
    :func:`node_scope`'s VMs from ``mappings`` (id -> the map lines as they will be) over the
    cluster's members, against ``config``. ``own`` (vmid -> hostpciN values) replaces what
    ``config`` holds for this node's VMs (their configs as planned, or read just now)."""
    vms = {vmid: (v.node, list(v.hostpci)) for vmid, v in config.vms.items()}
    if own is not None:
        vms = {vmid: v for vmid, v in vms.items() if v[0] != node}
        vms.update({vmid: (node, list(hostpci)) for vmid, hostpci in own.items()})
    scope = node_scope(node, managed, vms)
    picked = {vmid: vms[vmid] for vmid in scope}
    changes, warnings = ha_changes(placements(picked, mappings, config.members), config, scope=scope)
    return changes, warnings, scope


def _rule_params(p: Placement) -> dict[str, Any]:
    maps = ", ".join(sorted(p.needs))
    return {
        "type": "node-affinity",
        "resources": vm_sid(p.vmid),
        "nodes": format_node_list({n: 0 for n in p.nodes}),
        "strict": True,
        "comment": f"gputopo: nodes with the GPUs of mapping {maps}",
    }


def ha_changes(
    wanted: list[Placement], state: HaConfig, scope: set[int] | None = None
) -> tuple[list[HaChange], list[str]]:
    """The changes that make the HA configuration place ``wanted`` VMs, and warnings.

    Only placements of VMs in ``scope`` (None: every VM) are removed when no longer wanted: a
    run over some nodes leaves the other nodes' VMs as they are.
    """
    ours, warnings = _ours_wanted(wanted, state)
    changes = _rule_changes(ours, state, scope) if state.uses_rules else _group_changes(ours, state, scope)
    return held_moves(changes, state, warnings)


def _ours_wanted(wanted: list[Placement], state: HaConfig) -> tuple[dict[str, Placement], list[str]]:
    """Our rule or group id -> the placement it stands for, of each VM that can run on two nodes
    or more, is HA-managed and is placed by nothing else; warnings for the others."""
    warnings: list[str] = []
    ours: dict[str, Placement] = {}
    for p in wanted:
        sid = vm_sid(p.vmid)
        if len(p.nodes) < 2:
            continue
        if sid not in state.resources:
            warnings.append(
                f"VM {p.vmid}: its GPUs can run on {', '.join(p.nodes)} but it is not HA-managed; "
                f"no placement rule (ha-manager add {sid})"
            )
            continue
        other = _placed_elsewhere(sid, state)
        if other:
            warnings.append(
                f"VM {p.vmid}: {other} already places it; not adding a placement for {', '.join(p.nodes)}"
            )
            continue
        ours[f"{PREFIX}{p.vmid}"] = p
    return ours, warnings


def _rule_changes(ours: dict[str, Placement], state: HaConfig, scope: set[int] | None) -> list[HaChange]:
    """PVE 9: our node-affinity rules created, updated, and deleted where no longer wanted."""
    changes: list[HaChange] = []
    have = {r["rule"]: r for r in state.rules if str(r.get("rule", "")).startswith(PREFIX)}
    for rid, p in ours.items():
        params = _rule_params(p)
        if rid not in have:
            changes.append(HaChange(op="create-rule", id=rid, params=params))
        elif not _rule_same(have[rid], params):
            changes.append(
                HaChange(op="update-rule", id=rid, params={k: v for k, v in params.items() if k != "type"})
            )
    changes += [
        HaChange(op="delete-rule", id=rid) for rid in sorted(set(have) - set(ours)) if _in_scope(rid, scope)
    ]
    return changes


def _group_changes(ours: dict[str, Placement], state: HaConfig, scope: set[int] | None) -> list[HaChange]:
    """PVE 8: our restricted groups created or updated and the resources put in them; the
    groups no longer wanted emptied and deleted."""
    changes: list[HaChange] = []
    have = {g["group"]: g for g in state.groups if str(g.get("group", "")).startswith(PREFIX)}
    for gid, p in ours.items():
        params = {
            "nodes": format_node_list({n: 0 for n in p.nodes}),
            "restricted": True,
            "comment": _rule_params(p)["comment"],
        }
        if gid not in have:
            changes.append(HaChange(op="create-group", id=gid, params=params))
        elif node_list(str(have[gid].get("nodes", ""))) != node_list(params["nodes"]) or not int(
            have[gid].get("restricted", 0)
        ):
            changes.append(HaChange(op="update-group", id=gid, params=params))
        if state.resources[vm_sid(p.vmid)].get("group") != gid:
            changes.append(HaChange(op="set-group", id=vm_sid(p.vmid), params={"group": gid}))
    for gid in sorted(g for g in set(have) - set(ours) if _in_scope(g, scope)):
        for sid, r in sorted(state.resources.items()):
            if r.get("group") == gid:
                changes.append(HaChange(op="unset-group", id=sid))
        changes.append(HaChange(op="delete-group", id=gid))
    return changes


def _in_scope(rid: str, scope: set[int] | None) -> bool:
    vmid = rid[len(PREFIX) :]
    return scope is None or (vmid.isdigit() and int(vmid) in scope)


def _placed_elsewhere(sid: str, state: HaConfig) -> str | None:
    if state.uses_rules:
        for r in state.rules:
            if (
                r.get("type") == "node-affinity"
                and not str(r.get("rule", "")).startswith(PREFIX)
                and not int(r.get("disable", 0))
                and sid in resource_list(str(r.get("resources", "")))
            ):
                return f"HA rule {r['rule']}"
        return None
    group = state.resources.get(sid, {}).get("group")
    return f"HA group {group}" if group and not str(group).startswith(PREFIX) else None


def _rule_same(have: dict[str, Any], params: dict[str, Any]) -> bool:
    return (
        node_list(str(have.get("nodes", ""))) == node_list(params["nodes"])
        and resource_list(str(have.get("resources", ""))) == resource_list(params["resources"])
        and bool(int(have.get("strict", 0))) == params["strict"]
    )


def ha_step(
    node: str,
    mappings: dict[str, MappingTarget],
    current: CurrentState,
    configs: dict[int, dict[str, Any]],
    found: Findings,
    changing: bool = False,
) -> PlaceHa | None:
    """The node's HA placement step, its warnings added to ``found``. ``mappings``: the
    mappings its spec manages, as planned; ``configs``: its VMs' configs as planned (vmid ->
    config; the others as they are). None when nothing changes, unless ``changing`` (the plan
    writes map lines or VM configs): then the step is there even with no change as the other
    nodes' lines are now, since a node of the same rollout that applies at the same time may
    write its lines before this step runs, and each step plans again from what it reads then
    (of two nodes applying at once, the later HA step sees both nodes' lines)."""
    if current.ha_unread:
        found.warn(f"HA placement left alone: {current.ha_unread}")
    config = current.ha_config
    if config is None:
        return None
    lines = {mid: list(m.map) for mid, m in current.mappings.items()}
    for mid, target in mappings.items():
        others = [e for e in lines.get(mid, []) if map_node(e) != node]
        lines[mid] = others + [e for e in target.map if map_node(e) == node]
    own = {}
    for vmid, g in current.guests.items():
        cfg = configs.get(vmid, g.config)
        own[vmid] = [str(cfg[k]) for k in hostpci_keys(cfg)]
    changes, warnings, _scope = plan_placement(node, set(mappings), lines, config, own)
    for w in warnings:
        found.warn(w)
    if not changes and not changing:
        return None
    return PlaceHa(node=node, managed=sorted(mappings), release=config.release, changes=changes)


def ha_container_stop_warning(vmid: int, timeout: int) -> str:
    """What a plan that stops HA-managed container ``vmid`` warns: the HA manager shuts it down
    without force (pve-ha-manager src/PVE/HA/Resources/PVECT.pm l.85-105 passes the timeout only;
    pve-container API2/LXC/Status.pm l.364-375 hands an HA container's shutdown to ``hastop``
    without ``forceStop``), and one that outlasts the timeout puts its service in the manager's
    ``error`` state while it runs (src/PVE/HA/Manager.pm l.1199-1217)."""
    sid = f"ct:{vmid}"
    return (
        f"CT {vmid} is HA-managed ({sid}): the HA manager shuts it down without force, so "
        f"policy.force_stop does not apply to it; if it is not down within {timeout} s, {sid} "
        "enters the HA manager's error state while it keeps running and apply stops there "
        f"(exit 3; then fix it, 'ha-manager set {sid} --state disabled', '--state started')"
    )
