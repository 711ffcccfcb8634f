"""The pvesh adapter: command lines and pvesh's output (wire doc section 6) as literal strings,
and a real command run."""

from __future__ import annotations

import pytest

from gputopo.adapters.pvesh import Pvesh, parse_pvesh_output, pvesh_argv, run_command
from gputopo.errors import ConfigError, ProxmoxError

UPID = "UPID:pve1:0000A1B2:0001C3D4:67A0B1C2:vzstop:101:root@pam:"
MAP1 = "id=10de:2bb5,node=pve1,path=0000:81:00.0"
MAP2 = "id=10de:2bb5,node=pve1,path=0000:91:00.0"


def test_argv_repeats_array_options_and_sends_booleans_as_numbers():
    assert pvesh_argv(
        "POST", "/cluster/mapping/pci", {"id": "gpu", "map": [MAP1, MAP2], "description": None}
    ) == [
        "pvesh",
        "create",
        "/cluster/mapping/pci",
        "--id",
        "gpu",
        "--map",
        MAP1,
        "--map",
        MAP2,
        "--output-format",
        "json",
    ]
    assert pvesh_argv(
        "PUT", "/nodes/pve1/lxc/101/config", {"onboot": True, "cores": 4, "delete": "dev0"}
    ) == [
        "pvesh",
        "set",
        "/nodes/pve1/lxc/101/config",
        "--onboot",
        "1",
        "--cores",
        "4",
        "--delete",
        "dev0",
        "--output-format",
        "json",
    ]
    assert pvesh_argv("get", "/version", {})[:3] == ["pvesh", "get", "/version"]
    assert pvesh_argv("DELETE", "/cluster/mapping/pci/gpu", {})[1] == "delete"
    with pytest.raises(ConfigError):
        pvesh_argv("PATCH", "/version", {})


def test_results():
    # print_api_result: canonical JSON and a newline; nothing at all for a null result
    assert parse_pvesh_output("GET /version", '{"release":"8.4","version":"8.4.1"}\n', "", 0) == {
        "release": "8.4",
        "version": "8.4.1",
    }
    assert parse_pvesh_output("GET /nodes/pve1/lxc", "[]\n", "", 0) == []
    assert parse_pvesh_output("PUT /nodes/pve1/lxc/101/config", "", "", 0) is None
    # a task's worker output streams to stdout before the UPID line
    assert parse_pvesh_output("POST x", f'stopping CT 101\nCT 101 stopped\n"{UPID}"\n', "", 0) == UPID
    # a failed task prints on stderr and pvesh still exits 0: the task's status tells
    assert parse_pvesh_output("POST x", f'"{UPID}"\n', "stop failed: busy\n", 0) == UPID


@pytest.mark.parametrize(
    "stderr, rc, status, message, errors",
    [
        # PVE::Exception: "<code> <msg>", one line per parameter, then the usage line
        (
            "400 Parameter verification failed.\nmemory: type check ('integer') failed - got 'lots'\n"
            "pvesh set <api_path> [OPTIONS] [FORMAT_OPTIONS]\n",
            255,
            400,
            "Parameter verification failed.",
            {"memory": "type check ('integer') failed - got 'lots'"},
        ),
        # a plain die
        ("CT 101 already running\n", 255, 500, "CT 101 already running", {}),
        ("No 'get' handler defined for '/foo'\n", 1, 500, "No 'get' handler defined for '/foo'", {}),
        ("Unknown option: bogus\n400 unable to parse option\n", 255, 500, "Unknown option: bogus", {}),
        # a failure that printed nothing
        ("", 2, 500, "pvesh exited 2", {}),
    ],
)
def test_failures(stderr, rc, status, message, errors):
    with pytest.raises(ProxmoxError) as ei:
        parse_pvesh_output("PUT /nodes/pve1/lxc/101/config", '{"x":1}\n' if rc == 0 else "", stderr, rc)
    e = ei.value
    assert (e.call, e.status, e.pve_message, e.errors) == (
        "PUT /nodes/pve1/lxc/101/config",
        status,
        message,
        errors,
    )
    assert "\n" not in str(e)


@pytest.mark.parametrize(
    "stderr",
    [
        # pve-cluster Cluster.pm cfs_lock, while another holder has the lock
        "trying to acquire cfs lock 'file-mapping_pci_cfg' ...\ntrying to acquire cfs lock 'file-mapping_pci_cfg' ...\n",
        # pve-common Tools.pm lock_file_full
        "trying to acquire lock...\n OK\n",
        # pve-common RESTEnvironment.pm warn, and a Perl warn
        "WARN: something to know\n",
        "cannot delete 'dev7' - not set in current configuration!\n",
    ],
)
def test_noise_on_stderr_with_exit_code_0_is_success(stderr):
    assert parse_pvesh_output("GET /version", '{"version":"8.4.1"}\n', stderr, 0) == {"version": "8.4.1"}
    assert parse_pvesh_output("PUT /nodes/pve1/lxc/101/config", "", stderr, 0) is None


def test_output_that_is_not_json():
    with pytest.raises(ProxmoxError) as ei:
        parse_pvesh_output("GET /version", "Version: 8.4.1\n", "", 0)
    assert ei.value.status == 500 and "Version: 8.4.1" in str(ei.value)


def test_pvesh_through_a_runner():
    seen = []

    def runner(argv, timeout):
        seen.append((argv, timeout))
        return '{"status":"running"}\n', "", 0

    assert Pvesh(runner, timeout=7).call("GET", "/nodes/pve1/lxc/101/status/current") == {"status": "running"}
    assert seen == [(["pvesh", "get", "/nodes/pve1/lxc/101/status/current", "--output-format", "json"], 7)]


def test_run_command_for_real(tmp_path):
    assert run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], 5) == ("out\n", "err\n", 3)
    with pytest.raises(ConfigError, match="not found"):
        run_command([str(tmp_path / "pvesh"), "get", "/version"], 5)
    with pytest.raises(ProxmoxError) as ei:
        run_command(["sleep", "5"], 0.2)
    assert str(ei.value) == "sleep 5: timed out after 0.2 s"
