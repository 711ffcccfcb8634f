"""Guest power tasks as a real PVE node runs them, through gputopo's ProxmoxClient over HTTPS
and through pvesh: tasks that end ``WARNINGS: N``, shutdowns that time out, QEMU's power
actions that always start a task, tasks that never end."""

from __future__ import annotations

import time

import pytest

from gputopo.adapters.credentials import ApiConfig
from gputopo.adapters.proxmox import ProxmoxClient
from gputopo.errors import ProxmoxError, TaskFailed, TaskTimeout
from gputopo.sim import state
from gputopo.sim.container.distro import lsb_release, start_warnings
from gputopo.sim.pveapi import PveApiServer, PveshSim
from helpers.simapi import seed_root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # guest tasks that wait out their timeouts (seconds each); the full run only

CT = "arch: amd64\nhostname: llm\nmemory: 4096\nostype: ubuntu\n"
VM = "bios: ovmf\nmemory: 8192\nname: gpuvm\nostype: l26\n"
EFI = "efidisk0: local-lvm:vm-200-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M\n"
UBUNTU_WARNING = (
    "The container's Ubuntu version '27.04' is not in the known version list. As it's newer than "
    "the minimum supported version it's likely to work OK, but full compatibility cannot be "
    "guaranteed. Please check for PVE system updates."
)


class Hooks:
    """A container whose start logs what its rootfs' release makes pve-container say."""

    def __init__(self, rootfs):
        self.rootfs = rootfs

    def on_guest_start(self, kind, vmid):
        return start_warnings(self.rootfs, "ubuntu") if kind == "lxc" else []


def _server(tmp_path, root, version="8.4.1", release="27.04") -> PveApiServer:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/lsb-release").write_text(lsb_release(release))
    s = PveApiServer(
        tmp_path / "pve", tmp_path / "run", root, version=version, hooks=Hooks(rootfs), auth_fail_delay=0.0
    )
    s.write_conf("lxc", 101, CT)
    s.write_conf("qemu", 200, VM)
    return s.start()


def _client(s: PveApiServer, backend: str) -> ProxmoxClient:
    if backend == "local":
        return ProxmoxClient.from_config(
            ApiConfig(backend="local", timeout=10, poll_interval=0.02), env={}, runner=PveshSim(s)
        )
    cfg = ApiConfig(
        host="127.0.0.1", port=s.port, ca_bundle=str(s.ca_cert_path), timeout=10, poll_interval=0.02
    )
    return ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": s.root_password})


@pytest.fixture(params=["https", "local"])
def backend(request):
    return request.param


@pytest.fixture
def srv(tmp_path, seed_root):
    s = _server(tmp_path, seed_root)
    yield s
    s.stop()


# --- WARNINGS: N is success ------------------------------------------------------------------


def test_a_container_start_that_warns_succeeded_and_returns_its_warnings(srv, backend):
    c = _client(srv, backend)
    res = c.guest_action("lxc", 101, "start", timeout=10)
    assert (res.exitstatus, res.warnings, res.forced) == ("WARNINGS: 1", [UBUNTU_WARNING], False)
    assert c.guest_status("lxc", 101) == "running"
    log = c.task_log(res.upid)
    assert log[-2:] == [f"WARN: {UBUNTU_WARNING}", "TASK WARNINGS: 1"]


def test_pvesh_prints_the_warnings_of_a_task_and_exits_0(srv):
    out, err, rc = PveshSim(srv)(
        ["pvesh", "create", "/nodes/pve1/lxc/101/status/start", "--output-format", "json"], 10
    )
    # RESTEnvironment.pm fork_worker in the cli environment: the worker's output (its WARN lines
    # too) on stdout before the UPID, "Task finished with N warning(s)!" on stderr
    assert rc == 0 and err == "Task finished with 1 warning(s)!\n"
    lines = out.splitlines()
    assert lines[0] == f"WARN: {UBUNTU_WARNING}" and lines[-1].startswith('"UPID:pve1:')


