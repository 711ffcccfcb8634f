"""Apply on the simulated seed host: real HTTPS to the Proxmox simulator, simulated kernel and
container. The NUMA split applies, a second apply plans nothing, --dry-run changes nothing,
preflight refuses foreign holders and an API token, a second concurrent apply is refused."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputopo.apply import PlainProgress, Timeouts
from gputopo.apply.lock import HostLock
from gputopo.errors import HostChanged, LockHeld, PreflightFailed
from gputopo.formats.lxcconf import parse_dev_value, parse_lxc_conf
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.sim.container import SimExec
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)

NUMA0 = {"0000:01:00.0": 0, "0000:11:00.0": 1, "0000:61:00.0": 3, "0000:71:00.0": 2}
NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
NUMA1_MINORS = [4, 5, 6, 7]  # the seed fixture's minors of the NUMA-1 GPUs


def test_seed_split_applies_and_converges(host):
    ports = host.ports()
    spec = applysim.seed_spec(host)
    root = str(host.paths.root)
    res = apply(spec, ports, root=root)
    assert res.status == "applied"
    kinds = [s.text for s in res.steps]
    assert len(kinds) == len(res.plan.actions) and all(s.status == "done" for s in res.steps)
    assert res.stop_window_s is not None and 0 < res.stop_window_s < res.wall_s

    # NUMA 1 on vfio-pci with its group device, override kept
    for a in NUMA1:
        dev = host.paths.root / "sys/bus/pci/devices" / a
        assert os.path.basename(os.readlink(dev / "driver")) == "vfio-pci"
        assert (dev / "driver_override").read_text().strip() == "vfio-pci"
        group = os.path.basename(os.readlink(dev / "iommu_group"))
        assert (host.paths.root / "dev/vfio" / group).exists()
    for a in NUMA0:
        assert (
            os.path.basename(os.readlink(host.paths.root / "sys/bus/pci/devices" / a / "driver")) == "nvidia"
        )

    # container 101 kept running (container_restart: auto): its config has exactly the NUMA-0
    # minors plus the control nodes once the removals waiting for its next start are applied
    assert "stop_guest" not in [a.kind for a in res.plan.actions]
    conf = parse_lxc_conf(host.paths.lxc_conf(101).read_text())
    devs = sorted(
        parse_dev_value(v)["path"]
        for k, v in conf.options.items()
        if re.fullmatch(r"dev\d+", k) and k not in conf.pending_delete
    )
    nv = sorted(d for d in devs if re.fullmatch(r"/dev/nvidia\d+", d))
    assert nv == sorted(f"/dev/nvidia{m}" for m in NUMA0.values())
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} <= set(devs)
    removed = sorted(parse_dev_value(conf.options[k])["path"] for k in conf.pending_delete)
    assert removed == sorted(f"/dev/nvidia{m}" for m in NUMA1_MINORS)

    # mappings per spec: pro6000 untouched, pro6000-vm with the NUMA-1 GPUs
    maps = {m.id: m for m in parse_pci_cfg((host.paths.pve / "mapping/pci.cfg").read_text())}
    assert sorted(e.path for e in maps["pro6000-vm"].entries()) == NUMA1

    # the drop-in with --tp 4 and the service active on it
    sx = SimExec(host.dir)
    dropin = host.paths.rootfs(101) / "etc/systemd/system/sglang.service.d/gputopo.conf"
    assert "--tp 4" in dropin.read_text()
    assert sx.run(101, ["systemctl", "is-active", "sglang.service"], 5).stdout.strip() == "active"
    show = sx.run(101, ["systemctl", "show", "-p", "ExecStart", "sglang.service"], 5).stdout
    assert "--tp 4 " in show

    # journal: header, begin/done per step, end applied
    from gputopo.apply.journal import Journal, find_unfinished

    j = Journal.load(res.journal)
    assert j.result == "applied" and find_unfinished(root) is None
    assert len(j.header.actions) == len(res.plan.actions)
    assert all(s.status == "done" for s in j.steps().values())

    again = apply(spec, ports, root=root)
    assert again.status == "no-changes" and again.plan.is_empty


@pytest.mark.slow
def test_dry_run_changes_nothing(host):
    ports = host.ports()
    before = applysim.fingerprint(host)
    tree = _hash_tree(host.dir)
    res = apply(applysim.seed_spec(host), ports, root=str(host.paths.root), dry_run=True)
    assert res.status == "dry-run" and res.plan.actions
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert _hash_tree(host.dir) == tree


def _hash_tree(d: Path) -> dict[str, str]:
    import hashlib

    out = {}
    for p in sorted(Path(d).rglob("*")):
        rel = str(p.relative_to(d))
        # the API server's runtime records (its URL, TLS) are the simulator's, not the host's
        if rel.startswith(("run/api.json", "run/tls", "run/endpoint")):
            continue
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.mark.slow
def test_preflight_refuses_foreign_holder(host):
    applysim.fake_process(
        host.paths.root,
        4242,
        "/dev/nvidia4",
        argv=("python3", "train.py"),
        cgroup="0::/user.slice/user-0.slice/session-1.scope",
    )
    # a process inside CT 101 (stopped by the plan) is no obstacle
    applysim.fake_process(
        host.paths.root, 5151, "/dev/nvidia5", cgroup="0::/lxc/101/ns/system.slice/sglang.service"
    )
    before = applysim.fingerprint(host)
    with pytest.raises(PreflightFailed) as e:
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root))
    assert e.value.exit_code == 2
    assert e.value.problems == [
        "/dev/nvidia4 (GPU 0000:81:00.0) is held open by PID 4242 (python3 train.py); stop it before apply"
    ]
    assert applysim.diff(before, applysim.fingerprint(host)) == []


@pytest.mark.slow
def test_preflight_refuses_a_foreign_process_in_a_container_the_plan_keeps_running(host):
    """container_restart: auto keeps CT 101 running and stops only its service; a notebook in the
    same container that holds a leaving GPU would keep it busy, so apply refuses before anything
    stops. Its workers are named on one line. With ``always`` the container stops and it ends."""
    for pid in (6161, 6162):
        applysim.fake_process(
            host.paths.root,
            pid,
            "/dev/nvidia4",
            argv=("python3", "notebook.py"),
            cgroup="0::/lxc/101/ns/user.slice/user-0.slice/session-3.scope",
        )
    spec = applysim.seed_spec(host)
    assert spec.policy.container_restart == "auto"
    before = applysim.fingerprint(host)
    with pytest.raises(PreflightFailed) as e:
        apply(spec, host.ports(), root=str(host.paths.root))
    assert e.value.problems == [
        "/dev/nvidia4 (GPU 0000:81:00.0) is held open by PIDs 6161, 6162 (python3 notebook.py) in CT 101, "
        "which the plan keeps running; stop it, name its unit as the container's service, or set "
        "policy.container_restart: always"
    ]
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    spec.policy.container_restart = "always"
    res = apply(spec, host.ports(), root=str(host.paths.root), dry_run=True)
    assert res.status == "dry-run" and "stop_guest" in [a.kind for a in res.plan.actions]


@pytest.mark.slow
def test_a_container_whose_service_the_spec_does_not_name_restarts(host):
    """auto keeps a container running only when gputopo stops what uses its GPUs (its service)."""
    spec = applysim.seed_spec(host)
    res = apply(spec, host.ports(), root=str(host.paths.root), dry_run=True)
    assert "stop_guest" not in [a.kind for a in res.plan.actions]
    spec.nodes[0].containers[0].service = None
    res = apply(spec, host.ports(), root=str(host.paths.root), dry_run=True)
    kinds = [a.kind for a in res.plan.actions]
    assert kinds.count("stop_guest") == 1 and kinds.count("start_guest") == 1 and "stop_service" not in kinds


@pytest.mark.slow
def test_preflight_refuses_a_display_server_on_a_moving_gpus_dri_node(host):
    """Failure mode 2: nvidia_drm's /dev/dri nodes held by a display server keep the GPU busy."""
    dev = host.paths.root / "sys/bus/pci/devices/0000:91:00.0"
    (dev / "drm/card2").mkdir(parents=True)
    (dev / "drm/renderD129").mkdir()
    applysim.fake_process(
        host.paths.root,
        3131,
        "/dev/dri/card2",
        comm="Xorg",
        argv=("/usr/lib/xorg/Xorg", ":0"),
        cgroup="0::/system.slice/display-manager.service",
    )
    before = applysim.fingerprint(host)
    with pytest.raises(PreflightFailed) as e:
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root))
    assert e.value.problems == [
        "/dev/dri/card2 (GPU 0000:91:00.0) is held open by PID 3131 (/usr/lib/xorg/Xorg :0); stop it before apply"
    ]
    assert applysim.diff(before, applysim.fingerprint(host)) == []


