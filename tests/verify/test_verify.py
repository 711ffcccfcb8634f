"""verify: the parsers on real captures and literal strings, and each check on a simulated host
that PASSes after the seed split and FAILs (or WARNs) when broken in exactly one way."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from gputopo.errors import VerifyFailed
from gputopo.facts.observe import observe
from gputopo.formats.nvsmi import parse_nvidia_smi_q, parse_query_gpu
from gputopo.formats.systemd import parse_show_properties
from gputopo.plan.planner import plan as make_plan
from gputopo.plan.reads import spec_reads
from gputopo.plan.spec import parse_spec
from gputopo.usecases.verify import verify
from gputopo.verify import CHECKS, FAIL, PASS, WARN, Check, VerifyReport
from gputopo.verify.memory import assess_memory
from gputopo.verify.parse import (
    GpuRow,
    answer_matches,
    base_url,
    mapping_checks,
    memory_spread_pct,
    p2p_disabled,
    parse_environment,
    parse_gpu_rows,
    parse_root_complex,
    parse_sglang_kv_tokens,
    parse_vllm_kv_tokens,
    server_flavor,
    service_port,
)
from helpers import REPO

REAL = REPO / "fixtures" / "real"
CT = 101
VM_GPUS = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
CT_GPUS = ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]

SPEC = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {numa: [0]}
        mapping: pro6000
        service: {unit: sglang.service}
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {numa: [1]}
      guests: [201]
verify:
  timeout: 5
"""


# --- parsers -----------------------------------------------------------------------------


def _seed_rows() -> list[GpuRow]:
    """The seed host's four lines (fixtures/real/seed-query-gpu.csv) with the container's bus ids."""
    fields = ["index", "memory.used", "memory.total", "utilization.gpu"]
    raw = parse_query_gpu((REAL / "seed-query-gpu.csv").read_text(), fields)
    return [
        GpuRow(
            index=r["index"],
            address=a,
            used=r["memory.used"],
            total=r["memory.total"],
            utilization=r["utilization.gpu"],
        )
        for r, a in zip(raw, CT_GPUS)
    ]


def test_seed_numbers_pass_with_default_thresholds():
    rows = _seed_rows()
    assert [r.used for r in rows] == [79043, 78369, 78369, 78193]
    spec = parse_spec(SPEC)
    status, line, details = assess_memory(rows, spec.verify.memory_spread_pct, spec.verify.min_headroom_mib)
    assert status == PASS, line
    assert details["spread_pct"] == pytest.approx(1.08, abs=0.01)  # (79043-78193)/79043
    assert details["min_headroom_mib"] == 97887 - 79043
    assert "spread 1.1 %" in line and "18844" in line


def test_seed_numbers_fail_a_tighter_spread_or_a_headroom_floor():
    rows = _seed_rows()
    assert assess_memory(rows, 1.0)[0] == FAIL
    status, line, _ = assess_memory(rows, 5, min_headroom_mib=20000)
    assert status == FAIL and "0000:01:00.0 headroom 18844 MiB < 20000 MiB" in line


def test_memory_spread_edge_cases():
    assert memory_spread_pct([100]) == 0.0
    assert memory_spread_pct([0, 0]) == 0.0
    assert memory_spread_pct([100, 50]) == pytest.approx(50.0)


def test_unbalanced_rows_name_both_ends():
    rows = parse_gpu_rows("0, 00000000:01:00.0, 79043, 97887, 0\n1, 00000000:11:00.0, 32629, 97887, 0\n")
    status, line, _ = assess_memory(rows, 5)
    assert status == FAIL
    assert "0000:01:00.0 79043 MiB vs 0000:11:00.0 32629 MiB" in line


def test_memory_not_reported_fails():
    rows = parse_gpu_rows("0, 00000000:01:00.0, [N/A], 97887, [N/A]\n")
    assert rows[0].used is None and rows[0].utilization is None
    status, line, _ = assess_memory(rows, 5)
    assert status == FAIL and "0000:01:00.0" in line


