"""Proxmox's files under ``/etc/pve`` behind the read half of the Proxmox port
(:class:`gputopo.ports.ProxmoxReadPort`): what ``gputopo plan --pve-root``, the topology view
and an offline cluster plan read instead of the API.

It answers as the API would, so the current state has one set of rules whatever its source:

* ``nodes/<node>/lxc/<vmid>.conf`` and ``nodes/<node>/qemu-server/<vmid>.conf`` are a guest's
  config, pending values merged in (:mod:`gputopo.formats.pveview`); a missing one raises the
  API's ``Configuration file '...' does not exist``; ``mapping/pci.cfg`` holds the mappings;
* a missing pve root or node directory means nothing is configured yet: no guests, no mappings;
* the files cannot say whether a guest runs, so every guest counts as running
  (``status_known`` is False): a plan then shows every stop it may need rather than too few,
  and a stop it missed would move a GPU out from under a running guest;
* the files do not say the release: ``version()`` is {}, which counts as the older release.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gputopo.errors import ProxmoxError
from gputopo.formats.hacfg import parse_section_config
from gputopo.formats.pveview import config_from_lxc_text, config_from_qemu_text, mappings_from_pci_cfg

DEFAULT_ROOT = "/etc/pve"
_DIRS = {"lxc": "lxc", "qemu": "qemu-server"}


class PveFiles:
    """The guests of ``node`` and the cluster's PCI mappings, read from the pve root ``root``."""

    def __init__(self, root: str | os.PathLike, node: str):
        self.root = Path(root)
        self.node = node

    @property
    def status_known(self) -> bool:
        """False once the node has a guest directory: from then on a guest's status is unknown
        (with nothing configured there is no guest whose status could be)."""
        return not (self.root / "nodes" / self.node).is_dir()

    @property
    def guests_known(self) -> bool:
        """True once the node has a guest directory: a guest without a config there does not exist."""
        return (self.root / "nodes" / self.node).is_dir()

    def _dir(self, kind: str) -> Path:
        return self.root / "nodes" / self.node / _DIRS[kind]

    def _config_text(self, kind: str, vmid: int) -> str:
        """The config file's text. Raises ProxmoxError: ``does not exist`` as the API says it,
        or why the file cannot be read."""
        rel = f"nodes/{self.node}/{_DIRS[kind]}/{vmid}.conf"
        try:
            return (self.root / rel).read_text()
        except FileNotFoundError:
            raise ProxmoxError(
                f"read {self.root / rel}", 500, f"Configuration file '{rel}' does not exist"
            ) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ProxmoxError(f"read {self.root / rel}", 500, f"cannot read: {e}") from None

    def identity(self) -> None:
        """None: files have no login, so they do not say who will apply."""
        return None

    def version(self) -> dict[str, Any]:
        """{}: the files do not say which release wrote them."""
        return {}

    def list_guests(self, kind: str) -> list[dict[str, Any]]:
        """Every ``<vmid>.conf`` of the node's ``kind`` directory, by vmid, each ``running``; a
        file that cannot be read is left out, so the readable ones still show."""
        d = self._dir(kind)
        vmids = sorted(int(p.stem) for p in d.glob("*.conf") if p.stem.isdigit()) if d.is_dir() else []
        out = []
        for vmid in vmids:
            try:
                (d / f"{vmid}.conf").read_text()
            except (OSError, UnicodeDecodeError):
                continue
            out.append({"vmid": vmid, "status": "running"})
        return out

    def guest_status(self, kind: str, vmid: int) -> str:
        """'running' for every guest that has a config (see the module docstring for why).
        Raises ProxmoxError when it has none."""
        self._config_text(kind, vmid)
        return "running"

    def guest_ha(self, kind: str, vmid: int) -> dict[str, Any]:
        """The guest's section of ``ha/resources.cfg`` read as pve-ha-manager Config.pm
        vm_is_ha_managed does (``ct:ID`` or ``vm:ID``; ``ignored`` counts as unmanaged):
        ``{"managed": 1, "requested": <state, started by default>}`` or ``{"managed": 0}``; the
        manager's service state is not in the files."""
        try:
            text = (self.root / "ha" / "resources.cfg").read_text()
        except (OSError, UnicodeDecodeError):
            return {"managed": 0}
        for section in parse_section_config(text):
            if section.type in ("vm", "ct") and section.id == str(vmid):
                requested = section.props.get("state") or "started"
                if requested == "ignored":
                    return {"managed": 0}
                return {
                    "managed": 1,
                    "state": None,
                    "requested": "started" if requested == "enabled" else requested,
                }
        return {"managed": 0}

    def lxc_config(self, vmid: int) -> dict[str, Any]:
        """The container's config with pending values merged in, as the API's GET shows it.
        Raises ProxmoxError, PveFormatError for text Proxmox could not parse either."""
        return config_from_lxc_text(self._config_text("lxc", vmid))

    def qemu_config(self, vmid: int) -> dict[str, Any]:
        """The VM's config with pending values merged in, as the API's GET shows it.
        Raises ProxmoxError, PveFormatError for text Proxmox could not parse either."""
        return config_from_qemu_text(self._config_text("qemu", vmid))

    def mappings(self) -> list[dict[str, Any]]:
        """The PCI mappings of ``mapping/pci.cfg``; [] when it is missing or cannot be read."""
        try:
            text = (self.root / "mapping" / "pci.cfg").read_text()
        except (OSError, UnicodeDecodeError):
            return []
        return mappings_from_pci_cfg(text)
