"""The HA manager's placement rules taking effect: one CRM round of them over the cluster.

What a real CRM does on each round (pve-ha-manager src/PVE/HA/Manager.pm next_state_started,
about l.1508-1548): for a service in state ``started`` it asks ``select_service_node`` where
the service should run; when that is another node it sends the service to ``migrate`` (a VM:
``migrate service 'vm:201' to node 'pve2' (running)``) or ``relocate`` (a container: stop,
move, start there). Where it may run comes from

* PVE 9: a node-affinity rule of ``rules.cfg`` naming the service (src/PVE/HA/Rules/NodeAffinity.pm
  plugin_compile, get_node_affinity): its nodes with their priorities; a rule that is not
  ``strict`` adds every other node with priority -1; a ``disable``\\ d rule counts for nothing;
* PVE 8: the service's ``group`` in ``groups.cfg`` (Manager.pm get_service_group,
  get_node_priority_groups): its nodes with their priorities, every other node with priority -1
  unless the group is ``restricted``;

and ``select_service_node`` (Manager.pm): only online nodes count; the service stays where it
is when that node is among the highest priority, or, without failback (``failback 0`` on the
resource in PVE 9, ``nofailback 1`` on the group in PVE 8), anywhere it is allowed; else the
first of the highest priority nodes (by the nodes' usage scores, then by name; here every
node scores the same, so by name).

The move itself, as the LRM carries it out:

* a running VM migrates online (src/PVE/HA/Resources/PVEVM.pm migrate); qemu-server refuses
  a running VM with passthrough (src/PVE/QemuMigrate.pm prepare with
  ``PVE::QemuMigrate::Helpers::check_local_resources``: ``can't migrate VM which uses local
  devices: hostpci0`` for a ``host=`` device, ``can't migrate to 'pve2': missing mapped devices
  hostpci0`` for a mapping without lines there, ``can't live migrate running VM which uses
  following mapped devices: hostpci0:NAME`` for a mapping that is not live-migration-capable);
  the CRM logs ``service 'vm:201' - migration failed (exit code 1)``, puts the service back to
  ``started`` on its node (Manager.pm next_state_migrate_relocate) and, the rule unchanged,
  sends it again on the next round: a failed migration retried every round;
* a container relocates (src/PVE/HA/Resources/PVECT.pm migrate: shut down, moved offline,
  started on the target by the CRM).

Each move the CRM sent is recorded in the run state of the node the guest was on
(:data:`MOVES`: sid, op, node, target, error), so a test can tell whether anything asked HA
to move a guest. A round runs at most once per CRM delay (latency ``ha.crm``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from gputopo.formats.hacfg import Section, node_list, parse_section_config, resource_list
from gputopo.sim import state

MOVES = "ha-moves"
LAST_ROUND = "ha-rules-round"
DEFAULT_ROUND = 0.3  # seconds, as hacrm.DEFAULT_CRM_DELAY


def _read(pve_root: Path, name: str) -> list[Section]:
    try:
        return parse_section_config((pve_root / "ha" / name).read_text())
    except FileNotFoundError:
        return []


def node_priorities(pve_root: Path, release: int, r: Section, members: list[str]) -> dict[str, int] | None:
    """Where resource ``r`` may run (node -> priority), or None where nothing restricts it."""
    if release >= 9:
        for rule in _read(pve_root, "rules.cfg"):
            if rule.type != "node-affinity" or rule.props.get("disable") == "1":
                continue
            if r.sid in resource_list(rule.props.get("resources", "")):
                prios = dict(node_list(rule.props.get("nodes", "")))
                if rule.props.get("strict") != "1":
                    prios.update({n: -1 for n in members if n not in prios})
                return prios
        return None
    group = next(
        (g for g in _read(pve_root, "groups.cfg") if g.type == "group" and g.id == r.props.get("group")), None
    )
    if group is None:
        return None
    prios = dict(node_list(group.props.get("nodes", "")))
    if group.props.get("restricted") != "1":
        prios.update({n: -1 for n in members if n not in prios})
    return prios


def select_node(prios: dict[str, int], online: list[str], current: str, failback: bool) -> str | None:
    """Manager.pm select_service_node with preference ``none``: None when no allowed node is
    online, else where the service should run."""
    allowed = {n: p for n, p in prios.items() if n in online}
    if not allowed:
        return None
    if not failback and current in allowed:
        return current
    top = max(allowed.values())
    preferred = sorted(n for n, p in allowed.items() if p == top)
    return current if current in preferred else preferred[0]


def start_failure_target(server: Any, r: Section, failed: list[str]) -> str | None:
    """Where the CRM relocates service ``r`` whose start failed on the nodes ``failed`` (Manager.pm
    l.1468-1497: select_service_node with ``try_next`` and ``failed_nodes``): an online node its
    rule or group allows that has not failed it, the highest priority first; None: none left."""
    members = sorted(server.members())
    release = int(server.version.split(".")[0])
    prios = node_priorities(server.pve_root, release, r, members) or {n: 0 for n in members}
    left = [n for n in members if n not in failed and n in getattr(server, "peers", {})]
    return select_node({n: p for n, p in prios.items() if n in left}, left, "", True)


def _guest_node(pve_root: Path, kind: str, vmid: str) -> str | None:
    sub = "lxc" if kind == "lxc" else "qemu-server"
    found = sorted(pve_root.glob(f"nodes/*/{sub}/{vmid}.conf"))
    return found[0].parent.parent.name if found else None


def migrate_refusal(src: Any, vmid: int, target: str) -> str | None:
    """What qemu-server's online migration of running VM ``vmid`` to ``target`` dies of
    (QemuMigrate.pm prepare, in its order), or None when it would go through."""
    check = src.h_qemu_migrate_check(None, {"vmid": vmid})
    info = check["mapped-resource-info"]
    blocking = [k for k in check["local_resources"] if k not in info]
    if blocking:
        return f"can't migrate VM which uses local devices: {', '.join(blocking)}"
    missing = check["not_allowed_nodes"].get(target, {}).get("unavailable-resources", [])
    if missing:
        return f"can't migrate to '{target}': missing mapped devices {', '.join(missing)}"
    live = [f"{k}:{info[k]['name']}" for k in sorted(info) if not info[k].get("live-migration")]
    if check["running"] and live:
        return f"can't live migrate running VM which uses following mapped devices: {', '.join(live)}"
    return None


def record(src: Any, move: dict[str, Any]) -> None:
    """Log a move the CRM sent and keep it in ``src``'s run state (:data:`MOVES`)."""
    src.print_stderr(f"HA: {move['log']}\n")
    with state.locked(src.run_dir, MOVES):
        moves = state.read_state(src.run_dir, MOVES, []) or []
        moves.append(move)
        state.write_state(src.run_dir, MOVES, moves)