@pytest.mark.slow
def test_preflight_names_persistenced_with_the_fix(host):
    applysim.fake_process(host.paths.root, 900, "/dev/nvidiactl", comm="nvidia-persistenced")
    with pytest.raises(PreflightFailed) as e:
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root))
    (line,) = e.value.problems
    assert "nvidia-persistenced (PID 900)" in line and "systemctl stop nvidia-persistenced" in line


@pytest.mark.slow
def test_preflight_refuses_api_token_for_devN(host):
    before = applysim.fingerprint(host)
    with pytest.raises(PreflightFailed) as e:
        apply(applysim.seed_spec(host), host.ports(auth="token"), root=str(host.paths.root))
    (line,) = e.value.problems
    assert "root@pam!gputopo" in line and "only root@pam" in line and "GPUTOPO_PVE_PASSWORD" in line
    assert applysim.diff(before, applysim.fingerprint(host)) == []


@pytest.mark.slow
def test_preflight_refuses_running_vm_outside_the_plan(host):
    from gputopo.sim import state

    spec = applysim.seed_spec(host)
    ports = host.ports()
    # VM 201 uses pro6000 (all eight GPUs) directly and runs; the spec lists no guests to stop
    conf = host.paths.pve / "nodes/pve1/qemu-server/202.conf"
    conf.write_text("hostpci0: 0000:91:00.0,pcie=1\nmemory: 4096\nname: other\n")
    state.set_guest_status(host.paths.run, "qemu", 202, "running")
    spec = spec.model_copy(deep=True)
    spec.nodes[0].vms.guests = [201]
    with pytest.raises(PreflightFailed) as e:
        apply(spec, ports, root=str(host.paths.root))
    assert any(line.startswith("VM 202 is running with 0000:91:00.0") for line in e.value.problems)