def test_a_known_release_starts_without_warnings_and_an_ancient_one_fails(tmp_path, seed_root, backend):
    s = _server(tmp_path / "a", seed_root, release="24.04")
    try:
        res = _client(s, backend).guest_action("lxc", 101, "start", timeout=10)
        assert (res.exitstatus, res.warnings) == ("OK", [])
    finally:
        s.stop()
    s = _server(tmp_path / "b", seed_root, release="13.10")
    try:
        with pytest.raises(TaskFailed) as ei:
            _client(s, backend).guest_action("lxc", 101, "start", timeout=10)
        assert ei.value.exitstatus == "unsupported ancient Ubuntu version '13.10'"
        assert str(ei.value).startswith(
            "CT 101 start: failed: unsupported ancient Ubuntu version '13.10' (task UPID:"
        )
    finally:
        s.stop()


@pytest.mark.parametrize(
    "version, efidisk, warned",
    [
        ("9.1.2", EFI, True),
        ("9.1.2", EFI.replace("size=4M", "ms-cert=2023k,size=4M"), False),
        ("9.1.2", EFI.replace("pre-enrolled-keys=1", "pre-enrolled-keys=0"), False),
        ("8.4.1", EFI, False),  # the check came with qemu-server 9
    ],
)
def test_a_vm_start_with_an_efi_disk_without_the_2023_certificates_warns_on_pve_9(
    tmp_path, seed_root, backend, version, efidisk, warned
):
    s = _server(tmp_path, seed_root, version=version)
    try:
        s.write_conf("qemu", 200, VM + efidisk)
        res = _client(s, backend).guest_action("qemu", 200, "start", timeout=10)
        if warned:
            # qemu-server QemuServer.pm check_efi_vars: one log_warn whose message spans two lines
            assert res.exitstatus == "WARNINGS: 1"
            assert res.warnings == [
                "EFI disk without 'ms-cert=2023k' option, suggesting that not all UEFI 2023"
            ]
        else:
            assert (res.exitstatus, res.warnings) == ("OK", [])
    finally:
        s.stop()


# --- QEMU's power actions always start a task ---------------------------------------------


def test_qemu_start_of_a_running_vm_fails_in_its_task_and_stop_of_a_stopped_vm_succeeds(srv, backend):
    c = _client(srv, backend)
    assert c.guest_action("qemu", 200, "stop", timeout=10).exitstatus == "OK"
    assert c.guest_action("qemu", 200, "shutdown", timeout=10).exitstatus == "OK"
    c.guest_action("qemu", 200, "start", timeout=10)
    with pytest.raises(TaskFailed) as ei:
        c.guest_action("qemu", 200, "start", timeout=10)
    assert ei.value.exitstatus == "VM 200 already running"
    assert c.guest_status("qemu", 200) == "running"
    # a container's API refuses both outright
    with pytest.raises(ProxmoxError) as ei:
        c.guest_action("lxc", 101, "stop", timeout=10)
    assert ei.value.pve_message == "CT 101 not running" and not isinstance(ei.value, TaskFailed)


def test_pvesh_warns_when_it_shuts_down_a_stopped_vm_and_still_succeeds(srv):
    out, err, rc = PveshSim(srv)(
        ["pvesh", "create", "/nodes/pve1/qemu/200/status/shutdown", "--output-format", "json"], 10
    )
    # API2/Qemu.pm vm_shutdown -> vm_is_paused warns what the query-status failed with
    assert rc == 0 and err == "VM 200 not running\n\n" and out.startswith('"UPID:pve1:')


# --- shutdowns time out ------------------------------------------------------------------


def _shutdown(s, c, kind, vmid, takes, timeout, force, second=1.0):
    c.guest_action(kind, vmid, "start", timeout=10)
    s.set_latency("vzshutdown" if kind == "lxc" else "qmshutdown", takes, vmid=vmid)
    s.set_latency("second", second)
    return c.guest_action(kind, vmid, "shutdown", timeout=30, shutdown_timeout=timeout, force=force)