def move_config(src: Any, dst: Any, kind: str, vmid: int) -> tuple[Path, Path]:
    """Move the stopped guest's config from ``src``'s node to ``dst``'s (the offline part of a
    migration: pmxcfs renames ``nodes/<node>/...``); (old path, new path)."""
    old, new = src.conf_path(kind, vmid), dst.conf_path(kind, vmid)
    old.rename(new)
    return old, new


def _carry_out(src: Any, dst: Any, kind: str, vmid: int) -> str | None:
    """Move the guest's config to ``dst``'s node and start it there (a container stopped here
    first); the error that stopped it, or None."""
    try:
        if kind == "lxc":
            src._stop_guest(kind, vmid, None, [])
        old, new = move_config(src, dst, kind, vmid)
        try:
            dst._start_guest(kind, vmid, [])
        except Exception:
            new.rename(old)
            raise
        if kind == "qemu":
            state.set_guest_status(src.run_dir, kind, vmid, "stopped")
            src._qemu_stop(vmid)
    except Exception as e:  # the LRM's task failed: its message
        return str(e).strip() or type(e).__name__
    return None


def _move(server: Any, servers: dict[str, Any], r: Section, kind: str, node: str, target: str) -> bool:
    """Send the service to ``target``; whether a move was sent (the CRM retries next round)."""
    src, dst = servers[node], servers.get(target)
    if dst is None:
        return False
    vmid = int(r.id)
    if kind == "qemu":
        log = f"migrate service '{r.sid}' to node '{target}' (running)"
        error = migrate_refusal(src, vmid, target) or _carry_out(src, dst, kind, vmid)
        if error:  # Manager.pm next_state_migrate_relocate: back to 'started' on its node
            log += f"; {error}; service '{r.sid}' - migration failed (exit code 1)"
    else:
        log = f"relocate service '{r.sid}' to node '{target}'"
        error = _carry_out(src, dst, kind, vmid)
    record(
        src,
        {
            "sid": r.sid,
            "op": "migrate" if kind == "qemu" else "relocate",
            "node": node,
            "target": target,
            "error": error,
            "log": log,
            "at": time.time(),
        },
    )
    return True


