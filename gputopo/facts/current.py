"""Read the current state the planner compares against (edge layer: this is I/O).

One reader, one set of rules, whatever the source: the guests and mappings come through the
read half of the Proxmox port (:class:`gputopo.ports.ProxmoxReadPort`), answered by the API or
by Proxmox's files (:class:`gputopo.adapters.pvefiles.PveFiles`, which is where the rule that
guests read from files count as running lives); the services inside running containers through
an :class:`gputopo.ports.ExecPort` (``systemctl show`` and ``cat`` of the drop-in); host
persistence files through a :class:`gputopo.ports.HostFilesPort`. What to read comes as a
:class:`gputopo.model.reads.Reads`, so reading needs no spec. :func:`gputopo.facts.observe.observe`
is the one caller that pairs it with the facts.
"""

from __future__ import annotations

from typing import Any

from gputopo.errors import ExecError, ProxmoxError
from gputopo.facts.ha import read_ha_config
from gputopo.formats.hostpci import hostpci_keys
from gputopo.formats.systemctl import parse_tp
from gputopo.formats.systemd import parse_show_properties, show_state
from gputopo.model.reads import EXEC_TIMEOUT, ContainerRead, Reads, ServiceRead
from gputopo.model.state import ContainerState, CurrentState, GuestState, HaState, MappingState, ServiceState
from gputopo.ports import ClusterApiPort, ExecPort, HostFilesPort, ProxmoxReadPort


def hostpci_values(config: dict[str, Any]) -> list[str]:
    """The ``hostpciN`` values of a VM config, in index order."""
    return [str(config[k]) for k in hostpci_keys(config)]


def _service_state(exec: ExecPort, vmid: int, svc: ServiceRead) -> ServiceState:
    res = exec.run(vmid, svc.show_argv(), EXEC_TIMEOUT)
    props = parse_show_properties(res.stdout) if res.rc == 0 else {}
    active, command = show_state(props) if props else (False, None)
    # systemd answers for any name: an unknown unit is LoadState=not-found
    load = props.get("LoadState", "").strip()
    cat = exec.run(vmid, svc.dropin_argv(), EXEC_TIMEOUT)
    dropin = cat.stdout if cat.rc == 0 else None
    return ServiceState(
        unit=svc.unit,
        active=active,
        exec_start=command,
        tp=parse_tp(command) if command else None,
        dropin=dropin,
        found=load != "not-found",
    )


def _ha(proxmox: ProxmoxReadPort, kind: str, vmid: int) -> HaState | None:
    """The guest's HA resource state, or None when it is not one (status/current's ``ha``)."""
    ha = proxmox.guest_ha(kind, vmid)
    if not int(ha.get("managed") or 0):
        return None
    return HaState(state=ha.get("state"), requested=ha.get("requested"))


def _status(proxmox: ProxmoxReadPort, kind: str, vmid: int, listed: str | None = None) -> str:
    return "running" if (listed or proxmox.guest_status(kind, vmid)) == "running" else "stopped"


def read_current(
    reads: Reads,
    *,
    proxmox: ProxmoxReadPort,
    exec: ExecPort | None = None,
    files: HostFilesPort | None = None,
    cluster: ClusterApiPort | None = None,
) -> CurrentState:
    """Read what ``proxmox``'s node has now: the containers and VMs ``reads`` names (every VM
    the node lists besides), the mappings, the services, the host files, and (``cluster``
    given, on a member of a cluster) the HA configuration with the cluster's VMs that take
    mapped devices (:func:`gputopo.facts.ha.read_ha_config`; an HA read the API
    refuses is said in ``ha_unread``).

    A container that does not exist is left out, as is a VM whose config cannot be read.
    Services are read only when ``exec`` is given and the container runs. Returns the
    :class:`CurrentState`; raises ProxmoxError for any other failure of the source.
    """
    state = CurrentState(guest_status_known=proxmox.status_known, containers_known=proxmox.guests_known)
    # what a running container can take without a restart depends on the release (PVE 9
    # hot-plugs devN); a version the source does not tell counts as the older one
    state.pve_version = str(proxmox.version().get("version") or "") or None
    # what the API lets this login change depends on who it is (only root@pam may set some VM
    # keys); Proxmox's files do not say who will apply
    state.api_user = proxmox.identity()
    wanted = reads.containers
    if wanted is None:
        wanted = tuple(
            ContainerRead(vmid) for vmid in sorted(int(g["vmid"]) for g in proxmox.list_guests("lxc"))
        )
    state.containers = _containers(proxmox, wanted)
    state.mappings = _mappings(proxmox)
    state.guests = _vms(proxmox, reads.vms)
    if exec is not None:
        _read_services(exec, wanted, state.containers)
    if files is not None:
        for path in reads.files:
            state.files[path] = files.read(path)
    if cluster is not None:
        state.ha_config, state.ha_unread = read_ha_config(cluster)
    return state


def _containers(proxmox: ProxmoxReadPort, wanted: tuple[ContainerRead, ...]) -> dict[int, ContainerState]:
    """The containers of ``wanted`` that exist: config, status, HA state. Raises ProxmoxError."""
    out: dict[int, ContainerState] = {}
    for c in wanted:
        try:
            cfg = proxmox.lxc_config(c.vmid)
        except ProxmoxError as e:
            if e.status in (404, 500) and "does not exist" in str(e):
                continue
            raise
        out[c.vmid] = ContainerState(
            config=cfg, status=_status(proxmox, "lxc", c.vmid), ha=_ha(proxmox, "lxc", c.vmid)
        )
    return out


def _mappings(proxmox: ProxmoxReadPort) -> dict[str, MappingState]:
    """Every PCI mapping: its map lines, description and digest. Raises ProxmoxError."""
    return {
        m["id"]: MappingState(
            map=list(m.get("map") or []), description=m.get("description"), digest=m.get("digest")
        )
        for m in proxmox.mappings()
    }


def _vms(proxmox: ProxmoxReadPort, named: tuple[int, ...]) -> dict[int, GuestState]:
    """Every VM the node lists and those ``named``, whose config can be read. Raises ProxmoxError."""
    listed = {int(g["vmid"]): g.get("status") for g in proxmox.list_guests("qemu")}
    out: dict[int, GuestState] = {}
    for vmid in sorted(set(listed) | set(named)):
        try:
            cfg = proxmox.qemu_config(vmid)
        except ProxmoxError:
            continue
        out[vmid] = GuestState(
            status=_status(proxmox, "qemu", vmid, listed.get(vmid)),
            hostpci=hostpci_values(cfg),
            config=cfg,
            ha=_ha(proxmox, "qemu", vmid),
        )
    return out


def _read_services(
    exec: ExecPort, wanted: tuple[ContainerRead, ...], containers: dict[int, ContainerState]
) -> None:
    """Each running container's service of ``wanted`` into its state; one that cannot be read
    is kept as ``service_error`` for the planner (a service it cannot read must not be planned
    away)."""
    for c in wanted:
        ct = containers.get(c.vmid)
        if c.service is None or ct is None or ct.status != "running":
            continue
        try:
            ct.service = _service_state(exec, c.vmid, c.service)
        except ExecError as e:
            ct.service = None
            ct.service_error = (
                f"no {e.stderr.split(':', 1)[0] or 'pct'} on this machine"
                if e.rc == 127
                else str(e).removeprefix(f"CT {c.vmid}: ")
            )