@pytest.mark.slow
def test_confirm_declined_changes_nothing(host):
    from gputopo.errors import ApplyCancelled

    before = applysim.fingerprint(host)
    seen = []
    with pytest.raises(ApplyCancelled):
        apply(
            applysim.seed_spec(host),
            host.ports(),
            root=str(host.paths.root),
            confirm=lambda p: seen.append(p) or False,
        )
    assert seen and seen[0].actions
    assert applysim.diff(before, applysim.fingerprint(host)) == []


@pytest.mark.slow
def test_host_changed_between_confirm_and_lock(host):
    ports = host.ports()
    spec = applysim.seed_spec(host)

    def confirm(p):
        # someone moves a GPU by hand while the operator reads the plan (stopping the service
        # first: its workers hold the GPU open and the unbind would wait for them)
        ports.exec.run(101, ["systemctl", "stop", "sglang.service"], timeout=5)
        ports.sysfs.write("sys/bus/pci/devices/0000:81:00.0/driver_override", "vfio-pci")
        ports.sysfs.write("sys/bus/pci/drivers/nvidia/unbind", "0000:81:00.0")
        ports.sysfs.write("sys/bus/pci/drivers_probe", "0000:81:00.0")
        return True

    with pytest.raises(HostChanged) as e:
        apply(spec, ports, root=str(host.paths.root), confirm=confirm)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    from gputopo.apply.journal import list_journals

    assert list_journals(host.paths.root) == []


def test_lock_refuses_second_holder_naming_it(tmp_path):
    a = HostLock(tmp_path).acquire()
    try:
        with pytest.raises(LockHeld) as e:
            HostLock(tmp_path).acquire()
        assert f"pid {os.getpid()}" in str(e.value) and e.value.exit_code == 4
    finally:
        a.release()
    HostLock(tmp_path).acquire().release()


