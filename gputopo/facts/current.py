"""Read the current state the planner compares against (edge layer: this is I/O).

Two sources, the same result (:class:`gputopo.model.state.CurrentState`):

* Proxmox's files under a pve root (``/etc/pve``): ``nodes/<node>/lxc/<vmid>.conf``,
  ``nodes/<node>/qemu-server/<vmid>.conf``, ``mapping/pci.cfg``. Files cannot tell whether a
  guest runs, so guests read this way count as running: the plan then shows every stop it may
  need rather than too few. A missing pve root means nothing is configured yet.
* a :class:`gputopo.ports.ProxmoxPort` (the API) plus, for the services inside containers, an
  :class:`gputopo.ports.ExecPort` (``systemctl show`` and ``cat`` of the drop-in).

Host persistence files come from a :class:`gputopo.ports.HostFilesPort`. Parsing is done by the
pure ``parse_*`` functions here and in :mod:`gputopo.formats.lxcconf` and
:mod:`gputopo.formats.pcicfg`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputopo.formats.systemd import parse_show_properties, show_state
from gputopo.errors import ExecError, ProxmoxError
from gputopo.model.facts import Facts
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState, ServiceState
from gputopo.plan.select import pick_node
from gputopo.ports import ExecPort, HostFilesPort, ProxmoxPort
from gputopo.formats.hostpci import hostpci_keys
from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.formats.qemuconf import parse_qemu_conf
from gputopo.formats.propstring import sha1_digest
from gputopo.plan.render import PERSISTENCE_PATHS, dropin_path, parse_tp
from gputopo.plan.spec import Spec

EXEC_TIMEOUT = 20.0


def config_from_lxc_text(text: str) -> dict[str, Any]:
    """A container config as the API's GET .../config returns it: keys, ``lxc`` pairs, digest.

    Pending values are merged in and pending deletions removed (the API's default view).
    """
    conf = parse_lxc_conf(text)
    out: dict[str, Any] = dict(conf.options)
    out.update(conf.pending.options)
    out.pop("delete", None)
    for key in conf.pending_delete:
        out.pop(key, None)
    if conf.lxc:
        out["lxc"] = [[k, v] for k, v in conf.lxc]
    out["digest"] = sha1_digest(text)
    return out


def hostpci_values(config: dict[str, Any]) -> list[str]:
    """The ``hostpciN`` values of a VM config, in index order."""
    return [str(config[k]) for k in hostpci_keys(config)]


def config_from_qemu_text(text: str) -> dict[str, Any]:
    """A VM config as the API's GET .../qemu/{vmid}/config returns it: keys with pending values
    merged in and pending deletions removed, the description, the digest."""
    conf = parse_qemu_conf(text)
    out: dict[str, Any] = dict(conf.options)
    out.update({k: v for k, v in conf.pending.items() if k != "delete"})
    for key in conf.pending_delete:
        out.pop(key, None)
    if conf.description is not None:
        out["description"] = conf.description
    out["digest"] = sha1_digest(text)
    return out


def mappings_from_pci_cfg(text: str) -> dict[str, MappingState]:
    """Mapping id -> state from ``mapping/pci.cfg`` text (digest: SHA-1 of the file)."""
    digest = sha1_digest(text)
    return {
        m.id: MappingState(map=list(m.maps), description=m.description, digest=digest)
        for m in parse_pci_cfg(text)
    }


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _service_state(exec: ExecPort, vmid: int, svc: Any) -> ServiceState:
    res = exec.run(vmid, ["systemctl", "show", "-p", "ActiveState", "-p", "ExecStart", "-p", "LoadState", svc.unit],
                   EXEC_TIMEOUT)
    props = parse_show_properties(res.stdout) if res.rc == 0 else {}
    active, command = show_state(props) if props else (False, None)
    # systemd answers for any name: an unknown unit is LoadState=not-found
    load = props.get("LoadState", "").strip()
    cat = exec.run(vmid, ["cat", dropin_path(svc.unit, svc.dropin)], EXEC_TIMEOUT)
    dropin = cat.stdout if cat.rc == 0 else None
    return ServiceState(
        unit=svc.unit, active=active, exec_start=command, tp=parse_tp(command) if command else None, dropin=dropin,
        found=load != "not-found",
    )


def read_current(
    spec: Spec,
    facts: Facts,
    *,
    pve_root: str | Path | None = None,
    proxmox: ProxmoxPort | None = None,
    exec: ExecPort | None = None,
    files: HostFilesPort | None = None,
    node: str | None = None,
) -> CurrentState:
    """Read what the spec's node has now: containers, mappings, VM guests, services, host files.

    Uses ``proxmox`` when given, else the files under ``pve_root``. Services are read only when
    ``exec`` is given and the container runs. Returns the :class:`CurrentState`; raises
    ProxmoxError for an API failure other than a missing guest, SpecError when the spec has no
    node for this host.
    """
    spec_node = pick_node(spec, facts, node)
    name = spec_node.name
    state = CurrentState()
    # every VM of the node: a VM the spec does not name can still use a mapping whose GPUs move
    named = [*spec_node.vms.guests, *(c.vmid for c in spec_node.vms.consumers)]

    if proxmox is not None:
        # what a running container can take without a restart depends on the release (PVE 9
        # hot-plugs devN); a version the API does not tell counts as the older one
        state.pve_version = str(proxmox.version().get("version") or "") or None
        for c in spec_node.containers:
            try:
                cfg = proxmox.lxc_config(c.vmid)
            except ProxmoxError as e:
                if e.status in (404, 500) and "does not exist" in str(e):
                    continue
                raise
            status = proxmox.guest_status("lxc", c.vmid)
            state.containers[c.vmid] = ContainerState(config=cfg, status="running" if status == "running" else "stopped")
        for m in proxmox.mappings(check_node=None):
            state.mappings[m["id"]] = MappingState(
                map=list(m.get("map") or []), description=m.get("description"), digest=m.get("digest")
            )
        listed = {int(g["vmid"]): g.get("status") for g in proxmox.list_guests("qemu")}
        for vmid in sorted(set(listed) | set(named)):
            try:
                cfg = proxmox.qemu_config(vmid)
            except ProxmoxError:
                continue
            status = listed.get(vmid) or proxmox.guest_status("qemu", vmid)
            state.guests[vmid] = GuestState(
                status="running" if status == "running" else "stopped", hostpci=hostpci_values(cfg), config=cfg
            )
    elif pve_root is not None and Path(pve_root).is_dir():
        base = Path(pve_root)
        state.guest_status_known = False
        for c in spec_node.containers:
            text = _read_text(base / "nodes" / name / "lxc" / f"{c.vmid}.conf")
            if text is not None:
                state.containers[c.vmid] = ContainerState(config=config_from_lxc_text(text), status="running")
        text = _read_text(base / "mapping" / "pci.cfg")
        if text is not None:
            state.mappings = mappings_from_pci_cfg(text)
        qdir = base / "nodes" / name / "qemu-server"
        found = sorted(int(p.stem) for p in qdir.glob("*.conf") if p.stem.isdigit()) if qdir.is_dir() else []
        for vmid in sorted(set(found) | set(named)):
            text = _read_text(qdir / f"{vmid}.conf")
            if text is not None:
                cfg = config_from_qemu_text(text)
                state.guests[vmid] = GuestState(status="running", hostpci=hostpci_values(cfg), config=cfg)

    if exec is not None:
        for c in spec_node.containers:
            ct = state.containers.get(c.vmid)
            if c.service is None or ct is None or ct.status != "running":
                continue
            try:
                ct.service = _service_state(exec, c.vmid, c.service)
            except ExecError:
                ct.service = None

    if files is not None:
        for path in PERSISTENCE_PATHS:
            state.files[path] = files.read(path)
    return state
