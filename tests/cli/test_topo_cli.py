"""``gputopo topo`` and ``plan --svg`` on the command line: piped text, a real terminal (tmux),
JSON with its schema, pictures, bad input, and the README's picture of the seed split."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputopo.topo.model import TopoReport
from helpers import REPO
from helpers.cli import run_cli

README_SVG = REPO / "docs" / "seed-split.svg"
UPDATE = os.environ.get("GPUTOPO_UPDATE_GOLDEN") == "1"
TMUX = shutil.which("tmux")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SPLIT = ["--split", "numa", "--container", "101", "--vm-mapping", "pro6000-vm"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """The demo's seed host: container 101 holds all eight GPUs, VM 201 uses pro6000-vm."""
    from gputopo.sim.host import SimHost

    return SimHost.create(tmp_path_factory.mktemp("topo") / "sim", "seed")


def _where(sim) -> list[str]:
    return ["--root", str(sim.paths.root), "--pve-root", str(sim.paths.pve)]


def test_tree_piped_is_plain_and_fits_80_columns(sim, capsys):
    code, out, err = run_cli(["topo", *_where(sim)], capsys)
    assert code == 0, err
    assert not ANSI.search(out)
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    assert lines[0] == "pve1 · 8 GPUs:  container 101 (8)"
    for i, addr in enumerate(
        [
            "0000:01:00.0",
            "0000:11:00.0",
            "0000:61:00.0",
            "0000:71:00.0",
            "0000:81:00.0",
            "0000:91:00.0",
            "0000:e1:00.0",
            "0000:f1:00.0",
        ]
    ):
        (line,) = [ln for ln in lines if addr in ln]
        assert line.endswith(f"GPU{i} {addr}  container 101")
    assert out.count("RTX PRO 6000 Blackwell Server Edition") == 8  # identical GPUs all listed
    assert "host bridge 0000:80 · root port 0000:80:01.1" in out
    assert "NUMA node 1  CPUs 64-127,192-255" in out


def test_sim_option_reads_the_same(sim, capsys):
    code, out, _ = run_cli(["topo", "--sim", str(sim.dir)], capsys)
    assert code == 0 and "GPU7 0000:f1:00.0  container 101" in out
    code, _, err = run_cli(["topo", "--sim", str(sim.dir), "--root", "/"], capsys)
    assert code == 2 and err.strip() == (
        "gputopo: error: --root and --sim exclude each other (a simulated host has its own root)"
    )


def test_matrix(sim, capsys):
    code, out, _ = run_cli(["topo", "--matrix", *_where(sim)], capsys)
    assert code == 0
    lines = out.splitlines()
    nics = [f"NIC{k}" for k in range(4)]
    assert lines[0].split() == [f"GPU{i}" for i in range(8)] + nics + ["CPU", "Affinity", "NUMA", "Affinity"]
    # seed.yaml: the X710 (82:00.0/.1) and the ConnectX-7 (a1:00.0/.1), no RDMA names: by address
    assert lines[1].split() == [
        "GPU0",
        "X",
        "NODE",
        "NODE",
        "NODE",
        "SYS",
        "SYS",
        "SYS",
        "SYS",
        *["SYS"] * 4,  # GPU0 is on NUMA node 0, every adapter on node 1
        "0-63,128-191",
        "0",
    ]
    # GPU4 (81:00.0 behind root port 80:01.1) and the X710 (behind 80:05.1) share host bridge
    # 0000:80: PHB; the ConnectX-7 hangs from host bridge 0000:a0 on the same node: NODE
    assert lines[5].split()[9:13] == ["PHB", "PHB", "NODE", "NODE"]
    assert lines[8].split()[6:] == [
        "NODE",
        "NODE",
        "X",
        "NODE",
        "NODE",
        "NODE",
        "NODE",
        "64-127,192-255",
        "1",
    ]
    assert lines[9].split() == [
        "NIC0",
        *["SYS"] * 4,
        "PHB",
        "NODE",
        "NODE",
        "NODE",
        "X",
        "PIX",
        "NODE",
        "NODE",
    ]
    assert "  PIX  = Connection traversing at most a single PCIe bridge" in lines
    assert "  GPU6  0000:e1:00.0  minor 7   container 101" in lines
    legend = lines.index("NIC Legend:")
    assert lines[legend + 2 : legend + 6] == [
        "  NIC0: 0000:82:00.0",
        "  NIC1: 0000:82:00.1",
        "  NIC2: 0000:a1:00.0",
        "  NIC3: 0000:a1:00.1",
    ]


