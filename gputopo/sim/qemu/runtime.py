"""A VM's start and stop on the simulated node, in qemu-server's order (``vm_start``):

1. pending changes are applied (``vmconfig_apply_pending``);
2. the config becomes a command line: ``parse_hostpci_devices`` dies with ``q35 machine model
   is not enabled`` for ``pcie=1`` on i440fx, ``Memory.pm`` with ``numa needs to be enabled to
   use hugepages``; ``args`` is split like a shell (``Text::ParseWords::shellwords``: nothing at
   all for an unbalanced quote);
3. the PCI devices are reserved and bound (:mod:`gputopo.sim.passthrough`: ``already in use``,
   ``could not find a free device``);
4. QEMU runs under ``taskset --cpu-list --all-tasks <affinity>``, which fails for a list that
   names no CPU of the host: ``taskset: failed to set pid N's affinity: Invalid argument``;
5. the firmware maps the devices' BARs (:mod:`.firmware`): one that does not fit gets none.

The running VM is a process in ``<root>/proc/<pid>`` (``comm`` kvm, its ``cmdline``, ``status``
with ``Cpus_allowed_list``, fds of its ``/dev/vfio/<group>``), the pid ``status/current``
reports, also in ``<root>/run/qemu-server/<vmid>.pid`` as qemu-server writes it; what its guest sees is kept in ``run/qemu-runtime.json`` for :mod:`.guest`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from gputopo.facts.discover import parse_nvidia_information
from gputopo.formats.hostpci import hostpci_number, is_hostpci_key
from gputopo.formats.qemuconf import QemuConf
from gputopo.model.facts import format_cpulist, parse_cpulist
from gputopo.sim import state
from gputopo.sim.passthrough import Passthrough, PassthroughError, hostpci_props, parse_map_entry
from gputopo.sim.qemu.firmware import bar64, place, window
from gputopo.sim.state import load_json

RUNTIME = "qemu-runtime"
PID_BASE = 4242  # status/current reports 4242 + vmid for a running VM


def vm_pid(vmid: int) -> int:
    return PID_BASE + vmid


def _truthy(v: str | None) -> bool:
    return (v or "").lower() in ("1", "on", "yes", "true")


def host_cpus(root: Path) -> set[int]:
    """Every CPU of the host's NUMA nodes."""
    cpus: set[int] = set()
    for f in (root / "sys/devices/system/node").glob("node*/cpulist"):
        cpus |= parse_cpulist(f.read_text().strip())
    return cpus


def guest_address(key: str, pcie: bool) -> str:
    """Where ``hostpciN`` appears in the guest: behind root port ``ich9-pcie-port-(N+1)`` with
    pcie=1 (the firmware numbers those buses 1, 2, ... when nothing else sits behind them),
    else on the PCI bus at qemu-server's slot for it (``PCI.pm`` ``get_pci_addr_map``)."""
    n = hostpci_number(key)
    if pcie:
        return f"0000:{n + 1:02x}:00.0"
    slot = {0: 0x10, 1: 0x11, 2: 0x1B, 3: 0x1C}.get(n)
    return f"0000:00:{slot:02x}.0" if slot is not None else f"0000:02:{0x0D + n - 4:02x}.0"


# PCI.pm parse_hostpci_devices line 510 of qemu-server 9.2.6, as the task's exit status ends
Q35_DIE = "q35 machine model is not enabled at /usr/share/perl5/PVE/QemuServer/PCI.pm line 510."


def start(
    vmid: int, conf: QemuConf, root: Path, run_dir: Path, passthrough: Passthrough, mappings: list[Any]
) -> None:
    """Start VM ``vmid`` with ``conf`` (pending already applied). Raises PassthroughError with
    qemu-server's message when the start fails (nothing of it is left behind then)."""
    opts = conf.options
    pcie = _hostpci_pcie(opts, passthrough.node, mappings)
    if opts.get("hugepages") and not _truthy(opts.get("numa")):
        raise PassthroughError("numa needs to be enabled to use hugepages")
    try:
        args: list[str] | None = shlex.split(opts.get("args", ""))
    except ValueError:
        args = None  # shellwords gives nothing for an unbalanced quote
    passthrough.start(vmid, opts, mappings)
    affinity = opts.get("affinity")
    pid = vm_pid(vmid)
    try:
        _check_affinity(root, pid, affinity)
    except (PassthroughError, ValueError):
        passthrough.release(vmid)
        raise
    devices = [(key, a) for key, pick in passthrough.by_key for a in pick]
    need = {a: bar64(root, a) for _, a in devices}
    mapped = place([a for _, a in devices], need, window(args, opts.get("bios", "seabios")))
    runtime = {
        "pid": pid,
        "started": time.time(),
        "agent": "agent" in opts,
        "affinity": format_cpulist(parse_cpulist(affinity)) if affinity else format_cpulist(host_cpus(root)),
        "devices": [
            {
                "key": key,
                "address": a,
                "bars": mapped[a],
                "guest": guest_address(key, pcie.get(key, False)),
                **_identity(root, a),
            }
            for key, a in devices
        ],
    }
    _spawn(root, vmid, opts, args or [], runtime)
    with state.locked(run_dir, RUNTIME):
        all_rt = state.read_state(run_dir, RUNTIME, {}) or {}
        all_rt[str(vmid)] = runtime
        state.write_state(run_dir, RUNTIME, all_rt)