@pytest.mark.slow
def test_concurrent_apply_refused_naming_the_first(host):
    """Two real processes: the first is held inside its switch phase (an unbind that blocks until
    the test releases it), the second is refused naming the first. No timing window: the test
    waits for the first apply's journal to show the rebind began."""
    from gputopo.apply.journal import Begin, Journal, list_journals

    # the hung unbind must outlast the second apply, however slow this machine is
    kernel, first = applysim.held_apply(host, stderr=subprocess.STDOUT)
    try:

        def rebind_begun() -> bool:
            journals = list_journals(host.paths.root)
            return bool(journals) and any(
                isinstance(r, Begin) and r.action.kind == "rebind" for r in Journal.load(journals[-1]).records
            )

        deadline = time.monotonic() + 120  # a bound on a broken test, not a measured window
        while not rebind_begun() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, first.stdout.read()
        second = subprocess.run(first.args, capture_output=True, text=True, timeout=120)
        assert second.returncode == 4, second.stderr
        assert f"pid {first.pid} " in second.stderr and "another apply holds" in second.stderr
    finally:
        kernel.release()
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out


# --- the plan's phases, progress, secrets, backends --------------------------------------------

PREPARE_KINDS = {
    "write_host_file",
    "remove_host_file",
    "set_mapping",
    "delete_mapping",
    "write_service_dropin",
}
WINDOW_KINDS = {"stop_service", "stop_guest", "rebind", "update_container", "start_guest", "start_service"}


@pytest.mark.slow
def test_nothing_that_could_run_before_the_stop_runs_in_the_stop_window(host):
    from gputopo.apply.journal import Journal

    spec = applysim.seed_spec(host)
    out = io.StringIO()
    res = apply(spec, host.ports(), root=str(host.paths.root), progress=PlainProgress(out))
    actions = res.plan.actions
    phases = [a.phase for a in actions]
    first_stop = phases.index("stop")
    # the plan: every step that needs no stop comes before the first stop, and the window holds
    # only what needs the guests down
    assert {a.kind for a in actions[:first_stop]} <= PREPARE_KINDS
    assert {a.kind for a in actions[first_stop:]} <= WINDOW_KINDS
    assert {a.kind for a in actions[:first_stop]} >= {
        "write_host_file",
        "set_mapping",
        "write_service_dropin",
    }
    assert phases == sorted(phases, key=["prepare", "stop", "switch", "config", "start"].index)
    # the run: every prepare step was done before the first stop began (journal order)
    recs = Journal.load(res.journal).records
    order = [(r.type, r.step) for r in recs if r.type in ("begin", "done")]
    stop_began = order.index(("begin", first_stop))
    assert {("done", i) for i in range(first_stop)} <= set(order[:stop_began])
    # plain progress: one line per begin and end, numbered against the plan
    lines = out.getvalue().splitlines()
    total = len(actions)
    assert f"[ 1/{total}] prepare {actions[0].describe()} ..." in lines
    assert any(ln.startswith(f"[{total}/{total}] start ") and ": done (" in ln for ln in lines)
    assert lines[-1].startswith("applied in ") and "stop window" in lines[-1]


@pytest.mark.slow
def test_cli_progress_is_plain_lines_off_a_terminal_and_rich_on_one(host, monkeypatch):
    from click.testing import CliRunner

    from gputopo.apply import PlainProgress as Plain
    from gputopo.cli import applycmd, cli

    host.stop()
    spec_file = host.dir / "spec.yaml"
    spec_file.write_text(applysim.seed_spec_text(host))
    res = CliRunner().invoke(
        cli, ["apply", "--spec", str(spec_file), "--sim", str(host.dir), "--yes", "--no-verify"]
    )
    assert res.exit_code == 0, res.output
    assert re.search(
        r"^\[ 1/\d+\] prepare write host file /etc/udev/rules.d/\S+ \(\d+ lines\): done \(", res.output, re.M
    ), res.output
    assert "\x1b[" not in res.output  # no terminal escapes in a log
    assert isinstance(applycmd._progress(), Plain)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    rich = applycmd._progress()
    assert not isinstance(rich, Plain) and type(rich).__name__ == "_RichProgress"


