"""Diff and current-state reading: files under a pve root, services through an ExecPort."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gputopo.actions import UpdateContainer
from gputopo.adapters.hostfiles import RealHostFiles
from gputopo.adapters.pvefiles import PveFiles
from gputopo.facts.observe import observe
from gputopo.formats.lxcconf import parse_lxc_conf, write_lxc_conf
from gputopo.formats.pveview import config_from_lxc_text
from gputopo.formats.systemd import parse_systemctl_show
from gputopo.plan.diff import diff
from gputopo.plan.planner import expected_after, plan
from gputopo.plan.reads import spec_reads
from gputopo.plan.render import PERSISTENCE_PATHS, render
from gputopo.ports import ExecResult
from helpers.cli import run_cli
from helpers.hosts import SEED_CMD, SEED_SPEC, converged_seed, seed_current, seed_facts, seed_spec

SHOW = (
    "ExecStart={ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m sglang.launch_server --tp 8 ; "
    "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
    "ActiveState=active\n"
)


def read_files(spec, facts, pve, **ports):
    """The current state as ``plan --pve-root`` reads it: Proxmox's files of node pve1."""
    return observe(facts, spec_reads(spec), proxmox=PveFiles(pve, "pve1"), **ports).current


def test_parse_systemctl_show():
    assert parse_systemctl_show(SHOW) == (True, "/usr/bin/python3 -m sglang.launch_server --tp 8")
    assert parse_systemctl_show("ActiveState=inactive\nExecStart=\n") == (False, None)


def test_config_from_lxc_text_merges_pending():
    text = (
        "arch: amd64\ndev0: /dev/nvidia0,mode=0666\ndev1: /dev/nvidia1\nlxc.mount.entry: /dev/fuse dev/fuse none bind\n"
        "\n[pve:pending]\ndev2: /dev/nvidia2\ndelete: dev1\n"
    )
    cfg = config_from_lxc_text(text)
    assert cfg["dev0"] == "/dev/nvidia0,mode=0666" and cfg["dev2"] == "/dev/nvidia2" and "dev1" not in cfg
    assert cfg["lxc"] == [["lxc.mount.entry", "/dev/fuse dev/fuse none bind"]]
    assert len(cfg["digest"]) == 40 and "delete" not in cfg


class FakeExec:
    """Containers as dicts of files plus one unit's state, answering like systemctl and cat."""

    def __init__(self, exec_start: str, active: bool = True):
        self.files: dict[str, str] = {}
        self.exec_start = exec_start
        self.active = active

    def run(self, vmid, argv, timeout, input=None):
        if argv[:2] == ["systemctl", "show"]:
            return ExecResult(
                0,
                f"ExecStart={{ path=x ; argv[]={self.exec_start} ; ignore_errors=no }}\n"
                f"ActiveState={'active' if self.active else 'inactive'}\n",
            )
        if argv[0] == "cat":
            if argv[1] in self.files:
                return ExecResult(0, self.files[argv[1]])
            return ExecResult(1, "", f"cat: {argv[1]}: No such file or directory\n")
        return ExecResult(127, "", "not found")

    def push(self, vmid, path, content, mode=0o644):
        self.files[path] = content


def write_pve(pve: Path, current) -> None:
    lxc = pve / "nodes" / "pve1" / "lxc"
    lxc.mkdir(parents=True, exist_ok=True)
    conf = parse_lxc_conf("")
    for k, v in current.containers[101].config.items():
        if k == "lxc":
            conf.lxc = [tuple(x) for x in v]
        elif k != "digest":
            conf.options[k] = v
    (lxc / "101.conf").write_text(write_lxc_conf(conf))


