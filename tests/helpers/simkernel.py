"""A small host for the simulated kernel's tests, with both real GPU layouts, and its fixtures."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from gputopo.sim.hostroot import DeviceSpec, HostSpec, NumaSpec, materialize
from gputopo.sim.kernel import KernelEvent, SimKernel

ADA, ADA_AUDIO = "0000:41:00.0", "0000:41:00.1"
ADA2, ADA2_AUDIO = "0000:c1:00.0", "0000:c1:00.1"
PRO = ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0"]
SPARE = "0000:e1:00.0"  # an RTX PRO 6000 nobody had bound when the tree was first seen
DUMMY = "0000:e2:00.2"  # a function no driver matches
PSP = "0000:e2:00.1"  # bound to ccp, which the built-in match table does not know


def root_port(addr: str) -> str:
    """The root port a card at ``addr`` hangs from in :func:`host_spec`."""
    bus = int(addr[5:7], 16)
    return f"0000:00:{(bus % 0x1F) or 1:02x}.1"


def host_spec() -> HostSpec:
    """A small host with both real layouts gputopo meets: RTX PRO 6000s alone in their groups
    (seed), RTX 6000 Adas with an HDMI audio function in the same group (ESC8000A)."""
    devices: list[DeviceSpec] = []

    def card(addr: str, preset: str, **kw) -> None:
        port = root_port(addr)
        if not any(d.addr == port for d in devices):
            devices.append(DeviceSpec(addr=port, preset="pcie-root-port"))
        devices.append(DeviceSpec(addr=addr, preset=preset, parent=port, **kw))

    for minor, a in enumerate(PRO):
        card(a, "rtx-pro-6000", minor=minor)
    card(ADA, "rtx-6000-ada", minor=3)
    card(ADA_AUDIO, "rtx-6000-ada-audio")
    card(ADA2, "rtx-6000-ada", minor=4)
    card(ADA2_AUDIO, "rtx-6000-ada-audio")
    card(SPARE, "rtx-pro-6000", unbound=True)
    card("0000:e2:00.0", "amd-dummy-function")
    card(PSP, "amd-psp")
    card(DUMMY, "amd-dummy-function")
    return HostSpec(
        hostname="pve-test",
        cmdline="BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 amd_iommu=on",
        nvidia_driver="570.124.06",
        numa=[NumaSpec(id=0, cpus="0-15")],
        modules=["nvidia", "vfio_pci", "snd_hda_intel", "ccp"],
        devices=devices,
    )


_TEMPLATE: list[Path] = []


def build_root(path: Path) -> Path:
    """A fresh copy of the :func:`host_spec` tree under ``path`` (built once per session)."""
    if not _TEMPLATE:
        _TEMPLATE.append(materialize(host_spec(), Path(tempfile.mkdtemp(prefix="gputopo-kern-")) / "root"))
    return Path(shutil.copytree(_TEMPLATE[0], path / "root", symlinks=True))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return build_root(tmp_path)


@pytest.fixture
def kern(root: Path) -> SimKernel:
    return SimKernel(root, time_scale=0.0)


def overlap_all(events: list[KernelEvent]) -> bool:
    """Whether every event was under way at one same moment (none waited for another)."""
    return max(e.start for e in events) < min(e.end for e in events)