@pytest.mark.slow
def test_secrets_never_reach_output_journal_or_errors(host):
    """The password comes in through the environment only; an apply that fails at its last step
    (so every kind of message is printed: steps, failure, rollback) never shows it."""
    from gputopo.errors import ApplyFailed
    from gputopo.sim.container import break_container
    from gputopo.usecases.connect import Connection, build_ports

    sim_ports = host.ports()
    password = host.credentials()["password"]
    assert len(password) >= 8
    conn = Connection(api_url=host.url, node=host.node, ca_bundle=str(host.api.ca_cert_path))
    ports = build_ports(conn, env={"GPUTOPO_PVE_PASSWORD": password})
    ports.sysfs, ports.exec, ports.files = sim_ports.sysfs, sim_ports.exec, sim_ports.files
    assert password not in repr(ports.proxmox) and password not in str(vars(ports.proxmox))
    break_container(host.dir, 101, "service_fails", message="RuntimeError: CUDA error", tp=4)
    out = io.StringIO()
    with pytest.raises(ApplyFailed) as e:
        apply(
            applysim.seed_spec(host),
            ports,
            root=str(host.paths.root),
            progress=PlainProgress(out),
            timeouts=Timeouts(sysfs=5, guest=30, exec=10, service=20, poll=0.02),
        )
    assert e.value.rolled_back
    text = out.getvalue()
    assert "rolling back" in text and "undo" in text
    assert password not in text and password not in str(e.value)
    journals = (
        list((host.paths.root / "var/lib/gputopo").rglob("*"))
        if (host.paths.root / "var/lib/gputopo").exists()
        else []
    )
    from gputopo.apply.journal import list_journals

    files = list_journals(host.paths.root) + [p for p in journals if p.is_file()]
    assert files
    for p in files:
        assert password.encode() not in p.read_bytes(), p
    # no secret option on the command line: only the environment or an owner-only file
    from gputopo.cli.applycmd import apply as apply_cmd

    names = {o for p in apply_cmd.params for o in p.opts}
    assert not names & {"--password", "--token-secret", "--token-value", "--secret"}


def test_the_library_refuses_an_api_whose_node_is_not_this_host(host, tmp_path):
    """apply() and recover() called as a library, not only the CLI: sysfs and the containers are
    this host's, so an API acting on another node is refused before anything is read or changed."""
    from gputopo.adapters.credentials import ApiConfig
    from gputopo.adapters.proxmox import ProxmoxClient
    from gputopo.apply import recover
    from gputopo.apply.journal import list_journals
    from gputopo.errors import PreflightError
    from gputopo.sim.pveapi import PveApiServer

    own = host.ports()
    root = str(host.paths.root)
    before = applysim.fingerprint(host)
    other = PveApiServer(
        tmp_path / "o" / "pve", tmp_path / "o" / "run", host.paths.root, node="pve2", auth_fail_delay=0.0
    ).start()
    try:

        def client(port: int, ca: Path, node: str, password: str):
            cfg = ApiConfig(
                backend="https",
                host="127.0.0.1",
                port=port,
                node=node,
                user="root@pam",
                verify_ssl=True,
                ca_bundle=str(ca),
                timeout=30.0,
            )
            return ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": password})

        cases = {  # another node's API, and this host's API told to act on another node
            "pve2's API": client(other.port, other.ca_cert_path, "pve2", other.root_password),
            "pve1's API, node pve2": client(
                host.api.port, host.api.ca_cert_path, "pve2", host.credentials()["password"]
            ),
        }
        for name, px in cases.items():
            ports = dataclasses.replace(own, proxmox=px)
            with pytest.raises(PreflightError) as e:
                apply(applysim.seed_spec(host), ports, root=root)
            assert str(e.value).startswith(f"the Proxmox API via {px.address} serves node(s) "), name
            assert "would act on node pve2, but this host is pve1" in str(e.value), name
            assert str(e.value).endswith("(nothing was changed)")
            with pytest.raises(PreflightError) as e:  # compared without asking the API
                recover(ports, root=root)
            assert str(e.value).startswith(
                f"gputopo would act on node pve2 (the Proxmox API via {px.address})"
            )
            assert px.address.startswith("https://127.0.0.1:"), name
    finally:
        other.stop()
    assert applysim.fingerprint(host) == before and list_journals(root) == []
    # the host's own API, acting on this host, passes the same check
    assert apply(applysim.seed_spec(host), own, root=root, dry_run=True).status == "dry-run"


