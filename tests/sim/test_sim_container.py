"""Simulated containers: nvidia-smi layout, the device view, systemd units, the endpoint, faults."""

import http.client
import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from gputopo.errors import ExecError
from gputopo.formats.nvsmi import parse_list_gpus, parse_query_gpu
from gputopo.ports import ExecPort
from gputopo.sim import state
from gputopo.sim.container import EndpointServer, SimExec, write_unit
from gputopo.sim.container.devices import missing_devices, parse_granted_devices
from gputopo.sim.container.endpoint import answer_arithmetic
from gputopo.sim.container.server_args import parse_tp
from gputopo.sim.container.units import load_unit
from helpers import REPO

REAL = REPO / "fixtures" / "real"
# the seed host's NUMA-0 GPUs plus two more; minors deliberately not in bus order
GPUS = [
    ("0000:01:00.0", 2),
    ("0000:11:00.0", 0),
    ("0000:61:00.0", 1),
    ("0000:71:00.0", 3),
    ("0000:81:00.0", 4),
    ("0000:91:00.0", 5),
]
SGLANG = (
    "[Unit]\nDescription=SGLang\n[Service]\nType=simple\n"
    "ExecStart=/opt/sglang/bin/python -m sglang.launch_server --model-path /models/qwen "
    "--served-model-name qwen --tp 4 --port 30000\n[Install]\nWantedBy=multi-user.target\n"
)
QUERY = [
    "nvidia-smi",
    "--query-gpu=index,pci.bus_id,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader",
]