@pytest.mark.parametrize("capture", ["thamada-H100SXMx8_nvidia-smi-q.txt", "thamada-A40x10_nvidia-smi-q.txt"])
@pytest.mark.parametrize("units", [True, False])
def test_query_rows_from_real_captures(capture, units):
    """A real machine's figures (nvidia-smi -q), printed the way --query-gpu prints them."""
    gpus = parse_nvidia_smi_q((REAL / capture).read_text())
    assert gpus
    mib = " MiB" if units else ""
    pct = " %" if units else ""
    text = "".join(
        f"{i}, {g['bus_id']}, {g['memory_used']}{mib}, {g['memory_total']}{mib}, 0{pct}\n"
        for i, g in enumerate(gpus)
    )
    rows = parse_gpu_rows(text)
    assert [r.address for r in rows] == [g["address"] for g in gpus]
    assert all(r.address.startswith("0000:") and r.address == r.address.lower() for r in rows)
    assert [(r.used, r.total) for r in rows] == [(g["memory_used"], g["memory_total"]) for g in gpus]
    # idle machines: balanced, all memory free
    status, _, details = assess_memory(rows, 5)
    assert status == PASS and details["min_headroom_mib"] == gpus[0]["memory_total"] - gpus[0]["memory_used"]


def test_query_rows_with_a_header_line():
    text = (
        "index, pci.bus_id, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
        "0, 00000000:2A:00.0, 1 MiB, 81559 MiB, 0 %\n"
    )
    (row,) = parse_gpu_rows(text)
    assert row.address == "0000:2a:00.0" and row.headroom == 81558


def test_query_rows_reject_a_bad_bus_id():
    from gputopo.errors import NvsmiParseError

    with pytest.raises(NvsmiParseError, match="pci.bus_id"):
        parse_gpu_rows("0, GPU-1234, 1, 2, 0\n")


def test_show_properties_and_environment():
    props = parse_show_properties(
        "ExecStart={ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m sglang.launch_server --tp 4 ; "
        "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
        "ActiveState=active\n"
        'Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID NCCL_P2P_DISABLE=1 "NOTE=two words"\n'
    )
    assert props["ActiveState"] == "active"
    env = parse_environment(props["Environment"])
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_P2P_DISABLE": "1", "NOTE": "two words"}
    assert p2p_disabled(env, None)
    assert not p2p_disabled({"NCCL_P2P_DISABLE": "0"}, "python3 -m sglang.launch_server")
    assert p2p_disabled({}, "env NCCL_P2P_DISABLE=1 python3 -m sglang.launch_server")
    assert parse_environment("") == {}


def test_root_complex_from_device_path():
    assert parse_root_complex("/r/sys/devices/pci0000:60/0000:60:01.1/0000:61:00.0") == "0000:60"
    assert parse_root_complex("/sys/devices/pci10000:00/10000:00:02.0/10000:01:00.0") == "10000:00"
    assert parse_root_complex("/sys/devices/platform/foo") is None


def test_answer_matching():
    assert answer_matches("The answer is 91.", "91")
    assert answer_matches("91", "91")
    assert not answer_matches("The answer is 191.", "91")
    assert not answer_matches("The answer is 92.", "91")
    assert not answer_matches("It is 91.5", "91")  # a decimal is not the integer 91
    assert not answer_matches("It is 0.91", "91")
    assert answer_matches("PARIS", "Paris")


def test_kv_cache_parsers():
    assert parse_sglang_kv_tokens({"max_total_num_tokens": 1186816, "tp_size": 4}) == 1186816
    assert parse_sglang_kv_tokens({"internal_states": [{"max_total_num_tokens": 500}]}) == 500
    assert parse_sglang_kv_tokens({"tp_size": 4}) is None
    assert parse_sglang_kv_tokens([1, 2]) is None
    metrics = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="74176"} 1.0\n'
    )
    assert parse_vllm_kv_tokens(metrics) == 74176 * 16
    assert parse_vllm_kv_tokens("vllm:num_requests_running 0.0\n") is None


def test_mapping_checks_flatten_messages():
    items = [
        {"id": "pro6000-vm", "checks": [{"severity": "error", "message": "Invalid configuration: x\n"}]},
        {"id": "pro6000"},
    ]
    assert mapping_checks(items) == {
        "pro6000-vm": [{"severity": "error", "message": "Invalid configuration: x"}],
        "pro6000": [],
    }


