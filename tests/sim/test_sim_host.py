"""The seed simulated host end to end: real HTTPS to the Proxmox API simulator, SimExec, sim serve."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException
from proxmoxer.tools import Tasks

from gputopo.errors import SimHostError, TaskFailed
from gputopo.formats.lxcconf import parse_dev_value, parse_lxc_conf
from gputopo.formats.nvsmi import normalize_bus_id, parse_query_gpu
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.sim import state
from gputopo.sim.container import SimExec
from gputopo.sim.host import SimHost
from gputopo.sim.passthrough import PassthroughError, hostpci_props, parse_host_ids
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = (
    pytest.mark.slow
)  # the simulated host served over HTTPS and started as a process; the full run only

SEED_MINORS = {"0000:01:00.0": 0, "0000:11:00.0": 1, "0000:61:00.0": 3, "0000:71:00.0": 2}


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    d = tmp_path_factory.mktemp("seed") / "sim"
    return SimHost.create(d)


def _used(sx):
    r = sx.run(
        101, ["nvidia-smi", "--query-gpu=index,pci.bus_id,memory.used", "--format=csv,noheader"], timeout=5
    )
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
    minors = sx.run(
        101, ["nvidia-smi", "--query-gpu=pci.bus_id,minor_number", "--format=csv,noheader"], timeout=5
    )
    got = {
        normalize_bus_id(r["pci.bus_id"]): r["minor_number"]
        for r in parse_query_gpu(minors.stdout, ["pci.bus_id", "minor_number"])
    }
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
    return ProxmoxAPI(
        "127.0.0.1",
        port=port,
        user=creds["user"],
        password=creds["password"],
        verify_ssl=str(host.api.ca_cert_path),
        timeout=10,
    )


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
        resp = requests.post(
            host.endpoint.url + "/v1/chat/completions",
            timeout=5,
            json={"model": "qwen3", "messages": [{"role": "user", "content": "What is 7 x 13?"}]},
        )
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputopo", "sim", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
        del argv[i : i + 2]
    out = subprocess.run(
        argv[:1] + ["-sS", "-w", "\n%{http_code}"] + argv[1:], capture_output=True, text=True, timeout=20
    )
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
    from gputopo.facts.snapshot import snapshot
    from gputopo.sim.hostroot import materialize

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
        assert infos and sum(
            1 for k, v in conf.items() if re.fullmatch(r"dev\d+", k) and re.match(r"/dev/nvidia\d+,", v)
        ) == len(infos)
    except BaseException:
        proc.kill()
        raise
    _stop(proc, signal.SIGTERM)


def test_sim_serve_root_and_pve_root(tmp_path, seed):
    from gputopo.sim.hostroot import materialize

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
    r = subprocess.run(
        [sys.executable, "-m", "gputopo", "sim", "serve", "--pve-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
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

    from gputopo.facts.procfs import find_holders, parse_cgroup_container
    from gputopo.sim.kernel import SimKernel

    with SimHost.create(tmp_path / "sim") as host:
        root = host.paths.root
        held = find_holders(str(root), ["/dev/nvidia4"])["/dev/nvidia4"]
        cgroups = {parse_cgroup_container((root / f"proc/{pid}/cgroup").read_text()) for pid, _ in held}
        assert len(held) == 8 and cgroups == {101}  # one worker per rank of --tp 8
        kernel = SimKernel(str(root), time_scale=0.0)
        t = threading.Thread(
            target=kernel.write, args=("sys/bus/pci/drivers/nvidia/unbind", "0000:81:00.0"), daemon=True
        )
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
        assert (
            "dev20" in parse_lxc_conf(host.paths.lxc_conf(101).read_text()).pending.options
        ) is not seen_at_once
        _wait(api, ct.status.stop.post())
        _wait(api, ct.status.start.post())
        assert gpus() == 8  # a restart applies what was pending


def test_a_failed_hot_plug_answers_400_writes_nothing_and_keeps_the_other_plugs(tmp_path):
    """pve-container's vmconfig_hotplug_pending (LXC/Config.pm) records a devN that fails as
    ``unable to hotplug devN: <die text>`` and goes on with the next one; update_vm
    (API2/LXC/Config.pm) then answers 400 with those errors before write_config. The devN that
    did plug stay in the running container; the config file is not touched."""
    with SimHost.create(tmp_path / "sim", pve_version="9.1.2") as host:
        api = _api(host)
        ct = api.nodes("pve1").lxc(101)
        sx = SimExec(host.dir)
        _wait(api, ct.status.stop.post())
        ct.config.put(delete="dev5,dev6,dev7")
        _wait(api, ct.status.start.post())

        def nodes():
            out = sx.run(101, ["ls", "/dev"], timeout=5).stdout.split()
            return sorted(n for n in out if re.fullmatch(r"nvidia\d+", n))

        assert nodes() == [f"nvidia{m}" for m in range(5)]
        conf = host.paths.lxc_conf(101).read_bytes()
        host.api.inject_hotplug_failure(101, "dev21")
        with pytest.raises(ResourceException) as e:
            ct.config.put(dev20="/dev/nvidia5", dev21="/dev/nvidia6", dev22="/dev/nvidia7")
        assert e.value.status_code == 400 and e.value.content == "Parameter verification failed."
        assert e.value.errors == {
            "dev21": "unable to hotplug dev21: move_mount failed: Operation not permitted\n"
        }
        assert host.paths.lxc_conf(101).read_bytes() == conf
        assert nodes() == [f"nvidia{m}" for m in (0, 1, 2, 3, 4, 5, 7)]
        # the fault was one failure: the same change plugs now
        ct.config.put(dev20="/dev/nvidia5", dev21="/dev/nvidia6", dev22="/dev/nvidia7")
        assert nodes() == [f"nvidia{m}" for m in range(8)]
        assert {"dev20", "dev21", "dev22"} <= set(
            parse_lxc_conf(host.paths.lxc_conf(101).read_text()).options
        )


def test_sim_create_takes_the_proxmox_release(tmp_path):
    """`gputopo sim create --pve-version 9.1.2` makes a host that answers as PVE 9."""
    from gputopo.cli import main

    main(["sim", "create", str(tmp_path / "h"), "--pve-version", "9.1.2"])
    host = SimHost.open(tmp_path / "h")
    with host:
        ports = host.ports()
        assert ports.proxmox.version()["version"] == "9.1.2"


# --- PCI passthrough at VM start, as Proxmox does it -------------------------------------------

CT_GPUS = ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]
VM_GPUS = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]


def _drv(host, addr):
    link = host.paths.root / "sys/bus/pci/devices" / addr / "driver"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def _reserved(host):
    return state.read_state(host.paths.run, "pci-reserved", {}) or {}


def _write_vm(host, vmid, hostpci):
    (host.paths.pve / f"nodes/pve1/qemu-server/{vmid}.conf").write_text(
        f"{hostpci}\nmachine: q35\nmemory: 8192\nname: vm{vmid}\n"
    )


@pytest.fixture
def sim_copy(template):
    made = []

    def make(split: bool) -> SimHost:
        from gputopo.apply import Timeouts
        from gputopo.usecases.apply import apply

        base = Path(tempfile.mkdtemp(prefix="gputopo-pt-", dir=applysim.fast_tmp()))
        host = applysim.copy_host(template, base / "sim")
        made.append((host, base))
        if split:
            t = Timeouts(sysfs=5.0, guest=30.0, exec=10.0, service=20.0, poll=0.02)
            res = apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root), timeouts=t)
            assert res.status == "applied"
        return host

    yield make
    for host, base in made:
        host.stop()
        applysim.cleanup(base)


def test_hostpci_props():
    assert hostpci_props("mapping=pro6000-vm,pcie=1") == {"mapping": "pro6000-vm", "pcie": "1"}
    assert hostpci_props("0000:81:00.0,pcie=1") == {"host": "0000:81:00.0", "pcie": "1"}
    assert hostpci_props("host=81:00,x-vga=1") == {"host": "81:00", "x-vga": "1"}
    for bad in ("pcie=1", "mapping=a,host=81:00.0", "mapping=a,81:00.0"):
        with pytest.raises(PassthroughError):
            hostpci_props(bad)
    assert parse_host_ids("81:00.0;0000:A2:00") == [("0000:81:00.0", False), ("0000:a2:00", True)]
    with pytest.raises(PassthroughError, match="invalid PCI ID"):
        parse_host_ids("81:00.9")


def test_vm_start_after_the_split_takes_free_mapped_gpus(sim_copy):
    host = sim_copy(split=True)
    px = host.ports().proxmox
    px.guest_action("qemu", 201, "start", 30)
    assert px.guest_status("qemu", 201) == "running"
    assert _reserved(host) == {"0000:81:00.0": 201}
    assert [_drv(host, a) for a in CT_GPUS] == ["nvidia"] * 4
    assert [_drv(host, a) for a in VM_GPUS] == ["vfio-pci"] * 4
    # a second VM on the same mapping gets the next free entry, a third the one after
    _write_vm(host, 202, "hostpci0: mapping=pro6000-vm,pcie=1")
    px.guest_action("qemu", 202, "start", 30)
    assert _reserved(host) == {"0000:81:00.0": 201, "0000:91:00.0": 202}
    # two entries on one mapping in one VM: two different GPUs
    _write_vm(host, 203, "hostpci0: mapping=pro6000-vm\nhostpci1: mapping=pro6000-vm")
    px.guest_action("qemu", 203, "start", 30)
    assert {a for a, v in _reserved(host).items() if v == 203} == {"0000:e1:00.0", "0000:f1:00.0"}
    _write_vm(host, 204, "hostpci0: mapping=pro6000-vm")
    with pytest.raises(TaskFailed) as ei:
        px.guest_action("qemu", 204, "start", 30)
    assert ei.value.exitstatus == "could not find a free device for 'hostpci0'"
    assert px.guest_status("qemu", 204) == "stopped"
    # by address: a device a running VM uses is refused; once that VM stops it is free again
    _write_vm(host, 205, "hostpci0: 0000:91:00.0,pcie=1")
    with pytest.raises(TaskFailed) as ei:
        px.guest_action("qemu", 205, "start", 30)
    assert ei.value.exitstatus == "PCI device '0000:91:00.0' already in use by VMID '202'"
    px.guest_action("qemu", 202, "stop", 30)
    px.guest_action("qemu", 205, "start", 30)
    assert _reserved(host)["0000:91:00.0"] == 205
    assert _drv(host, "0000:91:00.0") == "vfio-pci"
    assert [_drv(host, a) for a in CT_GPUS] == ["nvidia"] * 4


def test_vm_start_fails_with_the_mapping_check_message(sim_copy):
    host = sim_copy(split=True)
    cfg = host.paths.pve / "mapping/pci.cfg"
    text = cfg.read_text()
    assert "subsystem-id=10de:204e" in text
    cfg.write_text(
        text.replace("path=0000:91:00.0,subsystem-id=10de:204e", "path=0000:91:00.0,subsystem-id=10de:1234")
    )
    px = host.ports().proxmox
    with pytest.raises(TaskFailed) as ei:
        px.guest_action("qemu", 201, "start", 30)
    # every entry of the mapping is checked, not only the one the VM would take
    assert ei.value.exitstatus == (
        "PCI device mapping invalid (hardware probably changed): "
        "'subsystem-id' does not match for 'pro6000-vm' (10de:204e != 10de:1234)"
    )
    assert px.guest_status("qemu", 201) == "stopped" and _reserved(host) == {}


def _unsplit_with_mapping(host):
    """The seed host as it came (eight GPUs on nvidia) plus a valid pro6000-vm for 0000:81:00.0."""
    from gputopo.formats.pcicfg import PciMapping, write_pci_cfg

    cfg = host.paths.pve / "mapping/pci.cfg"
    maps = parse_pci_cfg(cfg.read_text())
    entry = next(m for m in maps[0].maps if "path=0000:81:00.0" in m)
    cfg.write_text(write_pci_cfg(maps + [PciMapping(id="pro6000-vm", maps=[entry])]))


def test_vm_start_on_an_unsplit_host_shows_the_new_id_pitfall(sim_copy):
    from gputopo.sim.kernel import SimKernel

    host = sim_copy(split=False)
    assert [_drv(host, a) for a in CT_GPUS + VM_GPUS] == ["nvidia"] * 8
    _unsplit_with_mapping(host)
    px = host.ports().proxmox
    px.guest_action("lxc", 101, "shutdown", 30)
    # a GPU left unbound, as an operator half-way through a manual move leaves it
    SimKernel(str(host.paths.root)).write("sys/bus/pci/drivers/nvidia/unbind", "0000:e1:00.0")
    assert _drv(host, "0000:e1:00.0") is None
    px.guest_action("qemu", 201, "start", 30)
    assert _reserved(host) == {"0000:81:00.0": 201}
    assert _drv(host, "0000:81:00.0") == "vfio-pci"
    # new_id "10de 2bb5" made vfio-pci grab the other unbound GPU of that model too
    assert _drv(host, "0000:e1:00.0") == "vfio-pci"
    assert [_drv(host, a) for a in CT_GPUS + ["0000:91:00.0", "0000:f1:00.0"]] == ["nvidia"] * 6


def test_vm_start_blocks_while_the_container_holds_the_gpu(sim_copy):
    host = sim_copy(split=False)
    _unsplit_with_mapping(host)
    api = _api(host.start())
    upid = api.nodes("pve1").qemu(201).status.start.post()
    time.sleep(0.2)
    st = api.nodes("pve1").tasks(upid).status.get()
    assert st["status"] == "running"  # the kernel's unbind waits for the service's workers
    assert _drv(host, "0000:81:00.0") == "nvidia"
    # the container's stop runs meanwhile and lets the unbind (and the VM start) finish
    assert _wait(api, api.nodes("pve1").lxc(101).status.shutdown.post())["exitstatus"] == "OK"
    assert _wait(api, upid)["exitstatus"] == "OK"
    assert _drv(host, "0000:81:00.0") == "vfio-pci"
