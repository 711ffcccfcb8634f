"""The cluster's HA configuration, read through a :class:`gputopo.ports.ClusterApiPort`.

What the HA placement of VMs with mapped GPUs is planned from (:mod:`gputopo.plan.ha`): the HA
resources and the rules (PVE 9) or groups (PVE 8), the cluster's members, and every VM whose
``hostpciN`` names a mapping, with its node. :func:`gputopo.facts.current.read_current` reads
it for a plan; the HA placement step reads it again right before it writes.
"""

from __future__ import annotations

from gputopo.errors import ProxmoxError
from gputopo.formats.hostpci import hostpci_keys, hostpci_refs
from gputopo.model.state import ClusterVm, HaConfig
from gputopo.ports import ClusterApiPort, ProxmoxReadPort


def read_ha(api: ClusterApiPort) -> HaConfig:
    """The HA configuration through the API (no members, no VMs). Raises ProxmoxError."""
    release = api.release()
    state = HaConfig(release=release, resources={r["sid"]: r for r in api.ha_resources()})
    if state.uses_rules:
        state.rules = api.ha_rules()
    else:
        state.groups = api.ha_groups()
    return state


def mapped_vms(api: ClusterApiPort, members: list[str]) -> dict[int, ClusterVm]:
    """Every VM of ``members`` whose ``hostpciN`` names a mapping, with its node and those
    values (a config that cannot be read is left out: the VM went away). Raises ProxmoxError."""
    out: dict[int, ClusterVm] = {}
    for node in members:
        for g in api.node_vms(node):
            vmid = int(g["vmid"])
            try:
                cfg = api.vm_config(node, vmid)
            except ProxmoxError:
                continue
            hostpci = [str(cfg[k]) for k in hostpci_keys(cfg)]
            if any(hostpci_refs(h)[1] for h in hostpci):
                out[vmid] = ClusterVm(node=node, hostpci=hostpci, running=g.get("status") == "running")
    return out


def read_ha_cluster(api: ClusterApiPort) -> HaConfig:
    """The HA configuration with the cluster's members and their VMs with mapped devices.
    Raises ProxmoxError."""
    members = sorted(api.nodes())
    config = read_ha(api)
    config.members = members
    config.vms = mapped_vms(api, members)
    return config


def read_placement_inputs(
    api: ClusterApiPort, proxmox: ProxmoxReadPort
) -> tuple[HaConfig, dict[str, list[str]]]:
    """What the HA placement step plans from when it runs: :func:`read_ha_cluster`, and every
    mapping's map lines (id -> lines) as ``proxmox`` lists them now. Raises ProxmoxError."""
    config = read_ha_cluster(api)
    return config, {m["id"]: list(m.get("map") or []) for m in proxmox.mappings()}


def read_ha_config(api: ClusterApiPort) -> tuple[HaConfig | None, str | None]:
    """(the cluster's HA configuration and its VMs with mapped devices, None), (None, None) for
    a node outside a cluster (``GET /nodes`` lists it alone: nothing to place, nothing said), or
    (None, why) when the API refuses the HA reads (a login without ``Sys.Audit`` on ``/``).
    Raises ProxmoxError for any other failure."""
    members = api.nodes()
    if len(members) < 2:
        return None, None
    try:
        config = read_ha(api)
    except ProxmoxError as e:
        if e.status != 403:
            raise
        return None, f"the HA configuration cannot be read ({e.pve_message or e}): it needs Sys.Audit on /"
    config.members = sorted(members)
    config.vms = mapped_vms(api, config.members)
    return config, None
