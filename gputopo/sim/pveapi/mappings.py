"""PCI resource mappings through the simulated API (``/cluster/mapping/pci``).

Stored in ``mapping/pci.cfg`` in Proxmox's format; ``check-node`` runs pve-guest-common's
Mapping/PCI.pm:assert_valid against the simulated sysfs, as a VM start does.
"""

from __future__ import annotations

import re
from typing import Any

from gputopo.formats.pcicfg import PciMapping, parse_pci_cfg, write_pci_cfg
from gputopo.formats.propstring import sha1_digest
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.pveapi.answers import die
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.cfslock import cfs_lock, file_lock_id

PCI_CFG = "mapping/pci.cfg"

# The mapping's options and whether each may be deleted (pve-guest-common Mapping/PCI.pm
# options(): map is required, the others optional)
DELETABLE = {"map": False, "description": True, "mdev": True, "live-migration-capable": True}
# pve-guest-common Mapping/PCI.pm lock_pci_config: cfs_lock_file('mapping/pci.cfg'), whose lock
# id pve-cluster Cluster.pm cfs_lock_file builds as "file-" . the name with . and / as _


class MappingHandlers:
    """PCI mapping handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def _read_mappings(self) -> tuple[str, list[PciMapping]]:
        try:
            text = self.mapping_path().read_text()
        except FileNotFoundError:
            text = ""
        return text, parse_pci_cfg(text)

    def _mapping_item(self, mp: PciMapping, digest: str) -> dict:
        item: dict[str, Any] = {"id": mp.id, "type": "pci", "map": list(mp.maps), "digest": digest}
        if mp.description is not None:
            item["description"] = mp.description
        if mp.mdev is not None:
            item["mdev"] = int(mp.mdev)
        if mp.live_migration_capable is not None:
            item["live-migration-capable"] = int(mp.live_migration_capable)
        return item

    def h_mapping_list(self, caller: Caller, p: dict) -> Any:
        check = p.get("check-node")
        if check is not None and check != self.node:
            raise die(f"wrong node to check - {check} != {self.node}")
        text, maps = self._read_mappings()
        digest = sha1_digest(text)
        out = []
        for mp in maps:
            if caller is not None and not self._has_any(
                caller, ("Mapping.Audit", "Mapping.Use", "Mapping.Modify")
            ):
                continue
            item = self._mapping_item(mp, digest)
            if check is not None:
                item["checks"] = self._check_mapping(mp, check)
            out.append(item)
        return out

    def _check_mapping(self, mp: PciMapping, node: str) -> list[dict]:
        entries = []
        for raw in mp.maps:
            kv = dict(x.split("=", 1) for x in raw.split(",") if "=" in x)
            if kv.get("node") == node:
                entries.append(kv)
        if not entries:
            return [{"severity": "warning", "message": f"No mapping for node {node}."}]
        checks = []
        for kv in entries:
            err = self._assert_valid(mp.id, kv)
            if err:
                checks.append({"severity": "error", "message": f"Invalid configuration: {err}\n"})
        return checks

    def _assert_valid(self, name: str, cfg: dict[str, str]) -> str | None:
        """pve-guest-common Mapping/PCI.pm:assert_valid against the simulated sysfs."""
        from gputopo.facts.pci import read_pci_function

        for idx, path in enumerate((cfg.get("path") or "").split(";")):
            if not re.search(r"\.[0-9a-f]$", path, re.IGNORECASE):
                path = f"{path}.0"
            try:
                info = read_pci_function(self.sysfs_root, path) if self.sysfs_root is not None else None
            except Exception:
                info = None
            if info is None:
                return f"pci device '{path}' not found"
            expected = {
                "id": f"{info.vendor}:{info.device}".replace("0x", ""),
                "iommugroup": str(info.iommu_group if info.iommu_group is not None else -1),
            }
            if info.subsystem_vendor and info.subsystem_device:
                expected["subsystem-id"] = f"{info.subsystem_vendor}:{info.subsystem_device}".replace(
                    "0x", ""
                )
            configured = {k: cfg[k] for k in ("id", "iommugroup", "subsystem-id") if k in cfg}
            for prop in sorted(set(expected) | set(configured)):
                if prop == "iommugroup" and idx > 0:
                    continue
                if prop in expected and prop not in configured:
                    return f"missing expected property '{prop}' for device '{path}'"
                if prop not in expected and prop in configured:
                    return f"unexpected property '{prop}' configured for device '{path}'"
                e, c = expected[prop].replace("0x", ""), configured[prop].replace("0x", "")
                if e != c:
                    return f"'{prop}' does not match for '{name}' ({e} != {c})"
        return None

    def h_mapping_get(self, caller: Caller, p: dict) -> Any:
        text, maps = self._read_mappings()
        for mp in maps:
            if mp.id == p["id"]:
                item = self._mapping_item(mp, sha1_digest(text))
                del item["id"]
                return item
        raise die(f"mapping '{p['id']}' not found")

    def _apply_mapping_props(self, mp: PciMapping, p: dict) -> None:
        if "map" in p:
            mp.maps = p["map"]
        if "description" in p:
            mp.description = p["description"]
        if "mdev" in p:
            mp.mdev = p["mdev"]
        if "live-migration-capable" in p:
            mp.live_migration_capable = p["live-migration-capable"]

    def _mapping_lock(self, what: str):
        # pve-guest-common's Mapping::PCI::lock_pci_config: cfs_lock_file('mapping/pci.cfg'),
        # cluster-wide, so every node's API (any process) writes the file in turn
        return cfs_lock(self.pve_root, file_lock_id(PCI_CFG), what, on_wait=self.print_stderr)

    def h_mapping_create(self, caller: Caller, p: dict) -> Any:
        with self._lock, self._mapping_lock("create hardware mapping failed"):
            _, maps = self._read_mappings()
            if any(m.id == p["id"] for m in maps):
                raise die(f"create hardware mapping failed: pci ID '{p['id']}' already defined")
            mp = PciMapping(id=p["id"])
            self._apply_mapping_props(mp, p)
            atomic_write(self.mapping_path(), write_pci_cfg(maps + [mp]), PMXCFS_MODE)
        return None

    def h_mapping_update(self, caller: Caller, p: dict) -> Any:
        # pve-manager API2/Cluster/Mapping/PCI.pm update, in its order: digest, the id, then
        # check_config (map is required), then SectionConfig.pm delete_from_config; every die
        # inside lock_pci_config gets the "update hardware mapping failed: " prefix
        prefix = "update hardware mapping failed: "
        with self._lock, self._mapping_lock(prefix.rstrip(": ")):
            text, maps = self._read_mappings()
            if p.get("digest") and sha1_digest(text) != p["digest"]:
                raise die(prefix + "detected modified configuration - file changed by other user? Try again.")
            mp = next((m for m in maps if m.id == p["id"]), None)
            if mp is None:
                raise die(prefix + f"pci ID '{p['id']}' does not exist")
            if "map" not in p:
                raise die(prefix + "missing value for required option 'map'")
            for k in p.get("delete", []):
                if k not in DELETABLE:
                    raise die(prefix + f"no such option '{k}'")
                if not DELETABLE[k]:
                    raise die(prefix + f"unable to delete required option '{k}'")
                if k in p:
                    raise die(prefix + f"cannot set and delete property '{k}' at the same time!")
                setattr(mp, k.replace("-", "_"), None)
            self._apply_mapping_props(mp, p)
            atomic_write(self.mapping_path(), write_pci_cfg(maps), PMXCFS_MODE)
        return None

    def h_mapping_delete(self, caller: Caller, p: dict) -> Any:
        with self._lock, self._mapping_lock("delete pci mapping failed"):
            _, maps = self._read_mappings()
            keep = [m for m in maps if m.id != p["id"]]
            if len(keep) != len(maps):
                atomic_write(self.mapping_path(), write_pci_cfg(keep), PMXCFS_MODE)
        return None
