"""The gputopo.proxmox.topology module run as Ansible runs it on a node (its file and a JSON
arguments file, real ansible-core, real gputopo): the node's API reached over real HTTPS with the
connection options community.proxmox's modules use (a CA, a pinned fingerprint, or loudly
nothing; a password or a token, handed over in gputopo's environment, never on its command line),
gputopo's words for its options replaced by the module's, the plan's warnings as task warnings,
every documented return value in every mode, and verify run on a node that needs no change.

Skips without ansible-core (pip install 'gputopo[test]'), unless GPUTOPO_REQUIRE_ANSIBLE=1.
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
import subprocess
import sys

import pytest

from gputopo.sim import state
from gputopo.sim.container import break_container
from gputopo.sim.host import SERVICE_COMMANDS
from helpers.ansiblemod import doc, recorded, recording_gputopo, require_ansible, run_module, warnings
from helpers.applysim import copy_host, seed_spec_text, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # gputopo on a simulated host under the module; the full run only

# the sim's sglang command without its tensor-parallel flag: over HTTPS this machine has no pct to
# read the service's command from the container, so the spec gives it (as tests/cli do)
COMMAND = SERVICE_COMMANDS["sglang"].removesuffix(" --tp {tp}")
TYPES = {"str": str, "list": list, "dict": dict, "bool": bool, "int": int}


@pytest.fixture
def sim(template, tmp_path):
    require_ansible()
    h = copy_host(template, tmp_path / "sim")
    state.write_state(h.paths.run, "latencies", {"auth.fail": 0.0})
    yield h
    h.stop()


@pytest.fixture
def served(sim):
    """The simulated host with its API served over HTTPS on loopback."""
    sim.start()
    return sim


def spec_file(sim, command: bool = False):
    path = sim.dir / "spec.yaml"
    text = seed_spec_text(sim)
    if command:
        unit = "          unit: sglang.service\n"
        text = text.replace(unit, f'{unit}          command: "{COMMAND}"\n')
    path.write_text(text)
    return path


def served_fingerprint(port: int) -> str:
    der = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port)))
    h = hashlib.sha256(der).hexdigest().upper()
    return ":".join(h[i : i + 2] for i in range(0, 64, 2))


def api_args(served, tmp_path, log, **more):
    return {
        "spec": str(spec_file(served, command=True)),
        "api_host": "127.0.0.1",
        "api_port": served.api.port,
        "executable": str(recording_gputopo(tmp_path, log, root=served.paths.root)),
        **more,
    }


# --- the node's API over HTTPS --------------------------------------------------------------


def test_an_untrusted_certificate_names_the_modules_options(served, tmp_path):
    log = tmp_path / "runs.jsonl"
    password = served.credentials()["password"]
    got, printed = run_module(tmp_path, api_args(served, tmp_path, log, api_password=password), check=True)
    assert got["failed"] is True and got["rc"] == 2
    assert "\n" not in got["msg"]
    # gputopo's hint, in the words of the task: its options, not the command line's
    assert got["msg"].endswith(
        "pass ca_bundle /etc/pve/pve-root-ca.pem (copied from the node) or validate_certs=false"
    ), got["msg"]
    assert "--ca-bundle" not in got["msg"] and "--insecure" not in got["msg"]
    # the password reached gputopo in its environment only, and the task shows it nowhere
    (run,) = recorded(log)
    assert run["env"]["GPUTOPO_PVE_PASSWORD"] == password
    assert password not in " ".join(run["argv"]) and password not in printed
    assert run["argv"][1:3] == ["plan", "--json"]
    assert run["argv"][run["argv"].index("--api-url") + 1] == f"https://127.0.0.1:{served.api.port}"


@pytest.mark.parametrize("how", ["ca_bundle", "ca_path", "fingerprint", "token"])
def test_a_trusted_certificate_and_a_login_plan_the_node(served, tmp_path, how):
    log = tmp_path / "runs.jsonl"
    creds = served.credentials()
    trust = {
        "ca_bundle": {"ca_bundle": str(served.api.ca_cert_path)},
        "ca_path": {"ca_path": str(served.api.ca_cert_path)},  # community.proxmox's name for it
        "fingerprint": {"fingerprint": served_fingerprint(served.api.port).lower()},
        "token": {"ca_bundle": str(served.api.ca_cert_path)},
    }[how]
    login = (
        {"api_token_id": creds["token_id"], "api_token_secret": creds["token_value"]}
        if how == "token"
        else {"api_user": "root@pam", "api_password": creds["password"]}
    )
    got, printed = run_module(tmp_path, api_args(served, tmp_path, log, **trust, **login), check=True)
    assert not got.get("failed"), got.get("msg")
    assert (got["changed"], got["status"], got["node"]) == (True, "check", "pve1")
    assert re.fullmatch(r"[0-9a-f]{16}", got["signature"])
    secret = login.get("api_password") or login["api_token_secret"]
    (run,) = recorded(log)
    assert secret not in " ".join(run["argv"]) and secret not in printed
    if how == "token":
        assert run["env"]["GPUTOPO_PVE_TOKEN_SECRET"] == secret
        assert run["argv"][run["argv"].index("--token-name") + 1] == creds["token_id"]
    else:
        assert run["env"]["GPUTOPO_PVE_PASSWORD"] == secret
    option = "--fingerprint" if how == "fingerprint" else "--ca-bundle"
    assert option in run["argv"] and "--insecure" not in run["argv"]


def test_a_pinned_fingerprint_refuses_another_certificate(served, tmp_path):
    log = tmp_path / "runs.jsonl"
    wrong = ":".join(["AB"] * 32)
    args = api_args(served, tmp_path, log, fingerprint=wrong, api_password=served.credentials()["password"])
    got, _ = run_module(tmp_path, args, check=True)
    assert got["failed"] is True and got["rc"] == 2
    assert got["msg"].endswith(
        f"the certificate's SHA-256 fingerprint is {served_fingerprint(served.api.port)}, not the pinned {wrong}"
    ), got["msg"]
    bad, _ = run_module(tmp_path, {**args, "fingerprint": "AB:CD"}, check=True)
    assert bad["failed"] is True
    assert bad["msg"].startswith("fingerprint AB:CD: a SHA-256 fingerprint is 32 hex pairs"), bad["msg"]


def test_validate_certs_false_checks_nothing_and_warns(served, tmp_path):
    log = tmp_path / "runs.jsonl"
    args = api_args(
        served, tmp_path, log, validate_certs=False, api_password=served.credentials()["password"]
    )
    got, _ = run_module(tmp_path, args, check=True)
    assert not got.get("failed"), got.get("msg")
    assert got["changed"] is True
    assert (
        "validate_certs=false: the API's TLS certificate is not checked, anyone on the way can read the "
        "credentials; pin it with fingerprint instead"
    ) in warnings(got)
    # a pin or a CA with validate_certs=false: two answers to one question, refused by gputopo
    pinned, _ = run_module(tmp_path, {**args, "fingerprint": served_fingerprint(served.api.port)}, check=True)
    assert pinned["failed"] is True and pinned["rc"] == 2
    assert pinned["msg"].startswith("fingerprint and validate_certs=false exclude each other"), pinned["msg"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"api_user": "root@pam"}, "api_user applies to api_host or api_url only"),
        ({"fingerprint": "AB:" * 31 + "AB"}, "fingerprint applies to api_host or api_url only"),
        ({"validate_certs": False}, "validate_certs=false applies to api_host or api_url only"),
        ({"api_password": "hunter22"}, "api_password applies to api_host or api_url only"),
        ({"api_host": "pve1"}, "sim excludes api_host and api_url (the simulated node serves its own API)"),
        ({"api_port": 8006}, "api_port applies to api_host only (api_url names its port)"),
        ({"api_timeout": 5}, "api_timeout applies to api_host, api_url or pvesh on the node, not to sim"),
    ],
)
def test_an_option_the_source_would_ignore_is_refused_before_gputopo_runs(sim, tmp_path, args, message):
    log = tmp_path / "runs.jsonl"
    base = {
        "spec": str(spec_file(sim)),
        "sim": str(sim.dir),
        "executable": str(recording_gputopo(tmp_path, log)),
    }
    got, printed = run_module(tmp_path, {**base, **args}, check=True)
    assert got["failed"] is True and got["msg"] == message
    assert recorded(log) == []  # gputopo never ran
    assert "hunter22" not in printed


def test_a_token_and_a_password_exclude_each_other(tmp_path):
    log = tmp_path / "runs.jsonl"
    args = {
        "spec_content": "apiVersion: gputopo/v1\n",
        "api_url": "https://pve1:8006",
        "api_password": "pw-secret-1",
        "api_token_id": "gputopo",
        "api_token_secret": "tok-secret-2",
        "executable": str(recording_gputopo(tmp_path, log)),
    }
    got, printed = run_module(tmp_path, args, check=True)
    assert got["msg"] == "api_password and api_token_id/api_token_secret exclude each other: log in one way"
    assert recorded(log) == [] and "pw-secret-1" not in printed and "tok-secret-2" not in printed
    del args["api_password"], args["api_token_id"]
    got, _ = run_module(tmp_path, args, check=True)
    assert got["msg"] == "api_token_secret needs api_token_id (the token it is the secret of)"


# --- warnings, returns, verify ------------------------------------------------------------


def plan_warnings(sim, spec) -> list[str]:
    res = subprocess.run(
        [sys.executable, "-m", "gputopo", "plan", "--json", "--sim", str(sim.dir), "--spec", str(spec)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["warnings"]


def assert_documented_returns(got: dict) -> None:
    """Every RETURN value is in ``got``, not null, of its documented type."""
    for key, entry in doc("RETURN").items():
        assert entry["returned"] == "always", key
        assert key in got and got[key] is not None, (key, got.get(key))
        assert isinstance(got[key], TYPES[entry["type"]]), (key, got[key])


def test_every_return_in_every_mode_the_plans_warnings_and_verify_without_changes(sim, tmp_path):
    spec = spec_file(sim)
    expected = plan_warnings(sim, spec)
    assert expected  # the seed host's container has no network adapter near its GPUs
    args = {"spec_content": spec.read_text(), "sim": str(sim.dir)}

    check, _ = run_module(tmp_path, args, check=True, diff=True)
    assert not check.get("failed"), check.get("msg")
    assert_documented_returns(check)
    assert (check["status"], check["changed"], check["steps"], check["verify"]) == ("check", True, [], {})
    assert set(expected) <= set(warnings(check))
    assert any(d["after_header"] == "etc/modprobe.d/gputopo-vfio.conf" for d in check["diff"])

    applied, _ = run_module(tmp_path, args)
    assert not applied.get("failed"), applied.get("msg")
    assert_documented_returns(applied)
    assert (applied["status"], applied["changed"], applied["signature"]) == (
        "applied",
        True,
        check["signature"],
    )
    assert applied["actions"] == check["actions"] and len(applied["steps"]) == len(check["actions"])
    assert applied["verify"]["ok"] is True
    assert set(expected) <= set(warnings(applied))

    again, _ = run_module(tmp_path, args)
    assert not again.get("failed"), again.get("msg")
    assert_documented_returns(again)
    assert (again["status"], again["changed"], again["actions"], again["steps"]) == (
        "no-changes",
        False,
        [],
        [],
    )
    assert again["verify"]["ok"] is True  # verified although nothing changed

    # the node needs no change, but its inference server answers wrong: the task fails
    break_container(sim.dir, sim.container, "wrong_answer", answer="92")
    broken, _ = run_module(tmp_path, args)
    assert broken["failed"] is True and broken["changed"] is False and broken["rc"] == 1
    assert broken["status"] == "no-changes"
    assert broken["msg"].startswith("verification failed: 1 FAIL (inference)"), broken["msg"]
    inference = {c["name"]: c for c in broken["verify"]["checks"]}["inference"]
    assert inference["status"] == "FAIL" and "92" in inference["summary"]
    # verify=false: the task only says the node needs no change
    unchecked, _ = run_module(tmp_path, {**args, "verify": False})
    assert not unchecked.get("failed") and (unchecked["changed"], unchecked["verify"]) == (False, {})


def test_a_bad_spec_content_and_a_wrong_node_are_named_as_the_task_names_them(sim, tmp_path):
    bad = "apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n  - name: pve1\n    bogus: 1\n"
    got, _ = run_module(tmp_path, {"spec_content": bad, "sim": str(sim.dir)}, check=True)
    assert got["failed"] is True and got["rc"] == 2
    assert got["msg"] == "spec_content: nodes[0].bogus: unknown key"  # not the temporary file's path
    got, _ = run_module(
        tmp_path, {"spec": str(spec_file(sim)), "sim": str(sim.dir), "node": "pve7"}, check=True
    )
    assert got["msg"] == f"node pve7: the simulated host in {sim.dir} is node pve1"


def test_a_rollback_that_left_the_service_down_is_changed_and_says_so_in_few_words(sim, tmp_path):
    """The new service does not start and the rollback cannot start the old one again: the task
    fails with gputopo's one-line error, is ``changed`` (the service stays down), its ``steps``
    name the steps left ``undo-incomplete``, and it does not carry gputopo's whole output."""
    break_container(sim.dir, sim.container, "service_fails")
    got, _ = run_module(tmp_path, {"spec": str(spec_file(sim)), "sim": str(sim.dir)})
    assert got["failed"] is True and got["rc"] == 3 and got["status"] == "error"
    assert got["msg"].startswith("apply failed at step ") and "NOT fully rolled back" in got["msg"]
    assert got["changed"] is True
    steps = {s["description"]: s for s in got["steps"]}
    assert steps["CT 101: stop sglang.service"]["status"] == "undo-incomplete"
    assert steps["CT 101: stop sglang.service"]["warnings"][0].startswith(
        "left down: sglang.service in CT 101 did not start again: "
    )
    assert got["result"]["error"] == got["msg"] and got["result"]["journal"]
    assert "stdout" not in got or len(got["stdout"]) <= 4000
    assert len(got.get("stderr", "")) <= 4000
    assert len(json.dumps(got)) < 12000, len(json.dumps(got))