def test_a_container_that_does_not_shut_down_in_time(srv, backend):
    c = _client(srv, backend)
    t0 = time.monotonic()
    with pytest.raises(TaskFailed) as ei:
        _shutdown(srv, c, "lxc", 101, takes=600, timeout=2, force=False, second=0.05)
    # pve-container LXC.pm vm_stop: lxc-stop --nokill --timeout 2 fails, 2+5 s more of polling
    assert ei.value.exitstatus == "container did not stop"
    assert time.monotonic() - t0 >= (2 * 2 + 5) * 0.05
    assert c.guest_status("lxc", 101) == "running"
    assert c.task_log(ei.value.upid) == [
        "command 'lxc-stop -n 101 --nokill --timeout 2' failed: exit code 1",
        "TASK ERROR: container did not stop",
    ]
    # one that takes a little longer than the timeout still goes down in the polling after it
    srv.set_latency("vzshutdown", 1.5, vmid=101)  # more than 20 s at 0.05, less than (2 * 20 + 5) s
    res = c.guest_action("lxc", 101, "shutdown", timeout=30, shutdown_timeout=20, force=False)
    assert res.exitstatus == "OK" and not res.forced and c.guest_status("lxc", 101) == "stopped"
    assert c.task_log(res.upid)[0] == "command 'lxc-stop -n 101 --nokill --timeout 20' failed: exit code 1"


def test_a_container_forced_after_its_shutdown_timeout(srv, backend):
    c = _client(srv, backend)
    res = _shutdown(srv, c, "lxc", 101, takes=600, timeout=1, force=True)
    # lxc-stop without --nokill kills it after the timeout and logs nothing: the task's
    # length tells
    assert (res.exitstatus, res.forced) == ("OK", True) and 1.0 <= res.seconds < 5
    assert c.guest_status("lxc", 101) == "stopped"
    res = _shutdown(srv, c, "lxc", 101, takes=0.05, timeout=1, force=True)
    assert (res.exitstatus, res.forced) == ("OK", False)


def test_a_vm_that_does_not_shut_down_in_time(srv, backend):
    c = _client(srv, backend)
    with pytest.raises(TaskFailed) as ei:
        _shutdown(srv, c, "qemu", 200, takes=600, timeout=3, force=False, second=0.05)
    assert ei.value.exitstatus == "VM quit/powerdown failed - got timeout"
    assert c.guest_status("qemu", 200) == "running"
    res = c.guest_action("qemu", 200, "shutdown", timeout=30, shutdown_timeout=3, force=True)
    # QemuServer.pm _do_vm_stop: a plain warn in the log, the task ends OK
    assert (res.exitstatus, res.forced) == ("OK", True)
    assert "VM still running - terminating now with SIGTERM" in c.task_log(res.upid)
    assert c.guest_status("qemu", 200) == "stopped"


def test_the_shutdown_sends_its_timeout_and_force_only_when_asked(srv):
    pvesh = PveshSim(srv)
    c = ProxmoxClient.from_config(ApiConfig(backend="local", timeout=10), env={}, runner=pvesh)
    c.guest_action("lxc", 101, "start", timeout=10)
    c.guest_action("lxc", 101, "shutdown", timeout=10, shutdown_timeout=45)
    shutdown = next(a for a in reversed(pvesh.calls) if a[2].endswith("/status/shutdown"))
    assert shutdown == [
        "pvesh",
        "create",
        "/nodes/pve1/lxc/101/status/shutdown",
        "--timeout",
        "45",
        "--output-format",
        "json",
    ]
    c.guest_action("lxc", 101, "start", timeout=10)
    c.guest_action("lxc", 101, "shutdown", timeout=10, shutdown_timeout=45, force=True)
    shutdown = next(a for a in reversed(pvesh.calls) if a[2].endswith("/status/shutdown"))
    assert shutdown[3:7] == ["--timeout", "45", "--forceStop", "1"]


# --- a task that never ends ---------------------------------------------------------------