def test_diff_from_files_then_converged(tmp_path):
    facts, spec = seed_facts(), seed_spec()
    pve, root = tmp_path / "pve", tmp_path / "root"
    write_pve(pve, seed_current())
    ex = FakeExec(SEED_CMD)
    cur = read_files(spec, facts, pve, exec=ex, files=RealHostFiles(root))
    assert cur.containers[101].service.tp == 8 and cur.containers[101].service.dropin is None
    report = diff(facts, spec, cur)
    assert not report.is_empty
    assert set(report.areas) == {
        "driver bindings",
        "container devices",
        "mappings",
        "service",
        "persistence files",
    }
    assert "0000:81:00.0: nvidia -> vfio-pci" in report.areas["driver bindings"].lines
    devdiff = report.areas["container devices"].files["pve/lxc/101.devices.conf"]
    assert "-dev4: /dev/nvidia4,mode=0666" in devdiff and "+dev" not in devdiff
    assert "CT 101 sglang.service: tensor parallel 8 -> 4" in report.areas["service"].lines
    assert (
        "+++ b/etc/udev/rules.d/90-gputopo-vfio.rules"
        in report.areas["persistence files"].files["etc/udev/rules.d/90-gputopo-vfio.rules"]
    )
    text = report.to_text()
    assert "== mappings" in text and "+pro6000-vm" in text

    # carry the plan out on the files, as apply would, and read everything back
    p = plan(facts, spec, cur)
    facts2, cur2 = expected_after(p, facts, cur)
    files = render(p, spec, facts)
    upd = next(a for a in p.actions if isinstance(a, UpdateContainer))
    conf = parse_lxc_conf((pve / "nodes/pve1/lxc/101.conf").read_text())
    for k in upd.delete:
        conf.options.pop(k)
    conf.options.update(upd.set)
    (pve / "nodes/pve1/lxc/101.conf").write_text(write_lxc_conf(conf))
    (pve / "mapping").mkdir()
    (pve / "mapping/pci.cfg").write_text(files["pve/mapping/pci.cfg"])
    for rel in PERSISTENCE_PATHS:
        RealHostFiles(root).write(rel, files[rel])
    ex.files["/etc/systemd/system/sglang.service.d/gputopo.conf"] = files[
        "ct/101/etc/systemd/system/sglang.service.d/gputopo.conf"
    ]
    ex.exec_start = cur2.containers[101].service.exec_start
    cur3 = read_files(spec, facts2, pve, exec=ex, files=RealHostFiles(root))
    report = diff(facts2, spec, cur3)
    assert report.is_empty, report.to_text()
    assert report.to_text() == "Node pve1: no differences\n"


def test_missing_pve_root_is_nothing_configured(tmp_path):
    cur = read_files(seed_spec(), seed_facts(), tmp_path / "absent")
    assert cur.containers == {} and cur.mappings == {}


@pytest.fixture
def seed_root(materialized):
    return materialized("seed")


def _cli(args):
    from gputopo.cli import cli

    return CliRunner().invoke(cli, args)


