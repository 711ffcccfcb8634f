"""The :class:`gputopo.ports.HttpPort` of a simulated host.

A request for a simulated container's address (:mod:`gputopo.sim.addresses`) goes to that
container's endpoint, which the simulator serves on loopback; the port must be the one the
container's inference server listens on (its ``--port``, else the server's default), or the
connection is refused as on a real network. Any other URL goes out as a real request.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gputopo.adapters.http import RequestsHttp
from gputopo.errors import HttpError
from gputopo.ports import HttpResponse
from gputopo.sim.addresses import vmid_of_address


class SimHttp:
    """HttpPort routing ``http://<container address>:<port>/...`` to the simulated endpoints."""

    def __init__(self, sim_dir: str | os.PathLike, endpoints: dict[int, str]):
        self.sim_dir = sim_dir
        self.endpoints = dict(endpoints)  # vmid -> loopback base URL
        self._started: list = []  # endpoint servers this port started for other containers
        self._lock = threading.Lock()
        self._real = RequestsHttp()

    def _endpoint(self, vmid: int) -> str | None:
        """The loopback URL of container ``vmid``'s endpoint; one is started for a container that
        exists but has none yet (a second container of a scenario). None for no such container."""
        from gputopo.sim.container import EndpointServer, SimPaths

        with self._lock:
            if vmid not in self.endpoints:
                if not SimPaths(self.sim_dir).lxc_conf(vmid).is_file():
                    return None
                server = EndpointServer(self.sim_dir, vmid).start()
                self._started.append(server)
                self.endpoints[vmid] = server.url
            return self.endpoints[vmid]

    def close(self) -> None:
        """Stop the endpoint servers this port started."""
        with self._lock:
            for server in self._started:
                server.stop()
            self._started.clear()

    def request(self, method: str, url: str, *, json: Any = None, timeout: float) -> HttpResponse:
        """See :class:`gputopo.ports.HttpPort`. Raises HttpError when no reply came."""
        from gputopo.sim.container import Container
        from gputopo.sim.container.server_args import listening_port

        parts = urlsplit(url)
        vmid = vmid_of_address(parts.hostname)
        if vmid is None:
            return self._real.request(method, url, json=json, timeout=timeout)
        endpoint = self._endpoint(vmid)
        ct = Container(self.sim_dir, vmid)
        if endpoint is None or not ct.running():
            raise HttpError(url, "No route to host")  # the address is down with its container
        active = ct.active_server()
        if active is not None and parts.port != listening_port(active[1].get("argv", [])):
            raise HttpError(url, "Connection refused")
        target = urlsplit(endpoint)
        return self._real.request(
            method,
            urlunsplit((target.scheme, target.netloc, parts.path, parts.query, "")),
            json=json,
            timeout=timeout,
        )