def test_endpoint_parts_from_the_command_and_the_url():
    sglang = "/opt/sglang/.venv/bin/python -m sglang.launch_server --model-path /m --tp 4"
    assert server_flavor(sglang) == "sglang" and service_port(sglang) == 30000
    assert service_port(sglang + " --port 31000") == 31000
    assert service_port("vllm serve /m --port=8100 --tensor-parallel-size 4") == 8100
    assert service_port("vllm serve /m --tensor-parallel-size 4") == 8000
    assert service_port("/usr/bin/llama-server --ports 9") is None and server_flavor(None) is None
    assert base_url("http://10.0.0.5:30000/health") == "http://10.0.0.5:30000"
    assert base_url(" http://10.0.0.5:30000/ ") == "http://10.0.0.5:30000"


def test_report_ok_and_strict():
    checks = [Check(name="a", status=PASS, summary="x"), Check(name="b", status=WARN, summary="y")]
    assert VerifyReport(checks=checks).ok and VerifyReport(checks=checks).exit_code == 0
    strict = VerifyReport(checks=checks, strict=True)
    assert not strict.ok and strict.exit_code == 1
    failed = VerifyReport(checks=checks + [Check(name="c", status=FAIL, summary="z")])
    assert failed.exit_code == 1
    assert failed.summary_line() == "verification failed: 1 FAIL (c), 1 WARN (b)"
    data = json.loads(failed.to_json())
    assert data["ok"] is False and [c["status"] for c in data["checks"]] == [PASS, WARN, FAIL]


# --- the simulated host ------------------------------------------------------------------


def _converge(ports, spec, root: str) -> None:
    """Apply the spec with gputopo's own apply (verify as its last step), then check that a
    fresh plan is empty."""
    from gputopo.usecases.apply import apply

    result = apply(spec, ports, root=root, verify=lambda: verify(spec, ports, root=root))
    assert result.status == "applied", result
    assert result.verify.ok, result.verify.to_text()  # apply's own closing check
    facts, now = observe(root, spec_reads(spec), proxmox=ports.proxmox, exec=ports.exec, files=ports.files)
    again = make_plan(facts, spec, now)
    assert again.is_empty, again.to_text()


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """A seed simulated host on which the NUMA split was applied (servers stopped again)."""
    from gputopo.sim.host import SimHost

    d = tmp_path_factory.mktemp("verify") / "applied"
    host = SimHost.create(d)
    try:
        ports = host.ports()
        _converge(ports, parse_spec(SPEC), str(host.paths.root))
        # the split kept the container running, its removals pending until its next start
        # (test_pending_removals_warn_naming_them); the checks below start from after that restart
        ports.proxmox.guest_action("lxc", CT, "shutdown", 30)
        ports.proxmox.guest_action("lxc", CT, "start", 30)
    finally:
        host.stop()
    return d


@pytest.fixture(scope="module")
def live(applied):
    """The applied host, running, shared by the tests that only flip the simulator's fault switches."""
    from gputopo.sim.host import SimHost

    host = SimHost.open(applied)
    ports = host.ports()
    yield host, ports
    host.stop()


@pytest.fixture
def healthy(live):
    """The shared running host; every fault switched off again afterwards."""
    host, ports = live
    ports.exec.heal(CT)
    yield host, ports
    ports.exec.heal(CT)


@pytest.fixture
def demo(applied, tmp_path):
    """A private running copy of the applied host, for tests that change the host itself."""
    from gputopo.sim.host import SimHost

    d = tmp_path / "sim"
    shutil.copytree(applied, d, symlinks=True)
    host = SimHost.open(d)
    ports = host.ports()
    yield host, ports
    host.stop()


def _verify(host, ports, spec_text: str = SPEC, **kw) -> VerifyReport:
    return verify(parse_spec(spec_text), ports, root=str(host.paths.root), **kw)


