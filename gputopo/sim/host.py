"""A whole simulated Proxmox VE host in one directory, and the ports that drive it.

``SimHost.create(dir)`` builds the seed story (:mod:`gputopo.sim.seed`; docs/ARCHITECTURE.md,
"Simulated host") on a host root made from a fixture or a ``gputopo snapshot``: container 101 running with ``devN`` entries for every GPU
(real minors) and the nvidia control nodes, the PCI mapping ``pro6000`` with every GPU, a
stopped VM 201 (q35, OVMF, guest agent) with ``hostpci0: mapping=pro6000-vm,pcie=1``, and in the container an SGLang
(or vLLM) unit serving with ``--tp <all GPUs>``. ``host.start()`` serves the Proxmox API
(:class:`gputopo.sim.pveapi.PveApiServer`, TLS on loopback) and the container's inference
endpoint; ``host.ports()`` hands out the :class:`gputopo.ports.Ports` apply and verify use.
All state lives in files, so ``SimHost.open(dir)`` in another process sees the same host.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from gputopo.errors import SimHostError
from gputopo.sim import pace, state
from gputopo.sim.container import EndpointServer, SimExec, SimPaths
from gputopo.sim.container.modelfiles import MODELS
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.guesthooks import Hooks
from gputopo.sim.pace import HA_CRM, VM_SHUTDOWN
from gputopo.sim.seed import DEFAULT_CT, DEFAULT_VM, SERVICE_COMMANDS, build_host

__all__ = ["DEFAULT_CT", "DEFAULT_VM", "HA_CRM", "SERVICE_COMMANDS", "VM_SHUTDOWN", "SimHost"]


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
        model: str | None = None,
    ) -> SimHost:
        """Create a simulated host in ``dir`` (must not exist or be empty) and return it.

        ``source``: a fixture name (``seed``), a fixture yaml, or a ``gputopo snapshot``
        ``.tar.gz``; ``root`` instead copies an existing host root directory. ``node`` defaults
        to the root's hostname; ``vm`` is the stopped VM's vmid; ``model`` the model the container
        serves (one of :data:`gputopo.sim.container.modelfiles.MODELS`; unset: the seed's where it
        fits the GPUs, else the small one). Raises :class:`SimHostError`
        for a non-empty ``dir``, an unknown ``service`` or a root without GPUs on nvidia;
        :class:`gputopo.errors.FixtureError` for a bad fixture. A failed create leaves ``dir`` as it was.
        """
        dir = Path(dir)
        if dir.exists() and any(dir.iterdir()):
            raise SimHostError(str(dir), "directory is not empty")
        if service not in SERVICE_COMMANDS:
            raise SimHostError(str(dir), f"unknown service {service!r} (sglang or vllm)")
        if model is not None and model not in MODELS:
            raise SimHostError(str(dir), f"unknown model {model!r} ({' or '.join(MODELS)})")
        src = str(source)
        existed = dir.exists()
        try:
            build_host(dir, src, node, container, service, pve_version, root, vm, model)
            return cls(dir)
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
        return pace.set_latencies(self.paths.root, self.paths.run, scale, moving, vm_shutdown)

    def make_ha_managed(self, sid: str, requested: str | None = None) -> None:
        """Make guest ``sid`` (``ct:101``, ``vm:201``) an HA resource with requested state
        ``requested`` (None: the guest's own, ``started`` for a running guest, ``stopped`` for
        a stopped one, which the HA manager would otherwise start on its own), as
        ``ha-manager add <sid> --state <requested>`` writes
        ``ha/resources.cfg``; its start, stop and shutdown then go through the HA manager
        (:mod:`gputopo.sim.pveapi.hacrm`). Raises SimHostError for a malformed ``sid``, a guest
        that has no config or a state the HA manager does not know."""
        from gputopo.formats.hacfg import Section, parse_section_config, write_section_config

        kind, _, vmid = sid.partition(":")
        if kind not in ("ct", "vm") or not vmid.isdigit():
            raise SimHostError(sid, "an HA resource id is ct:<vmid> or vm:<vmid>")
        if requested is None:
            running = state.guest_status(self.paths.run, "lxc" if kind == "ct" else "qemu", vmid) == "running"
            requested = "started" if running else "stopped"
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
