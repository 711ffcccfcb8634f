"""Whether a guest is HA-managed, read from Proxmox's files (``ha/resources.cfg``) as
pve-ha-manager Config.pm vm_is_ha_managed / service_check_ha_state read it."""

from __future__ import annotations

import pytest

from gputopo.adapters.pvefiles import PveFiles


@pytest.mark.parametrize(
    "text, kind, vmid, want",
    [
        ("ct: 101\n\tstate stopped\n", "lxc", 101, {"managed": 1, "state": None, "requested": "stopped"}),
        ("ct: 101\n", "lxc", 101, {"managed": 1, "state": None, "requested": "started"}),  # the default
        ("vm: 201\n\tstate enabled\n", "qemu", 201, {"managed": 1, "state": None, "requested": "started"}),
        ("ct: 101\n\tstate ignored\n", "lxc", 101, {"managed": 0}),  # ignored: not managed
        ("vm: 201\n\tstate started\n", "lxc", 101, {"managed": 0}),
        (None, "lxc", 101, {"managed": 0}),  # no HA configured
    ],
)
def test_guest_ha_from_resources_cfg(tmp_path, text, kind, vmid, want):
    if text is not None:
        (tmp_path / "ha").mkdir()
        (tmp_path / "ha/resources.cfg").write_text(text)
    assert PveFiles(tmp_path, "pve1").guest_ha(kind, vmid) == want
