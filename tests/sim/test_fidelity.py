"""The simulators must not be kinder than the real systems they stand in for.

Each test cites the statement it checks: quoted from a reference of the Proxmox VE API's wire
behaviour (``wire N``: its section N, 0 the request pipeline, 2 error responses, 4 shapes, 6 pvesh
and proxmoxer's local backend), or the kernel/Proxmox source named in the test.
"""

import errno
import json

import pytest
import requests

from gputopo.errors import ExecError, SysfsWriteError
from gputopo.sim import state
from gputopo.sim.container import SimExec, write_unit
from gputopo.sim.hostroot import materialize
from gputopo.sim.kernel import SimKernel
from gputopo.sim.pveapi import PveApiServer, PveshSim
from helpers.simapi import seed_root  # noqa: F401 (fixtures)

CT = (
    "arch: amd64\nhostname: llm\nmemory: 4096\ndev0: /dev/nvidia0,gid=44,mode=0666\n"
    "\n[before-split]\narch: amd64\nhostname: llm-old\nmemory: 1024\n"
)


@pytest.fixture
def srv(tmp_path, seed_root):
    s = PveApiServer(tmp_path / "pve", tmp_path / "run", seed_root, tls=False, auth_fail_delay=0.0)
    s.write_conf("lxc", 101, CT)
    s.start()
    yield s
    s.stop()


def _token(s: PveApiServer) -> dict:
    return {"Authorization": f"PVEAPIToken={s.root_token_id}={s.root_token_secret}"}


# --- Proxmox API: parameters ---------------------------------------------------------------


def test_json_body_repeating_the_uri_vmid_is_not_a_conflict(srv):
    # wire 0: "JSON bodies accepted"; the duplicate check compares the values Perl sees, and
    # JSON 101 and the URI's "101" are the same value
    r = requests.put(
        f"{srv.url}/nodes/pve1/lxc/101/config", json={"vmid": 101, "memory": 2048}, headers=_token(srv)
    )
    assert r.status_code == 200, r.text
    r = requests.put(
        f"{srv.url}/nodes/pve1/lxc/101/config", json={"vmid": 102, "memory": 2048}, headers=_token(srv)
    )
    assert r.status_code == 400
    assert r.json()["errors"] == {
        "vmid": "duplicate parameter (already defined in URI) with conflicting values!"
    }


