"""The simulated Proxmox API server on loopback for tests: the seed host's root (made once per
module) and a started server holding given guest configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from gputopo.sim.hostroot import materialize
from gputopo.sim.pveapi import PveApiServer


@pytest.fixture(scope="module")
def seed_root(tmp_path_factory):
    """The seed host's root (sysfs, /dev, /proc), materialized once per test module."""
    return materialize("seed", tmp_path_factory.mktemp("seed") / "root")


def api_server(tmp_path: Path, seed_root: Path, confs: dict[tuple[str, int], str]) -> PveApiServer:
    """An API server on loopback over ``tmp_path``/pve and ``tmp_path``/run holding each
    ``(kind, vmid) -> config text`` of ``confs`` (kind ``lxc`` or ``qemu``), not started."""
    s = PveApiServer(tmp_path / "pve", tmp_path / "run", seed_root, auth_fail_delay=0.0)
    for (kind, vmid), text in confs.items():
        s.write_conf(kind, vmid, text)
    return s


def token_put(s: PveApiServer, path: str, body: str) -> requests.Response:
    """A PUT of the raw form ``body`` to ``path`` with root's API token, as a client sends it
    (``application/x-www-form-urlencoded``), for what proxmoxer would encode differently."""
    return requests.put(
        f"{s.url}{path}",
        data=body.encode(),
        timeout=10,
        verify=str(s.ca_cert_path),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Authorization": f"PVEAPIToken={s.root_token_id}={s.root_token_secret}",
        },
    )