def make_host(tmp: Path, gpus=GPUS, grant=None, extra_conf=""):
    root = tmp / "root"
    for addr, minor in gpus:
        dev = root / "sys/devices/pci0000:00" / addr
        dev.mkdir(parents=True)
        (dev / "device").write_text("0x2bb5\n")
        drv = root / "sys/bus/pci/drivers/nvidia"
        drv.mkdir(parents=True, exist_ok=True)
        (dev / "driver").symlink_to(drv)
        link = root / "sys/bus/pci/devices" / addr
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dev)
        info = root / "proc/driver/nvidia/gpus" / addr
        info.mkdir(parents=True)
        (info / "information").write_text(
            "Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition\n"
            f"GPU UUID: \t GPU-0000000{minor}-aaaa-bbbb-cccc-dddddddddddd\n"
            f"Bus Location: \t {addr}\nDevice Minor: \t {minor}\n"
        )
        (root / "dev").mkdir(exist_ok=True)
        (root / f"dev/nvidia{minor}").write_text("")
    for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        (root / "dev" / n).write_text("")
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.57.08  Sat May 24 07:21:13 UTC 2025\n"
    )
    grant = [m for _, m in gpus] if grant is None else grant
    lines = ["arch: amd64", "hostname: llm"]
    nodes = [f"/dev/nvidia{m}" for m in grant] + [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    lines += [f"dev{i}: {p},gid=44,mode=0666" for i, p in enumerate(nodes)]
    conf = tmp / "pve/nodes/pve1/lxc/101.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("\n".join(lines) + "\n" + extra_conf)
    state.write_state(tmp / "run", "host", {"node": "pve1"})
    write_unit(tmp, 101, "sglang.service", SGLANG)
    return SimExec(tmp)


def push_dropin(sx, path, text):
    """What apply does: pct push never creates the unit's .d directory, so mkdir -p first."""
    assert sx.run(101, ["mkdir", "-p", path.rsplit("/", 1)[0]], timeout=5).rc == 0
    sx.push(101, path, text)


def boot(sx, vmid=101):
    state.set_guest_status(sx.paths.run, "lxc", vmid, "running")
    sx.container(vmid).boot()


@pytest.fixture
def sx(tmp_path):
    s = make_host(tmp_path, grant=[2, 0, 1, 3])  # the four NUMA-0 GPUs
    boot(s)
    return s


def test_is_an_exec_port(sx):
    assert isinstance(sx, ExecPort)


def test_stopped_container_fails_like_pct(tmp_path):
    s = make_host(tmp_path)
    r = s.run(101, ["nvidia-smi", "-L"], timeout=5)
    assert (r.rc, r.stderr) == (255, "container '101' not running!\n")
    with pytest.raises(ExecError) as e:
        s.push(101, "/etc/x", "y")
    assert e.value.rc == 255 and "can only push files to a running CT" in str(e.value)
    r = s.run(999, ["true"], timeout=5)
    assert r.rc == 255 and r.stderr == "Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n"


def test_seed_memory_pattern_byte_exact(sx):
    r = sx.run(
        101,
        ["nvidia-smi", "--query-gpu=index,memory.used,memory.total,utilization.gpu", "--format=csv,noheader"],
        timeout=5,
    )
    assert r.rc == 0
    assert r.stdout == (REAL / "seed-query-gpu.csv").read_text()


def test_query_header_units_bus_ids_and_order(sx):
    r = sx.run(
        101,
        ["nvidia-smi", "--query-gpu=index,pci.bus_id,minor_number,memory.used", "--format=csv"],
        timeout=5,
    )
    lines = r.stdout.splitlines()
    assert lines[0] == "index, pci.bus_id, minor_number, memory.used [MiB]"
    # indices follow PCI bus order, not the minors
    assert lines[1:] == [
        "0, 00000000:01:00.0, 2, 79043 MiB",
        "1, 00000000:11:00.0, 0, 78369 MiB",
        "2, 00000000:61:00.0, 1, 78369 MiB",
        "3, 00000000:71:00.0, 3, 78193 MiB",
    ]
    r = sx.run(
        101,
        ["nvidia-smi", "--query-gpu=memory.used,memory.free,driver_version", "--format=csv,nounits"],
        timeout=5,
    )
    assert r.stdout.splitlines()[:2] == [
        "memory.used [MiB], memory.free [MiB], driver_version",
        "79043, 18844, 575.57.08",
    ]


def test_bus_id_layout_matches_real_capture(sx):
    # the real H100 capture spells bus ids as 00000000:2A:00.0 (8-digit domain, upper-case hex)
    real = (REAL / "thamada-H100SXMx8_nvidia-smi.txt").read_text()
    assert "00000000:2A:00.0" in real
    s2 = make_host(Path(str(sx.sim_dir) + "-h"), gpus=[("0000:2a:00.0", 0)])
    boot(s2)
    r = s2.run(101, ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], timeout=5)
    assert r.stdout == "00000000:2A:00.0\n"


def test_output_round_trips_through_parser(sx):
    fields = [
        "index",
        "pci.bus_id",
        "name",
        "memory.used",
        "memory.total",
        "memory.free",
        "utilization.gpu",
        "uuid",
        "minor_number",
    ]
    r = sx.run(101, ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv"], timeout=5)
    rows = parse_query_gpu(r.stdout, fields)
    assert [x["minor_number"] for x in rows] == [2, 0, 1, 3]
    assert all(x["memory.used"] + x["memory.free"] == x["memory.total"] for x in rows)
    listed = parse_list_gpus(sx.run(101, ["nvidia-smi", "-L"], timeout=5).stdout)
    assert [x["uuid"] for x in listed] == [x["uuid"] for x in rows]


def test_bad_field_and_format(sx):
    r = sx.run(101, ["nvidia-smi", "--query-gpu=index,bogus", "--format=csv"], timeout=5)
    assert r.rc == 2 and 'Field "bogus" is not a valid field to query.' in r.stdout
    assert sx.run(101, ["nvidia-smi", "--query-gpu=index", "--format=xml"], timeout=5).rc == 2


def test_device_view_follows_config_and_host(tmp_path):
    # lxc.mount.entry grants too; a granted node missing on the host is not seen
    s = make_host(
        tmp_path,
        grant=[2],
        extra_conf="lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
        "lxc.mount.entry: /dev/nvidia9 dev/nvidia9 none bind,optional,create=file\n",
    )
    boot(s)
    ls = s.run(101, ["ls", "/dev"], timeout=5).stdout.split()
    assert {"nvidia2", "nvidia0", "nvidiactl", "nvidia-uvm", "null"} <= set(ls)
    assert "nvidia9" not in ls and "nvidia1" not in ls
    assert s.run(101, ["test", "-e", "/dev/nvidia0"], timeout=5).rc == 0
    assert s.run(101, ["test", "-e", "/dev/nvidia1"], timeout=5).rc == 1
    bus = s.run(101, ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], timeout=5).stdout
    assert bus == "00000000:01:00.0\n00000000:11:00.0\n"


