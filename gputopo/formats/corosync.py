"""The node list of ``/etc/pve/corosync.conf``, the cluster's membership. Pure, no I/O.

corosync's config is nested ``name { key: value }`` blocks; a Proxmox cluster lists its nodes
as ``nodelist { node { name: pve1  nodeid: 1  quorum_votes: 1  ring0_addr: 10.0.0.1 } }`` and
names the cluster in ``totem { cluster_name: ... }`` (what ``pvecm create``/``pvecm add``
write). :func:`parse_corosync_nodes` reads the nodes, :func:`write_corosync_conf` writes a
file of that shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CorosyncNode:
    name: str
    nodeid: int
    ring0_addr: str


def parse_corosync_nodes(text: str) -> list[CorosyncNode]:
    """The ``node`` blocks of ``nodelist``, in file order. Raises nothing: a node block without
    a name or a numeric nodeid is skipped."""
    nodes: list[CorosyncNode] = []
    stack: list[str] = []
    current: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^([A-Za-z0-9_]+)\s*\{$", line)
        if m:
            stack.append(m.group(1))
            if stack[-2:] == ["nodelist", "node"]:
                current = {}
            continue
        if line == "}":
            if (
                stack[-2:] == ["nodelist", "node"]
                and current.get("name")
                and current.get("nodeid", "").isdigit()
            ):
                nodes.append(
                    CorosyncNode(current["name"], int(current["nodeid"]), current.get("ring0_addr", ""))
                )
            if stack:
                stack.pop()
            continue
        kv = re.match(r"^([A-Za-z0-9_]+)\s*:\s*(.*)$", line)
        if kv and stack[-2:] == ["nodelist", "node"]:
            current[kv.group(1)] = kv.group(2).strip()
    return nodes


def write_corosync_conf(cluster: str, nodes: list[CorosyncNode]) -> str:
    """A corosync.conf for ``cluster`` with ``nodes`` (one link, as ``pvecm create`` writes)."""
    out = ["logging {", "  debug: off", "  to_syslog: yes", "}", "", "nodelist {"]
    for n in nodes:
        out += [
            "  node {",
            f"    name: {n.name}",
            f"    nodeid: {n.nodeid}",
            "    quorum_votes: 1",
            f"    ring0_addr: {n.ring0_addr}",
            "  }",
        ]
    out += [
        "}",
        "",
        "quorum {",
        "  provider: corosync_votequorum",
        "}",
        "",
        "totem {",
        f"  cluster_name: {cluster}",
        "  config_version: 1",
        "  interface {",
        "    linknumber: 0",
        "  }",
        "  ip_version: ipv4-6",
        "  link_mode: passive",
        "  secauth: on",
        "  version: 2",
        "}",
        "",
    ]
    return "\n".join(out)
