"""``gputopo sim guest``: start, stop or show a simulated host's guests through its Proxmox API."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("guest")
def guest() -> None:
    """Start, stop or show a simulated host's containers and VMs through its Proxmox API, as
    'pct start' or 'qm stop' would on a node: no curl, no login ticket."""


def _sim_option(f):
    return click.option(
        "--sim",
        "sim_dir",
        required=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Simulated host directory (gputopo sim create DIR).",
    )(f)


def _guests(proxmox, vmid: int | None) -> list[tuple[str, int, str]]:
    """(kind, vmid, status) of every guest on the node, or of ``vmid`` alone. Raises
    SimGuestError with Proxmox's words for a vmid that is neither a container nor a VM:
    "no such VM ('999')" (pve-firewall src/PVE/API2/Firewall/VM.pm, get_options: the vmid looked
    up in the cluster's vmlist, whatever its kind)."""
    from gputopo.errors import SimGuestError

    found = [
        (kind, int(g["vmid"]), str(g.get("status") or "unknown"))
        for kind in ("lxc", "qemu")
        for g in proxmox.list_guests(kind)
        if vmid is None or str(g.get("vmid")) == str(vmid)
    ]
    if vmid is not None and not found:
        raise SimGuestError(f"no such VM ('{vmid}')", bad_input=True)
    return sorted(found, key=lambda g: g[1])


def _label(kind: str, vmid: int) -> str:
    return f"{'CT' if kind == 'lxc' else 'VM'} {vmid}"


def _power(sim_dir: Path, vmid: int, action: str) -> None:
    """POST the guest's status/{action} to the simulated host's API and wait for its task, as
    gputopo's own apply does (the ProxmoxClient over HTTPS with a root@pam ticket)."""
    from gputopo.errors import ProxmoxError, SimGuestError, TaskFailed
    from gputopo.sim.host import SimHost

    ports = SimHost.open(sim_dir).ports()
    try:
        ((kind, _, _),) = _guests(ports.proxmox, vmid)
        try:
            ports.proxmox.guest_action(kind, vmid, action, timeout=300.0)
        except TaskFailed as e:
            # the task's own last word, as pct/qm print it ("VM 201 already running")
            raise SimGuestError(str(e.exitstatus or e).strip()) from None
        except ProxmoxError as e:
            # refused before a task began: Proxmox's message ("CT 101 already running", 500),
            # and nothing was changed
            raise SimGuestError(str(e.pve_message or e).strip(), bad_input=True) from None
        status = ports.proxmox.guest_status(kind, vmid)
    finally:
        ports.close()
    click.echo(f"{_label(kind, vmid)}: {status}")


@guest.command("start")
@click.argument("vmid", type=click.IntRange(100, 999999999))
@_sim_option
def guest_start(vmid: int, sim_dir: Path) -> None:
    """Start container or VM VMID (its start hooks run: a VM's GPUs go to vfio-pci)."""
    _power(sim_dir, vmid, "start")


@guest.command("stop")
@click.argument("vmid", type=click.IntRange(100, 999999999))
@_sim_option
def guest_stop(vmid: int, sim_dir: Path) -> None:
    """Stop container or VM VMID at once (Proxmox's stop, not a shutdown)."""
    _power(sim_dir, vmid, "stop")


@guest.command("status")
@click.argument("vmid", type=click.IntRange(100, 999999999), required=False)
@_sim_option
def guest_status(vmid: int | None, sim_dir: Path) -> None:
    """Each container's and VM's status (or VMID's alone), one line each: 'CT 101: running'."""
    from gputopo.sim.host import SimHost

    ports = SimHost.open(sim_dir).ports()
    try:
        rows = _guests(ports.proxmox, vmid)
    finally:
        ports.close()
    for kind, n, status in rows:
        click.echo(f"{_label(kind, n)}: {status}")
