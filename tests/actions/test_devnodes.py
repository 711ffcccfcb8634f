"""Which nvidia-modprobe command makes which NVIDIA node (NVIDIA/nvidia-modprobe
``nvidia-modprobe.c``), and what :func:`make_nodes` reports when a node is not made."""

from __future__ import annotations

from pathlib import Path

from gputopo.actions.devnodes import make_nodes, missing_nodes, node_command
from gputopo.ports import ExecResult

MINORS = {0: "0000:01:00.0", 4: "0000:81:00.0"}


def _root(tmp_path: Path) -> Path:
    caps = tmp_path / "proc/driver/nvidia/capabilities/mig"
    caps.mkdir(parents=True)
    (caps / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    (tmp_path / "dev").mkdir()
    return tmp_path


def test_each_node_has_the_command_that_makes_it(tmp_path: Path) -> None:
    root = _root(tmp_path)
    table = {
        "/dev/nvidia4": ["nvidia-modprobe", "-c", "4"],
        "/dev/nvidiactl": ["nvidia-modprobe", "-c", "255"],
        "/dev/nvidia-uvm": ["nvidia-modprobe", "-u", "-c", "0"],
        "/dev/nvidia-uvm-tools": ["nvidia-modprobe", "-u", "-c", "0"],
        "/dev/nvidia-modeset": ["nvidia-modprobe", "-m"],
        "/dev/nvidia-caps/nvidia-cap1": [
            "nvidia-modprobe",
            "-f",
            "/proc/driver/nvidia/capabilities/mig/config",
        ],
        "/dev/nvidia9": None,  # no GPU on nvidia has minor 9
        "/dev/nvidia-caps/nvidia-cap2": None,  # the driver lists no capability with minor 2
    }
    assert {p: node_command(p, MINORS, root) for p in table} == table


class FakeHost:
    def __init__(self, root: Path, rc: int, make: bool) -> None:
        self.root, self.rc, self.make, self.ran = root, rc, make, []

    def run(self, argv: list[str], timeout: float) -> ExecResult:
        self.ran.append(argv)
        if self.make:
            (self.root / "dev/nvidia-uvm").touch()
            (self.root / "dev/nvidia-uvm-tools").touch()
        return ExecResult(self.rc, "", "FATAL: Module nvidia_uvm not found.\n" if self.rc else "")


def test_one_command_for_both_uvm_nodes(tmp_path: Path) -> None:
    root = _root(tmp_path)
    host = FakeHost(root, 0, make=True)
    wanted = {"/dev/nvidia-uvm": "CT 101 dev5", "/dev/nvidia-uvm-tools": "CT 101 dev6"}
    made, problems = make_nodes(host, root, wanted, MINORS, 5)
    assert problems == [] and host.ran == [["nvidia-modprobe", "-u", "-c", "0"]]
    assert made == [
        "made /dev/nvidia-uvm for CT 101 dev5 (nvidia-modprobe -u -c 0)",
        "made /dev/nvidia-uvm-tools for CT 101 dev6 (nvidia-modprobe -u -c 0)",
    ]
    assert missing_nodes(root, list(wanted)) == []


def test_a_failing_or_silent_command_is_named_with_the_node(tmp_path: Path) -> None:
    root = _root(tmp_path)
    _, problems = make_nodes(
        FakeHost(root, 1, make=False), root, {"/dev/nvidia-uvm": "CT 101 dev5"}, MINORS, 5
    )
    assert problems == [
        "/dev/nvidia-uvm does not exist and 'nvidia-modprobe -u -c 0' did not make it (exit 1: FATAL: "
        "Module nvidia_uvm not found.); CT 101 dev5 names it: install nvidia-modprobe or make the node "
        "with the driver's udev rules, then apply again"
    ]
    _, problems = make_nodes(FakeHost(root, 0, make=False), root, {"/dev/nvidia4": "CT 101 dev0"}, MINORS, 5)
    assert "(it exited 0 but made no node)" in problems[0]


def test_without_a_host_to_run_on_the_fix_is_the_command(tmp_path: Path) -> None:
    root = _root(tmp_path)
    made, problems = make_nodes(
        None, root, {"/dev/nvidiactl": "CT 101 dev4", "/dev/nvidia9": "CT 101 dev9"}, MINORS, 5
    )
    assert made == []
    assert problems == [
        "/dev/nvidiactl does not exist (CT 101 dev4 names it; the nvidia driver makes no node): run "
        "'nvidia-modprobe -c 255' on the host, then apply again",
        "/dev/nvidia9 does not exist and no GPU on the nvidia driver has minor 9 (CT 101 dev9 names it; "
        "Proxmox refuses a devN whose node is missing): bind its GPU to nvidia or remove that entry",
    ]
