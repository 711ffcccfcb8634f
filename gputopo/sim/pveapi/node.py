"""The node's own endpoints: ``/version`` and ``/nodes/{node}/hardware/pci`` (``/nodes``: :mod:`.cluster`)."""

from __future__ import annotations

import re
from typing import Any

from gputopo.sim.pveapi.answers import perm_error
from gputopo.sim.pveapi.auth import Caller


class NodeHandlers:
    """Node handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def h_version(self, caller: Caller | None, p: dict) -> Any:
        return {
            "version": self.version,
            "release": ".".join(self.version.split(".")[:2]),
            "repoid": "5a6b8c9d0e1f2a3b",
        }

    def h_hardware_pci(self, caller: Caller, p: dict) -> Any:
        from gputopo.facts.pci import list_pci_functions

        if not self._has_any(caller, ("Sys.Audit",)) if caller else False:
            raise perm_error("/nodes/" + self.node + ", Sys.Audit")
        if self.sysfs_root is None:
            return []
        blacklist = [c for c in re.split(r"[;,\s]+", p.get("pci-class-blacklist", "05;06;0b")) if c]
        verbose = p.get("verbose", True)
        out = []
        for f in list_pci_functions(self.sysfs_root):
            klass = f.class_ or "0x000000"
            if any(klass[2:].startswith(b.lower()) for b in blacklist):
                continue
            item: dict[str, Any] = {
                "id": f.address,
                "class": klass,
                "vendor": f.vendor,
                "device": f.device,
                "iommugroup": f.iommu_group if f.iommu_group is not None else -1,
            }
            if verbose:
                if f.subsystem_vendor:
                    item["subsystem_vendor"] = f.subsystem_vendor
                if f.subsystem_device:
                    item["subsystem_device"] = f.subsystem_device
            if f.vendor == "0x10de":
                item["nvidia"] = 1
            out.append(item)
        return sorted(out, key=lambda i: i["id"])