def test_apply_over_the_local_backend_with_pvesh(host):
    """The same apply with ``--local``: every Proxmox call is a ``pvesh`` command on the node."""
    from gputopo.adapters.credentials import ApiConfig
    from gputopo.adapters.proxmox import ProxmoxClient
    from gputopo.ports import Ports
    from gputopo.sim.pveapi import PveshSim

    sim_ports = host.ports()
    pvesh = PveshSim(host.api)
    client = ProxmoxClient.from_config(ApiConfig(backend="local", node=host.node, timeout=30), runner=pvesh)
    ports = Ports(
        sysfs=sim_ports.sysfs, proxmox=client, exec=sim_ports.exec, files=sim_ports.files, http=sim_ports.http
    )
    spec = applysim.seed_spec(host)
    res = apply(spec, ports, root=str(host.paths.root))
    assert res.status == "applied"
    maps = {m.id: m for m in parse_pci_cfg((host.paths.pve / "mapping/pci.cfg").read_text())}
    assert sorted(e.path for e in maps["pro6000-vm"].entries()) == NUMA1
    conf = parse_lxc_conf(host.paths.lxc_conf(101).read_text())
    nv = sorted(
        parse_dev_value(v)["path"]
        for k, v in conf.options.items()
        if re.fullmatch(r"dev\d+", k)
        and k not in conf.pending_delete
        and re.fullmatch(r"/dev/nvidia\d+", parse_dev_value(v)["path"])
    )
    assert nv == sorted(f"/dev/nvidia{m}" for m in NUMA0.values())
    # the mapping went through pvesh with one --map option per entry (a list, not its str())
    writes = [c for c in pvesh.calls if c[1] in ("create", "set") and "/cluster/mapping/pci" in c[2]]
    assert writes and all(c.count("--map") == 4 or c.count("-map") == 4 for c in writes), writes
    (put,) = [c for c in pvesh.calls if c[1] == "set" and c[2].strip("/") == "nodes/pve1/lxc/101/config"]
    assert {"-digest", "--digest"} & set(put), put  # the config update is guarded by its digest
    assert apply(spec, ports, root=str(host.paths.root)).status == "no-changes"


# --- the reverse split: GPUs come back from vfio-pci to the container ----------------------------

REVERSE = ("numa: [0]", "numa: [0, 1]"), ("numa: [1]", "rest")


def _reverse_spec_text(host) -> str:
    text = applysim.seed_spec_text(host)
    for old, new in REVERSE:
        assert old in text
        text = text.replace(old, new)
    return text


@pytest.mark.slow
def test_reverse_split_gives_every_gpu_back_with_tp_8_and_verifies(host):
    from gputopo.actions import UpdateContainer
    from gputopo.plan.spec import parse_spec
    from gputopo.usecases.verify import verify

    ports = host.ports()
    root = str(host.paths.root)
    assert apply(applysim.seed_spec(host), ports, root=root).status == "applied"
    spec = parse_spec(_reverse_spec_text(host))
    # only devN entries resolved after the switch change: an API token is still refused up front
    with pytest.raises(PreflightFailed) as e:
        apply(spec, host.ports(auth="token"), root=root)
    assert any("only root@pam" in line for line in e.value.problems)
    res = apply(spec, ports, root=root, verify=lambda: verify(spec, ports, root=root))
    assert res.status == "applied"
    # the four minors did not exist at plan time: the config step resolved them after the switch
    (upd,) = [a for a in res.plan.actions if isinstance(a, UpdateContainer)]
    assert upd.resolve == NUMA1 and upd.set == {} and upd.delete == []
    kinds = [a.kind for a in res.plan.actions]
    assert kinds.index("update_container") > max(i for i, k in enumerate(kinds) if k == "rebind")
    assert "stop_guest" in kinds and "start_guest" in kinds  # the container restarts to see them

    minors = {}
    for a in NUMA0.keys() | set(NUMA1):
        dev = host.paths.root / "sys/bus/pci/devices" / a
        assert os.path.basename(os.readlink(dev / "driver")) == "nvidia", a
        assert (dev / "driver_override").read_text().strip() in ("", "(null)")
        info = (host.paths.root / "proc/driver/nvidia/gpus" / a / "information").read_text()
        minors[a] = int(re.search(r"Device Minor:\s*(\d+)", info).group(1))
    conf = parse_lxc_conf(host.paths.lxc_conf(101).read_text())
    nv = sorted(
        parse_dev_value(v)["path"]
        for k, v in conf.options.items()
        if re.fullmatch(r"dev\d+", k) and re.fullmatch(r"/dev/nvidia\d+", parse_dev_value(v)["path"])
    )
    assert nv == sorted(f"/dev/nvidia{m}" for m in minors.values())
    assert sorted(minors.values()) == list(range(8))
    assert not list((host.paths.root / "dev/vfio").glob("[0-9]*"))
    maps = {m.id for m in parse_pci_cfg((host.paths.pve / "mapping/pci.cfg").read_text())}
    assert "pro6000-vm" not in maps
    dropin = host.paths.rootfs(101) / "etc/systemd/system/sglang.service.d/gputopo.conf"
    assert "--tp 8" in dropin.read_text()

    report = res.verify
    statuses = {c.name: c.status for c in report.checks}
    # pro6000, the container's mapping from before that the spec does not manage, lists its GPUs
    # and no VM uses it: a warning (a VM using it could be given a container GPU)
    assert statuses.pop("vm") == "WARN", report.to_text()
    assert report.check("vm").summary.startswith(
        "mapping pro6000 lists container GPU(s) 0000:01:00.0 (CT 101)"
    )
    assert report.ok and set(statuses.values()) == {"PASS"}, report.to_text()
    assert report.check("container").details["101"]["seen"] == sorted(minors)
    assert report.check("service").details["101"]["tp"] == 8
    assert apply(spec, ports, root=root).status == "no-changes"