def test_view_is_fixed_at_start_and_needs_bound_driver(tmp_path):
    s = make_host(tmp_path, grant=[2, 0])
    boot(s)
    conf = s.paths.lxc_conf(101)
    conf.write_text(conf.read_text().replace("dev1: /dev/nvidia0", "dev1: /dev/nvidia4"))
    q = ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"]
    assert s.run(101, q, timeout=5).stdout == "00000000:01:00.0\n00000000:11:00.0\n"
    boot(s)  # restart: the new config applies (a running container kept its start-time view)
    assert s.run(101, q, timeout=5).stdout == "00000000:01:00.0\n00000000:81:00.0\n"
    # unbinding the host GPU from nvidia makes it vanish from nvidia-smi
    link = tmp_path / "root/sys/devices/pci0000:00/0000:81:00.0/driver"
    link.unlink()
    link.symlink_to(tmp_path / "root/sys/bus/pci/drivers/vfio-pci")
    assert s.run(101, q, timeout=5).stdout == "00000000:01:00.0\n"


def test_no_gpus_and_no_control_node(tmp_path):
    s = make_host(tmp_path, grant=[])
    boot(s)
    r = s.run(101, ["nvidia-smi", "-L"], timeout=5)
    assert (r.rc, r.stdout) == (6, "No devices were found\n")
    conf = s.paths.lxc_conf(101)
    conf.write_text("\n".join(l for l in conf.read_text().splitlines() if "nvidiactl" not in l) + "\n")
    boot(s)
    r = s.run(101, ["nvidia-smi"], timeout=5)
    assert r.rc == 9 and "couldn't communicate with the NVIDIA driver" in r.stdout


def test_missing_devices_reports_devN_only(tmp_path):
    s = make_host(
        tmp_path,
        grant=[2, 7],
        extra_conf="lxc.mount.entry: /dev/nvidia9 dev/nvidia9 none bind,optional,create=file\n",
    )
    assert missing_devices(s.sim_dir, 101) == ["/dev/nvidia7"]
    assert parse_granted_devices(s.paths.lxc_conf(101).read_text())[:2] == ["/dev/nvidia2", "/dev/nvidia7"]


def test_systemctl_show_real_format(sx):
    r = sx.run(
        101,
        ["systemctl", "show", "-p", "ActiveState", "-p", "ExecStart", "-p", "MainPID", "sglang.service"],
        timeout=5,
    )
    lines = r.stdout.splitlines()
    assert [l.split("=", 1)[0] for l in lines] == ["MainPID", "ExecStart", "ActiveState"]
    assert lines[2] == "ActiveState=active"
    assert int(lines[0].split("=")[1]) > 0
    assert lines[1].startswith(
        "ExecStart={ path=/opt/sglang/bin/python ; argv[]=/opt/sglang/bin/python -m sglang.launch_server "
    )
    assert "--tp 4" in lines[1] and lines[1].endswith("code=(null) ; status=0/0 }")
    r = sx.run(101, ["systemctl", "show", "-p", "ActiveState", "nope.service"], timeout=5)
    assert (r.rc, r.stdout) == (0, "ActiveState=inactive\n")