def test_json_and_its_schema(sim, capsys):
    code, out, _ = run_cli(["topo", "--json", *_where(sim)], capsys)
    assert code == 0
    report = TopoReport.model_validate_json(out)
    assert report.hostname == "pve1" and len(report.matrix.levels) == 8
    assert [o.model_dump() for o in report.owners] == [
        {"key": "container:101", "label": "container 101", "gpus": 8}
    ]
    code, out, _ = run_cli(["schema", "topo"], capsys)
    schema = json.loads(out)
    assert set(schema["properties"]) == set(TopoReport.model_fields)
    assert {"TreeNode", "GpuView", "OwnerView", "DistanceMatrix"} <= set(schema["$defs"])
    data = json.loads(report.model_dump_json(by_alias=True))
    assert set(data["tree"][0]) == set(schema["$defs"]["TreeNode"]["properties"])
    gpu = data["tree"][0]["children"][0]["children"][0]["children"][0]["gpu"]
    assert gpu["address"] == "0000:01:00.0"
    assert set(gpu) == set(schema["$defs"]["GpuView"]["properties"])
    assert set(gpu["owner"]) == set(schema["$defs"]["OwnerView"]["properties"])


def test_json_with_all_has_adapters_drives_and_the_nic_matrix(sim, capsys):
    code, out, _ = run_cli(["topo", "--json", *_where(sim)], capsys)
    plain = json.loads(out)
    code, out, _ = run_cli(["topo", "--json", "--all", *_where(sim)], capsys)
    assert code == 0
    data = json.loads(out)
    schema = json.loads(run_cli(["schema", "topo"], capsys)[1])

    def walk(node):
        yield node
        for c in node["children"]:
            yield from walk(c)

    kinds = {k: [n for r in data["tree"] for n in walk(r) if n["kind"] == k] for k in ("nic", "nvme")}
    assert [n["id"] for n in kinds["nic"]] == ["0000:82:00.0", "0000:82:00.1", "0000:a1:00.0", "0000:a1:00.1"]
    assert [n["id"] for n in kinds["nvme"]] == ["0000:21:00.0", "0000:22:00.0"]
    assert set(kinds["nic"][0]["device"]) == set(schema["$defs"]["DeviceView"]["properties"])
    assert [n["device"]["nic"] for n in kinds["nic"]] == [0, 1, 2, 3]
    assert not [n for r in plain["tree"] for n in walk(r) if n["kind"] in ("nic", "nvme")]
    # the matrix is the same with or without --all: the adapters are always in it
    assert data["matrix"] == plain["matrix"] and len(data["matrix"]["nic_levels"]) == 4
    assert set(data["matrix"]["nics"][0]) == set(schema["$defs"]["MatrixNic"]["properties"])


def test_pictures_to_files(sim, tmp_path, capsys):
    code, _, err = run_cli(["topo", *_where(sim), "--format", "svg", "-o", str(tmp_path / "t.svg")], capsys)
    assert code == 0 and err.strip() == f"wrote {tmp_path / 't.svg'}"
    assert (tmp_path / "t.svg").read_text().count('class="gpu"') == 8
    code, out, _ = run_cli(["topo", *_where(sim), "--format", "dot"], capsys)
    assert code == 0 and out.startswith('digraph "pve1"') and "NIC0" not in out
    code, out, _ = run_cli(["topo", *_where(sim), "--all", "--format", "dot"], capsys)
    assert code == 0 and all(f"NIC{k} " in out for k in range(4)) and out.count("NVMe 0000:") == 2
    code, _, _ = run_cli(["topo", *_where(sim), "-o", str(tmp_path / "tree.txt")], capsys)
    text = (tmp_path / "tree.txt").read_text()
    assert code == 0 and "GPU0 0000:01:00.0  container 101" in text and not ANSI.search(text)


