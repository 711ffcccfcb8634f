"""Every guest of a node and every PCI mapping, from Proxmox's files (edge layer: this is I/O).

The topology view shows who owns each GPU without a spec, so it reads all of a node's guests
rather than the ones a spec names (:mod:`gputopo.facts.current` reads those): the container
configs ``nodes/<node>/lxc/<vmid>.conf``, the VM configs ``nodes/<node>/qemu-server/<vmid>.conf``
and ``mapping/pci.cfg``, parsed by the same functions the planner's reader uses. Files cannot say
whether a guest runs; guests read this way count as running, as there.
"""

from __future__ import annotations

from pathlib import Path

from gputopo.facts.current import config_from_lxc_text, config_from_qemu_text, hostpci_values, mappings_from_pci_cfg
from gputopo.model.state import ContainerState, CurrentState, GuestState


def _confs(directory: Path) -> list[tuple[int, str]]:
    """(vmid, text) of every ``<vmid>.conf`` in ``directory``, by vmid; unreadable ones skipped."""
    out = []
    for p in sorted(directory.glob("*.conf"), key=lambda p: (len(p.stem), p.stem)):
        if not p.stem.isdigit():
            continue
        try:
            out.append((int(p.stem), p.read_text()))
        except (OSError, UnicodeDecodeError):
            continue
    return out


def read_node_guests(pve_root: str | Path, node: str) -> CurrentState:
    """The containers, VMs and PCI mappings under ``pve_root`` (``/etc/pve``) for ``node``.

    A missing ``pve_root`` or node directory means nothing is configured: an empty state.
    Config text Proxmox could not parse either raises
    :class:`gputopo.errors.PveFormatError` naming the value.
    """
    base = Path(pve_root)
    # read from files, a guest's status is unknown (nothing read: nothing to know)
    state = CurrentState(guest_status_known=not (base / "nodes" / node).is_dir())
    nodedir = base / "nodes" / node
    for vmid, text in _confs(nodedir / "lxc"):
        state.containers[vmid] = ContainerState(config=config_from_lxc_text(text), status="running")
    for vmid, text in _confs(nodedir / "qemu-server"):
        cfg = config_from_qemu_text(text)
        state.guests[vmid] = GuestState(status="running", hostpci=hostpci_values(cfg), config=cfg)
    try:
        text = (base / "mapping" / "pci.cfg").read_text()
    except (OSError, UnicodeDecodeError):
        text = None
    if text is not None:
        state.mappings = mappings_from_pci_cfg(text)
    return state
