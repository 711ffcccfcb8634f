"""HA placement of VMs whose GPUs come from a mapping that spans several nodes: pure planning,
and the reads and writes it makes through a :class:`gputopo.ports.ClusterApiPort`.

A VM with ``hostpciN: mapping=NAME`` starts only on a node where that mapping has enough
devices; the HA manager, recovering it after a node failure, does not know that. So each
HA-managed VM whose mappings have enough devices on at least two nodes gets a strict placement
on exactly those nodes (the ones with as many mapped GPUs as it uses):

* PVE 9: a node-affinity rule ``gputopo-vm<vmid>`` (``/cluster/ha/rules``: ``type
  node-affinity``, ``resources vm:<vmid>``, ``nodes``, ``strict 1``);
* PVE 8: a restricted HA group ``gputopo-vm<vmid>`` and the resource's ``group`` set to it.

Rules and groups named ``gputopo-*`` are ours: updated when the nodes change, removed when no
longer wanted. A VM that is not HA-managed, or that another rule or group already places, is
left alone with a warning. The changes are data (:class:`HaChange`) with a one-line
``describe``; :func:`ha_files` renders the files before and after for ``diff``.

A node plans the placement of the VMs in its scope (:func:`node_scope`: the VMs anywhere in the
cluster that use a mapping its spec manages, and its own VMs) from its planned map lines and the
other nodes' lines as they are (:func:`plan_placement`); its step
(:class:`gputopo.actions.ha.PlaceHa`) plans again from what it reads right before it writes.
Both here, below planning and the cluster code, so the planner, the step and ``gputopo cluster``
share one set of rules.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import Field

from gputopo.errors import ProxmoxError
from gputopo.formats.hacfg import (
    Section,
    format_node_list,
    node_list,
    resource_list,
    sid_id,
    vm_sid,
    write_section_config,
)
from gputopo.formats.hostpci import hostpci_keys, hostpci_refs
from gputopo.formats.mapline import map_node
from gputopo.model.state import ClusterVm, HaConfig
from gputopo.model.strict import Strict
from gputopo.ports import ClusterApiPort

PREFIX = "gputopo-vm"
RULES = "pve/ha/rules.cfg"
GROUPS = "pve/ha/groups.cfg"
RESOURCES = "pve/ha/resources.cfg"


class Placement(Strict):
    """Where a VM can run: the nodes with as many devices of each of its mappings as it uses."""

    vmid: int
    node: str
    needs: dict[str, int]
    nodes: list[str]


class HaChange(Strict):
    op: Literal[
        "create-rule",
        "update-rule",
        "delete-rule",
        "create-group",
        "update-group",
        "delete-group",
        "set-group",
        "unset-group",
    ]
    id: str
    params: dict[str, Any] = Field(default_factory=dict)

    def describe(self) -> str:
        nodes = self.params.get("nodes")
        what = {
            "create-rule": "create HA rule",
            "update-rule": "update HA rule",
            "delete-rule": "delete HA rule",
            "create-group": "create HA group",
            "update-group": "update HA group",
            "delete-group": "delete HA group",
        }  # set-group and unset-group say more, below
        if self.op == "set-group":
            return f"put HA resource {self.id} in group {self.params['group']}"
        if self.op == "unset-group":
            return f"take HA resource {self.id} out of its group"
        whom = f"{self.params['resources']} " if self.params.get("resources") else ""
        on = f": {whom}on {nodes} (strict)" if nodes else ""
        return f"{what[self.op]} {self.id}{on}"

    def run(self, api: ClusterApiPort) -> None:
        """Carry the change out through the API. Raises ProxmoxError."""
        if self.op == "create-rule":
            api.ha_rule_create(self.id, self.params)
        elif self.op == "update-rule":
            api.ha_rule_update(self.id, self.params)
        elif self.op == "delete-rule":
            api.ha_rule_delete(self.id)
        elif self.op == "create-group":
            api.ha_group_create(self.id, self.params)
        elif self.op == "update-group":
            api.ha_group_update(self.id, self.params)
        elif self.op == "delete-group":
            api.ha_group_delete(self.id)
        elif self.op == "set-group":
            api.ha_resource_update(self.id, {"group": self.params["group"]})
        else:
            api.ha_resource_update(self.id, {"delete": "group"})


# --- reading -----------------------------------------------------------------------------------


def read_ha(api: ClusterApiPort) -> HaConfig:
    """The HA configuration through the API (no members, no VMs). Raises ProxmoxError."""
    release = api.release()
    state = HaConfig(release=release, resources={r["sid"]: r for r in api.ha_resources()})
    if state.uses_rules:
        state.rules = api.ha_rules()
    else:
        state.groups = api.ha_groups()
    return state


def mapped_vms(api: ClusterApiPort, members: list[str]) -> dict[int, ClusterVm]:
    """Every VM of ``members`` whose ``hostpciN`` names a mapping, with its node and those
    values (a config that cannot be read is left out: the VM went away). Raises ProxmoxError."""
    out: dict[int, ClusterVm] = {}
    for node in members:
        for g in api.node_vms(node):
            vmid = int(g["vmid"])
            try:
                cfg = api.vm_config(node, vmid)
            except ProxmoxError:
                continue
            hostpci = [str(cfg[k]) for k in hostpci_keys(cfg)]
            if any(hostpci_refs(h)[1] for h in hostpci):
                out[vmid] = ClusterVm(node=node, hostpci=hostpci)
    return out


def read_ha_config(api: ClusterApiPort) -> tuple[HaConfig | None, str | None]:
    """(the cluster's HA configuration and its VMs with mapped devices, None), (None, None) for
    a node outside a cluster (``GET /nodes`` lists it alone: nothing to place, nothing said), or
    (None, why) when the API refuses the HA reads (a login without ``Sys.Audit`` on ``/``).
    Raises ProxmoxError for any other failure."""
    members = api.nodes()
    if len(members) < 2:
        return None, None
    try:
        config = read_ha(api)
    except ProxmoxError as e:
        if e.status != 403:
            raise
        return None, f"the HA configuration cannot be read ({e.pve_message or e}): it needs Sys.Audit on /"
    config.members = sorted(members)
    config.vms = mapped_vms(api, config.members)
    return config, None


# --- planning ----------------------------------------------------------------------------------


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
    changes: list[HaChange] = []
    warnings: list[str] = []
    ours_wanted: dict[str, Placement] = {}
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
        ours_wanted[f"{PREFIX}{p.vmid}"] = p
    if state.uses_rules:
        have = {r["rule"]: r for r in state.rules if str(r.get("rule", "")).startswith(PREFIX)}
        for rid, p in ours_wanted.items():
            params = _rule_params(p)
            if rid not in have:
                changes.append(HaChange(op="create-rule", id=rid, params=params))
            elif not _rule_same(have[rid], params):
                changes.append(
                    HaChange(
                        op="update-rule", id=rid, params={k: v for k, v in params.items() if k != "type"}
                    )
                )
        changes += [
            HaChange(op="delete-rule", id=rid)
            for rid in sorted(set(have) - set(ours_wanted))
            if _in_scope(rid, scope)
        ]
        return changes, warnings
    have_g = {g["group"]: g for g in state.groups if str(g.get("group", "")).startswith(PREFIX)}
    for gid, p in ours_wanted.items():
        params = {
            "nodes": format_node_list({n: 0 for n in p.nodes}),
            "restricted": True,
            "comment": _rule_params(p)["comment"],
        }
        if gid not in have_g:
            changes.append(HaChange(op="create-group", id=gid, params=params))
        elif node_list(str(have_g[gid].get("nodes", ""))) != node_list(params["nodes"]) or not int(
            have_g[gid].get("restricted", 0)
        ):
            changes.append(HaChange(op="update-group", id=gid, params=params))
        if state.resources[vm_sid(p.vmid)].get("group") != gid:
            changes.append(HaChange(op="set-group", id=vm_sid(p.vmid), params={"group": gid}))
    for gid in sorted(g for g in set(have_g) - set(ours_wanted) if _in_scope(g, scope)):
        for sid, r in sorted(state.resources.items()):
            if r.get("group") == gid:
                changes.append(HaChange(op="unset-group", id=sid))
        changes.append(HaChange(op="delete-group", id=gid))
    return changes, warnings


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


def _text(v: Any) -> str:
    return str(int(v)) if isinstance(v, bool) else str(v)


def apply_changes(state: HaConfig, changes: list[HaChange]) -> HaConfig:
    """``state`` as the API will list it once ``changes`` are made (what a step expects)."""
    out = state.model_copy(deep=True)
    rules = {str(r["rule"]): r for r in out.rules}
    groups = {str(g["group"]): g for g in out.groups}
    for c in changes:
        props = {k: _text(v) for k, v in c.params.items()}
        if c.op == "create-rule":
            rules[c.id] = {"rule": c.id, **props, "strict": int(c.params.get("strict", False))}
        elif c.op == "update-rule":
            rules[c.id].update({**props, "strict": int(c.params.get("strict", False))})
        elif c.op == "delete-rule":
            rules.pop(c.id, None)
        elif c.op == "create-group":
            groups[c.id] = {"group": c.id, "type": "group", **props}
        elif c.op == "update-group":
            groups[c.id].update(props)
        elif c.op == "delete-group":
            groups.pop(c.id, None)
        elif c.op == "set-group":
            out.resources[c.id]["group"] = c.params["group"]
        else:
            out.resources[c.id].pop("group", None)
    out.rules, out.groups = list(rules.values()), list(groups.values())
    return out


def _sections(items: list[dict[str, Any]], type_key: str, id_key: str) -> list[Section]:
    out = []
    for it in items:
        props = {
            k: _text(v)
            for k, v in it.items()
            if k not in (type_key, id_key, "digest", "order", "errors", "sid") and v is not None
        }
        out.append(Section(type=str(it.get(type_key, "group")), id=str(it[id_key]), props=props))
    return out


def ha_files(state: HaConfig, changes: list[HaChange]) -> dict[str, tuple[str | None, str | None]]:
    """path -> (before, after) of the HA files ``changes`` touch, as Proxmox writes them."""
    if not changes:
        return {}
    out: dict[str, tuple[str | None, str | None]] = {}
    if state.uses_rules:
        before = _sections(state.rules, "type", "rule")
        after = {s.id: Section(s.type, s.id, dict(s.props)) for s in before}
        for c in changes:
            if c.op == "delete-rule":
                after.pop(c.id, None)
            else:
                s = after.setdefault(c.id, Section(type="node-affinity", id=c.id))
                s.props.update({k: _text(v) for k, v in c.params.items() if k != "type"})
        out[RULES] = (
            write_section_config(before) or None,
            write_section_config(list(after.values())) or None,
        )
        return out
    groups = _sections([dict(g, type="group") for g in state.groups], "type", "group")
    gafter = {s.id: Section(s.type, s.id, dict(s.props)) for s in groups}
    res = [
        Section(
            type=r.get("type", "vm"),
            id=sid_id(sid),
            props={k: str(v) for k, v in r.items() if k not in ("sid", "type", "digest")},
        )
        for sid, r in state.resources.items()
    ]
    rafter = {s.sid: Section(s.type, s.id, dict(s.props)) for s in res}
    for c in changes:
        if c.op == "delete-group":
            gafter.pop(c.id, None)
        elif c.op in ("create-group", "update-group"):
            g = gafter.setdefault(c.id, Section(type="group", id=c.id))
            g.props.update({k: _text(v) for k, v in c.params.items()})
        elif c.op == "set-group":
            rafter[c.id].props["group"] = c.params["group"]
        elif c.op == "unset-group":
            rafter[c.id].props.pop("group", None)
    out[GROUPS] = (write_section_config(groups) or None, write_section_config(list(gafter.values())) or None)
    out[RESOURCES] = (write_section_config(res) or None, write_section_config(list(rafter.values())) or None)
    return out