def _show(sx, *props: str) -> dict[str, str]:
    argv = ["systemctl", "show", *[w for p in props for w in ("-p", p)], "sglang.service"]
    out = sx.run(101, argv, timeout=5).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_no_block_start_returns_at_once_with_its_job_queued(sx):
    # a model that takes 30 s to load: the start job runs until the server is ready
    sx.break_(101, "slow_start", seconds=30, tp=4)
    sx.run(101, ["systemctl", "stop", "sglang.service"], timeout=5)
    assert _show(sx, "Job") == {"Job": ""}  # no job: systemctl show prints an asked property empty
    t0 = time.monotonic()
    r = sx.run(101, ["systemctl", "start", "--no-block", "sglang.service"], timeout=5)
    assert (r.rc, r.stderr) == (0, "") and time.monotonic() - t0 < 5
    props = _show(sx, "ActiveState", "Job")
    assert props["ActiveState"] == "activating" and props["Job"].isdigit()
    # the option may come before the verb as well (getopt_long), and a restart queues a new job
    r = sx.run(101, ["systemctl", "--no-block", "restart", "sglang.service"], timeout=5)
    assert r.rc == 0 and int(_show(sx, "Job")["Job"]) > int(props["Job"])
    sx.heal(101, "slow_start")


def test_no_block_start_of_a_crashing_server_exits_0_and_the_unit_fails(sx):
    sx.run(101, ["systemctl", "stop", "sglang.service"], timeout=5)
    sx.break_(101, "service_fails", message="RuntimeError: CUDA error: out of memory")
    r = sx.run(101, ["systemctl", "start", "--no-block", "sglang.service"], timeout=5)
    assert (r.rc, r.stderr) == (0, "")  # only queued: the crash shows in the unit's state
    assert _show(sx, "ActiveState", "Job") == {"ActiveState": "failed", "Job": ""}
    blocking = sx.run(101, ["systemctl", "start", "sglang.service"], timeout=5)
    assert blocking.rc == 1 and "failed because the control process exited" in blocking.stderr
    # what systemd checks before queueing still fails the command
    r = sx.run(101, ["systemctl", "start", "--no-block", "nope.service"], timeout=5)
    assert r.rc == 5 and "Unit nope.service not found" in r.stderr


def test_systemctl_refuses_an_option_it_does_not_know(sx):
    r = sx.run(101, ["systemctl", "start", "--no-wait-please", "sglang.service"], timeout=5)
    assert (r.rc, r.stderr) == (1, "systemctl: unrecognized option '--no-wait-please'\n")
    r = sx.run(101, ["systemctl", "-Z", "start", "sglang.service"], timeout=5)
    assert (r.rc, r.stderr) == (1, "systemctl: invalid option -- 'Z'\n")


def test_drop_in_reset_and_daemon_reload(sx):
    d = sx.paths.rootfs(101) / "etc/systemd/system/sglang.service.d"
    unit = load_unit(sx.paths.rootfs(101), "sglang.service")
    assert parse_tp(unit.argv) == 4
    push_dropin(
        sx,
        "/etc/systemd/system/sglang.service.d/10-tp.conf",
        "[Service]\nExecStart=\nExecStart=/opt/sglang/bin/python -m sglang.launch_server "
        "--model-path /models/qwen --tp=2\n",
    )
    assert (d / "10-tp.conf").stat().st_mode & 0o777 == 0o644
    # without daemon-reload the old command runs, with systemd's warning
    r = sx.run(101, ["systemctl", "restart", "sglang.service"], timeout=5)
    assert r.rc == 0 and "Run 'systemctl daemon-reload'" in r.stderr
    assert (
        "--tp 4" in sx.run(101, ["systemctl", "show", "-p", "ExecStart", "sglang.service"], timeout=5).stdout
    )
    assert sx.run(101, ["systemctl", "daemon-reload"], timeout=5).rc == 0
    r = sx.run(101, ["systemctl", "restart", "sglang.service"], timeout=5)
    assert (r.rc, r.stderr) == (0, "")
    used = sx.run(101, ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=5)
    assert used.stdout.split() == ["79043", "78369", "1", "1"]  # TP 2 loads two of four GPUs


