"""A whole simulated Proxmox VE host in one directory, and the ports that drive it.

``SimHost.create(dir)`` builds the seed story (docs/DESIGN.md) on a host root made from a
fixture or a ``gputopo snapshot``: container 101 running with ``devN`` entries for every GPU
(real minors) and the nvidia control nodes, the PCI mapping ``pro6000`` with every GPU, a
stopped VM 201 (q35, OVMF, guest agent) with ``hostpci0: mapping=pro6000-vm,pcie=1``, and in the container an SGLang
(or vLLM) unit serving with ``--tp <all GPUs>``. ``host.start()`` serves the Proxmox API
(:class:`gputopo.sim.pveapi.PveApiServer`, TLS on loopback) and the container's inference
endpoint; ``host.ports()`` hands out the :class:`gputopo.ports.Ports` apply and verify use.
All state lives in files, so ``SimHost.open(dir)`` in another process sees the same host.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from gputopo.errors import SimHostError
from gputopo.formats.devn import devn_key
from gputopo.formats.lxcconf import LxcConf, format_dev_value, write_lxc_conf
from gputopo.formats.pcicfg import MapEntry, PciMapping, format_map_entry, write_pci_cfg
from gputopo.sim import state
from gputopo.sim.container import Container, EndpointServer, SimExec, SimPaths, write_unit
from gputopo.sim.container.distro import lsb_release
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.guesthooks import Hooks
from gputopo.sim.hostroot import materialize

DEFAULT_CT = 101
DEFAULT_VM = 201
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
SERVICE_COMMANDS = {
    "sglang": (
        "/opt/sglang/.venv/bin/python -m sglang.launch_server --model-path /models/Qwen3-235B-A22B-FP8 "
        "--served-model-name qwen3 --host 0.0.0.0 --port 30000 --tp {tp}"
    ),
    "vllm": (
        "/usr/local/bin/vllm serve /models/Qwen3-235B-A22B-FP8 --served-model-name qwen3 "
        "--host 0.0.0.0 --port 8000 --tensor-parallel-size {tp}"
    ),
}


UBUNTU_RELEASE = "24.04"  # the container's distribution release (a known one: its start does not warn)

# A real server's pace (seconds), used by set_latencies(): what an operator waits for.
SERVICE_STOP, SERVICE_START = 3.0, 20.0
CT_STOP, CT_START = 4.0, 6.0
VFIO_BIND, NVIDIA_BIND = 0.3, 0.5
UNBIND_MIN, UNBIND_MAX = 1.0, 3.0
# A guest OS's own shutdown after Proxmox's ACPI powerdown (qmshutdown): its services stop, its
# filesystems sync and unmount. Seconds to tens of seconds: a graceful guest stop "typically takes
# 30 to 60 seconds" (HP Integrity Virtual Machines Manager 4.1 user guide, "Stopping virtual
# machines"), and Proxmox waits 60 s for it by default (qemu-server QemuServer.pm _do_vm_stop;
# 180 s for its start/stop order, pve-docs qm.adoc "Shutdown timeout"). 20 s is a Linux guest
# stopping its own inference server (as the container's does, 3 s) and the rest of its units.
VM_SHUTDOWN = 20.0
# The HA manager's delay between a hastart/hastop task's OK and the guest's move: the CRM and
# the LRM each work in 10 s rounds (pve-ha-manager src/PVE/HA/CRM.pm / LRM.pm, $max_time = 10);
# a request waits on average half a round for each.
HA_CRM = 10.0


def _extract_snapshot(archive: Path, dest: Path) -> None:
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


class SimHost:
    """A simulated host rooted at ``dir``; see the module docstring."""

    def __init__(self, dir: str | os.PathLike):
        self.dir = Path(dir)
        self.paths = SimPaths(self.dir)
        info = state.read_state(self.paths.run, "host", None)
        if info is None:
            raise SimHostError(
                str(self.dir), "not a simulated host (no run/host.json); create one with 'gputopo sim create'"
            )
        self.info: dict[str, Any] = info
        self.node: str = info["node"]
        self.version: str = info.get("pve_version", "8.4.1")
        self.container: int = int(info.get("container", DEFAULT_CT))
        self.api = None
        self.endpoint: EndpointServer | None = None
        self.hooks = Hooks(self.dir)

    # -- creation --

    @classmethod
    def create(
        cls,
        dir: str | os.PathLike,
        source: str | os.PathLike = "seed",
        node: str | None = None,
        container: int = DEFAULT_CT,
        service: str = "sglang",
        pve_version: str = "8.4.1",
        root: str | os.PathLike | None = None,
        vm: int = DEFAULT_VM,
    ) -> SimHost:
        """Create a simulated host in ``dir`` (must not exist or be empty) and return it.

        ``source``: a fixture name (``seed``), a fixture yaml, or a ``gputopo snapshot``
        ``.tar.gz``; ``root`` instead copies an existing host root directory. ``node`` defaults
        to the root's hostname; ``vm`` is the stopped VM's vmid. Raises :class:`SimHostError`
        for a non-empty ``dir``, an unknown ``service`` or a root without GPUs on nvidia;
        :class:`gputopo.errors.FixtureError` for a bad fixture. A failed create leaves ``dir`` as it was.
        """
        dir = Path(dir)
        if dir.exists() and any(dir.iterdir()):
            raise SimHostError(str(dir), "directory is not empty")
        if service not in SERVICE_COMMANDS:
            raise SimHostError(str(dir), f"unknown service {service!r} (sglang or vllm)")
        paths = SimPaths(dir)
        src = str(source)
        existed = dir.exists()
        try:
            return cls._build(dir, paths, src, node, container, service, pve_version, root, vm)
        except BaseException:
            # a failed create leaves nothing behind: the directory is as it was (absent or empty)
            if existed:
                for child in list(dir.iterdir()):
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
            else:
                shutil.rmtree(dir, ignore_errors=True)
            raise

    @classmethod
    def _build(
        cls,
        dir: Path,
        paths: SimPaths,
        src: str,
        node: str | None,
        container: int,
        service: str,
        pve_version: str,
        root: str | os.PathLike | None,
        vm: int = DEFAULT_VM,
    ) -> SimHost:
        from gputopo.facts.discover import discover

        if root is not None:
            shutil.copytree(root, paths.root, symlinks=True)
        elif src.endswith((".tar.gz", ".tgz", ".tar")):
            _extract_snapshot(Path(src), paths.root)
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
        _write_pve(paths, hostname, container, facts, vm)
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
        unit = f"{service}.service"
        write_unit(
            dir,
            container,
            unit,
            f"[Unit]\nDescription={service} inference server\nAfter=network-online.target\n\n"
            f"[Service]\nType=simple\nExecStart={SERVICE_COMMANDS[service].format(tp=len(gpus))}\n"
            f"Restart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n",
        )
        release = paths.rootfs(container) / "etc/lsb-release"
        release.parent.mkdir(parents=True, exist_ok=True)
        release.write_text(lsb_release(UBUNTU_RELEASE))
        state.set_guest_status(paths.run, "lxc", container, "running")
        state.set_guest_status(paths.run, "qemu", vm, "stopped")
        Container(dir, container).boot()
        return cls(dir)

    @classmethod
    def open(cls, dir: str | os.PathLike) -> SimHost:
        """Reattach to the simulated host in ``dir``. Raises :class:`SimHostError` when none."""
        return cls(dir)

    # -- serving --

    def start(self, port: int = 0, tls: bool = True, endpoint_port: int = 0) -> SimHost:
        """Serve the Proxmox API (``port`` 0: any free port) and the inference endpoint on loopback.

        Raises :class:`SimHostError` when a fixed ``port`` is asked of a server that cannot.
        """
        from gputopo.sim.pveapi import PveApiServer

        kw: dict[str, Any] = {"tls": tls, "hooks": self.hooks}
        if port:
            kw["port"] = port
        lat = state.read_state(self.paths.run, "latencies", {}) or {}
        if "auth.fail" in lat:  # how late a 401 comes (a real node: 3 s)
            kw["auth_fail_delay"] = float(lat["auth.fail"])
        self.api = PveApiServer(
            self.paths.pve, self.paths.run, self.paths.root, self.node, self.version, **kw
        )
        try:
            self.api.start()
        except OSError as e:
            self.api = None
            raise SimHostError(
                str(self.dir), f"cannot serve the API on 127.0.0.1:{port or 'any port'}: {e.strerror or e}"
            ) from None
        if self.info.get("cluster"):
            from gputopo.sim.cluster.peers import attach_peers

            attach_peers(self.api, self)
        self.endpoint = EndpointServer(self.dir, self.container, port=endpoint_port).start()
        state.write_state(self.paths.run, "api", {"url": self.api.url})
        return self

    def stop(self) -> None:
        """Stop whatever :meth:`start` started (safe to call twice)."""
        if self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None
        if self.api is not None:
            self.api.stop()
            self.api = None

    def __enter__(self) -> SimHost:
        return self.start() if self.api is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self.api is None:
            raise SimHostError(str(self.dir), "not started")
        return self.api.url

    def ports(self, auth: str = "password"):
        """The :class:`gputopo.ports.Ports` bundle for this host (starts it when needed).

        ``auth`` is ``"password"`` (root@pam ticket) or ``"token"`` (an API token of root@pam,
        which Proxmox refuses for devN changes). Raises ValueError for another ``auth``.
        """
        from gputopo.adapters.credentials import ApiConfig
        from gputopo.adapters.hostfiles import RealHostFiles
        from gputopo.adapters.proxmox import ProxmoxClient
        from gputopo.ports import Ports
        from gputopo.sim.hostcmd import SimHostCommands
        from gputopo.sim.http import SimHttp
        from gputopo.sim.kernel import SimKernel

        if auth not in ("password", "token"):
            raise ValueError(f"auth must be 'password' or 'token', not {auth!r}")
        if self.api is None:
            self.start()
        creds = self.credentials()
        port = self.api.port
        cfg = ApiConfig(
            backend="https",
            host="127.0.0.1",
            port=port,
            node=self.node,
            user="root@pam",
            token_name=creds["token_name"] if auth == "token" else None,
            verify_ssl=bool(self.api.ca_cert_path),
            ca_bundle=str(self.api.ca_cert_path) if self.api.ca_cert_path else None,
            timeout=30.0,
            task_timeout=60.0,
            poll_interval=0.05,
        )
        # the simulator's throw-away secrets go in as the environment, as an operator's would
        env = (
            {"GPUTOPO_PVE_TOKEN_SECRET": creds["token_value"]}
            if auth == "token"
            else {"GPUTOPO_PVE_PASSWORD": creds["password"]}
        )
        client = ProxmoxClient.from_config(cfg, env=env)
        endpoints = {self.container: self.endpoint.url} if self.endpoint else {}
        http = SimHttp(self.dir, endpoints)

        def close() -> None:
            http.close()
            self.stop()

        from gputopo.adapters.clusterapi import ClusterApi

        return Ports(
            sysfs=SimKernel(str(self.paths.root)),
            proxmox=client,
            exec=SimExec(self.dir),
            files=RealHostFiles(str(self.paths.root)),
            http=http,
            close=close,
            host=SimHostCommands(self.dir),
            cluster=ClusterApi(client),
        )

    def set_latencies(
        self, scale: float = 1.0, moving: list[str] | None = None, vm_shutdown: float = VM_SHUTDOWN
    ) -> dict[str, float]:
        """Give the host a real server's pace, every latency multiplied by ``scale``.

        At scale 1 (seconds): nvidia unbind 1-3 per GPU (spread over ``moving``, the GPUs that
        will move, in order), vfio-pci bind 0.3, nvidia bind 0.5, container stop 4 / start 6,
        service stop 3 / start 20, a VM's guest shutdown ``vm_shutdown`` (20). Returns the
        per-operation latencies at scale 1 (``unbind`` per address under ``unbind:<address>``)
        so a caller can compute a critical path. A host without this call answers every task
        at once (the tests' pace).
        """
        from gputopo.sim.kernel import SimKernel

        moving = moving or []
        step = (UNBIND_MAX - UNBIND_MIN) / max(1, len(moving) - 1)
        unbind = {a: UNBIND_MIN + i * step for i, a in enumerate(moving)}
        SimKernel(str(self.paths.root)).configure(
            time_scale=scale,
            latency={"vfio-pci.bind": VFIO_BIND, "nvidia.bind": NVIDIA_BIND, "nvidia.unbind": UNBIND_MIN},
            address_latency={a: {"unbind": v} for a, v in unbind.items()},
        )
        state.write_state(
            self.paths.run,
            "latencies",
            {
                "vzshutdown": CT_STOP * scale,
                "vzstop": CT_STOP * scale,
                "vzstart": CT_START * scale,
                "service.stop": SERVICE_STOP * scale,
                "service.start": SERVICE_START * scale,
                "qmshutdown": vm_shutdown * scale,
                "ha.crm": HA_CRM * scale,
            },
        )
        out = {
            "service.stop": SERVICE_STOP,
            "service.start": SERVICE_START,
            "ct.stop": CT_STOP,
            "ct.start": CT_START,
            "vm.shutdown": vm_shutdown,
            "ha.crm": HA_CRM,
            "vfio-pci.bind": VFIO_BIND,
            "nvidia.bind": NVIDIA_BIND,
        }
        out.update({f"unbind:{a}": v for a, v in unbind.items()})
        return out

    def make_ha_managed(self, sid: str, requested: str = "started") -> None:
        """Make guest ``sid`` (``ct:101``, ``vm:201``) an HA resource with requested state
        ``requested``, as ``ha-manager add <sid> --state <requested>`` writes
        ``ha/resources.cfg``; its start, stop and shutdown then go through the HA manager
        (:mod:`gputopo.sim.pveapi.hacrm`). Raises SimHostError for a malformed ``sid``, a guest
        that has no config or a state the HA manager does not know."""
        from gputopo.formats.hacfg import Section, parse_section_config, write_section_config

        kind, _, vmid = sid.partition(":")
        if kind not in ("ct", "vm") or not vmid.isdigit():
            raise SimHostError(sid, "an HA resource id is ct:<vmid> or vm:<vmid>")
        if requested not in ("started", "stopped", "disabled", "ignored"):
            raise SimHostError(sid, f"unknown HA state {requested!r} (started, stopped, disabled, ignored)")
        conf = (
            self.paths.pve / "nodes" / self.node / ("lxc" if kind == "ct" else "qemu-server") / f"{vmid}.conf"
        )
        if not conf.is_file():
            raise SimHostError(sid, f"no such guest: {conf} does not exist")
        path = self.paths.pve / "ha" / "resources.cfg"
        sections = parse_section_config(path.read_text()) if path.is_file() else []
        sections = [s for s in sections if s.sid != sid]
        sections.append(Section(type=kind, id=vmid, props={"state": requested}))
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, write_section_config(sections), PMXCFS_MODE)

    def credentials(self) -> dict[str, str]:
        """root@pam's password and an API token of root@pam, as the API server holds them."""
        api = self.api
        if api is None:
            raise SimHostError(str(self.dir), "not started")
        token_id = api.root_token_id
        return {
            "user": "root@pam",
            "password": api.root_password,
            "token_name": token_id.split("!", 1)[1],
            "token_value": api.root_token_secret,
            "token_id": token_id,
        }


def _write_pve(paths: SimPaths, node: str, ctid: int, facts, vmid: int = DEFAULT_VM) -> None:
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
