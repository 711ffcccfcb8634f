"""Processes under <root>/proc: pure parsers on literal strings, readers on real-layout trees."""

from __future__ import annotations

import os
from pathlib import Path

from gputopo.facts.pci import read_drm_nodes
from gputopo.facts.procfs import (
    Holder,
    find_holders,
    match_fd_links,
    parse_cgroup_container,
    parse_cmdline,
    read_cmdline,
    read_container,
    read_fd_links,
    read_holders,
)

# --- parsers -------------------------------------------------------------------------------


def test_parse_cgroup_container():
    assert parse_cgroup_container("0::/lxc/101/ns/system.slice/sglang.service\n") == 101
    assert parse_cgroup_container("4:devices:/lxc/205\n1:name=systemd:/lxc/205/init.scope\n") == 205
    assert parse_cgroup_container("0::/lxc.payload.300/system.slice\n") == 300
    # pve-container (src/PVE/LXC.pm) puts a container in lxc/<vmid> and its monitor, a host
    # process, in lxc.monitor/<vmid>
    assert parse_cgroup_container("0::/lxc.monitor/301\n") is None
    assert parse_cgroup_container("0::/system.slice/nvidia-persistenced.service\n") is None
    assert parse_cgroup_container("0::/user.slice/lxc/x/\n") is None
    assert parse_cgroup_container("") is None


def test_parse_cmdline():
    assert parse_cmdline(b"/usr/lib/xorg/Xorg\0:0\0-nolisten\0tcp\0") == "/usr/lib/xorg/Xorg :0 -nolisten tcp"
    assert parse_cmdline(b"python3\0-c\0print(1)\0") == "python3 -c print(1)"
    assert parse_cmdline(b"") is None  # a kernel thread or a zombie
    assert parse_cmdline(b"nvidia-smi \xff\0") == "nvidia-smi \ufffd"


def test_match_fd_links():
    links = {
        100: ["/dev/nvidia3", "/dev/nvidiactl", "/dev/null", "socket:[77]"],
        200: ["/dev/nvidia3", "/dev/./nvidia3"],
        300: ["pipe:[1234]", "dev/nvidia3"],
        400: ["/srv/sim/root/dev/nvidia5"],
    }
    paths = ["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia5", "/dev/nvidia0"]
    assert match_fd_links(links, paths, "/srv/sim/root") == {
        "/dev/nvidia3": [100, 200],
        "/dev/nvidiactl": [100],
        "/dev/nvidia5": [400],
    }
    # on the live root a link into another tree is not a device node
    assert match_fd_links(links, paths) == {"/dev/nvidia3": [100, 200], "/dev/nvidiactl": [100]}
    assert match_fd_links({}, paths) == {}


# --- readers on a real /proc layout ----------------------------------------------------------


def _process(
    root: Path,
    pid: int,
    targets: list[str],
    comm: str | None = None,
    argv: tuple[str, ...] | None = None,
    cgroup: str | None = None,
) -> None:
    """``<root>/proc/<pid>`` as the kernel shows it: comm (with its newline), cmdline
    (NUL-ended arguments), cgroup, and ``fd/<n>`` links to what the process has open."""
    proc = root / "proc" / str(pid)
    (proc / "fd").mkdir(parents=True)
    if comm is not None:
        (proc / "comm").write_text(comm + "\n")
    if argv is not None:
        (proc / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    if cgroup is not None:
        (proc / "cgroup").write_text(cgroup + "\n")
    for n, t in enumerate(targets):
        os.symlink(t, proc / "fd" / str(n))


def test_read_holders(tmp_path):
    _process(
        tmp_path,
        100,
        ["/dev/nvidia3", "/dev/nvidiactl", "/dev/null"],
        "python3",
        ("/opt/sglang/bin/python", "-m", "sglang.launch_server", "--tp", "4"),
        "0::/lxc/101/ns/system.slice/sglang.service",
    )
    _process(
        tmp_path,
        200,
        ["/dev/nvidia3"],
        "nvidia-persiste",
        ("/usr/bin/nvidia-persistenced",),
        "0::/system.slice/nvidia-persistenced.service",
    )
    _process(tmp_path, 300, ["/dev/pts/0", "pipe:[1234]"], "bash", ("-bash",), "0::/user.slice")
    # a process that is exiting: its comm is still there, cmdline and cgroup are gone
    _process(tmp_path, 400, [str(tmp_path / "dev/nvidia5")], "python3")
    # one that vanished between the listing of /proc and the reading of its files
    _process(tmp_path, 500, ["/dev/nvidia5"])
    (tmp_path / "proc/self").symlink_to("100")
    (tmp_path / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz\n")

    assert sorted(read_fd_links(tmp_path)[300]) == ["/dev/pts/0", "pipe:[1234]"]  # in directory order
    assert sorted(read_fd_links(tmp_path)) == [100, 200, 300, 400, 500]
    assert (
        read_cmdline(tmp_path, 200) == "/usr/bin/nvidia-persistenced" and read_cmdline(tmp_path, 400) is None
    )
    assert read_container(tmp_path, 100) == 101 and read_container(tmp_path, 200) is None
    assert read_container(tmp_path, 999) is None

    got = read_holders(tmp_path, ["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia5", "/dev/nvidia0"])
    sglang = Holder(
        100, "python3", "/opt/sglang/bin/python -m sglang.launch_server --tp 4", 101, "sglang.service"
    )
    assert got == {
        "/dev/nvidia3": [
            sglang,
            Holder(
                200, "nvidia-persiste", "/usr/bin/nvidia-persistenced", None, "nvidia-persistenced.service"
            ),
        ],
        "/dev/nvidiactl": [sglang],
        "/dev/nvidia5": [Holder(400, "python3", None, None), Holder(500, "?", None, None)],
    }
    assert find_holders(tmp_path, ["/dev/nvidia3", "/dev/nvidia5"]) == {
        "/dev/nvidia3": [(100, "python3"), (200, "nvidia-persiste")],
        "/dev/nvidia5": [(400, "python3"), (500, "?")],
    }
    assert read_holders(tmp_path / "nowhere", ["/dev/nvidia0"]) == {}
    assert find_holders(tmp_path / "nowhere", ["/dev/nvidia0"]) == {}


def test_read_drm_nodes(tmp_path):
    # The kernel puts a PCI device's DRM minors in a "drm" class directory below the device
    # (drivers/base/core.c: get_device_parent makes the class glue directory).
    dev = tmp_path / "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0"
    (dev / "drm/card1").mkdir(parents=True)
    (dev / "drm/renderD128").mkdir()
    (dev / "drm/controlD65").mkdir()  # a control minor (older kernels): only card and render nodes count
    bus = tmp_path / "sys/bus/pci/devices"
    bus.mkdir(parents=True)
    (bus / "0000:01:00.0").symlink_to("../../../devices/pci0000:00/0000:00:01.1/0000:01:00.0")
    (bus / "0000:02:00.0").symlink_to("../../../devices/pci0000:00/0000:00:01.2/0000:02:00.0")
    assert read_drm_nodes(tmp_path, "0000:01:00.0") == ["card1", "renderD128"]
    assert read_drm_nodes(tmp_path, "0000:02:00.0") == []
    assert read_drm_nodes(tmp_path / "nowhere", "0000:01:00.0") == []