def _one_line_error(code: int, err: str) -> str:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path, fresh_host, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = _one_line_error(*run_cli(["topo", "--root", str(empty)], capsys)[::2])
    assert line == f"gputopo: error: {empty}: not a sysfs root (no sys/bus/pci/devices)"
    (empty / "sys/bus/pci/devices").mkdir(parents=True)
    line = _one_line_error(*run_cli(["topo", "--root", str(empty)], capsys)[::2])
    assert line.endswith("not a sysfs root (no PCI functions under sys/bus/pci/devices)")
    # a damaged root: a GPU's entry is a copied directory, not a link into sys/devices
    root = fresh_host("seed")
    link = root / "sys/bus/pci/devices/0000:61:00.0"
    real = link.resolve()
    link.unlink()
    shutil.copytree(real, link, symlinks=True)
    line = _one_line_error(*run_cli(["topo", "--root", str(root), "--matrix"], capsys)[::2])
    assert line == (
        f"gputopo: error: {root}: not a sysfs root (0000:61:00.0: sys/bus/pci/devices entry "
        "does not lead into sys/devices)"
    )
    line = _one_line_error(*run_cli(["topo", "--root", str(root), "--format", "png"], capsys)[::2])
    assert line.startswith("gputopo: error: topo: Invalid value for '--format': 'png' is not one of")
    line = _one_line_error(*run_cli(["topo", "--root", str(root), "--format", "svg", "--json"], capsys)[::2])
    assert line == "gputopo: error: --json and --format svg exclude each other"
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not a tar archive")
    line = _one_line_error(*run_cli(["topo", "--root", str(broken)], capsys)[::2])
    assert line.startswith(f"gputopo: error: {broken}")


def test_plan_svg(sim, tmp_path, capsys):
    out_svg = tmp_path / "split.svg"
    code, out, err = run_cli(["plan", *SPLIT, *_where(sim), "--svg", str(out_svg)], capsys)
    assert code == 0, err
    assert "rebind 0000:81:00.0: nvidia -> vfio-pci" in out  # the plan still prints
    svg = out_svg.read_text()
    assert svg.count('class="gpu"') == 16 and svg.count("→ VM mapping pro6000-vm · VM 201") == 4
    assert svg.count("← from container 101") == 4
    code, _, err = run_cli(["plan", *SPLIT, *_where(sim), "--svg", "/proc/nope/x.svg"], capsys)
    # quick mode from Proxmox's files says first that it cannot see the container's unit
    unseen, error = err.strip().splitlines()
    assert unseen == (
        "gputopo: warning: container 101: Proxmox's files cannot show the unit it runs; the service "
        "is not managed and its model's fit is not checked (give --service-unit, or plan with --local)"
    )
    assert _one_line_error(code, error).startswith("gputopo: error: /proc/nope/x.svg: cannot write")


def _readme_svg(sim, tmp_path, capsys) -> str:
    out_svg = tmp_path / "seed-split.svg"
    # the README's command: the current state read through the simulated host's API
    code, _, err = run_cli(["plan", "--sim", str(sim.dir), *SPLIT, "--svg", str(out_svg)], capsys)
    assert code == 0, err
    return out_svg.read_text()


def test_readme_picture_is_up_to_date(sim, tmp_path, capsys):
    """docs/seed-split.svg is what the README's command makes (GPUTOPO_UPDATE_GOLDEN=1 rewrites it)."""
    got = _readme_svg(sim, tmp_path, capsys)
    if UPDATE:
        README_SVG.write_text(got)
    assert README_SVG.is_file(), "run with GPUTOPO_UPDATE_GOLDEN=1 to make docs/seed-split.svg"
    assert README_SVG.read_text() == got, "docs/seed-split.svg is stale: run with GPUTOPO_UPDATE_GOLDEN=1"
    readme = (REPO / "README.md").read_text()
    assert "![" in readme and "(docs/seed-split.svg)" in readme
    assert "--split numa --container 101 --vm-mapping pro6000-vm --svg docs/seed-split.svg" in readme


# --- a real terminal ------------------------------------------------------------------------------


