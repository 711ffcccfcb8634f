"""The seed simulated host end to end: real HTTPS to the Proxmox API simulator, SimExec, sim serve."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import requests
from proxmoxer import ProxmoxAPI
from proxmoxer.tools import Tasks

from gputopo.nvsmi import normalize_bus_id, parse_query_gpu
from gputopo.pvefmt import parse_lxc_conf, parse_pci_cfg, parse_dev_value
from gputopo.sim import state
from gputopo.sim.container import SimExec
from gputopo.sim.host import SimHost, SimHostError

SEED_MINORS = {"0000:01:00.0": 0, "0000:11:00.0": 1, "0000:61:00.0": 3, "0000:71:00.0": 2}


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    d = tmp_path_factory.mktemp("seed") / "sim"
    return SimHost.create(d)


def _used(sx):
    r = sx.run(101, ["nvidia-smi", "--query-gpu=index,pci.bus_id,memory.used", "--format=csv,noheader"], timeout=5)
    assert r.rc == 0, r
    return parse_query_gpu(r.stdout, ["index", "pci.bus_id", "memory.used"])


def test_seed_story_files(seed):
    conf = parse_lxc_conf(seed.paths.lxc_conf(101).read_text())
    devs = [parse_dev_value(v)["path"] for k, v in conf.options.items() if k.startswith("dev")]
    assert {f"/dev/nvidia{m}" for m in range(8)} <= set(devs)
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} <= set(devs)
    (mapping,) = parse_pci_cfg((seed.paths.pve / "mapping/pci.cfg").read_text())
    assert mapping.id == "pro6000"
    entries = mapping.entries()
    assert len(entries) == 8 and all(e.node == "pve1" and e.id == "10de:2bb5" for e in entries)
    assert all(e.iommugroup is not None and e.subsystem_id for e in entries)
    vm = (seed.paths.pve / "nodes/pve1/qemu-server/201.conf").read_text()
    assert "hostpci0: mapping=pro6000-vm,pcie=1\n" in vm
    assert state.guest_status(seed.paths.run, "lxc", 101) == "running"
    assert state.guest_status(seed.paths.run, "qemu", 201) == "stopped"


def test_seed_container_serves_on_all_gpus(seed):
    sx = SimExec(seed.dir)
    rows = _used(sx)
    assert len(rows) == 8 and all(r["memory.used"] > 78000 for r in rows)
    minors = sx.run(101, ["nvidia-smi", "--query-gpu=pci.bus_id,minor_number", "--format=csv,noheader"], timeout=5)
    got = {normalize_bus_id(r["pci.bus_id"]): r["minor_number"]
           for r in parse_query_gpu(minors.stdout, ["pci.bus_id", "minor_number"])}
    assert {a: got[a] for a in SEED_MINORS} == SEED_MINORS  # real minors, not bus order
    show = sx.run(101, ["systemctl", "show", "-p", "ExecStart", "sglang.service"], timeout=5).stdout
    assert "--tp 8 " in show


def test_open_and_refusals(seed, tmp_path):
    again = SimHost.open(seed.dir)
    assert (again.node, again.container) == ("pve1", 101)
    with pytest.raises(SimHostError):
        SimHost.open(tmp_path)
    (tmp_path / "x").write_text("")
    with pytest.raises(SimHostError) as e:
        SimHost.create(tmp_path)
    assert str(tmp_path) in str(e.value)


def _api(host):
    creds = host.credentials()
    port = int(re.search(r":(\d+)/", host.url).group(1))
    return ProxmoxAPI("127.0.0.1", port=port, user=creds["user"], password=creds["password"],
                      verify_ssl=str(host.api.ca_cert_path), timeout=10)


def _wait(api, upid):
    st = Tasks.blocking_status(api, upid, timeout=10, polling_interval=0.05)
    assert st is not None, "task did not finish"
    return st


def test_stop_start_through_real_api(tmp_path):
    with SimHost.create(tmp_path / "sim") as host:
        api = _api(host)
        sx = SimExec(host.dir)
        ct = api.nodes("pve1").lxc(101)
        assert _wait(api, ct.status.stop.post())["exitstatus"] == "OK"
        assert ct.status.current.get()["status"] == "stopped"
        r = sx.run(101, ["nvidia-smi", "-L"], timeout=5)
        assert (r.rc, r.stderr) == (255, "container '101' not running!\n")
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(host.endpoint.url + "/health", timeout=2)

        assert _wait(api, ct.status.start.post())["exitstatus"] == "OK"
        r = sx.run(101, ["systemctl", "is-active", "sglang.service"], timeout=5)
        assert (r.rc, r.stdout) == (0, "active\n")
        assert len(_used(sx)) == 8
        resp = requests.post(host.endpoint.url + "/v1/chat/completions", timeout=5,
                             json={"model": "qwen3", "messages": [{"role": "user", "content": "What is 7 x 13?"}]})
        assert "91" in resp.json()["choices"][0]["message"]["content"]


def test_start_fails_when_a_granted_node_is_missing(tmp_path):
    with SimHost.create(tmp_path / "sim") as host:
        api = _api(host)
        ct = api.nodes("pve1").lxc(101)
        _wait(api, ct.status.stop.post())
        os.unlink(host.paths.root / "dev/nvidia5")
        st = _wait(api, ct.status.start.post())
        assert st["exitstatus"] == "Device /dev/nvidia5 does not exist"
        assert ct.status.current.get()["status"] == "stopped"


@pytest.mark.parametrize("auth,who", [("token", "root@pam!gputopo"), ("password", "root@pam")])
def test_ports_bundle(tmp_path, auth, who):
    with SimHost.create(tmp_path / "sim") as host:
        ports = host.ports(auth=auth)
        assert ports.proxmox.identity() == who
        assert ports.proxmox.guest_status("lxc", 101) == "running"
        ports.proxmox.guest_action("lxc", 101, "stop", timeout=10)
        assert ports.exec.run(101, ["true"], timeout=5).rc == 255
        ports.proxmox.guest_action("lxc", 101, "start", timeout=10)
        assert ports.exec.run(101, ["systemctl", "is-active", "sglang.service"], timeout=5).rc == 0
        assert ports.files.read("proc/cmdline") is not None


def _serve(args: list[str]) -> tuple[subprocess.Popen, list[str]]:
    """Start ``gputopo sim serve ARGS`` and return it with its announcement (up to "Ctrl-C")."""
    proc = subprocess.Popen([sys.executable, "-m", "gputopo", "sim", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    while True:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError("sim serve ended early: " + "".join(lines) + proc.stderr.read())
        lines.append(line)
        if line.startswith("Ctrl-C"):
            return proc, lines


def _curl(command: str, token: bool = True) -> tuple[int, str]:
    """Run the announced curl command line, without its token header when ``token`` is false;
    return (HTTP status, body). Falls back to requests where curl is not installed."""
    import shlex
    import shutil

    argv = shlex.split(command.strip())
    assert argv[0] == "curl"
    if shutil.which("curl") is None:  # the same request without curl
        ca = argv[argv.index("--cacert") + 1] if "--cacert" in argv else None
        hdr = dict([argv[argv.index("-H") + 1].split(": ", 1)]) if token else {}
        r = requests.get(argv[-1], headers=hdr, verify=ca or False, timeout=10)
        return r.status_code, r.text
    if not token:
        i = argv.index("-H")
        del argv[i:i + 2]
    out = subprocess.run(argv[:1] + ["-sS", "-w", "\n%{http_code}"] + argv[1:], capture_output=True, text=True,
                         timeout=20)
    body, _, code = out.stdout.rpartition("\n")
    return int(code), body


def _stop(proc: subprocess.Popen, sig: int) -> str:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert err.strip().endswith("stopped") and "Traceback" not in err
    return err


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sim_serve_from_a_fixture_answers_curl_and_stops_on_sigint(tmp_path):
    proc, lines = _serve(["--dir", str(tmp_path / "sim"), "--from", "seed"])
    try:
        text = "".join(lines)
        assert "node pve1 in " in text
        curl = next(l for l in lines if l.strip().startswith("curl "))
        assert "-H 'Authorization: PVEAPIToken=root@pam!gputopo=" in curl and "--cacert " in curl
        status, body = _curl(curl)
        assert status == 200 and json.loads(body)["data"]["version"] == "8.4.1"
        status, body = _curl(curl, token=False)
        assert (status, body) == (401, "")
    except BaseException:
        proc.kill()
        raise
    _stop(proc, signal.SIGINT)
    # what it served stays on disk: the next serve reopens the same host
    assert SimHost.open(tmp_path / "sim").node == "pve1"


def test_sim_serve_from_a_snapshot_on_a_fixed_port_stops_on_sigterm(tmp_path):
    from gputopo.fixtures import materialize
    from gputopo.snapshot import snapshot

    snap = tmp_path / "coyote2.tar.gz"
    snapshot(materialize("esc8000a", tmp_path / "real"), snap)
    port = _free_port()
    proc, lines = _serve(["--dir", str(tmp_path / "sim"), "--from", str(snap), "--port", str(port)])
    try:
        assert "node coyote2 in " in "".join(lines)  # the snapshot's own hostname
        curl = next(l for l in lines if l.strip().startswith("curl "))
        assert f"https://127.0.0.1:{port}/api2/json/version" in curl
        status, body = _curl(curl.replace("/version", "/nodes/coyote2/lxc/101/config"))
        conf = json.loads(body)["data"]
        assert status == 200 and conf["digest"]
        # the container is granted exactly the snapshot's GPUs on nvidia
        host = SimHost.open(tmp_path / "sim")
        infos = list((host.paths.root / "proc/driver/nvidia/gpus").glob("*/information"))
        assert infos and sum(1 for k, v in conf.items() if re.fullmatch(r"dev\d+", k)
                             and re.match(r"/dev/nvidia\d+,", v)) == len(infos)
    except BaseException:
        proc.kill()
        raise
    _stop(proc, signal.SIGTERM)


def test_sim_serve_root_and_pve_root(tmp_path, seed):
    from gputopo.fixtures import materialize

    root = materialize("seed", tmp_path / "root")
    pve = tmp_path / "etc-pve"
    shutil.copytree(seed.paths.pve, pve, symlinks=True)
    conf = pve / "nodes/pve1/lxc/101.conf"
    conf.write_text(conf.read_text().replace("hostname: llm\n", "hostname: rehearsal\n"))
    proc, lines = _serve(["--root", str(root), "--pve-root", str(pve), "--http"])
    try:
        curl = next(l for l in lines if l.strip().startswith("curl "))
        assert "--cacert" not in curl and "http://127.0.0.1:" in curl
        status, body = _curl(curl.replace("/version", "/nodes/pve1/lxc/101/config"))
        assert status == 200 and json.loads(body)["data"]["hostname"] == "rehearsal"
    except BaseException:
        proc.kill()
        raise
    _stop(proc, signal.SIGTERM)
    # the operator's tree was copied, not used: the booted container's processes are not in it
    assert not (root / f"proc/{200000 + 101 * 100}").exists()


def test_sim_serve_refuses_bad_options(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gputopo", "sim", "serve", "--pve-root", str(tmp_path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr == "gputopo: error: --pve-root needs --root\n"


def test_sim_create_cli(tmp_path):
    from click.testing import CliRunner

    from gputopo.cli import cli

    r = CliRunner().invoke(cli, ["sim", "create", str(tmp_path / "h"), "--service", "vllm"])
    assert r.exit_code == 0, r.output
    host = SimHost.open(tmp_path / "h")
    unit = (host.paths.rootfs(101) / "etc/systemd/system/vllm.service").read_text()
    assert "vllm serve" in unit and "--tensor-parallel-size 8" in unit
    r = SimExec(host.dir).run(101, ["systemctl", "is-active", "vllm.service"], timeout=5)
    assert r.stdout == "active\n"


def test_unbind_waits_for_the_running_container_to_stop(tmp_path):
    """The service's workers hold /dev/nvidia<minor> in the host's /proc, so the simulated kernel
    blocks an unbind of a GPU the container serves on until Proxmox stops the container."""
    import threading

    from gputopo.apply import parse_cgroup_container
    from gputopo.discover import find_holders
    from gputopo.sim.kernel import SimKernel

    with SimHost.create(tmp_path / "sim") as host:
        root = host.paths.root
        held = find_holders(str(root), ["/dev/nvidia4"])["/dev/nvidia4"]
        cgroups = {parse_cgroup_container((root / f"proc/{pid}/cgroup").read_text()) for pid, _ in held}
        assert len(held) == 8 and cgroups == {101}  # one worker per rank of --tp 8
        kernel = SimKernel(str(root), time_scale=0.0)
        t = threading.Thread(target=kernel.write, args=("sys/bus/pci/drivers/nvidia/unbind", "0000:81:00.0"),
                             daemon=True)
        t.start()
        t.join(0.2)
        assert t.is_alive()
        api = _api(host)
        _wait(api, api.nodes("pve1").lxc(101).status.shutdown.post())
        t.join(5)
        assert not t.is_alive()
        assert not (root / "sys/bus/pci/devices/0000:81:00.0/driver").exists()
        assert find_holders(str(root), ["/dev/nvidiactl"]) == {}


def test_create_from_an_unsafe_or_empty_archive_is_refused(tmp_path):
    import io
    import tarfile

    from gputopo.errors import InputError

    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tf:
        data = b"x"
        info = tarfile.TarInfo("../escape")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    with pytest.raises(InputError) as e:
        SimHost.create(tmp_path / "a", source=str(bad))
    assert "leaves the root" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "escape").exists()
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz") as tf:
        info = tarfile.TarInfo("proc/cmdline")
        tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(SimHostError) as e:
        SimHost.create(tmp_path / "b", source=str(empty))
    assert str(e.value) == f"{empty}: snapshot holds no sys/ tree"


@pytest.mark.parametrize("version, seen_at_once", [("8.4.1", False), ("9.1.2", True)])
def test_new_dev_on_a_running_container_pending_or_hotplugged(tmp_path, version, seen_at_once):
    with SimHost.create(tmp_path / "sim", pve_version=version) as host:
        api = _api(host)
        ct = api.nodes("pve1").lxc(101)
        sx = SimExec(host.dir)
        assert parse_dev_value(ct.config.get()["dev7"])["path"] == "/dev/nvidia7"
        _wait(api, ct.status.stop.post())
        ct.config.put(delete="dev7")
        _wait(api, ct.status.start.post())

        def gpus():
            return len(sx.run(101, ["nvidia-smi", "-L"], timeout=5).stdout.splitlines())

        assert gpus() == 7
        ct.config.put(dev20="/dev/nvidia7,mode=0666")
        assert gpus() == (8 if seen_at_once else 7)
        assert ("dev20" in parse_lxc_conf(host.paths.lxc_conf(101).read_text()).pending.options) is not seen_at_once
        _wait(api, ct.status.stop.post())
        _wait(api, ct.status.start.post())
        assert gpus() == 8  # a restart applies what was pending


def test_sim_create_takes_the_proxmox_release(tmp_path):
    """`gputopo sim create --pve-version 9.1.2` makes a host that answers as PVE 9."""
    from gputopo.cli import main

    main(["sim", "create", str(tmp_path / "h"), "--pve-version", "9.1.2"])
    host = SimHost.open(tmp_path / "h")
    with host:
        ports = host.ports()
        assert ports.proxmox.version()["version"] == "9.1.2"
