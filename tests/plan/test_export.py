"""``gputopo export``: the host as it is, as a spec whose plan is "No changes", with the inference
unit found inside the container; ``init`` and quick mode look inside the container the same way
and write the same spec; systemctl's list and show output parsed as systemd prints it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml

from gputopo.facts.discover import discover
from gputopo.formats.systemctl import (
    InferenceUnit,
    candidate_units,
    exec_argv,
    inference_server,
    inference_units,
    parse_list_unit_files,
    parse_list_units,
    parse_show_blocks,
    tp_of,
)
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState
from gputopo.plan.export import export_spec
from gputopo.plan.spec import parse_spec
from gputopo.sim.container import SimExec
from gputopo.sim.host import SimHost
from helpers.applysim import copy_host, fast_tmp, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run

# systemd 252 (Debian 12): list-units --type=service --all --no-legend --plain --full
LIST_UNITS = """\
apparmor.service                       loaded    active   exited  Load AppArmor profiles
cron.service                           loaded    active   running Regular background program processing daemon
display-manager.service                not-found inactive dead    display-manager.service
sglang.service                         loaded    active   running SGLang server
systemd-fsck@dev-disk-by\\x2duuid-1.service loaded active exited File System Check on /dev/disk/by-uuid/1
"""
# list-unit-files --type=service --no-legend --full
LIST_UNIT_FILES = """\
apparmor.service                           enabled         enabled
autovt@.service                            alias           -
vllm-b.service                             disabled        enabled
getty@.service                             enabled         enabled
hidden.service                             masked          enabled
"""
SHOW = """\
ExecStart={ path=/usr/sbin/cron ; argv[]=/usr/sbin/cron -f $EXTRA_OPTS ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }
Id=cron.service
ActiveState=active

ExecStart={ path=/opt/v/bin/vllm ; argv[]=/opt/v/bin/vllm serve /models/m -tp 2 --port 8001 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }
Id=vllm-b.service
ActiveState=inactive