def test_json_body_that_is_not_an_object_gets_an_answer(srv):
    # a malformed body must be answered (the real daemon answers every request), not dropped
    r = requests.put(
        f"{srv.url}/nodes/pve1/lxc/101/config",
        data="[1, 2]",
        headers={**_token(srv), "Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert r.reason and "\n" not in r.reason


def test_map_array_errors_are_keyed_per_item(srv):
    # wire 2: "for array items the key is map[0] and so on"
    good = "id=10de:2bb5,iommugroup=40,node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"
    r = requests.post(
        f"{srv.url}/cluster/mapping/pci",
        data={"id": "gpu", "map": [good, "node=pve1,path=zz"]},
        headers=_token(srv),
    )
    assert r.status_code == 400
    errors = r.json()["errors"]
    assert set(errors) == {"map[1]"}
    assert errors["map[1]"].startswith("invalid format - format error\nmap[1].")


# --- Proxmox API: GET config with snapshot ---------------------------------------------------


def test_get_config_of_a_snapshot_returns_that_snapshot(srv):
    # wire 4: "snapshot=<name> returns that snapshot's config plus the main digest"
    h = _token(srv)
    main = requests.get(f"{srv.url}/nodes/pve1/lxc/101/config", headers=h).json()["data"]
    snap = requests.get(
        f"{srv.url}/nodes/pve1/lxc/101/config", params={"snapshot": "before-split"}, headers=h
    ).json()["data"]
    assert snap["hostname"] == "llm-old" and snap["memory"] == 1024 and "dev0" not in snap
    assert snap["digest"] == main["digest"]


def test_get_config_of_a_missing_snapshot_fails(srv):
    # pve-guest-common AbstractConfig.pm:load_snapshot_config: die "snapshot '$snapname' does not exist\n"
    r = requests.get(f"{srv.url}/nodes/pve1/lxc/101/config", params={"snapshot": "nope"}, headers=_token(srv))
    assert r.status_code == 500
    assert r.reason == "snapshot 'nope' does not exist"


# --- Proxmox API: tasks ------------------------------------------------------------------------


def test_token_task_upid_names_the_token_and_status_splits_it(srv):
    # pve-manager API2/Tasks.pm $convert_token_task: the UPID's user is "user@realm!tokenid",
    # the status answer splits it into user and tokenid
    h = _token(srv)
    upid = requests.post(f"{srv.url}/nodes/pve1/lxc/101/status/start", headers=h).json()["data"]
    assert upid.endswith(":root@pam!gputopo:") and len(upid.split(":")) == 9
    st = requests.get(f"{srv.url}/nodes/pve1/tasks/{upid}/status", headers=h).json()["data"]
    assert (st["user"], st["tokenid"]) == ("root@pam", "gputopo")


# --- pvesh (local backend) ---------------------------------------------------------------------


def test_pvesh_takes_boolean_words_only_for_boolean_parameters(srv):
    # wire 6: "Booleans accept 1|0|yes|no|on|off|true|false" (JS:parse_boolean, boolean
    # parameters only); a string parameter keeps the word
    pvesh = PveshSim(srv)
    out, err, rc = pvesh(
        ["pvesh", "set", "/nodes/pve1/lxc/101/config", "--description", "yes", "--onboot", "yes"], 5
    )
    assert (rc, err) == (0, "")
    out, err, rc = pvesh(["pvesh", "get", "/nodes/pve1/lxc/101/config", "--output-format", "json"], 5)
    cfg = json.loads(out)
    assert cfg["description"].strip() == "yes"
    assert cfg["onboot"] == 1


def test_pvesh_unknown_option(srv):
    # wire 6: "An unknown option prints `Unknown option: x` and then `400 unable to parse option`"
    out, err, rc = PveshSim(srv)(["pvesh", "set", "/nodes/pve1/lxc/101/config", "--foo", "1"], 5)
    assert (out, rc) == ("", 255)
    assert err == "Unknown option: foo\n400 unable to parse option\n"


# --- kernel: the remove attribute ---------------------------------------------------------------


@pytest.fixture
def kern(tmp_path):
    root = materialize("seed", tmp_path / "root")
    return root, SimKernel(root)


def test_remove_zero_keeps_the_device(kern):
    # drivers/pci/pci-sysfs.c remove_store: kstrtoul(buf, 0, &val); only a non-zero val removes
    root, k = kern
    addr = "0000:81:00.0"
    k.write(f"sys/bus/pci/devices/{addr}/remove", "0\n")
    assert (root / "sys/bus/pci/devices" / addr).exists()


@pytest.mark.parametrize("value", ["yes", " 1", "1x"])
def test_remove_with_a_non_number_is_einval(kern, value):
    root, k = kern
    addr = "0000:81:00.0"
    with pytest.raises(SysfsWriteError) as e:
        k.write(f"sys/bus/pci/devices/{addr}/remove", value)
    assert e.value.errno == errno.EINVAL
    assert (root / "sys/bus/pci/devices" / addr).exists()


# --- container: pct push ------------------------------------------------------------------------


@pytest.fixture
def ct(tmp_path):
    conf = tmp_path / "pve/nodes/pve1/lxc/101.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("arch: amd64\nhostname: llm\n")
    (tmp_path / "root").mkdir()
    state.write_state(tmp_path / "run", "host", {"node": "pve1"})
    write_unit(tmp_path, 101, "sglang.service", "[Service]\nExecStart=/bin/true\n")
    sx = SimExec(tmp_path)
    state.set_guest_status(sx.paths.run, "lxc", 101, "running")
    sx.container(101).boot()
    return sx


def test_push_into_a_missing_directory_fails_like_pct(ct):
    # pve-container PVE/CLI/pct.pm create_file: sysopen(O_CREAT) without creating parents,
    # die "failed to create file: $path: $!\n"
    path = "/etc/systemd/system/sglang.service.d/gputopo.conf"
    with pytest.raises(ExecError) as e:
        ct.push(101, path, "[Service]\n")
    assert f"failed to create file: {path}: No such file or directory" in str(e.value)
    assert not (ct.paths.rootfs(101) / path.lstrip("/")).parent.exists()


def test_mkdir_in_the_container_then_push(ct):
    d = "/etc/systemd/system/sglang.service.d"
    r = ct.run(101, ["mkdir", d + "/x"], timeout=5)
    assert r.rc == 1 and r.stderr == f"mkdir: cannot create directory '{d}/x': No such file or directory\n"
    assert ct.run(101, ["mkdir", "-p", d], timeout=5).rc == 0
    assert ct.run(101, ["mkdir", "-p", d], timeout=5).rc == 0
    r = ct.run(101, ["mkdir", d], timeout=5)
    assert r.rc == 1 and r.stderr == f"mkdir: cannot create directory '{d}': File exists\n"
    ct.push(101, d + "/gputopo.conf", "[Service]\n")
    assert ct.run(101, ["cat", d + "/gputopo.conf"], timeout=5).stdout == "[Service]\n"


def test_mkdir_without_operand(ct):
    r = ct.run(101, ["mkdir", "-p"], timeout=5)
    assert (r.rc, r.stderr) == (1, "mkdir: missing operand\nTry 'mkdir --help' for more information.\n")


# --- container: systemctl -----------------------------------------------------------------------


def test_systemctl_takes_a_unit_name_without_suffix_as_a_service(ct):
    # systemd unit_name_mangle: "sglang" means "sglang.service"
    assert ct.run(101, ["systemctl", "start", "sglang"], timeout=5).rc == 0
    r = ct.run(101, ["systemctl", "is-active", "sglang"], timeout=5)
    assert (r.rc, r.stdout) == (0, "active\n")
    r = ct.run(101, ["systemctl", "show", "sglang", "-p", "ActiveState"], timeout=5)
    assert r.stdout == "ActiveState=active\n"


def test_systemctl_restart_of_a_missing_unit_names_the_verb(ct):
    r = ct.run(101, ["systemctl", "restart", "nope"], timeout=5)
    assert (r.rc, r.stderr) == (5, "Failed to restart nope.service: Unit nope.service not found.\n")
