"""The seed story a new simulated host starts from: its host root (a fixture, a snapshot or a
copied root), ``/etc/pve`` (container 101 with every GPU, a stopped VM 201 on a mapping, the PCI
mapping ``pro6000``) and the container's inference service. :meth:`gputopo.sim.host.SimHost.create`
builds a host with :func:`build_host`."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from gputopo.errors import SimHostError
from gputopo.formats.devn import devn_key
from gputopo.formats.lxcconf import LxcConf, format_dev_value, write_lxc_conf
from gputopo.formats.pcicfg import MapEntry, PciMapping, format_map_entry, write_pci_cfg
from gputopo.sim import state
from gputopo.sim.container import Container, SimPaths, write_unit
from gputopo.sim.container.distro import lsb_release
from gputopo.sim.container.footprint import read_footprint
from gputopo.sim.container.footprint import start as start_engine
from gputopo.sim.container.gpus import DEFAULT_TOTAL_MIB, MEMORY_TOTAL_MIB
from gputopo.sim.container.modelfiles import SEED_MODEL, SMALL_MODEL, install_model, model_store
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.hostroot import materialize

DEFAULT_CT = 101
DEFAULT_VM = 201
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# The seed unit's memory fraction (0.79) is what makes the seed log's load (78,193-79,043 of
# 97,887 MiB per GPU) come out of the engines' formulas: gputopo.sim.container.footprint.
SERVICE_COMMANDS = {
    "sglang": (
        "/opt/sglang/.venv/bin/python -m sglang.launch_server --model-path /models/Qwen3-235B-A22B-FP8 "
        "--served-model-name qwen3 --host 0.0.0.0 --port 30000 --mem-fraction-static 0.79 --tp {tp}"
    ),
    "vllm": (
        "/usr/local/bin/vllm serve /models/Qwen3-235B-A22B-FP8 --served-model-name qwen3 "
        "--host 0.0.0.0 --port 8000 --gpu-memory-utilization 0.79 --tensor-parallel-size {tp}"
    ),
}


UBUNTU_RELEASE = "24.04"  # the container's distribution release (a known one: its start does not warn)


def extract_snapshot(archive: Path, dest: Path) -> None:
    """Unpack a ``gputopo snapshot`` archive into ``dest`` (the root holds ``sys/``), refusing
    unsafe members like every other reader of snapshots; an archive made with ``tar`` around one
    top directory is accepted too. Raises SimHostError when no ``sys/`` tree comes out and
    :class:`gputopo.errors.SnapshotError` for an unreadable or unsafe archive."""
    from gputopo.facts.snapshot import extract

    extract(archive, dest)
    if not (dest / "sys").is_dir():
        tops = [p for p in dest.iterdir() if p.is_dir()]
        if len(tops) == 1 and (tops[0] / "sys").is_dir():
            inner = tops[0]
            for child in list(inner.iterdir()):
                child.rename(dest / child.name)
            inner.rmdir()
    if not (dest / "sys").is_dir():
        raise SimHostError(str(archive), "snapshot holds no sys/ tree")


def build_host(
    dir: Path,
    src: str,
    node: str | None,
    container: int,
    service: str,
    pve_version: str,
    root: str | os.PathLike | None,
    vm: int = DEFAULT_VM,
    model: str | None = None,
) -> None:
    """Build the seed story in the empty ``dir``: the host root from ``root`` (a directory to
    copy) or ``src`` (a snapshot archive or a fixture), ``/etc/pve``, ``run/host.json``, the
    container's service and its running state. Raises :class:`SimHostError` for a root without
    GPUs on nvidia, :class:`gputopo.errors.FixtureError` for a bad fixture."""
    from gputopo.facts.discover import discover

    paths = SimPaths(dir)
    if root is not None:
        shutil.copytree(root, paths.root, symlinks=True)
    elif src.endswith((".tar.gz", ".tgz", ".tar")):
        extract_snapshot(Path(src), paths.root)
    else:
        materialize(src, paths.root)
    facts = discover(str(paths.root))
    hostname = node or facts.host.hostname or "pve"
    if hostname != facts.host.hostname:
        # Proxmox's node name is the host's name: the root must say the same
        (paths.root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
        (paths.root / "proc/sys/kernel/hostname").write_text(hostname + "\n")
    gpus = [g for g in facts.gpus if g.driver == "nvidia" and g.minor is not None]
    if not gpus:
        raise SimHostError(src, "the host has no GPU on the nvidia driver to give the container")
    write_pve(paths, hostname, container, facts, vm)
    state.write_state(
        paths.run,
        "host",
        {
            "node": hostname,
            "pve_version": pve_version,
            "container": container,
            "vm": vm,
            "service": service,
            "source": src,
        },
    )
    totals = [MEMORY_TOTAL_MIB.get(g.device or "", DEFAULT_TOTAL_MIB) for g in gpus]
    _write_service(dir, paths, container, service, len(gpus), model or _fitting_model(service, totals))
    state.set_guest_status(paths.run, "lxc", container, "running")
    state.set_guest_status(paths.run, "qemu", vm, "stopped")
    Container(dir, container).boot()


def _fitting_model(service: str, totals_mib: list[int]) -> str:
    """The model the container serves when none is named: the seed's where its weights fit the
    host's GPUs at the full tensor-parallel size, else :data:`SMALL_MODEL` (an operator serves what
    fits: 236 GB of FP8 weights do not fit four 48 GiB RTX 6000 Ada)."""
    argv = SERVICE_COMMANDS[service].format(tp=len(totals_mib)).split()
    fp = read_footprint(Path("/"), str(model_store(SEED_MODEL)))
    if fp is None or start_engine(argv, totals_mib, fp).error:
        return SMALL_MODEL
    return SEED_MODEL


def _write_service(
    dir: Path, paths: SimPaths, container: int, service: str, tp: int, model: str = SEED_MODEL
) -> None:
    """The container's inference unit serving ``/models/<model>`` with ``--tp <tp>``, the model's
    directory, and the container's distribution release."""
    unit = f"{service}.service"
    command = SERVICE_COMMANDS[service].format(tp=tp).replace(f"/models/{SEED_MODEL}", f"/models/{model}")
    write_unit(
        dir,
        container,
        unit,
        f"[Unit]\nDescription={service} inference server\nAfter=network-online.target\n\n"
        f"[Service]\nType=simple\nExecStart={command}\n"
        f"Restart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n",
    )
    install_model(paths.rootfs(container), model)  # the directory the command serves
    release = paths.rootfs(container) / "etc/lsb-release"
    release.parent.mkdir(parents=True, exist_ok=True)
    release.write_text(lsb_release(UBUNTU_RELEASE))


