"""What a node of a simulated cluster answers beyond its own guests.

* Membership comes from ``corosync.conf`` in the shared pve root (:mod:`gputopo.formats.corosync`);
  without one the node is alone. ``/nodes`` and ``/cluster/status`` list the members.
* ``peers`` holds the API servers of the other members: a path under ``/nodes/<other>/`` is
  handed to that node, as pveproxy proxies a method with ``proxyto => 'node'`` to the node it
  names, after its own permission check (pve-manager PVE/HTTPServer.pm ``rest_handler``,
  pve-http-server ``proxy_request`` with ``PVEDisableProxy``).
* ``GET /nodes/{node}/qemu/{vmid}/migrate`` is qemu-server's ``migrate_vm_precondition``: for
  each other member, the ``hostpciN`` entries whose PCI mapping has no entry for that node
  (``not_allowed_nodes.<node>.unavailable-resources``, from QemuMigrate/Helpers.pm
  ``check_local_resources``); a mapped device blocks only a live migration, unless the
  mapping is ``live-migration-capable``.
"""

from __future__ import annotations

from typing import Any

from gputopo.formats.corosync import parse_corosync_nodes
from gputopo.formats.hostpci import hostpci_keys
from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.formats.propstring import split_property_string
from gputopo.sim import state
from gputopo.sim.pveapi.answers import die
from gputopo.sim.pveapi.auth import Caller


class ClusterHandlers:
    """Cluster handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def members(self) -> dict[str, str]:
        """Node name -> address of every cluster member (this node alone outside a cluster)."""
        try:
            text = (self.pve_root / "corosync.conf").read_text()
        except FileNotFoundError:
            return {self.node: "127.0.0.1"}
        nodes = {n.name: n.ring0_addr for n in parse_corosync_nodes(text)}
        return nodes or {self.node: "127.0.0.1"}

    def forward_to(self, node: str | None) -> Any:
        """The peer server that answers for ``node``, or None when this node answers."""
        peers = getattr(self, "peers", None) or {}
        if node is None or node == self.node:
            return None
        return peers.get(node)

    def _node_item(self, name: str) -> dict[str, Any]:
        item = {
            "id": f"node/{name}",
            "node": name,
            "type": "node",
            "status": "online",
            "uptime": 86400,
            "cpu": 0.01,
            "mem": 8 << 30,
            "maxmem": 512 << 30,
            "disk": 10 << 30,
            "maxdisk": 100 << 30,
            "maxcpu": 128,
            "level": "",
        }
        # ssl_fingerprint: pve-manager API2/Nodes.pm index -> PVE::Cluster::get_node_fingerprint,
        # the SHA-256 of the node's certificate as Net::SSLeay prints it (AA:BB:..., upper case);
        # absent when it cannot be read (eval): over plain HTTP, and for the other simulated
        # nodes, whose certificates this server does not have
        if name == self.node and self.cert_fingerprint:
            item["ssl_fingerprint"] = self.cert_fingerprint
        return item

    def h_nodes(self, caller: Caller | None, p: dict) -> Any:
        return [self._node_item(n) for n in sorted(self.members())]

    def h_cluster_status(self, caller: Caller | None, p: dict) -> Any:
        members = self.members()
        try:
            nodes = parse_corosync_nodes((self.pve_root / "corosync.conf").read_text())
        except FileNotFoundError:
            return [
                {
                    "type": "node",
                    "id": f"node/{self.node}",
                    "name": self.node,
                    "nodeid": 0,
                    "ip": "127.0.0.1",
                    "local": 1,
                    "online": 1,
                    "level": "",
                }
            ]
        out: list[dict[str, Any]] = [
            {
                "type": "cluster",
                "id": "cluster",
                "name": "gputopo-sim",
                "nodes": len(nodes),
                "quorate": 1,
                "version": len(nodes),
            }
        ]
        for n in nodes:
            out.append(
                {
                    "type": "node",
                    "id": f"node/{n.name}",
                    "name": n.name,
                    "nodeid": n.nodeid,
                    "ip": members[n.name],
                    "local": int(n.name == self.node),
                    "online": 1,
                    "level": "",
                }
            )
        return out

    def h_qemu_migrate_check(self, caller: Caller, p: dict) -> Any:
        vmid = p["vmid"]
        path = self.pve_root / "nodes" / self.node / "qemu-server" / f"{vmid}.conf"
        try:
            conf = parse_lxc_conf(path.read_text()).options
        except FileNotFoundError:
            raise die(
                f"Configuration file 'nodes/{self.node}/qemu-server/{vmid}.conf' does not exist"
            ) from None
        running = state.guest_status(self.run_dir, "qemu", vmid) == "running"
        try:
            pci = {m.id: m for m in parse_pci_cfg((self.pve_root / "mapping" / "pci.cfg").read_text())}
        except FileNotFoundError:
            pci = {}
        others = [n for n in sorted(self.members()) if n != self.node]
        missing: dict[str, list[str]] = {n: [] for n in others}
        mapped: dict[str, dict[str, Any]] = {}
        local: list[str] = []
        for key in hostpci_keys(conf):
            entry = dict((k or "host", v) for k, v in split_property_string(str(conf[key]), key))
            name = entry.get("mapping")
            if name is None:
                local.append(key)
                continue
            mapped[key] = {"name": name}
            nodes_of_map = {_map_node(m) for m in (pci[name].maps if name in pci else [])}
            for n in others:
                if n not in nodes_of_map:
                    missing[n].append(key)
            if name in pci and pci[name].live_migration_capable:
                mapped[key]["live-migration"] = 1
            elif running:
                local.append(key)
        not_allowed = {n: {"unavailable-resources": keys} for n, keys in missing.items() if keys}
        return {
            "running": int(running),
            "allowed_nodes": [n for n in others if n not in not_allowed],
            "not_allowed_nodes": not_allowed,
            "local_disks": [],
            "local_resources": local,
            "mapped-resources": sorted(mapped),
            "mapped-resource-info": mapped,
            "has-dbus-vmstate": 1,
        }


def _map_node(entry: str) -> str | None:
    for part in entry.split(","):
        if part.startswith("node="):
            return part[5:]
    return None
