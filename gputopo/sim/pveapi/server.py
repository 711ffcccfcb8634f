"""A simulated Proxmox VE API server: real HTTP(S) on loopback, state in real files.

It answers the calls gputopo makes the way a PVE node does (see docs: proxmox-api-wire.md):
the same paths under ``/api2/json``, the same request pipeline (401 before 501 before 403
before 400 before the handler), the same status codes, reason phrases and bodies, UPID tasks
that take time and can fail, and API-token / ticket+CSRF authentication.

State lives where Proxmox keeps it, in Proxmox's formats (written with :mod:`gputopo.formats`):
``<pve_root>/nodes/<node>/lxc/<vmid>.conf``, ``nodes/<node>/qemu-server/<vmid>.conf`` and
``mapping/pci.cfg``. Runtime state (guest status, tasks, latencies, faults) is JSON under
``run_dir`` through :mod:`gputopo.sim.state`, so another process sees the same host.

The pieces: :mod:`.routes` (paths and parameters), :mod:`.params` (formats), :mod:`.auth`,
:mod:`.pipeline` (the order of checks), the handlers (:mod:`.node`, :mod:`.guest_config`,
:mod:`.guest_status`, :mod:`.tasks`, :mod:`.mappings`, :mod:`.qemu_config`, :mod:`.qemu_vm`), :mod:`.http_handler` (the wire) and
:mod:`.pvesh` (the command line).
"""

from __future__ import annotations

import secrets
import ssl
import threading
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.pveapi.auth import Auth
from gputopo.sim.pveapi.cluster import ClusterHandlers
from gputopo.sim.pveapi.guest_config import GuestConfigHandlers
from gputopo.sim.pveapi.guest_status import GuestStatusHandlers
from gputopo.sim.pveapi.ha import HaHandlers
from gputopo.sim.pveapi.hacrm import HaCrmHandlers
from gputopo.sim.pveapi.http_handler import ApiRequestHandler
from gputopo.sim.pveapi.mappings import MappingHandlers
from gputopo.sim.pveapi.node import NodeHandlers
from gputopo.sim.pveapi.pipeline import Pipeline
from gputopo.sim.pveapi.qemu_config import QemuConfigHandlers
from gputopo.sim.pveapi.qemu_vm import QemuVmHandlers
from gputopo.sim.pveapi.routes import API_PREFIX
from gputopo.sim.pveapi.tasks import TaskHandlers

# pve-http-server AnyEvent.pm authenticate_and_handle_request: "always delay unauthorized calls
# by 3 seconds" (a bad login at /access/ticket too, handle_api2_request)
AUTH_FAIL_DELAY = 3.0


class PveApiServer(
    Auth,
    Pipeline,
    NodeHandlers,
    GuestConfigHandlers,
    GuestStatusHandlers,
    TaskHandlers,
    MappingHandlers,
    QemuConfigHandlers,
    QemuVmHandlers,
    ClusterHandlers,
    HaHandlers,
    HaCrmHandlers,
):
    """The simulated API server of one PVE node.

    Credentials are attributes: ``root_password`` (ticket login as root@pam),
    ``root_token_id``/``root_token_secret`` (token ``root@pam!gputopo``), ``operator_user``
    with ``operator_password`` and ``operator_token_id``/``operator_token_secret`` (a non-root
    user with VM and mapping privileges). ``hooks`` may have ``on_guest_start(kind, vmid)`` /
    ``on_guest_stop(kind, vmid)``; they run inside the task and an exception fails the task
    with its message. ``on_lxc_hotplug(vmid, key, value)`` runs after a running container's
    new ``devN`` was hot-plugged (PVE 9). A VM start does Proxmox's PCI passthrough on the
    sysfs root (mapping check, device choice, vfio-pci binding through new_id; see
    :mod:`gputopo.sim.passthrough`) and fails its task with Proxmox's message. In a simulated
    cluster ``peers`` maps the other nodes' names to their (unstarted) servers: node paths of
    theirs are answered by them (:mod:`.cluster`); the HA manager's API is :mod:`.ha`.
    """

    def __init__(
        self,
        pve_root: Path,
        run_dir: Path,
        sysfs_root: Path | None = None,
        node: str = "pve1",
        version: str = "8.4.1",
        tls: bool = True,
        hooks: Any = None,
        auth_fail_delay: float = AUTH_FAIL_DELAY,
        port: int = 0,
    ):
        self.listen_port = port
        self.pve_root = Path(pve_root)
        self.run_dir = Path(run_dir)
        self.sysfs_root = Path(sysfs_root) if sysfs_root is not None else None
        self.node = node
        self.version = version
        self.tls = tls
        self.hooks = hooks
        # a real node answers every 401 after 3 s; tests that provoke many pass less
        self.auth_fail_delay = auth_fail_delay
        self.root_user = "root@pam"
        self.root_password = secrets.token_urlsafe(12)
        self.root_token_id = "root@pam!gputopo"
        self.root_token_secret = str(uuid.uuid4())
        self.operator_user = "ops@pve"
        self.operator_password = secrets.token_urlsafe(12)
        self.operator_token_id = "ops@pve!gputopo"
        self.operator_token_secret = str(uuid.uuid4())
        self.ca_cert_path: Path | None = None
        self.cert_fingerprint: str | None = None  # SHA-256 of the served certificate, AA:BB:...
        self._lock = threading.RLock()
        self._tickets: dict[str, tuple[str, str]] = {}  # ticket -> (user, csrf)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        self.peers: dict[str, PveApiServer] = {}
        self._layout()

    # --- lifecycle ------------------------------------------------------------------------

    def _layout(self) -> None:
        nd = self.pve_root / "nodes" / self.node
        for sub in ("lxc", "qemu-server"):
            (nd / sub).mkdir(parents=True, exist_ok=True)
        (self.pve_root / "mapping").mkdir(parents=True, exist_ok=True)
        for name, target in (
            ("lxc", f"nodes/{self.node}/lxc"),
            ("qemu-server", f"nodes/{self.node}/qemu-server"),
            ("local", f"nodes/{self.node}"),
        ):
            link = self.pve_root / name
            if not link.is_symlink() and not link.exists():
                link.symlink_to(target)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> PveApiServer:
        """Listen on 127.0.0.1 (``port`` 0: an ephemeral port) in a background thread; returns self."""
        handler = type("Handler", (ApiRequestHandler,), {"server_obj": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", self.listen_port), handler)
        httpd.daemon_threads = True
        if self.tls:
            from gputopo.sim.tls import cert_fingerprint, make_ca_and_server_cert

            ca, cert, key = make_ca_and_server_cert(self.run_dir / "tls", node=self.node)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
            self.ca_cert_path = ca
            self.cert_fingerprint = cert_fingerprint(cert)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="pveapi", daemon=True
        )
        self._thread.start()
        self.resume_tasks()  # the node's tasks run on whoever served them before
        return self

    def stop(self) -> None:
        """Stop listening and cancel pending task timers (their tasks finish on next read)."""
        for t in self._timers:
            t.cancel()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> PveApiServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{API_PREFIX}"

    def conf_path(self, kind: str, vmid: int) -> Path:
        sub = "lxc" if kind == "lxc" else "qemu-server"
        return self.pve_root / "nodes" / self.node / sub / f"{vmid}.conf"

    def write_conf(self, kind: str, vmid: int, text: str) -> None:
        """Place a guest config file (as ``pct create``/``qm create`` would leave it)."""
        atomic_write(self.conf_path(kind, vmid), text, PMXCFS_MODE)

    def mapping_path(self) -> Path:
        return self.pve_root / "mapping" / "pci.cfg"