@pytest.mark.slow
def test_a_vfio_dynamic_id_left_by_a_vm_start_cannot_take_the_gpus_back(host):
    """Proxmox writes the GPU's 'vendor device' to vfio-pci/new_id at a VM start whose device is
    not on vfio-pci yet (pve-common SysFSTools.pm pci_dev_bind_to_vfio); the id stays. A reverse
    split then binds every GPU back by name (driver_override=nvidia): probing alone would let
    vfio-pci's dynamic id win, as the simulated kernel lets it."""
    from gputopo.adapters.sysfs import Binder
    from gputopo.errors import BindError
    from gputopo.plan.spec import parse_spec
    from gputopo.sim.kernel import SimKernel

    ports = host.ports()
    root = str(host.paths.root)
    assert apply(applysim.seed_spec(host), ports, root=root).status == "applied"
    kernel = SimKernel(root)
    kernel.write("sys/bus/pci/drivers/vfio-pci/new_id", "10de 2bb5")
    # what probing alone does now: the dynamic id wins, the GPU is not the container's again
    probe_only = Binder(kernel, root, 5.0)
    with pytest.raises(BindError) as e:
        probe_only.move_group([NUMA1[0]], None, False)
    assert e.value.got == "vfio-pci" and "remove_id" in str(e.value)
    probe_only.move_group([NUMA1[0]], "vfio-pci", True)  # back where the split left it

    res = apply(parse_spec(_reverse_spec_text(host)), ports, root=root)
    assert res.status == "applied"
    for a in NUMA0.keys() | set(NUMA1):
        dev = host.paths.root / "sys/bus/pci/devices" / a
        assert os.path.basename(os.readlink(dev / "driver")) == "nvidia", a
        assert (dev / "driver_override").read_text().strip() in ("", "(null)"), a