@pytest.mark.slow
def test_each_service_is_shown_once(healthy):
    """One ``systemctl show`` per container serves the current-state read and every check."""
    from dataclasses import replace

    host, ports = healthy
    seen: list[list[str]] = []

    class Recording:
        def run(self, vmid, argv, timeout, input=None):
            seen.append(list(argv))
            return ports.exec.run(vmid, argv, timeout, input)

        def push(self, vmid, path, content, mode=0o644):
            ports.exec.push(vmid, path, content, mode)

    report = verify(parse_spec(SPEC), replace(ports, exec=Recording()), root=str(host.paths.root))
    assert report.ok, report.to_text()
    shows = [a for a in seen if a[:2] == ["systemctl", "show"]]
    assert len(shows) == 1 and shows[0][-1] == "sglang.service", seen
    assert {"ActiveState", "SubState", "ExecStart", "Environment"} <= set(shows[0][2:-1])
    assert ["cat", "/etc/systemd/system/sglang.service.d/gputopo.conf"] in seen  # the rest still runs
    assert report.check("service").details[str(CT)]["tp"] == 4


@pytest.mark.slow
def test_pending_removals_warn_naming_them(tmp_path):
    """A container that gave GPUs away without a restart keeps their device nodes until its next
    start (Proxmox keeps a running container's devN removal pending): verify WARNs naming them,
    and a restart clears it."""
    from gputopo.sim.host import SimHost

    host = SimHost.create(tmp_path / "sim")
    try:
        ports = host.ports()
        _converge(ports, parse_spec(SPEC), str(host.paths.root))
        c = _verify(host, ports, only=["container"]).check("container")
        assert c.status == WARN, c.summary
        assert c.details[str(CT)]["pending_removals"] == {f"dev{i}": f"/dev/nvidia{i}" for i in (4, 5, 6, 7)}
        assert "dev4 (/dev/nvidia4)" in c.summary and "until its next restart" in c.summary
        assert c.details[str(CT)]["seen"] == CT_GPUS  # the GPUs it gave away do not work there
        ports.proxmox.guest_action("lxc", CT, "shutdown", 30)
        ports.proxmox.guest_action("lxc", CT, "start", 30)
        c = _verify(host, ports, only=["container"]).check("container")
        assert c.status == PASS and "pending_removals" not in c.details[str(CT)], c.summary
    finally:
        host.stop()


@pytest.mark.slow
def test_demo_host_passes_every_check(healthy):
    host, ports = healthy
    report = _verify(host, ports)
    assert [c.name for c in report.checks] == list(CHECKS)
    assert {c.name: c.status for c in report.checks} == {n: PASS for n in CHECKS}, report.to_text()
    assert report.ok and report.exit_code == 0
    mem = report.check("memory").details[str(CT)]
    assert mem["spread_pct"] == pytest.approx(1.08, abs=0.01)  # the seed's load on the four GPUs
    assert report.check("service").details[str(CT)]["tp"] == 4
    assert report.check("inference").details[str(CT)]["kv_tokens"] > 0
    assert "KV cache" in report.check("inference").summary and "tokens" in report.check("inference").summary
    assert report.check("container").details[str(CT)]["seen"] == CT_GPUS
    assert report.summary_line() == "all clear: 7 PASS"


@pytest.mark.slow
def test_gpu_missing_in_container_fails(healthy):
    host, ports = healthy
    ports.exec.break_(CT, "gpu_missing", address="0000:61:00.0")
    c = _verify(host, ports, only=["container"]).check("container")
    assert c.status == FAIL
    assert "missing 0000:61:00.0" in c.summary and "3 of 4" in c.summary


@pytest.mark.slow
def test_unbalanced_memory_fails(healthy):
    host, ports = healthy
    ports.exec.break_(CT, "unbalanced_memory", index=1, used_mib=40000)
    c = _verify(host, ports, only=["memory"]).check("memory")
    assert c.status == FAIL and "unbalanced" in c.summary
    assert "0000:11:00.0 40000 MiB" in c.summary


@pytest.mark.slow
def test_wrong_answer_fails(healthy):
    host, ports = healthy
    ports.exec.break_(CT, "wrong_answer", answer="92")
    c = _verify(host, ports, only=["inference"]).check("inference")
    assert c.status == FAIL and "wrong answer" in c.summary and "92" in c.summary


@pytest.mark.slow
def test_hung_endpoint_fails_within_the_timeout(healthy):
    host, ports = healthy
    ports.exec.break_(CT, "hung_endpoint", seconds=3)
    started = time.monotonic()
    report = _verify(host, ports, only=["inference"], http_timeout=0.5)
    wall = time.monotonic() - started
    c = report.check("inference")
    assert c.status == FAIL and "0.5 s" in c.summary
    assert wall < 2.0, f"verify took {wall:.2f} s with a 0.5 s timeout"


