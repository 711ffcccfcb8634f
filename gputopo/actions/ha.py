"""HA placement written by a node's own apply: the ``gputopo-vm<vmid>`` rules (PVE 9) or
groups (PVE 8) of the VMs in the node's scope (:func:`gputopo.plan.ha.node_scope`), and the
changes it makes (:class:`HaChange`: data with a one-line ``describe``, carried out through a
:class:`gputopo.ports.ClusterApiPort`).

The step is planned from the node's planned map lines and the other nodes' lines as they were
read, but what it writes is derived data, like a digest: right before it writes, it reads the
HA configuration, the mappings and the cluster's VM configs again and plans the placement
anew (an earlier node of a rollout may have changed them, or this apply's own mapping and VM
steps did), so it is left out of :meth:`gputopo.plan.model.Plan.signature`. The reads
(:mod:`gputopo.facts.ha`) and the rules (:mod:`gputopo.plan.ha`) it plans with come with the
step context (:class:`gputopo.actions.base.HaRules`). Its before-state
is every rule, group and resource of its scope as it was; its undo puts exactly those back.
Two nodes writing at once (a rollout's batch) may race on one rule or group: a write Proxmox
refuses because the other node made it first is planned again from a fresh read. A login that
may read the HA configuration but not change it gets a warning, and the apply goes on.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from gputopo.actions.base import ActionModel, DiffContext, HaRules, Phase, Resource, StepContext, World
from gputopo.actions.shell import CommandContext, line
from gputopo.errors import ConfigError, ProxmoxError
from gputopo.formats.hacfg import PREFIX, ha_files, text_value, vm_sid
from gputopo.model.state import HaConfig
from gputopo.model.strict import Strict
from gputopo.ports import ClusterApiPort

ATTEMPTS = 10
# what Proxmox answers when another node changed the same rule, group or resource first
# (pve-ha-manager src/PVE/API2/HA/{Rules,Groups}.pm: create dies "... already defined",
# update and delete "no such ha rule|group")
RACED = ("already defined", "no such ha", "does not exist")
RULE_KEYS = ("type", "resources", "nodes", "strict", "comment", "disable")
GROUP_KEYS = ("nodes", "restricted", "nofailback", "comment")


class HaChange(Strict):
    """One change of the HA configuration: ``op`` on the rule, group or resource ``id``, with
    the ``params`` its API call takes."""

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


def apply_changes(state: HaConfig, changes: list[HaChange]) -> HaConfig:
    """``state`` as the API will list it once ``changes`` are made (what a step expects)."""
    out = state.model_copy(deep=True)
    rules = {str(r["rule"]): r for r in out.rules}
    groups = {str(g["group"]): g for g in out.groups}
    for c in changes:
        props = {k: text_value(v) for k, v in c.params.items()}
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


class HaBefore(Strict):
    """The rules, groups and resources' groups of the step's scope before it: id -> what the
    API listed (None: absent); sid -> its group (None: none)."""

    release: int = 0
    rules: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    groups: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    resources: dict[str, str | None] = Field(default_factory=dict)


def _api(ctx: StepContext) -> ClusterApiPort:
    api = ctx.ports.cluster
    if api is None:
        raise ConfigError(
            "HA placement needs the cluster calls of the Proxmox API, which this connection lacks"
        )
    return api


def _rules(ctx: StepContext) -> HaRules:
    if ctx.ha is None:
        raise ConfigError("HA placement needs the HA reads and rules, which this run was built without")
    return ctx.ha


def _props(item: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: item[k] for k in keys if item.get(k) is not None}


def _snapshot(config: HaConfig, ids: set[str], sids: set[str]) -> HaBefore:
    """What ``config`` holds of the rules or groups ``ids`` and the resources ``sids``."""
    rules = {str(r["rule"]): _props(r, RULE_KEYS) for r in config.rules}
    groups = {str(g["group"]): _props(g, GROUP_KEYS) for g in config.groups}
    resources = {sid: r.get("group") for sid, r in config.resources.items()}
    out = HaBefore(release=config.release)
    if config.uses_rules:
        out.rules = {i: rules.get(i) for i in sorted(ids)}
    else:
        out.groups = {i: groups.get(i) for i in sorted(ids)}
        # a resource in one of these groups is changed with it
        sids = sids | {sid for sid, g in resources.items() if g in ids}
        out.resources = {sid: resources[sid] for sid in sorted(sids) if sid in config.resources}
    return out


def _same(have: dict[str, Any] | None, want: dict[str, Any] | None) -> bool:
    if have is None or want is None:
        return have is want
    return {k: text_value(v) for k, v in have.items()} == {k: text_value(v) for k, v in want.items()}


def restore_changes(now: HaConfig, before: HaBefore) -> list[HaChange]:
    """The changes that put ``before``'s rules, groups and resources back, ``now`` being what
    the API lists: groups made again first, then the resources, then the groups deleted."""
    if before.release >= 9 or now.uses_rules:
        have = {str(r["rule"]): _props(r, RULE_KEYS) for r in now.rules}
        out = []
        for rid, was in before.rules.items():
            cur = have.get(rid)
            if was is None and cur is not None:
                out.append(HaChange(op="delete-rule", id=rid))
            elif was is not None and cur is None:
                out.append(HaChange(op="create-rule", id=rid, params=dict(was)))
            elif was is not None and not _same(cur, was):
                out.append(
                    HaChange(op="update-rule", id=rid, params={k: v for k, v in was.items() if k != "type"})
                )
        return out
    have_g = {str(g["group"]): _props(g, GROUP_KEYS) for g in now.groups}
    first, last = [], []
    for gid, was in before.groups.items():
        cur = have_g.get(gid)
        if was is None and cur is not None:
            last.append(HaChange(op="delete-group", id=gid))
        elif was is not None and cur is None:
            first.append(HaChange(op="create-group", id=gid, params=dict(was)))
        elif was is not None and not _same(cur, was):
            first.append(HaChange(op="update-group", id=gid, params=dict(was)))
    middle = []
    for sid, was in before.resources.items():
        if sid not in now.resources or now.resources[sid].get("group") == was:
            continue
        if was is None:
            middle.append(HaChange(op="unset-group", id=sid))
        else:
            middle.append(HaChange(op="set-group", id=sid, params={"group": was}))
    return first + middle + last


def _change_command(c: HaChange) -> str:
    """``pvesh`` for one change: the API call :meth:`HaChange.run` makes (``pvesh`` takes the
    method's parameters as options, booleans as 0/1)."""

    def opts(params: dict[str, Any]) -> list[str]:
        out: list[str] = []
        for k, v in params.items():
            out += [f"--{k}", str(int(v)) if isinstance(v, bool) else str(v)]
        return out

    if c.op == "create-rule":
        return line("pvesh", "create", "/cluster/ha/rules", "--rule", c.id, *opts(c.params))
    if c.op == "update-rule":
        return line("pvesh", "set", f"/cluster/ha/rules/{c.id}", *opts(c.params))
    if c.op == "delete-rule":
        return line("pvesh", "delete", f"/cluster/ha/rules/{c.id}")
    if c.op == "create-group":
        return line("pvesh", "create", "/cluster/ha/groups", "--group", c.id, *opts(c.params))
    if c.op == "update-group":
        return line("pvesh", "set", f"/cluster/ha/groups/{c.id}", *opts(c.params))
    if c.op == "delete-group":
        return line("pvesh", "delete", f"/cluster/ha/groups/{c.id}")
    if c.op == "set-group":
        return line("pvesh", "set", f"/cluster/ha/resources/{c.id}", "--group", c.params["group"])
    return line("pvesh", "set", f"/cluster/ha/resources/{c.id}", "--delete", "group")


class PlaceHa(ActionModel):
    """Place the HA-managed VMs of this node's scope on the nodes that hold their GPUs."""

    kind: Literal["ha_placement"] = "ha_placement"
    phase: Phase = "start"
    node: str
    managed: list[str] = Field(default_factory=list, description="The mappings this node's spec manages")
    release: int = Field(description="The Proxmox VE release planned for: 9 rules, 8 groups")
    changes: list[HaChange] = Field(default_factory=list, description="As planned; written as read again")

    Before: ClassVar[type[HaBefore]] = HaBefore
    counts_as = "HA change"
    in_signature = False

    def describe(self) -> str:
        what = "rules" if self.release >= 9 else "groups"
        if not self.changes:
            return f"HA placement ({what}): planned again from the map lines as they are when it runs"
        return f"HA placement ({what}): " + "; ".join(c.describe() for c in self.changes)

    def _plan_now(self, api: ClusterApiPort, ctx: StepContext) -> tuple[HaConfig, list[HaChange], set[int]]:
        """The HA configuration, the mappings and the cluster's VMs read now, and the changes
        and scope planned from them."""
        rules = _rules(ctx)
        config, maps = rules.read_inputs(api, ctx.ports.proxmox)
        changes, _warnings, scope = rules.plan(self.node, set(self.managed), maps, config)
        return config, changes, scope

    def before(self, ctx: StepContext) -> HaBefore:
        config, changes, scope = self._plan_now(_api(ctx), ctx)
        ids = {f"{PREFIX}{vmid}" for vmid in scope} | {c.id for c in changes if c.id.startswith(PREFIX)}
        sids = {vm_sid(vmid) for vmid in scope} | {
            c.id for c in changes if c.op in ("set-group", "unset-group")
        }
        return _snapshot(config, ids, sids)

    def do(self, ctx: StepContext) -> None:
        api = _api(ctx)
        for attempt in range(ATTEMPTS):
            _config, changes, _scope = self._plan_now(api, ctx)
            try:
                for c in changes:
                    c.run(api)
                return
            except ProxmoxError as e:
                if e.status == 403:
                    # a login that may read HA but not change it (no Sys.Console on /): the
                    # node's other changes stand, the placement is left as it is and said so
                    ctx.warn(f"HA placement not written: {e.pve_message} (it needs Sys.Console on /)")
                    return
                # another node wrote the same rule or group first: read and plan again
                if not any(r in str(e) for r in RACED):
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise ProxmoxError("/cluster/ha", None, f"HA placement still changing after {ATTEMPTS} attempts")

    def undo(self, before: HaBefore, ctx: StepContext) -> str:
        api = _api(ctx)
        now = _rules(ctx).read(api)
        done = []
        for c in restore_changes(now, before):
            c.run(api)
            done.append(c.describe())
        return f"restored HA placement: {'; '.join(done)}" if done else ""

    def undo_restores(self) -> set[Resource]:
        return {Resource("ha", "placement")}

    def expect(self, world: World) -> None:
        if world.current.ha_config is not None:
            world.current.ha_config = apply_changes(world.current.ha_config, self.changes)

    def diff(self, ctx: DiffContext) -> None:
        area = ctx.area("ha placement")
        area.lines += [c.describe() for c in self.changes]
        config = ctx.current.ha_config
        if config is None:
            return
        for path, (old, new) in ha_files(config, self.changes).items():
            area.files[path] = ctx.unified(path, old, new)

    def commands(self, ctx: CommandContext) -> list[str]:
        return [_change_command(c) for c in self.changes]

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        config = ctx.current.ha_config
        if config is None:
            return []
        ids = {c.id for c in self.changes if c.op not in ("set-group", "unset-group")}
        sids = {c.id for c in self.changes if c.op in ("set-group", "unset-group")}
        before = _snapshot(config, ids, sids)
        return [_change_command(c) for c in restore_changes(apply_changes(config, self.changes), before)]

    def signature(self) -> dict[str, Any]:
        # derived data, planned again from what the step reads before it writes
        return {"kind": self.kind}