@pytest.mark.slow
def test_reverse_split_failing_at_the_start_rolls_back_the_resolved_entries(host):
    from gputopo.errors import ApplyFailed
    from gputopo.plan.spec import parse_spec
    from gputopo.sim.container import break_container

    ports = host.ports()
    root = str(host.paths.root)
    assert apply(applysim.seed_spec(host), ports, root=root).status == "applied"
    # the split left CT 101 running with its removals pending; they apply at its next start, which
    # a rollback of the reverse split (a restart on PVE 8) does too: start from that state
    ports.proxmox.guest_action("lxc", 101, "shutdown", 30)
    ports.proxmox.guest_action("lxc", 101, "start", 30)
    before = applysim.fingerprint(host)
    break_container(host.dir, 101, "service_fails", message="RuntimeError: CUDA error", tp=8)
    with pytest.raises(ApplyFailed) as e:
        apply(
            parse_spec(_reverse_spec_text(host)),
            ports,
            root=root,
            timeouts=Timeouts(sysfs=5, guest=30, exec=10, service=20, poll=0.02),
        )
    assert e.value.rolled_back and "start sglang.service" in str(e.value)
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_resolve_devices_fills_free_indices_and_needs_every_minor():
    from gputopo.actions import UpdateContainer
    from gputopo.formats.devn import resolve_devices

    cfg = {
        "dev0": "/dev/nvidia0,mode=0666",
        "dev1": "/dev/nvidiactl,mode=0666",
        "dev3": "/dev/nvidia9,mode=0666",
        "digest": "x",
    }
    upd = UpdateContainer(
        vmid=101,
        set={"dev2": "/dev/nvidia1,mode=0666"},
        delete=["dev3"],
        resolve=["0000:81:00.0", "0000:91:00.0"],
        dev_mode="0666",
    )

    def resolve(minors):
        return resolve_devices(cfg, upd.set, upd.delete, upd.resolve, upd.dev_gid, upd.dev_mode, minors)

    got = resolve({"0000:81:00.0": 4, "0000:91:00.0": 0})
    # minor 0 is already mapped; minor 4 takes dev3, freed by the delete
    assert got == {"dev3": "/dev/nvidia4,mode=0666"}
    with pytest.raises(KeyError, match="0000:91:00.0"):
        resolve({"0000:81:00.0": 4, "0000:91:00.0": None})


# --- apply ends with verify ----------------------------------------------------------------------


@pytest.mark.slow
def test_cli_apply_ends_with_verify_and_rolls_back_on_its_failure(host):
    from click.testing import CliRunner

    from gputopo.apply.journal import Journal, list_journals
    from gputopo.cli import cli
    from gputopo.errors import VerifyFailed
    from gputopo.sim.container import break_container

    spec_file = host.dir / "spec.yaml"
    spec_file.write_text(applysim.seed_spec_text(host))
    before = applysim.fingerprint(host)
    break_container(host.dir, 101, "wrong_answer", answer="92")
    args = ["apply", "--spec", str(spec_file), "--sim", str(host.dir), "--yes"]
    res = CliRunner().invoke(cli, args + ["--rollback-on-verify-failure"])
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, VerifyFailed)
    assert str(res.exception) == "verification failed after apply; the host was rolled back"
    assert re.search(r"inference\s+.*FAIL.*wrong answer", res.output), res.output
    assert "verification failed; rolling back" in res.output
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    end = Journal.load(list_journals(host.paths.root)[-1]).records[-1]
    assert end.result == "rolled-back" and end.reason == "verify"

    # without the flag the split stays and the exit code still says verification failed
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1 and "applied, but verification failed" in str(res.exception)
    after = applysim.fingerprint(host)
    assert after["pci:0000:81:00.0"][0] == "vfio-pci" and after["service"][0] == "active"
    from gputopo.sim.container import heal_container

    heal_container(host.dir, 101)
    res = CliRunner().invoke(cli, ["verify", "--spec", str(spec_file), "--sim", str(host.dir)])
    # the seed's old mapping pro6000 still lists the container's GPUs (the spec does not manage it)
    # the container kept running: the GPUs it gave up stay in it until its next restart (a WARN)
    assert res.exit_code == 0 and "all clear: 6 PASS, 2 WARN (vm, container)" in res.output, res.output


@pytest.mark.slow
def test_gpus_going_back_to_nvidia_need_the_nvidia_driver_loaded(host):
    """Failure mode 7, second half: nvidia must be loaded before GPUs go back to it."""
    from gputopo.plan.spec import parse_spec

    ports = host.ports()
    root = str(host.paths.root)
    assert apply(applysim.seed_spec(host), ports, root=root).status == "applied"
    drivers = host.paths.root / "sys/bus/pci/drivers"
    (drivers / "nvidia").rename(drivers / ".nvidia-unloaded")  # as if `rmmod nvidia` had run
    try:
        before = applysim.fingerprint(host)
        with pytest.raises(PreflightFailed) as e:
            apply(parse_spec(_reverse_spec_text(host)), ports, root=root)
        (line,) = [p for p in e.value.problems if "nvidia driver is not loaded" in p]
        assert "0000:81:00.0" in line and line.endswith("run: modprobe nvidia")
        assert applysim.diff(before, applysim.fingerprint(host)) == []
    finally:
        (drivers / ".nvidia-unloaded").rename(drivers / "nvidia")