def _hostpci_pcie(opts: dict[str, str], node: str, mappings: list[Any]) -> dict[str, bool]:
    """Whether each ``hostpciN`` is a PCIe device, its mapping checked to exist on ``node`` and a
    PCIe device checked to be on a q35 machine, key by key (qemu-server's order). Raises
    PassthroughError with qemu-server's message."""
    q35 = "q35" in opts.get("machine", "")
    pcie: dict[str, bool] = {}
    node_maps = {m.id for m in mappings if any(parse_map_entry(e).get("node") == node for e in m.maps)}
    for key, value in sorted(opts.items(), key=lambda kv: (len(kv[0]), kv[0])):
        if is_hostpci_key(key):
            # the value parsed (the mapping looked up) comes before the q35 check, line by line
            props = hostpci_props(value)
            if "mapping" in props and props["mapping"] not in node_maps:
                raise PassthroughError(f"PCI device mapping not found for '{props['mapping']}'")
            if _truthy(props.get("pcie")) and not q35:
                # qemu-server 9.2.6 src/PVE/QemuServer/PCI.pm parse_hostpci_devices, line 510: a
                # die without "\n", so Perl appends where it died (the installed module's path)
                raise PassthroughError(Q35_DIE)
            pcie[key] = _truthy(props.get("pcie"))
    return pcie


def _check_affinity(root: Path, pid: int, affinity: str | None) -> None:
    """taskset's check of the VM's ``affinity``: some of its CPUs are the host's. Raises
    PassthroughError as taskset fails, ValueError for a malformed list."""
    if affinity is not None:
        cpus = parse_cpulist(affinity) if affinity.strip() else set()
        if not cpus & host_cpus(root):
            raise PassthroughError(f"taskset: failed to set pid {pid}'s affinity: Invalid argument")


def _identity(root: Path, address: str) -> dict[str, Any]:
    """What the guest's driver learns of a device: whether it is an NVIDIA GPU, its device id,
    and the name and UUID the GPU carries (the simulated kernel keeps each GPU's nvidia
    ``information`` text from when the host driver had it)."""
    dev = root / "sys/bus/pci/devices" / address

    def attr(name: str) -> str:
        try:
            return (dev / name).read_text().strip()
        except OSError:
            return ""

    info_text = ((load_json(root / ".gputopo-sim/kernel.json", {}) or {}).get("nv_info") or {}).get(
        address, ""
    )
    info = parse_nvidia_information(info_text)
    return {
        "gpu": attr("vendor") == "0x10de" and attr("class").startswith("0x03"),
        "device_id": attr("device"),
        "name": info.get("Model") or "NVIDIA Graphics Device",
        "uuid": info.get("GPU UUID") or "",
    }


def stop(vmid: int, root: Path, run_dir: Path, passthrough: Passthrough) -> None:
    """Stop VM ``vmid``: its process goes, its reservations are released."""
    passthrough.release(vmid)
    shutil.rmtree(root / "proc" / str(vm_pid(vmid)), ignore_errors=True)
    (root / "run/qemu-server" / f"{vmid}.pid").unlink(missing_ok=True)
    with state.locked(run_dir, RUNTIME):
        all_rt = state.read_state(run_dir, RUNTIME, {}) or {}
        all_rt.pop(str(vmid), None)
        state.write_state(run_dir, RUNTIME, all_rt)


def runtime_of(run_dir: Path, vmid: int) -> dict[str, Any] | None:
    """What the running VM ``vmid`` was started with (None when it does not run)."""
    if state.guest_status(run_dir, "qemu", vmid) != "running":
        return None
    return (state.read_state(run_dir, RUNTIME, {}) or {}).get(str(vmid))


def _spawn(root: Path, vmid: int, opts: dict[str, str], args: list[str], runtime: dict[str, Any]) -> None:
    d = root / "proc" / str(runtime["pid"])
    shutil.rmtree(d, ignore_errors=True)
    (d / "fd").mkdir(parents=True)
    argv = ["/usr/bin/kvm", "-id", str(vmid), "-name", f"{opts.get('name') or f'vm{vmid}'},debug-threads=on"]
    for dev in runtime["devices"]:
        argv += ["-device", f"vfio-pci,host={dev['address']},id={dev['key']}"]
    argv += args
    (d / "comm").write_text("kvm\n")
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (d / "cgroup").write_text(f"0::/qemu.slice/{vmid}.scope\n")
    (d / "status").write_text(
        f"Name:\tkvm\nPid:\t{runtime['pid']}\nCpus_allowed_list:\t{runtime['affinity']}\n"
    )
    groups = set()
    for dev in runtime["devices"]:
        link = root / "sys/bus/pci/devices" / dev["address"] / "iommu_group"
        if link.is_symlink():
            groups.add(os.path.basename(os.readlink(link)))
    pidfile = root / "run/qemu-server" / f"{vmid}.pid"
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(f"{runtime['pid']}\n")
    for n, target in enumerate(
        ["/dev/null"] * 3 + ["/dev/vfio/vfio"] + [f"/dev/vfio/{g}" for g in sorted(groups)]
    ):
        os.symlink(target, d / "fd" / str(n))