def test_drop_in_without_reset_is_a_bad_setting(sx):
    push_dropin(
        sx,
        "/etc/systemd/system/sglang.service.d/20-bad.conf",
        "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --tp 4\n",
    )
    sx.run(101, ["systemctl", "daemon-reload"], timeout=5)
    r = sx.run(101, ["systemctl", "restart", "sglang.service"], timeout=5)
    assert r.rc == 1 and "bad unit file setting" in r.stderr


@pytest.mark.parametrize(
    "flag,ok",
    [("--tp 8", False), ("--tensor-parallel-size 3", False), ("--tp 4", True), ("--tp-size=1", True)],
)
def test_service_tp_check(sx, flag, ok):
    push_dropin(
        sx,
        "/etc/systemd/system/sglang.service.d/tp.conf",
        f"[Service]\nExecStart=\nExecStart=python3 -m sglang.launch_server --model-path m {flag}\n",
    )
    sx.run(101, ["systemctl", "daemon-reload"], timeout=5)
    r = sx.run(101, ["systemctl", "restart", "sglang.service"], timeout=5)
    active = sx.run(101, ["systemctl", "is-active", "sglang.service"], timeout=5)
    if ok:
        assert (r.rc, active.rc, active.stdout) == (0, 0, "active\n")
    else:
        assert r.rc == 1 and r.stderr.startswith("Job for sglang.service failed")
        assert (active.rc, active.stdout) == (3, "failed\n")
        used = sx.run(101, ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], timeout=5)
        assert set(used.stdout.split("\n")[:-1]) == {"1 MiB"}


def test_stop_and_idle_memory(sx):
    assert sx.run(101, ["systemctl", "stop", "sglang.service"], timeout=5).rc == 0
    r = sx.run(101, ["systemctl", "is-active", "sglang.service"], timeout=5)
    assert (r.rc, r.stdout) == (3, "inactive\n")
    used = sx.run(101, ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=5)
    assert used.stdout == "1\n1\n1\n1\n"
    r = sx.run(101, ["systemctl", "start", "nope.service"], timeout=5)
    assert (r.rc, r.stderr) == (5, "Failed to start nope.service: Unit nope.service not found.\n")


