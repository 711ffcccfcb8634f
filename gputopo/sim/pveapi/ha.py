"""The HA manager's API of the simulated cluster: rules (PVE 9), groups (PVE 8) and resources.

Modelled on pve-ha-manager's src/PVE/API2/HA/{Rules,Groups,Resources}.pm: the files
``ha/rules.cfg``, ``ha/groups.cfg`` and ``ha/resources.cfg`` of the shared pve root (written
with :mod:`gputopo.formats.hacfg`), changed under the cluster lock ``domain-ha``
(``PVE::HA::Config::lock_ha_domain``). What a release answers:

* PVE 9 serves ``/cluster/ha/rules``; its groups calls die with ``ha groups have been migrated
  to rules`` once ``groups.cfg`` holds no group (``have_groups_been_migrated``);
* PVE 8 has no rules API (501, as for any unknown path) and serves the groups.

A rule may only name HA-managed resources (``cannot use unmanaged resource(s) vm:201.``) and
existing nodes; a resource in two node-affinity rules is an infeasible rule (400 ``Rule 'x' is
invalid.`` with ``resources: resource 'vm:201' is already used in another node affinity rule``).
"""

from __future__ import annotations

import re
from typing import Any

from gputopo.formats.hacfg import (
    Section,
    format_node_list,
    node_list,
    parse_section_config,
    resource_list,
    write_section_config,
)
from gputopo.formats.propstring import sha1_digest
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.pveapi.answers import ApiError, die
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.cfslock import cfs_lock
from gputopo.sim.pveapi.harules import next_round

RULE_KEYS = ("resources", "nodes", "strict", "comment", "disable")
GROUP_KEYS = ("nodes", "restricted", "nofailback", "comment")
RESOURCE_KEYS = ("state", "group", "comment", "failback", "max_restart", "max_relocate")
_INT_RESOURCE_KEYS = ("failback", "max_restart", "max_relocate")