def round_length(server: Any) -> float:
    """How long a CRM round takes here (latency ``ha.crm``)."""
    lat = state.read_state(server.run_dir, "latencies", {}) or {}
    return float(lat.get("ha.crm", DEFAULT_ROUND))


def next_round(server: Any, after: float | None = None) -> None:
    """Run a round once the present one is over (a changed rule takes effect then)."""
    timer = threading.Timer((round_length(server) if after is None else after) * 1.05, server.ha_tick)
    timer.daemon = True
    server._timers.append(timer)
    timer.start()


def _due(server: Any) -> float | None:
    """The round's length when one is due now (None: the last one was less than that ago)."""
    length = round_length(server)
    now = time.time()
    with state.locked(server.run_dir, LAST_ROUND):
        last = state.read_state(server.run_dir, LAST_ROUND, 0.0) or 0.0
        if now - float(last) < length:
            return None
        state.write_state(server.run_dir, LAST_ROUND, now)
    return length


def rules_round(server: Any) -> None:
    """One CRM round of the placement rules over the cluster ``server`` answers for (itself and
    its ``peers``): every running HA guest in state ``started`` on a node its rule or group no
    longer allows is sent to migrate (VM) or relocate (CT). A move sent schedules the next
    round, so a failed migration is retried as a real CRM retries it."""
    resources = [r for r in _read(server.pve_root, "resources.cfg") if r.type in ("vm", "ct")]
    if not resources or (
        not (server.pve_root / "ha" / "rules.cfg").exists()
        and not (server.pve_root / "ha" / "groups.cfg").exists()
    ):
        return
    length = _due(server)
    if length is None:
        return
    servers = {server.node: server, **getattr(server, "peers", {})}
    members = sorted(server.members())
    release = int(server.version.split(".")[0])
    sent = False
    for r in resources:
        kind = "lxc" if r.type == "ct" else "qemu"
        node = _guest_node(server.pve_root, kind, r.id)
        src = servers.get(node or "")
        if src is None or r.props.get("state", "started") not in ("started", "enabled"):
            continue
        if state.guest_status(src.run_dir, kind, r.id) != "running":
            continue
        if src._ha_service_state(kind, int(r.id), r.sid) != "started":
            continue
        prios = node_priorities(server.pve_root, release, r, members)
        if prios is None:
            continue
        failback = r.props.get("failback", "1") != "0" if release >= 9 else True
        if release < 9:
            group = next(
                (g for g in _read(server.pve_root, "groups.cfg") if g.id == r.props.get("group")), None
            )
            failback = not (group is not None and group.props.get("nofailback") == "1")
        target = select_node(prios, members, node, failback)
        if target is not None and target != node:
            sent = _move(server, servers, r, kind, node, target) or sent
    if sent:
        next_round(server, length)