@pytest.mark.slow
def test_gpu_left_on_nvidia_fails_the_vm_side(demo):
    host, ports = demo
    from gputopo.adapters.sysfs import Binder

    Binder(ports.sysfs, host.paths.root).move_group(["0000:91:00.0"], "nvidia")
    report = _verify(host, ports, only=["vm", "converged"])
    vm = report.check("vm")
    assert vm.status == FAIL and "0000:91:00.0 on nvidia, not vfio-pci" in vm.summary
    assert "/dev/vfio/" in vm.summary
    assert report.check("converged").status == FAIL
    assert any("rebind 0000:91:00.0" in a for a in report.check("converged").details["pending"])


@pytest.mark.slow
def test_mapping_check_error_fails(demo):
    host, ports = demo
    cfg = host.paths.pve / "mapping" / "pci.cfg"
    text = cfg.read_text()
    assert "path=0000:e1:00.0" in text
    # the device behind one entry reports other subsystem ids (a card swapped in the slot)
    sub = host.paths.root / "sys/bus/pci/devices/0000:e1:00.0/subsystem_device"
    sub.write_text("0x9999\n")
    vm = _verify(host, ports, only=["vm"]).check("vm")
    assert vm.status == FAIL
    assert "mapping pro6000-vm: error:" in vm.summary and "subsystem-id" in vm.summary


@pytest.mark.slow
def test_mapping_check_warning_warns(demo):
    host, ports = demo
    # a mapping the spec does not manage, with no entry for this node: Proxmox warns
    ports.proxmox.mapping_create("other", ["id=10de:2bb5,node=pve2,path=0000:01:00.0"], None)
    report = _verify(host, ports, only=["vm"])
    vm = report.check("vm")
    assert vm.status == WARN and "mapping other: warning: No mapping for node pve1." in vm.summary
    assert report.ok
    assert not _verify(host, ports, only=["vm"], strict=True).ok


def _restart_with_dropin(ports, text: str) -> None:
    ports.exec.push(CT, "/etc/systemd/system/sglang.service.d/gputopo.conf", text)
    assert ports.exec.run(CT, ["systemctl", "daemon-reload"], 10).rc == 0
    assert ports.exec.run(CT, ["systemctl", "restart", "sglang.service"], 10).rc == 0


@pytest.mark.slow
def test_service_on_the_wrong_tp_fails(demo):
    host, ports = demo
    _restart_with_dropin(
        ports,
        "[Service]\nExecStart=\nExecStart=/opt/sglang/.venv/bin/python -m "
        "sglang.launch_server --model-path /m --served-model-name qwen3 --tp 2\n"
        "Environment=NCCL_P2P_DISABLE=1\n",
    )
    report = _verify(host, ports, only=["service", "memory"])
    svc = report.check("service")
    assert svc.status == FAIL and "tp 2, planned tp 4" in svc.summary
    # with two GPUs idle the load is not balanced either
    assert report.check("memory").status == FAIL


@pytest.mark.slow
def test_service_not_active_fails(demo):
    host, ports = demo
    assert ports.exec.run(CT, ["systemctl", "stop", "sglang.service"], 10).rc == 0
    svc = _verify(host, ports, only=["service"]).check("service")
    assert svc.status == FAIL and "sglang.service is inactive" in svc.summary


@pytest.mark.slow
def test_sev_snp_with_p2p_enabled_warns(demo):
    host, ports = demo
    _restart_with_dropin(
        ports,
        "[Service]\nExecStart=\nExecStart=/opt/sglang/.venv/bin/python -m "
        "sglang.launch_server --model-path /m --served-model-name qwen3 --tp 4\n"
        "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID\n",
    )
    report = _verify(host, ports, only=["platform", "service"])
    plat = report.check("platform")
    assert plat.status == WARN, plat.summary
    assert "4 root complexes" in plat.summary and "NCCL_P2P_DISABLE=1" in plat.summary
    assert "gputopo apply" in plat.summary
    assert report.check("service").status == PASS
    assert report.ok and not _verify(host, ports, only=["platform"], strict=True).ok
    # the same service without SEV-SNP: peer-to-peer is safe
    param = host.paths.root / "sys/module/kvm_amd/parameters/sev_snp"
    assert param.is_file()
    param.write_text("N\n")
    plat = _verify(host, ports, only=["platform"]).check("platform")
    assert plat.status == PASS and "SEV-SNP off" in plat.summary