class HaHandlers:
    """HA handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    # -- files --

    def _ha_read(self, name: str) -> tuple[str, list[Section]]:
        try:
            text = (self.pve_root / "ha" / name).read_text()
        except FileNotFoundError:
            text = ""
        return text, parse_section_config(text)

    def _ha_write(self, name: str, sections: list[Section]) -> None:
        (self.pve_root / "ha").mkdir(exist_ok=True)
        atomic_write(self.pve_root / "ha" / name, write_section_config(sections), PMXCFS_MODE)
        next_round(self)  # the CRM acts on the change on its next round (harules.py)

    def _ha_lock(self, what: str):
        return cfs_lock(self.pve_root, "domain-ha", what, on_wait=self.print_stderr)

    def _pve_major(self) -> int:
        return int(self.version.split(".")[0])

    def _groups_migrated(self) -> bool:
        return not any(s.type == "group" for s in self._ha_read("groups.cfg")[1])

    def _need_rules(self, method: str, path: str) -> None:
        if self._pve_major() < 9:
            raise ApiError(501, f"Method '{method} {path}' not implemented")

    # -- rules (PVE 9) --

    def _rule_item(self, s: Section, digest: str, order: int) -> dict[str, Any]:
        item: dict[str, Any] = {"rule": s.id, "type": s.type, "digest": digest, "order": order}
        for k, v in s.props.items():
            item[k] = int(v) if k in ("strict", "disable") else v
        return item

    def h_ha_rules(self, caller: Caller, p: dict) -> Any:
        self._need_rules("GET", "/cluster/ha/rules")
        text, rules = self._ha_read("rules.cfg")
        return [
            self._rule_item(s, sha1_digest(text), i)
            for i, s in enumerate(rules, 1)
            if p.get("type") in (None, s.type)
        ]

    def h_ha_rule_get(self, caller: Caller, p: dict) -> Any:
        self._need_rules("GET", f"/cluster/ha/rules/{p['rule']}")
        text, rules = self._ha_read("rules.cfg")
        for i, s in enumerate(rules, 1):
            if s.id == p["rule"]:
                return self._rule_item(s, sha1_digest(text), i)
        raise die(f"no such ha rule '{p['rule']}'")

    def _check_rule(self, s: Section, rules: list[Section]) -> None:
        managed = {r.sid for r in self._ha_read("resources.cfg")[1]}
        sids = resource_list(s.props.get("resources", ""))
        if not sids:
            raise die("no resources were specified")
        unmanaged = [sid for sid in sids if sid not in managed]
        if unmanaged:
            raise die(f"cannot use unmanaged resource(s) {', '.join(unmanaged)}.")
        if s.type == "node-affinity":
            nodes = node_list(s.props.get("nodes", ""))
            if not nodes:
                raise die("no nodes were specified")
            missing = [n for n in sorted(nodes) if n not in self.members()]
            if missing:
                raise die(f"cannot use non-existent node(s) {', '.join(missing)}.")
            for other in rules:
                if other.id == s.id or other.type != "node-affinity" or other.props.get("disable") == "1":
                    continue
                both = sorted(set(sids) & set(resource_list(other.props.get("resources", ""))))
                if both:
                    raise ApiError(
                        400,
                        f"Rule '{s.id}' is invalid.\n",
                        {"resources": f"resource '{both[0]}' is already used in another node affinity rule"},
                    )

    def _rule_props(self, p: dict, s: Section) -> None:
        for key in RULE_KEYS:
            if key not in p:
                continue
            value = p[key]
            if key == "nodes":
                value = format_node_list(node_list(value))
            elif key == "resources":
                value = ",".join(resource_list(value))
            elif key in ("strict", "disable"):
                value = "1" if value else "0"
            s.props[key] = str(value)
        if s.props.get("disable") == "0":
            del s.props["disable"]  # API2/HA/Rules.pm: delete $param->{disable} if !$param->{disable}

    def h_ha_rule_create(self, caller: Caller, p: dict) -> Any:
        self._need_rules("POST", "/cluster/ha/rules")
        with self._lock, self._ha_lock("create ha rule failed"):
            _, rules = self._ha_read("rules.cfg")
            if any(s.id == p["rule"] for s in rules):
                raise die(f"create ha rule failed: HA rule '{p['rule']}' already defined")
            s = Section(type=p["type"], id=p["rule"])
            self._rule_props(p, s)
            self._check_rule(s, rules)
            self._ha_write("rules.cfg", rules + [s])
        return None

    def h_ha_rule_update(self, caller: Caller, p: dict) -> Any:
        self._need_rules("PUT", f"/cluster/ha/rules/{p['rule']}")
        with self._lock, self._ha_lock("update HA rules failed"):
            text, rules = self._ha_read("rules.cfg")
            if p.get("digest") and p["digest"] != sha1_digest(text):
                raise die(
                    "update HA rules failed: detected modified configuration - file changed by other user? "
                    "Try again."
                )
            s = next((r for r in rules if r.id == p["rule"]), None)
            if s is None:
                raise die(f"update HA rules failed: HA rule '{p['rule']}' does not exist")
            for key in p.get("delete", []):
                s.props.pop(key, None)
            self._rule_props(p, s)
            self._check_rule(s, rules)
            self._ha_write("rules.cfg", rules)
        return None

    def h_ha_rule_delete(self, caller: Caller, p: dict) -> Any:
        self._need_rules("DELETE", f"/cluster/ha/rules/{p['rule']}")
        with self._lock, self._ha_lock("delete ha rule failed"):
            _, rules = self._ha_read("rules.cfg")
            self._ha_write("rules.cfg", [s for s in rules if s.id != p["rule"]])
        return None

    # -- groups (PVE 8) --

    def h_ha_groups(self, caller: Caller, p: dict) -> Any:
        if self._pve_major() >= 9 and self._groups_migrated():
            raise die("cannot index groups: ha groups have been migrated to rules")
        text, groups = self._ha_read("groups.cfg")
        digest = sha1_digest(text)
        return [
            {
                "group": g.id,
                "type": "group",
                "digest": digest,
                **{k: int(v) if k in ("restricted", "nofailback") else v for k, v in g.props.items()},
            }
            for g in groups
            if g.type == "group"
        ]

    def _group_props(self, p: dict, g: Section) -> None:
        for key in GROUP_KEYS:
            if key in p:
                value = p[key]
                if key == "nodes":
                    value = format_node_list(node_list(value))
                elif key in ("restricted", "nofailback"):
                    value = "1" if value else "0"
                g.props[key] = str(value)

    def h_ha_group_create(self, caller: Caller, p: dict) -> Any:
        if self._pve_major() >= 9 and self._groups_migrated():
            raise die("cannot create group: ha groups have been migrated to rules")
        with self._lock, self._ha_lock("create ha group failed"):
            _, groups = self._ha_read("groups.cfg")
            if any(g.id == p["group"] for g in groups):
                raise die(f"create ha group failed: ha group ID '{p['group']}' already defined")
            g = Section(type="group", id=p["group"])
            self._group_props(p, g)
            self._ha_write("groups.cfg", groups + [g])
        return None

    def h_ha_group_update(self, caller: Caller, p: dict) -> Any:
        if self._pve_major() >= 9 and self._groups_migrated():
            raise die("cannot update group: ha groups have been migrated to rules")
        with self._lock, self._ha_lock("update ha group failed"):
            text, groups = self._ha_read("groups.cfg")
            if p.get("digest") and p["digest"] != sha1_digest(text):
                raise die(
                    "update ha group failed: detected modified configuration - file changed by other user? "
                    "Try again."
                )
            g = next((x for x in groups if x.id == p["group"]), None)
            if g is None:
                raise die(f"update ha group failed: no such ha group '{p['group']}'")
            for key in p.get("delete", []):
                g.props.pop(key, None)
            self._group_props(p, g)
            self._ha_write("groups.cfg", groups)
        return None

    def h_ha_group_delete(self, caller: Caller, p: dict) -> Any:
        with self._lock, self._ha_lock("delete ha group failed"):
            _, groups = self._ha_read("groups.cfg")
            users = [r.sid for r in self._ha_read("resources.cfg")[1] if r.props.get("group") == p["group"]]
            if users:
                raise die(f"delete ha group failed: ha group is used by service '{users[0]}'")
            self._ha_write("groups.cfg", [g for g in groups if g.id != p["group"]])
        return None

    # -- resources --

    def _resource_item(self, r: Section, digest: str) -> dict[str, Any]:
        item: dict[str, Any] = {"sid": r.sid, "type": r.type, "digest": digest, "state": "started"}
        item.update(r.props)
        return item

    def h_ha_resources(self, caller: Caller, p: dict) -> Any:
        text, resources = self._ha_read("resources.cfg")
        return [self._resource_item(r, sha1_digest(text)) for r in resources]

    def _parse_sid(self, sid: str) -> tuple[str, str]:
        """Config.pm parse_sid, after the schema's format (Tools.pm
        pve_verify_ha_resource_or_vm_id): ``type:name``, or a bare VMID whose type the cluster's
        guest list gives. Raises the API's 400 or the parse's die."""
        if not re.match(r"^([a-z]+:\S+|\d+)$", sid):
            raise ApiError(
                400,
                "Parameter verification failed.\n",
                {"sid": "value does not look like a valid ha resource id"},
            )
        if sid.isdigit():
            found = sorted(self.pve_root.glob(f"nodes/*/lxc/{sid}.conf")) + sorted(
                self.pve_root.glob(f"nodes/*/qemu-server/{sid}.conf")
            )
            if not found:
                raise die(f"unable to detect SID from VMID - VM/CT {sid} does not exist")
            return ("ct" if found[0].parent.name == "lxc" else "vm"), sid
        kind, _, vmid = sid.partition(":")
        if kind not in ("vm", "ct") or not vmid.isdigit():
            # PVE::HA::Resources->lookup($type) finds no plugin (Resources.pm create/update)
            raise ApiError(
                400, "Parameter verification failed.\n", {"sid": f"unable to parse HA resource id '{sid}'"}
            )
        return kind, vmid

    def h_ha_resource_get(self, caller: Caller, p: dict) -> Any:
        """GET /cluster/ha/resources/{sid} (API2/HA/Resources.pm read): the section's own keys
        (no defaults filled in), ``sid``, ``type`` and the file's ``digest``; an unknown sid
        dies ``no such resource 'ct:N'`` ($api_copy_config); ``group`` is left out once the
        groups were migrated to rules."""
        kind, vmid = self._parse_sid(p["sid"])
        text, resources = self._ha_read("resources.cfg")
        r = next((x for x in resources if x.sid == f"{kind}:{vmid}"), None)
        if r is None:
            raise die(f"no such resource '{kind}:{vmid}'")
        item: dict[str, Any] = {"sid": r.sid, "type": r.type, "digest": sha1_digest(text)}
        item.update({k: int(v) if k in _INT_RESOURCE_KEYS else v for k, v in r.props.items()})
        if self._pve_major() >= 9 and self._groups_migrated():
            item.pop("group", None)
        return item

    def h_ha_resource_delete(self, caller: Caller, p: dict) -> Any:
        """DELETE /cluster/ha/resources/{sid} (API2/HA/Resources.pm delete): an unknown sid dies
        ``cannot delete service 'ct:N', not HA managed!``; else the section goes under the HA
        lock (Config.pm delete_service_from_config, ``delete resource failed``) and, with
        ``purge`` (default 1, PVE 9.1 on), the sid leaves every rule, a rule left empty with it."""
        kind, vmid = self._parse_sid(p["sid"])
        sid = f"{kind}:{vmid}"
        if not any(x.sid == sid for x in self._ha_read("resources.cfg")[1]):
            raise die(f"cannot delete service '{sid}', not HA managed!")
        purge = p.get("purge", True) and tuple(int(x) for x in self.version.split(".")[:2]) >= (9, 1)
        with self._lock, self._ha_lock("delete resource failed"):
            _, resources = self._ha_read("resources.cfg")
            self._ha_write("resources.cfg", [x for x in resources if x.sid != sid])
            if purge:
                _, rules = self._ha_read("rules.cfg")
                kept = []
                for rule in rules:
                    left = [x for x in resource_list(rule.props.get("resources", "")) if x != sid]
                    if left:
                        rule.props["resources"] = ",".join(left)
                        kept.append(rule)
                self._ha_write("rules.cfg", kept)
        return None

    def h_ha_resource_create(self, caller: Caller, p: dict) -> Any:
        kind, vmid = self._parse_sid(p["sid"])
        with self._lock, self._ha_lock("create resource failed"):
            _, resources = self._ha_read("resources.cfg")
            if any(r.sid == f"{kind}:{vmid}" for r in resources):
                raise die(f"create resource failed: resource ID '{kind}:{vmid}' already defined")
            r = Section(type=kind, id=vmid)
            r.props.update({k: str(p[k]) for k in RESOURCE_KEYS if k in p})
            self._ha_write("resources.cfg", resources + [r])
        return None

    def h_ha_resource_update(self, caller: Caller, p: dict) -> Any:
        """PUT /cluster/ha/resources/{sid} (API2/HA/Resources.pm update), in the source's order:
        the group named (migrated to rules, does not exist), the service's error state
        (check_service_state: only ``state disabled`` passes), then under the HA lock
        (Config.pm update_resources_config, ``update resources config failed: ...``) the
        digest and the resource itself (``no such resource 'ct:N'``)."""
        kind, vmid = self._parse_sid(p["sid"])
        sid = f"{kind}:{vmid}"
        if p.get("group"):
            _, groups = self._ha_read("groups.cfg")
            if self._pve_major() >= 9 and self._groups_migrated():
                raise die("invalid parameter 'group': ha groups have been migrated to rules")
            if not any(g.id == p["group"] and g.type == "group" for g in groups):
                raise die(f"HA group '{p['group']}' does not exist")
        managed = any(x.sid == sid for x in self._ha_read("resources.cfg")[1])
        if (
            managed
            and self._ha_service_state("lxc" if kind == "ct" else "qemu", int(vmid), sid) == "error"
            and p.get("state") != "disabled"
        ):
            raise die(f"service '{sid}' in error state, must be disabled and fixed first")
        with self._lock, self._ha_lock("update resources config failed"):
            text, resources = self._ha_read("resources.cfg")
            if p.get("digest") and p["digest"] != sha1_digest(text):
                raise die(
                    "update resources config failed: detected modified configuration - file changed by "
                    "other user? Try again."
                )
            r = next((x for x in resources if x.sid == sid), None)
            if r is None:
                raise die(f"update resources config failed: no such resource '{sid}'")
            was = r.props.get("state", "started")
            for key in p.get("delete", []):
                r.props.pop(key, None)
            r.props.update({k: str(p[k]) for k in RESOURCE_KEYS if k in p})
            self._ha_write("resources.cfg", resources)
            # the CRM moves the guest to the new requested state on its next rounds
            self.ha_requested_changed(sid, was, r.props.get("state", "started"))
        return None