ExecStart={ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m sglang.launch_server --model-path /m --tp=8 ; ignore_errors=no ; start_time=[Mon 2025-01-06 10:00:00 UTC] ; stop_time=[n/a] ; pid=812 ; code=(null) ; status=0/0 }
Id=sglang.service
ActiveState=active
"""


def test_systemctl_output_parses_as_systemd_prints_it():
    units = parse_list_units(LIST_UNITS)
    assert units[0] == ("apparmor.service", "active") and ("display-manager.service", "inactive") in units
    assert parse_list_units("● failed.service loaded failed failed Broken\n") == [
        ("failed.service", "failed")
    ]
    assert parse_list_unit_files(LIST_UNIT_FILES)[2] == ("vllm-b.service", "disabled")
    names = candidate_units(LIST_UNITS, LIST_UNIT_FILES)
    assert "vllm-b.service" in names and "sglang.service" in names
    assert not any("@." in n for n in names) and "hidden.service" not in names
    blocks = parse_show_blocks(SHOW)
    assert [b["Id"] for b in blocks] == ["cron.service", "vllm-b.service", "sglang.service"]
    assert exec_argv(blocks[2]["ExecStart"])[-2:] == ["/m", "--tp=8"]


def test_the_inference_units_are_those_running_sglang_or_vllm_active_first():
    found = inference_units(parse_show_blocks(SHOW))
    assert found == [
        InferenceUnit(
            "sglang.service",
            "sglang",
            True,
            "/usr/bin/python3 -m sglang.launch_server --model-path /m --tp=8",
            "--tp",
            8,
        ),
        InferenceUnit(
            "vllm-b.service", "vllm", False, "/opt/v/bin/vllm serve /models/m -tp 2 --port 8001", "-tp", 2
        ),
    ]
    assert inference_server(["python", "-m", "vllm.entrypoints.openai.api_server"]) == "vllm"
    assert inference_server(["/usr/bin/sglang", "serve", "--model-path", "m"]) == "sglang"
    assert inference_server(["/usr/sbin/cron", "-f"]) is None and inference_server(["vllm-helper"]) is None
    assert tp_of(["vllm", "serve", "m", "--tensor-parallel-size", "4"]) == ("--tensor-parallel-size", 4)
    assert tp_of(["x", "--tp", "auto"]) == ("--tp", None) and tp_of(["x"]) == (None, None)
    # a server without the flag runs with 1, and the spec names its own flag
    (u,) = inference_units(
        parse_show_blocks("ExecStart={ path=/v ; argv[]=vllm serve m ; x=y }\nId=v.service\n")
    )
    assert (u.tp_flag, u.tp, u.active) == ("--tensor-parallel-size", 1, False)


def test_the_simulated_systemctl_lists_units_in_systemds_columns(template, tmp_path):
    sim = copy_host(template, tmp_path / "sim")
    sx = SimExec(sim.dir)
    out = sx.run(101, ["systemctl", "list-units", "--type=service", "--all"], 5).stdout
    assert out.splitlines()[0].split() == ["UNIT", "LOAD", "ACTIVE", "SUB", "DESCRIPTION"]
    assert out.rstrip().endswith("1 loaded units listed.")
    rows = sx.run(
        101, ["systemctl", "list-units", "--type=service", "--all", "--no-legend", "--plain"], 5
    ).stdout
    assert parse_list_units(rows) == [("sglang.service", "active")]
    files = sx.run(101, ["systemctl", "list-unit-files", "--type=service", "--no-legend"], 5).stdout
    assert parse_list_unit_files(files) == [("sglang.service", "enabled")]
    sx.run(101, ["systemctl", "stop", "sglang.service"], 5)
    assert sx.run(101, ["systemctl", "list-units", "--type=service", "--no-legend"], 5).stdout == ""


# --- export ----------------------------------------------------------------------------------------


def _seed_facts(sim):
    return discover(str(sim.paths.root))


def test_export_spec_follows_the_devices_mappings_and_overrides(template, tmp_path):
    sim = copy_host(template, tmp_path / "sim")
    facts = _seed_facts(sim)
    vm = ["0000:81:00.0", "0000:91:00.0"]
    for g in facts.gpus:
        if g.address in vm:
            g.driver, g.driver_override, g.minor = "vfio-pci", "vfio-pci", None
    minors = {g.address: g.minor for g in facts.gpus}
    ct_cfg = {
        f"dev{i}": f"/dev/nvidia{minors[a]},gid=44,mode=0660"
        for i, a in enumerate(["0000:01:00.0", "0000:11:00.0"])
    }
    state = CurrentState(
        containers={
            101: ContainerState(config=ct_cfg, status="running"),
            102: ContainerState(config={"dev0": f"/dev/nvidia{minors['0000:11:00.0']}"}, status="running"),
        },
        mappings={
            "vmgpus": MappingState(map=[f"id=10de:2bb5,node=pve1,path={a}" for a in vm]),
            "ct": MappingState(
                map=[f"id=10de:2bb5,node=pve1,path={a}" for a in ("0000:01:00.0", "0000:11:00.0")]
            ),
            "elsewhere": MappingState(map=["id=10de:2bb5,node=pve2,path=0000:e1:00.0"]),
        },
        guests={
            201: GuestState(hostpci=["mapping=vmgpus,pcie=1"]),
            202: GuestState(hostpci=["0000:e1:00.0"]),
        },
    )
    unit = InferenceUnit(
        "llm.service", "vllm", True, "vllm serve m --tensor-parallel-size 2", "--tensor-parallel-size", 2
    )
    ex = export_spec(facts, state, "pve1", {101: [unit]}, manage={101})
    spec = ex.spec
    (ct,) = spec.nodes[0].containers
    assert ct.vmid == 101 and ct.gpus.addresses == ["0000:01:00.0", "0000:11:00.0"]
    assert (ct.mode, ct.gid, ct.mapping) == ("0660", 44, "ct")
    assert (ct.service.unit, ct.service.tp_flag) == ("llm.service", "--tensor-parallel-size")
    (m,) = spec.nodes[0].vms.mappings
    assert m.name == "vmgpus" and m.gpus.addresses == vm and spec.nodes[0].vms.guests == [201]
    assert spec.policy.keep_driver_override is True
    assert any("0000:11:00.0 is in the devices of containers 101 and 102" in n for n in ex.notes)
    # not managed: the unit is only named
    assert export_spec(facts, state, "pve1", {101: [unit]}).spec.nodes[0].containers[0].service is None


@pytest.fixture(scope="module")
def vllm_host():
    base = Path(tempfile.mkdtemp(prefix="gputopo-vllm-", dir=fast_tmp()))
    from gputopo.sim.kernel import SimKernel

    host = SimHost.create(base / "sim", service="vllm")
    SimKernel(str(host.paths.root)).configure(time_scale=0.01)
    yield host
    import shutil

    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_export_of_a_host_nobody_split_plans_no_changes(capsys, template, tmp_path):
    sim = copy_host(template, tmp_path / "sim")
    out = tmp_path / "now.yaml"
    code, _, err = run(capsys, "export", "--sim", str(sim.dir), "-o", str(out))
    assert code == 0, err
    text = out.read_text()
    spec = parse_spec(text)
    (ct,) = spec.nodes[0].containers
    assert len(ct.gpus.addresses) == 8 and ct.mapping == "pro6000" and ct.service is None
    # the unit was looked for inside the container: named, with its flag and size, not managed yet
    assert "# container 101 runs sglang in sglang.service (active), --tp 8:" in text
    assert '#     service: {unit: sglang.service, tp_flag: "--tp"}' in text
    code, stdout, err = run(capsys, "plan", "--sim", str(sim.dir), "--spec", str(out))
    assert code == 0 and stdout.rstrip().endswith("No changes"), stdout
    code, _, err = run(capsys, "export", "--sim", str(sim.dir), "-o", str(out))
    assert code == 2 and one_line(err) == f"gputopo: error: {out}: exists; pass --force to replace it"


@pytest.mark.slow
def test_export_after_a_split_manages_the_service_and_plans_no_changes(capsys, template, tmp_path):
    sim = copy_host(template, tmp_path / "sim")
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(seed_spec_text(sim))
    code, _, err = run(
        capsys, "apply", "--sim", str(sim.dir), "--spec", str(spec_file), "--yes", "--no-verify"
    )
    assert code == 0, err
    code, text, err = run(capsys, "export", "--sim", str(sim.dir))
    assert code == 0, err
    data = yaml.safe_load(text)
    ct = data["nodes"][0]["containers"][0]
    assert (
        ct["service"] == {"unit": "sglang.service", "tp_flag": "--tp"} and len(ct["gpus"]["addresses"]) == 4
    )
    vm = data["nodes"][0]["vms"]
    assert vm["mappings"][0]["name"] == "pro6000-vm" and vm["guests"] == [201]
    assert "--tp 4:" in text
    out = tmp_path / "now.yaml"
    out.write_text(text)
    code, stdout, err = run(capsys, "plan", "--sim", str(sim.dir), "--spec", str(out))
    assert code == 0 and stdout.rstrip().endswith("No changes"), stdout


@pytest.mark.slow
def test_init_and_quick_mode_find_the_unit_inside_and_agree(capsys, vllm_host, tmp_path):
    out = tmp_path / "init.yaml"
    code, _, err = run(capsys, "init", "--sim", str(vllm_host.dir), "-o", str(out))
    assert code == 0, err
    assert "container 101: vllm.service runs vllm with --tensor-parallel-size 8" in err
    spec = parse_spec(out.read_text())
    svc = spec.nodes[0].containers[0].service
    assert (svc.unit, svc.tp_flag) == ("vllm.service", "--tensor-parallel-size")
    code, by_init, err = run(capsys, "plan", "--sim", str(vllm_host.dir), "--spec", str(out), "--json")
    assert code == 0, err
    code, by_quick, err = run(capsys, "plan", "--sim", str(vllm_host.dir), "--split", "numa", "--json")
    assert code == 0, err
    assert by_quick == by_init  # the same actions, drop-in and mapping description included
    assert "--tensor-parallel-size 4" in by_quick


def test_init_without_a_connection_manages_no_service(capsys, template, tmp_path):
    sim = copy_host(template, tmp_path / "sim")
    code, text, err = run(capsys, "init", "--root", str(sim.paths.root))
    assert code == 0, err
    assert parse_spec(text).nodes[0].containers[0].service is None
    assert "# not managed: no unit was named or found inside the container" in text
    code, by_init, _ = run(
        capsys,
        "plan",
        "--root",
        str(sim.paths.root),
        "--pve-root",
        str(sim.paths.pve),
        "--split",
        "numa",
        "--json",
    )
    assert "sglang" not in by_init