@pytest.mark.slow
def test_container_stopped_fails_container_checks(demo):
    host, ports = demo
    ports.proxmox.guest_action("lxc", CT, "stop", 30)
    report = _verify(host, ports, only=["container", "memory", "service", "inference"])
    for name in ("container", "memory", "service", "inference"):
        assert report.check(name).status == FAIL, report.to_text()
    assert "not running" in report.check("container").summary


@pytest.mark.slow
def test_verify_rejects_an_unknown_check(healthy):
    host, ports = healthy
    with pytest.raises(ValueError, match="nope"):
        _verify(host, ports, only=["nope"])


# --- the command line --------------------------------------------------------------------


@pytest.mark.slow
def test_cli_verify_on_a_simulated_host(applied, tmp_path):
    from click.testing import CliRunner

    from gputopo.cli import cli
    from gputopo.sim.container import break_container

    d = tmp_path / "sim"
    shutil.copytree(applied, d, symlinks=True)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    res = CliRunner().invoke(cli, ["verify", "--spec", str(spec), "--sim", str(d), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    # the simulated container serves a model whose files gputopo reads: the capacity check is in
    names = [c["name"] for c in data["checks"]]
    assert (
        data["ok"] is True and [n for n in names if n != "capacity"] == list(CHECKS) and "capacity" in names
    )
    assert data["summary"] == "all clear: 8 PASS"
    res = CliRunner().invoke(cli, ["verify", "--spec", str(spec), "--sim", str(d)])
    assert res.exit_code == 0, res.output
    assert "converged" in res.output and "PASS" in res.output and "all clear" in res.output

    break_container(d, CT, "wrong_answer", answer="92")
    res = CliRunner().invoke(cli, ["verify", "--spec", str(spec), "--sim", str(d), "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["ok"] is False
    assert {c["name"]: c["status"] for c in data["checks"]}["inference"] == FAIL
    assert isinstance(res.exception, VerifyFailed)
    assert str(res.exception) == "verification failed: 1 FAIL (inference)"


@pytest.mark.slow
def test_cli_verify_warn_passes_unless_strict_and_the_json_shape(applied, tmp_path):
    from click.testing import CliRunner

    from gputopo.cli import cli
    from gputopo.sim.host import SimHost

    d = tmp_path / "sim"
    shutil.copytree(applied, d, symlinks=True)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    with SimHost.open(d) as host:
        # a mapping the spec does not manage, with no entry for this node: Proxmox's check warns
        host.ports().proxmox.mapping_create("other", ["id=10de:2bb5,node=pve2,path=0000:01:00.0"], None)
    args = ["verify", "--spec", str(spec), "--sim", str(d), "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert set(data) == {"schema_version", "node", "strict", "checks", "ok", "exit_code", "summary"}
    assert (
        data["node"] == "pve1" and data["strict"] is False and data["ok"] is True and data["exit_code"] == 0
    )
    for c in data["checks"]:
        assert set(c) == {"name", "status", "summary", "details"} and "\n" not in c["summary"]
        assert c["status"] in (PASS, WARN, FAIL) and isinstance(c["details"], dict)
    assert {c["name"]: c["status"] for c in data["checks"]}["vm"] == WARN
    assert data["summary"] == "all clear: 7 PASS, 1 WARN (vm)"  # capacity among them
    res = CliRunner().invoke(cli, args + ["--strict"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["strict"] is True and data["ok"] is False and data["exit_code"] == 1
    assert str(res.exception) == "verification failed (strict): 1 WARN (vm)"


def test_cli_connection_options_conflict(tmp_path):
    from click.testing import CliRunner

    from gputopo.cli import cli

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    res = CliRunner().invoke(
        cli, ["verify", "--spec", str(spec), "--sim", str(tmp_path), "--root", str(tmp_path)]
    )
    assert res.exit_code != 0
    assert "--root and --sim exclude each other" in str(res.exception) + res.output


def test_http_reasons():
    import requests

    from gputopo.adapters.http import http_reason

    refused = requests.ConnectionError(
        "HTTPConnectionPool(host='10.0.0.5', port=30000): Max retries exceeded with url: /v1/models "
        "(Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f>: Failed to "
        "establish a new connection: [Errno 111] Connection refused'))"
    )
    assert http_reason(refused) == "Connection refused"
    closed = requests.ConnectionError(
        "('Connection aborted.', RemoteDisconnected('Remote end closed connection without response'))"
    )
    assert http_reason(closed) == "connection closed without a reply"
    assert (
        http_reason(requests.ReadTimeout("HTTPConnectionPool(...): Read timed out. (read timeout=0.5)"))
        == "timed out"
    )
    assert http_reason(ValueError("x")) == "ValueError"


@pytest.mark.slow
def test_endpoint_from_the_container_address(healthy):
    """Without health_url the URL is the container's address (Proxmox's interfaces of the running
    container) and the port of the service's command (--port 30000)."""
    from gputopo.sim.addresses import container_address

    host, ports = healthy
    c = _verify(host, ports, only=["inference"]).check("inference")
    assert c.status == PASS, c.summary
    assert c.details[str(CT)]["url"] == f"http://{container_address(CT)}:30000"
    assert ports.proxmox.lxc_interfaces(CT)[1]["inet"] == f"{container_address(CT)}/24"


@pytest.mark.slow
def test_endpoint_from_the_spec_health_url(healthy):
    """service.health_url wins; a plain HTTP port reaches it (here the endpoint's loopback URL)."""
    from gputopo.adapters.http import RequestsHttp
    from gputopo.ports import Ports

    host, ports = healthy
    bare = Ports(
        sysfs=ports.sysfs, proxmox=ports.proxmox, exec=ports.exec, files=ports.files, http=RequestsHttp()
    )
    url = host.endpoint.url
    spec = SPEC.replace(
        "service: {unit: sglang.service}", f"service: {{unit: sglang.service, health_url: '{url}/health'}}"
    )
    c = _verify(host, bare, spec, only=["inference"]).check("inference")
    assert c.status == PASS and c.details[str(CT)]["url"] == url, c.summary
    # the container's address on a network this machine cannot reach: no reply within the timeout
    c = _verify(host, bare, only=["inference"], http_timeout=0.5).check("inference")
    assert c.status == FAIL and "10.0.0.101:30000" in c.summary


@pytest.mark.slow
def test_endpoint_of_a_stopped_container_is_unknown(demo):
    """A stopped container has no address (Proxmox answers null): nothing can answer, a FAIL."""
    from gputopo.verify.parse import container_address

    host, ports = demo
    assert container_address([]) is None
    assert container_address([{"name": "lo", "inet": "127.0.0.1/8"}]) is None
    ports.proxmox.guest_action("lxc", CT, "shutdown", 30)
    assert ports.proxmox.lxc_interfaces(CT) == []
    c = _verify(host, ports, only=["inference"]).check("inference")
    assert c.status == FAIL and "not running" in c.summary, c.summary


@pytest.mark.slow
def test_endpoint_not_listening_fails(healthy):
    import socket

    from gputopo.adapters.http import RequestsHttp
    from gputopo.ports import Ports

    host, ports = healthy
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    bare = Ports(
        sysfs=ports.sysfs, proxmox=ports.proxmox, exec=ports.exec, files=ports.files, http=RequestsHttp()
    )
    spec = SPEC.replace(
        "service: {unit: sglang.service}",
        f"service: {{unit: sglang.service, health_url: 'http://127.0.0.1:{port}/health'}}",
    )
    c = _verify(host, bare, spec, only=["inference"]).check("inference")
    assert c.status == FAIL and "Connection refused" in c.summary


@pytest.mark.slow
def test_a_wrong_port_on_the_container_is_refused(healthy):
    host, ports = healthy
    spec = SPEC.replace(
        "service: {unit: sglang.service}",
        "service: {unit: sglang.service, health_url: 'http://10.0.0.101:8000'}",
    )
    c = _verify(host, ports, spec, only=["inference"]).check("inference")
    assert c.status == FAIL and "Connection refused" in c.summary


def test_api_url_parsing():
    from gputopo.errors import ConfigError
    from gputopo.usecases.connect import parse_api_url

    assert parse_api_url("https://pve1.example:8443/api2/json") == ("pve1.example", 8443)
    assert parse_api_url("pve1") == ("pve1", 8006)
    with pytest.raises(ConfigError, match="https"):
        parse_api_url("http://pve1:8006")
    with pytest.raises(ConfigError, match="bad port"):
        parse_api_url("https://pve1:http")


def test_build_ports_refuses_contradictions(tmp_path):
    from gputopo.errors import ConfigError
    from gputopo.usecases.connect import Connection, build_ports

    with pytest.raises(ConfigError, match="--api-url and --local"):
        build_ports(Connection(api_url="https://pve1", local=True))
    with pytest.raises(ConfigError, match="--sim excludes"):
        build_ports(Connection(sim=str(tmp_path), local=True))


@pytest.mark.slow
def test_build_ports_for_a_real_api(healthy):
    """The real-host path: HTTPS with a CA bundle and the password from the environment."""
    from gputopo.adapters.pct import PctExec
    from gputopo.adapters.sysfs import RealSysfs
    from gputopo.usecases.connect import Connection, build_ports

    host, _ = healthy
    conn = Connection(
        root=str(host.paths.root), api_url=host.url, node="pve1", ca_bundle=str(host.api.ca_cert_path)
    )
    ports = build_ports(conn, env={"GPUTOPO_PVE_PASSWORD": host.credentials()["password"]})
    try:
        assert isinstance(ports.sysfs, RealSysfs) and isinstance(ports.exec, PctExec)
        assert ports.proxmox.node == "pve1" and ports.proxmox.identity() == "root@pam"
        assert {m["id"] for m in ports.proxmox.mappings()} == {"pro6000", "pro6000-vm"}
    finally:
        ports.close()


# --- what verify cannot check: SKIP with why, never PASS -----------------------------------------


@pytest.mark.slow
def test_a_refused_plan_fails_converged_naming_it_and_the_rest_skip_with_why(healthy):
    """A spec for a container that does not exist: converged FAILs naming the refusal, and every
    check that needs the plan says SKIP, pointing at it in a few words (before, memory, service
    and inference said PASS 'no service in the spec' although the spec has one): the refusal is
    printed once."""
    host, ports = healthy
    report = verify(parse_spec(SPEC.replace("vmid: 101", "vmid: 999")), ports, root=str(host.paths.root))
    why = "the plan was refused (see converged)"
    assert [(c.name, c.status, c.summary) for c in report.checks] == [
        ("converged", FAIL, "the spec was refused: container 999 does not exist on node pve1"),
        ("vm", "SKIP", f"not run: {why}"),
        ("container", "SKIP", f"not run: {why}"),
        ("memory", "SKIP", f"not run: {why}"),
        ("service", "SKIP", f"not run: {why}"),
        ("inference", "SKIP", f"not run: {why}"),
        (
            "platform",
            "SKIP",
            f"not run: {why}; SEV-SNP is on with the IOMMU translating, so each multi-GPU service "
            "needs NCCL_P2P_DISABLE=1",
        ),
    ]
    assert not report.ok
    assert report.summary_line() == (
        "verification failed: 1 FAIL (converged), 6 SKIP (vm, container, memory, service, inference, platform)"
    )


@pytest.mark.slow
def test_checks_with_nothing_to_check_skip_and_do_not_fail(healthy):
    """No service in the spec: memory, service and inference did not run; they say SKIP and why,
    the verification passes and its line names them."""
    host, ports = healthy
    report = verify(
        parse_spec(SPEC.replace("        service: {unit: sglang.service}\n", "")),
        ports,
        root=str(host.paths.root),
    )
    skipped = {c.name: c.summary for c in report.checks if c.status == "SKIP"}
    assert skipped == {n: "not run: no service in the spec" for n in ("memory", "service", "inference")}
    assert report.ok and report.exit_code == 0
    assert report.summary_line().endswith(", 3 SKIP (memory, service, inference)"), report.summary_line()