def test_memory_scales_with_total(tmp_path):
    s = make_host(tmp_path, gpus=[("0000:18:00.0", 0), ("0000:2a:00.0", 1)])
    for info in (tmp_path / "root/sys/devices/pci0000:00").glob("*/device"):
        info.write_text("0x2330\n")  # H100 80GB HBM3: 81559 MiB
    write_unit(tmp_path, 101, "sglang.service", SGLANG.replace("--tp 4", "--tp 2"))
    boot(s)
    r = s.run(101, ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader"], timeout=5)
    assert (
        r.stdout
        == f"{round(79043 * 81559 / 97887)} MiB, 81559 MiB\n{round(78369 * 81559 / 97887)} MiB, 81559 MiB\n"
    )


def test_cat_and_test(sx):
    r = sx.run(101, ["cat", "/etc/systemd/system/sglang.service"], timeout=5)
    assert r.rc == 0 and "sglang.launch_server" in r.stdout
    r = sx.run(101, ["cat", "/etc/nope"], timeout=5)
    assert (r.rc, r.stderr) == (1, "cat: /etc/nope: No such file or directory\n")
    assert "575.57.08" in sx.run(101, ["cat", "/proc/driver/nvidia/version"], timeout=5).stdout
    assert sx.run(101, ["test", "-e", "/etc/systemd/system/sglang.service"], timeout=5).rc == 0
    assert sx.run(101, ["frobnicate"], timeout=5).rc == 127


def test_tp_parsing():
    assert parse_tp(["vllm", "serve", "m", "-tp", "8"]) == 8
    assert parse_tp(["python", "-m", "sglang.launch_server"]) == 1
    with pytest.raises(ValueError):
        parse_tp(["x", "--tp", "four"])
    assert answer_arithmetic("What is 7 x 13?") == "91"
    assert answer_arithmetic("what is 12 * 12") == "144"
    assert answer_arithmetic("hello") is None


# --- the endpoint over real HTTP ---------------------------------------------------------


@pytest.fixture
def endpoint(sx):
    ep = EndpointServer(sx.sim_dir, 101).start()
    yield ep
    ep.stop()


def _get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _chat(url, q, timeout=2):
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        method="POST",
        data=json.dumps({"model": "qwen", "messages": [{"role": "user", "content": q}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def test_endpoint_answers(sx, endpoint):
    assert state.read_state(sx.paths.run, "endpoint-101")["url"] == endpoint.url
    assert _get(endpoint.url + "/health")[0] == 200
    models = json.loads(_get(endpoint.url + "/v1/models")[1])
    assert models["data"][0]["id"] == "qwen"
    assert "91" in _chat(endpoint.url, "What is 7 x 13?")
    info = json.loads(_get(endpoint.url + "/get_server_info")[1])
    assert info["tp_size"] == 4 and info["max_total_num_tokens"] > 0
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(endpoint.url + "/metrics")  # SGLang flavor: no vLLM metrics
    assert e.value.code == 404


def test_endpoint_vllm_metrics(sx, endpoint):
    push_dropin(
        sx,
        "/etc/systemd/system/sglang.service.d/vllm.conf",
        "[Service]\nExecStart=\nExecStart=/usr/local/bin/vllm serve Qwen/Qwen3-32B --tensor-parallel-size 4\n",
    )
    sx.run(101, ["systemctl", "daemon-reload"], timeout=5)
    sx.run(101, ["systemctl", "restart", "sglang.service"], timeout=5)
    text = _get(endpoint.url + "/metrics")[1].decode()
    line = next(l for l in text.splitlines() if l.startswith("vllm:cache_config_info{"))
    assert 'num_gpu_blocks="' in line and 'num_gpu_blocks="0"' not in line
    assert json.loads(_get(endpoint.url + "/v1/models")[1])["data"][0]["id"] == "Qwen/Qwen3-32B"


def test_endpoint_gone_when_service_stops(sx, endpoint):
    sx.run(101, ["systemctl", "stop", "sglang.service"], timeout=5)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError, urllib.error.URLError)):
        _get(endpoint.url + "/health")


# --- faults ------------------------------------------------------------------------------


def test_break_gpu_missing(sx):
    sx.break_(101, "gpu_missing", address="0000:61:00.0")
    out = sx.run(101, ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], timeout=5).stdout
    assert "00000000:61:00.0" not in out and len(out.splitlines()) == 3
    sx.heal(101)
    assert len(sx.run(101, ["nvidia-smi", "-L"], timeout=5).stdout.splitlines()) == 4


def test_break_unbalanced_memory(sx):
    sx.break_(101, "unbalanced_memory", index=2, used_mib=30000)
    used = sx.run(101, ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=5)
    assert used.stdout.split() == ["79043", "78369", "30000", "78193"]


def test_break_nvidia_smi_fails(sx):
    sx.break_(101, "nvidia_smi_fails")
    r = sx.run(101, QUERY, timeout=5)
    assert r.rc == 9 and "NVIDIA-SMI has failed" in r.stdout


def test_break_service_fails(sx):
    sx.break_(101, "service_fails", message="torch.OutOfMemoryError: CUDA out of memory")
    r = sx.run(101, ["systemctl", "restart", "sglang.service"], timeout=5)
    assert r.rc == 1
    assert sx.run(101, ["systemctl", "is-active", "sglang.service"], timeout=5).stdout == "failed\n"
    show = sx.run(101, ["systemctl", "show", "-p", "ExecStart", "sglang.service"], timeout=5).stdout
    assert "code=exited ; status=1/FAILURE" in show


def test_break_wrong_answer(sx, endpoint):
    sx.break_(101, "wrong_answer")
    assert "92" in _chat(endpoint.url, "What is 7 x 13?")


def test_break_hung_endpoint(sx, endpoint):
    sx.break_(101, "hung_endpoint", seconds=5)
    t0 = time.monotonic()
    with pytest.raises(Exception) as e:
        _get(endpoint.url + "/health", timeout=0.2)
    assert time.monotonic() - t0 < 2
    assert "timed out" in str(e.value).lower()


def test_unknown_fault(sx):
    with pytest.raises(ValueError):
        sx.break_(101, "gremlins")


# --- the service's processes as the host sees them ----------------------------------------


def _host_procs(root: Path) -> dict[int, dict]:
    out = {}
    for d in sorted((root / "proc").glob("[0-9]*")):
        fds = sorted(((d / "fd").iterdir()), key=lambda p: int(p.name))
        out[int(d.name)] = {
            "comm": (d / "comm").read_text(),
            "cgroup": (d / "cgroup").read_text(),
            "cmdline": (d / "cmdline").read_bytes().split(b"\0")[:-1],
            "fds": [os.readlink(f) for f in fds],
        }
    return out


def test_service_processes_show_in_host_proc(sx):
    from gputopo.facts.procfs import find_holders, parse_cgroup_container

    root = sx.paths.root
    procs = _host_procs(root)
    assert sorted(procs) == sx.container(101).host_pids() and len(procs) == 5  # main + 4 TP workers
    assert {p["cgroup"] for p in procs.values()} == {"0::/lxc/101/ns/system.slice/sglang.service\n"}
    assert all(parse_cgroup_container(p["cgroup"]) == 101 for p in procs.values())
    assert {p["comm"] for p in procs.values()} == {"python\n"}
    main = procs[min(procs)]
    assert main["cmdline"][:3] == [b"/opt/sglang/bin/python", b"-m", b"sglang.launch_server"]
    # the four granted GPUs are minors 2, 0, 1, 3; the workers hold them and the control nodes
    held = find_holders(
        str(root),
        [
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidia2",
            "/dev/nvidia3",
            "/dev/nvidia4",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
        ],
    )
    workers = sorted(procs)[1:]
    assert set(held) == {
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia2",
        "/dev/nvidia3",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    }
    assert [pid for pid, _ in held["/dev/nvidia2"]] == workers
    assert sx.run(101, ["systemctl", "stop", "sglang.service"], timeout=5).rc == 0
    assert _host_procs(root) == {} and sx.container(101).host_pids() == []


def test_processes_follow_tp_and_vanish_with_the_container(sx):
    root = sx.paths.root
    push_dropin(
        sx,
        "/etc/systemd/system/sglang.service.d/tp.conf",
        "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path m --tp 2\n",
    )
    sx.run(101, ["systemctl", "daemon-reload"], timeout=5)
    sx.run(101, ["systemctl", "restart", "sglang.service"], timeout=5)
    procs = _host_procs(root)
    assert len(procs) == 3
    nodes = sorted({f for p in procs.values() for f in p["fds"] if f.startswith("/dev/nvidia")})
    assert nodes == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia2", "/dev/nvidiactl"]  # GPUs 0 and 1
    sx.container(101).shutdown()
    assert _host_procs(root) == {}


def test_foreign_proc_entries_are_left_alone(tmp_path):
    s = make_host(tmp_path, grant=[2, 0, 1, 3])
    foreign = tmp_path / "root/proc" / str(200000 + 101 * 100)  # the first PID the container would take
    (foreign / "fd").mkdir(parents=True)
    (foreign / "comm").write_text("nvidia-persiste\n")
    boot(s)
    assert foreign.is_dir() and (foreign / "comm").read_text() == "nvidia-persiste\n"
    assert 200000 + 101 * 100 not in s.container(101).host_pids()
    s.container(101).shutdown()
    assert foreign.is_dir()