def test_a_task_that_never_finishes_is_a_timeout_naming_the_task_the_guest_and_the_limit(srv, backend):
    c = _client(srv, backend)
    srv.set_latency("vzstart", 3600)
    t0 = time.monotonic()
    with pytest.raises(TaskTimeout) as ei:
        c.guest_action("lxc", 101, "start", timeout=0.5)
    assert time.monotonic() - t0 < 5
    e = ei.value
    assert e.limit == 0.5 and e.what == "CT 101 start" and isinstance(e, TaskFailed)
    if backend == "https":
        assert e.upid.startswith("UPID:pve1:") and ":vzstart:101:" in e.upid
        assert str(e) == f"CT 101 start: task {e.upid} did not finish within 0.5 s (the step's limit)"
    else:  # pvesh runs the task in the foreground: the call itself outlives the limit
        assert str(e) == "CT 101 start: its task did not finish within 0.5 s (the step's limit)"
    assert "None" not in str(e)


# --- pvesh noise --------------------------------------------------------------------------


def test_pvesh_waiting_for_a_cfs_lock_prints_it_and_the_call_still_succeeds(srv, seed_root):
    group = int((seed_root / "sys/bus/pci/devices/0000:81:00.0/iommu_group").readlink().name)
    m = f"id=10de:2bb5,iommugroup={group},node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"
    srv.hold_cfs_lock("file-mapping_pci_cfg", 0.3)
    pvesh = PveshSim(srv)
    out, err, rc = pvesh(
        ["pvesh", "create", "/cluster/mapping/pci", "--id", "gpu", "--map", m, "--output-format", "json"], 10
    )
    # pve-cluster Cluster.pm $cfs_lock prints this while another holder has the lock
    assert (out, rc) == ("", 0) and err == "trying to acquire cfs lock 'file-mapping_pci_cfg' ...\n"
    srv.hold_cfs_lock("file-mapping_pci_cfg", 0.3)
    c = ProxmoxClient.from_config(ApiConfig(backend="local", timeout=10), env={}, runner=pvesh)
    c.mapping_update("gpu", [m], "held", c.mappings()[0]["digest"])
    assert c.mappings()[0]["description"] == "held"


# --- a task is the node's: it runs on when its client goes away -----------------------------


@pytest.mark.parametrize("kind,vmid", [("lxc", 101), ("qemu", 200)])
def test_a_shutdown_runs_on_when_the_client_and_the_server_that_took_it_go_away(
    tmp_path, seed_root, kind, vmid
):
    """pve-container API2/LXC/Status.pm and qemu-server API2/Qemu.pm vm_shutdown answer the UPID
    of a worker (pve-common RESTEnvironment.pm fork_worker) that no client waits for: the guest
    goes down whether or not anyone asks, also once the process that served the call is gone."""
    s = _server(tmp_path, seed_root)
    c = _client(s, "https")
    c.guest_action(kind, vmid, "start", timeout=10)
    s.set_latency("vzshutdown" if kind == "lxc" else "qmshutdown", 0.6, vmid=vmid)
    upid = c._call("POST", f"/nodes/pve1/{kind}/{vmid}/status/shutdown")  # nobody waits for it
    assert c.guest_status(kind, vmid) == "running"
    s.stop()  # the process that served it ended (a CLI with --sim, killed)

    # a server started again before it is due: the task ends on its own, no read needed
    s = PveApiServer(tmp_path / "pve", tmp_path / "run", seed_root, auth_fail_delay=0.0).start()
    try:
        time.sleep(1.0)
        assert state.guest_status(tmp_path / "run", kind, vmid) == "stopped"
        c = _client(s, "https")
        assert c.wait_task(upid, 1) == "OK"
        # one served again once it was due: the guest's status read shows what the task did
        c.guest_action(kind, vmid, "start", timeout=10)
        c._call("POST", f"/nodes/pve1/{kind}/{vmid}/status/shutdown")
    finally:
        s.stop()
    time.sleep(0.8)
    s = PveApiServer(tmp_path / "pve", tmp_path / "run", seed_root, auth_fail_delay=0.0)
    s.start()
    try:
        assert _client(s, "https").guest_status(kind, vmid) == "stopped"
    finally:
        s.stop()
