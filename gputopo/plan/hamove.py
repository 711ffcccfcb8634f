"""HA placement never asks the HA manager to move a running VM with passthrough: the check, pure.

A strict node-affinity rule (PVE 9) or a restricted group (PVE 8) takes effect on the CRM's
next round: a service in state ``started`` running on a node the rule or group no longer allows
is sent to migrate (pve-ha-manager src/PVE/HA/Manager.pm next_state_started, about
l.1534-1548, ``select_service_node``). For a VM with passthrough that is an online migration
qemu-server refuses (src/PVE/QemuMigrate.pm prepare, ``PVE::QemuMigrate::Helpers::
check_local_resources``: ``can't live migrate running VM which uses following mapped
devices``), which the CRM sends again every round (Manager.pm next_state_migrate_relocate puts
the service back to ``started`` on its node).

gputopo's placement (:mod:`gputopo.plan.ha`) names the nodes whose map lines hold a VM's GPUs;
a VM of another node that runs while its node's lines no longer hold its GPUs (an operator
took them, or that node's apply did) would be placed away from the node it runs on. Such a
rule or group change is held back: the placement stays as it is, with a warning that names
the VM, its node and what to do first.
"""

from __future__ import annotations

from gputopo.actions.ha import HaChange
from gputopo.formats.hacfg import node_list, resource_list, vm_sid
from gputopo.model.state import HaConfig

# the changes that decide where a resource may run, and the ones that only follow them
_PLACING = ("create-rule", "update-rule", "create-group", "update-group")


def _sids(change: HaChange, changes: list[HaChange], state: HaConfig) -> list[str]:
    """The resources ``change`` places: a rule's own, or those in (or put in) the group."""
    if change.op.endswith("-rule"):
        return resource_list(str(change.params.get("resources", "")))
    put = {c.id for c in changes if c.op == "set-group" and c.params.get("group") == change.id}
    now = {sid for sid, r in state.resources.items() if r.get("group") == change.id}
    return sorted(put | now)


def _moved(sid: str, nodes: dict[str, int], state: HaConfig) -> str | None:
    """Why placing ``sid`` on ``nodes`` would send a running passthrough VM away, or None."""
    if not sid.startswith("vm:") or not sid[3:].isdigit():
        return None
    vm = state.vms.get(int(sid[3:]))
    requested = str(state.resources.get(sid, {}).get("state") or "started")
    if vm is None or not vm.running or requested not in ("started", "enabled") or vm.node in nodes:
        return None
    return vm.node


def held_moves(
    changes: list[HaChange], state: HaConfig, warnings: list[str]
) -> tuple[list[HaChange], list[str]]:
    """``changes`` without those that would leave a running VM with passthrough on a node its
    rule or group no longer allows (and, for a group, the resources it would take), and
    ``warnings`` with one line for each VM held."""
    held: set[str] = set()
    out_warnings = list(warnings)
    for c in changes:
        if c.op not in _PLACING or "nodes" not in c.params:
            continue
        nodes = node_list(str(c.params["nodes"]))
        for sid in _sids(c, changes, state):
            node = _moved(sid, nodes, state)
            if node is None:
                continue
            held.add(c.id)
            vmid = sid[3:]
            out_warnings.append(
                f"VM {vmid} runs on {node} with its GPUs passed through, but HA {c.id} would allow "
                f"only {', '.join(sorted(nodes))}: the HA manager would try to migrate it, which fails "
                f"for a running VM with passthrough and is retried every round; left as it is: stop "
                f"VM {vmid} (ha-manager set {vm_sid(int(vmid))} --state stopped) or give {node} its "
                f"mapping lines back, then apply again"
            )
    kept = [c for c in changes if c.id not in held and c.params.get("group") not in held]
    return kept, out_warnings