def write_pve(paths: SimPaths, node: str, ctid: int, facts, vmid: int = DEFAULT_VM) -> None:
    """Write /etc/pve for the seed story from the host's facts."""
    nodedir = paths.pve / "nodes" / node
    (nodedir / "lxc").mkdir(parents=True, exist_ok=True)
    (nodedir / "qemu-server").mkdir(parents=True, exist_ok=True)
    for name in ("lxc", "qemu-server"):
        link = paths.pve / name
        if not link.is_symlink():
            link.symlink_to(f"nodes/{node}/{name}")
    (paths.pve / "mapping").mkdir(exist_ok=True)
    gpus = sorted(
        (g for g in facts.gpus if g.driver == "nvidia" and g.minor is not None), key=lambda g: g.minor
    )
    _write_container_conf(paths, nodedir, ctid, gpus)
    _write_vm_conf(nodedir, vmid)
    _write_mapping(paths, node, gpus)


def _write_container_conf(paths: SimPaths, nodedir: Path, ctid: int, gpus: list) -> None:
    """Container ``ctid`` with a ``devN`` entry for every GPU and nvidia node the root has."""
    nodes = [f"/dev/nvidia{g.minor}" for g in gpus] + [f"/dev/{n}" for n in CONTROL_NODES]
    caps = paths.root / "dev/nvidia-caps"
    if caps.is_dir():
        nodes += [f"/dev/nvidia-caps/{p.name}" for p in sorted(caps.iterdir())]
    nodes = [n for n in nodes if os.path.lexists(paths.root / n.lstrip("/"))]
    options = {
        "arch": "amd64",
        "cores": "32",
        "hostname": "llm",
        "memory": "262144",
        "net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:01:01,ip=dhcp,type=veth",
        "ostype": "ubuntu",
        "rootfs": f"local-lvm:vm-{ctid}-disk-0,size=200G",
        "swap": "0",
    }
    for i, n in enumerate(nodes):
        options[devn_key(i)] = format_dev_value(n, mode="0666")
    atomic_write(nodedir / "lxc" / f"{ctid}.conf", write_lxc_conf(LxcConf(options=options)), PMXCFS_MODE)


def _write_vm_conf(nodedir: Path, vmid: int) -> None:
    """VM ``vmid`` (q35, OVMF, guest agent) with ``hostpci0: mapping=pro6000-vm,pcie=1``."""
    atomic_write(
        nodedir / "qemu-server" / f"{vmid}.conf",
        "agent: 1\nbios: ovmf\nboot: order=scsi0\ncores: 32\ncpu: host\n"
        f"efidisk0: local-lvm:vm-{vmid}-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M\n"
        "hostpci0: mapping=pro6000-vm,pcie=1\nmachine: q35\n"
        "memory: 131072\nname: gpu-vm\nnet0: virtio=BC:24:11:00:02:01,bridge=vmbr0\nnuma: 1\nostype: l26\n"
        f"scsi0: local-lvm:vm-{vmid}-disk-0,iothread=1,size=100G\nscsihw: virtio-scsi-single\n"
        f"sockets: 1\nvmgenid: 6f1c2c4e-0000-4000-8000-{vmid:012d}\n",
        PMXCFS_MODE,
    )


def _write_mapping(paths: SimPaths, node: str, gpus: list) -> None:
    """The PCI mapping ``pro6000`` with every GPU, by address."""
    maps = []
    for g in sorted(gpus, key=lambda g: g.address):
        entry = MapEntry(
            id=f"{_hex(g.vendor)}:{_hex(g.device)}",
            node=node,
            path=g.address,
            iommugroup=g.iommu_group,
            subsystem_id=(
                f"{_hex(g.subsystem_vendor)}:{_hex(g.subsystem_device)}"
                if g.subsystem_vendor and g.subsystem_device
                else None
            ),
        )
        maps.append(format_map_entry(entry))
    atomic_write(
        paths.pve / "mapping" / "pci.cfg",
        write_pci_cfg([PciMapping(id="pro6000", maps=maps, description="GPUs of the inference container")]),
        PMXCFS_MODE,
    )


def _hex(value: str | None) -> str:
    return re.sub(r"^0x", "", value or "").lower()