def test_cli_diff_exit_codes(tmp_path, seed_root, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SEED_SPEC)
    args = [
        "diff",
        "--spec",
        str(spec),
        "--root",
        str(seed_root),
        "--pve-root",
        str(tmp_path / "pve"),
        "--exit-code",
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 2, err
    assert "== driver bindings" in out and "0000:81:00.0: nvidia -> vfio-pci" in out
    # without --exit-code a difference is not an error
    assert run_cli(args[:-1], capsys)[0] == 0
    # an error (here a bad spec) is 1 with --exit-code, one line naming the culprit
    spec.write_text(SEED_SPEC.replace("vmid: 101", "vmid: 1"))
    code, out, err = run_cli(args, capsys)
    assert (code, out) == (1, "")
    assert err == (
        f"gputopo: error: {spec}: nodes[0].containers[0].vmid: "
        "Input should be greater than or equal to 100 (got 1)\n"
    )
    # a refused plan is an error too
    spec.write_text(SEED_SPEC.replace("gpus: {numa: [0]}", "gpus: {numa: [0, 1]}"))
    code, out, err = run_cli(args, capsys)
    assert code == 1 and "refused: 0000:81:00.0: claimed by both container:101 and vm:pro6000-vm" in err


def test_cli_diff_exit_code_0_when_the_host_matches(tmp_path, seed_root, capsys):
    spec, pve = converged_seed(seed_root, tmp_path)
    code, out, err = run_cli(
        ["diff", "--spec", str(spec), "--root", str(seed_root), "--pve-root", str(pve), "--exit-code"], capsys
    )
    assert (code, out, err) == (0, "Node pve1: no differences\n", "")
    # one device entry gone from the container: a difference again
    conf = pve / "nodes/pve1/lxc/101.conf"
    conf.write_text(
        "".join(ln for ln in conf.read_text().splitlines(keepends=True) if not ln.startswith("dev3:"))
    )
    code, out, err = run_cli(
        ["diff", "--spec", str(spec), "--root", str(seed_root), "--pve-root", str(pve), "--exit-code"], capsys
    )
    assert code == 2 and "== container devices" in out
    assert "+dev3: /dev/nvidia2,mode=0666" in out


def test_cli_diff_json_shape(tmp_path, seed_root, capsys):
    import json

    spec = tmp_path / "spec.yaml"
    spec.write_text(SEED_SPEC)
    code, out, err = run_cli(
        [
            "diff",
            "--spec",
            str(spec),
            "--root",
            str(seed_root),
            "--pve-root",
            str(tmp_path / "pve"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["node"] == "pve1" and data["is_empty"] is False
    # nothing configured yet (no pve root); the service's command is unknown, so it is not managed
    assert set(data["areas"]) == {"driver_bindings", "container_devices", "mappings", "persistence_files"}
    assert data["schema_version"] == 1 and data["areas"]["driver_bindings"]["title"] == "driver bindings"
    for area in data["areas"].values():
        assert set(area) == {"title", "lines", "files"} and area["lines"]
    assert "0000:f1:00.0: nvidia -> vfio-pci" in data["areas"]["driver_bindings"]["lines"]
    udev = data["areas"]["persistence_files"]["files"]["etc/udev/rules.d/90-gputopo-vfio.rules"]
    assert udev.startswith("--- /dev/null\n+++ b/etc/udev/rules.d/90-gputopo-vfio.rules\n")


def test_cli_plan_quick_mode(seed_root, tmp_path, capsys):
    code, out, err = run_cli(
        [
            "plan",
            "--split",
            "numa",
            "--container",
            "101",
            "--vm-mapping",
            "pro6000-vm",
            "--service-unit",
            "sglang.service",
            "--root",
            str(seed_root),
            "--pve-root",
            str(tmp_path / "none"),
        ],
        capsys,
    )
    assert code == 0, err
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("0000:")}
    for addr in ("0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"):
        assert rows[addr].split()[1] == "0" and rows[addr].endswith("nvidia                 container:101")
    for addr in ("0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"):
        assert rows[addr].split()[1] == "1" and rows[addr].endswith("nvidia -> vfio-pci     vm:pro6000-vm")
    assert "Container 101: 4 GPU(s), tp 4, devN, sglang.service tp 4" in out
    assert "Mapping pro6000-vm: 4 device(s)" in out
    assert (
        "[prepare] create PCI mapping pro6000-vm: 4 device(s) 0000:81:00.0, 0000:91:00.0, 0000:e1:00.0, 0000:f1:00.0"
        in out
    )
    assert "[switch] rebind 0000:f1:00.0: nvidia -> vfio-pci" in out


def test_cli_render_writes_files(seed_root, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SEED_SPEC)
    out = tmp_path / "out"
    r = _cli(
        [
            "render",
            "--spec",
            str(spec),
            "--root",
            str(seed_root),
            "--pve-root",
            str(tmp_path / "none"),
            "--out",
            str(out),
        ]
    )
    assert r.exit_code == 0, r.output
    assert (out / "pve/mapping/pci.cfg").read_text().startswith("pro6000\n")
    assert (out / "etc/modules-load.d/gputopo-vfio.conf").is_file()


def test_container_diff_keeps_lines_of_the_specs_legacy_majors():
    # The current file must be read with the majors the planner manages, or an unchanged
    # "c 508:* rwm" line shows up as added.
    text = SEED_SPEC.replace(
        "mapping: pro6000\n",
        "mapping: pro6000\n        device_mode: legacy\n"
        "        legacy_majors: {nvidia-uvm: 508, nvidia-caps: 236}\n",
    )
    spec, facts = seed_spec(text), seed_facts()
    p = plan(facts, spec, seed_current())
    facts2, cur2 = expected_after(p, facts, seed_current())
    stale = ["lxc.mount.entry", "/dev/nvidia9 dev/nvidia9 none bind,optional,create=file"]
    cur2.containers[101].config["lxc"].append(stale)
    devdiff = diff(facts2, spec, cur2).areas["container devices"].files["pve/lxc/101.devices.conf"]
    assert "-lxc.mount.entry: /dev/nvidia9 dev/nvidia9" in devdiff
    added = [ln for ln in devdiff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert added == [], devdiff
