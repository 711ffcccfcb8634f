"""The seed simulated host end to end: real HTTPS to the Proxmox API simulator, SimExec, sim serve."""

import os
import re
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


def test_sim_serve_answers_with_token(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "gputopo", "sim", "serve", "--dir", str(tmp_path / "sim")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        text = "".join(lines)
        curl = next(l for l in lines if l.strip().startswith("curl "))
        ca = re.search(r"--cacert (\S+)", curl).group(1)
        header = re.search(r"-H 'Authorization: ([^']+)'", curl).group(1)
        url = curl.split()[-1]
        assert header.startswith("PVEAPIToken=root@pam!") and url.endswith("/api2/json/version"), text
        r = requests.get(url, headers={"Authorization": header}, verify=ca, timeout=10)
        assert r.status_code == 200 and r.json()["data"]["version"] == "8.4.1"
        assert requests.get(url, verify=ca, timeout=10).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


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