def _tmux_capture(args: list[str], until: str, tmp_path: Path, rows: int = 50) -> str:
    """Run ``gputopo ARGS`` in a detached tmux session 80 columns wide; the pane's text with
    its escape codes once ``until`` shows (history included)."""
    sock = f"gputopo-test-{os.getpid()}-{time.monotonic_ns()}"
    done = tmp_path / "done"
    cmd = " ".join([sys.executable, "-m", "gputopo", *args]) + f"; touch {done}; sleep 120"
    base = [TMUX, "-L", sock, "-f", "/dev/null"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    subprocess.run(
        [
            *base,
            "new-session",
            "-d",
            "-s",
            "topo",
            "-x",
            "80",
            "-y",
            str(rows),
            f"env -u COLUMNS -u LINES {cmd}",
        ],
        check=True,
        env=env,
        timeout=30,
    )
    try:
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert done.exists(), "gputopo did not finish in the terminal"
        width = subprocess.run(
            [*base, "display-message", "-p", "-t", "topo", "#{pane_width}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert width == "80"
        text = subprocess.run(
            [*base, "capture-pane", "-p", "-e", "-S", "-", "-t", "topo"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert until in ANSI.sub("", text)
        return text
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True, timeout=30)


@pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (apt-get install tmux): terminal view not checked"
)
@pytest.mark.slow
def test_tree_in_a_real_80_column_terminal(sim, tmp_path):
    raw = _tmux_capture(["topo", *_where(sim)], "GPU7 0000:f1:00.0", tmp_path)
    plain = [ANSI.sub("", ln).rstrip() for ln in raw.splitlines()]
    plain = [ln for ln in plain if ln]
    assert max(len(ln) for ln in plain) <= 80
    # nothing wrapped or cut: every GPU line whole, with its owner at the end
    for addr in ["0000:01:00.0", "0000:81:00.0", "0000:f1:00.0"]:
        assert any(ln.endswith(f"{addr}  container 101") for ln in plain), addr
    assert not any("…" in ln for ln in plain)
    assert sum("RTX PRO 6000 Blackwell Server Edition" in ln for ln in plain) == 8
    # coloured by owner: the owner's label is drawn in colour (an SGR code right before it)
    assert re.search(r"\x1b\[[0-9;]*m container 101|\x1b\[[0-9;]*mcontainer 101", raw)
    assert raw.count("\x1b[") > 20


@pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (apt-get install tmux): terminal view not checked"
)
@pytest.mark.slow
def test_large_tree_in_a_real_80_column_terminal(materialized, tmp_path):
    root = materialized("large")
    raw = _tmux_capture(
        ["topo", "--root", str(root), "--pve-root", str(tmp_path / "none")], "GPU67 0001:9e:00.0", tmp_path
    )
    plain = [ANSI.sub("", ln).rstrip() for ln in raw.splitlines()]
    assert max(len(ln) for ln in plain) <= 80
    gpu_lines = [ln for ln in plain if re.search(r"GPU\d+ [0-9a-f]{4}:", ln)]
    assert len(gpu_lines) == 68 and all(ln.endswith("free") for ln in gpu_lines)
    assert sum("NVSwitch 0000:" in ln for ln in plain) == 2


@pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (apt-get install tmux): terminal view not checked"
)
@pytest.mark.slow
def test_all_shows_adapters_and_drives_in_a_real_80_column_terminal(materialized, tmp_path):
    root = materialized("esc8000a")
    raw = _tmux_capture(
        ["topo", "--all", "--root", str(root), "--pve-root", str(tmp_path / "none")],
        "NIC5 0000:82:00.1",
        tmp_path,
    )
    plain = [ln for ln in (ANSI.sub("", x).rstrip() for x in raw.splitlines()) if ln]
    assert max(len(ln) for ln in plain) <= 80 and not any("…" in ln for ln in plain)
    tree = [ln for ln in plain if not ln.startswith(("python", "$"))]

    def below(parent: str, child: str) -> bool:
        """``child`` is the next entry under ``parent``, one level deeper (its branch sign)."""
        i = next(k for k, ln in enumerate(tree) if ln.endswith(parent))
        col = len(tree[i]) - len(parent)
        return tree[i + 1][col:].startswith(("├── " + child, "└── " + child))

    # each under its own root port, named as the kernel names it, its model on the next line
    assert below("host bridge 0000:20 · root port 0000:20:03.1", "NIC0 0000:21:00.0  mlx5_0")
    assert below("root port 0000:00:05.1", "NVMe 0000:02:00.0  nvme16")
    assert below("root port 0000:80:05.1", "NIC4 0000:82:00.0")
    i = next(k for k, ln in enumerate(tree) if ln.endswith("NIC0 0000:21:00.0  mlx5_0"))
    assert tree[i + 1].endswith("ConnectX-7 · mlx5_core")
    # the model line is dim, as a GPU's details are
    assert re.search(r"\x1b\[2m(\x1b\[[0-9;]*m)*ConnectX-7 · mlx5_core", raw)
