"""Creating a simulated cluster: N simulated hosts that share one ``/etc/pve``.

A Proxmox cluster keeps one configuration file system for all its nodes (pmxcfs): each node's
guests under ``nodes/<node>/``, the PCI mappings in ``mapping/pci.cfg`` with one ``map`` line per
device and node, the members in ``corosync.conf``, the HA manager's files under ``ha/``. Each
node keeps its own kernel, containers and runtime state. So a simulated cluster in ``DIR`` is::

    DIR/pve/                 the shared /etc/pve
    DIR/nodes/<node>/        one simulated host (gputopo.sim.host.SimHost) per node, whose
                             pve -> ../../pve
    DIR/run/cluster.json     the members, their loopback addresses, container and VM ids

VM and container ids are unique in a cluster, so node i (from 1) gets container 100+i and VM
200+i; every node's seed mapping ``pro6000`` becomes one mapping with every node's lines, and
every VM is an HA resource (``ha/resources.cfg``, state stopped) so that placement rules can
name it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gputopo.errors import SimHostError
from gputopo.formats.corosync import CorosyncNode, write_corosync_conf
from gputopo.formats.hacfg import Section, write_section_config
from gputopo.formats.pcicfg import PciMapping, parse_pci_cfg, write_pci_cfg
from gputopo.sim import state
from gputopo.sim.cluster.peers import CLUSTER
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.host import SimHost

ADDRESS_BASE = 10  # node i answers on 127.0.0.<10 + i>


def node_names(count: int, prefix: str = "pve") -> list[str]:
    """``pve1`` .. ``pve<count>``."""
    return [f"{prefix}{i}" for i in range(1, count + 1)]


def create_cluster(
    dir: str | os.PathLike,
    count: int = 3,
    source: str = "seed",
    service: str = "sglang",
    pve_version: str = "8.4.1",
    prefix: str = "pve",
) -> Path:
    """Create a simulated cluster of ``count`` nodes in ``dir`` (absent or empty); returns ``dir``.

    Raises SimHostError for a non-empty ``dir`` or fewer than 2 nodes (one node is a simulated
    host: ``gputopo sim create``), and what :meth:`SimHost.create` raises. A failed create
    leaves ``dir`` as it was.
    """
    dir = Path(dir)
    if count < 2:
        raise SimHostError(str(dir), f"a cluster has at least 2 nodes (got {count})")
    if dir.exists() and any(dir.iterdir()):
        raise SimHostError(str(dir), "directory is not empty")
    existed = dir.exists()
    try:
        _build(dir, node_names(count, prefix), source, service, pve_version)
    except BaseException:
        if existed:
            for child in list(dir.iterdir()):
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        else:
            shutil.rmtree(dir, ignore_errors=True)
        raise
    return dir


def _build(dir: Path, names: list[str], source: str, service: str, pve_version: str) -> None:
    shared = dir / "pve"
    (shared / "nodes").mkdir(parents=True)
    (shared / "mapping").mkdir()
    members: dict[str, dict] = {}
    mappings: dict[str, PciMapping] = {}
    for i, name in enumerate(names, 1):
        node_dir = dir / "nodes" / name
        host = SimHost.create(
            node_dir,
            source=source,
            node=name,
            container=100 + i,
            vm=200 + i,
            service=service,
            pve_version=pve_version,
        )
        own = host.paths.pve
        shutil.move(str(own / "nodes" / name), str(shared / "nodes" / name))
        for m in parse_pci_cfg(_read(own / "mapping" / "pci.cfg")):
            if m.id in mappings:
                mappings[m.id].maps += m.maps
            else:
                mappings[m.id] = m
        shutil.rmtree(own)
        own.symlink_to(Path("..") / ".." / "pve")
        info = dict(host.info, cluster=os.path.join("..", ".."))
        state.write_state(host.paths.run, "host", info)
        members[name] = {
            "address": f"127.0.0.{ADDRESS_BASE + i}",
            "nodeid": i,
            "container": 100 + i,
            "vm": 200 + i,
        }
    for link in ("lxc", "qemu-server"):
        # pmxcfs shows each node its own; one tree shared by all can show only one node's
        (shared / link).symlink_to(f"nodes/{names[0]}/{link}")
    (shared / "local").symlink_to(f"nodes/{names[0]}")
    atomic_write(shared / "mapping" / "pci.cfg", write_pci_cfg(list(mappings.values())), PMXCFS_MODE)
    atomic_write(
        shared / "corosync.conf",
        write_corosync_conf(
            "gputopo-sim", [CorosyncNode(n, m["nodeid"], m["address"]) for n, m in members.items()]
        ),
        PMXCFS_MODE,
    )
    (shared / "ha").mkdir()
    atomic_write(
        shared / "ha" / "resources.cfg",
        write_section_config(
            [Section(type="vm", id=str(m["vm"]), props={"state": "stopped"}) for m in members.values()]
        ),
        PMXCFS_MODE,
    )
    state.write_state(
        dir / "run",
        CLUSTER,
        {"nodes": members, "pve_version": pve_version, "service": service, "source": source},
    )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
