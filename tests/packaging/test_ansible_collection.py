"""The Ansible collection's sanity checks that run offline: ansible-core's own ``ansible-test
sanity`` for the tests that need no virtual environment of theirs, ``ansible-doc`` reading the
module, and the module's argument spec against its DOCUMENTATION and RETURN (what
``validate-modules`` compares, which needs its own virtual environment: see the collection's
README for what could not run here and how it was run).

Skips without ansible-core (pip install 'gputopo[test]'), unless GPUTOPO_REQUIRE_ANSIBLE=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO
from helpers.ansiblemod import COLLECTION, ansible_tool, doc, load_module

pytestmark = pytest.mark.slow  # ansible-core's tools start in about a second each; the full run only

# ansible-test sanity's tests that run from this Python, without a virtual environment of their
# own (those that need one download its pip bootstrap: see the collection's README)
OFFLINE_SANITY = (
    "action-plugin-docs",
    "compile",
    "empty-init",
    "ignores",
    "line-endings",
    "no-assert",
    "no-get-exception",
    "no-illegal-filenames",
    "no-smart-quotes",
    "replace-urlopen",
    "shebang",
    "symlinks",
    "use-argspec-type-path",
    "use-compat-six",
)


def test_ansible_test_sanity_runs_offline_and_passes(tmp_path):
    exe = ansible_tool("ansible-test")
    # a copy: ansible-test writes tests/output into the collection it checks
    dest = tmp_path / "ansible_collections/gputopo/proxmox"
    shutil.copytree(COLLECTION, dest, ignore=shutil.ignore_patterns("output", "__pycache__"))
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    tests = [a for t in OFFLINE_SANITY for a in ("--test", t)]
    res = subprocess.run(
        [exe, "sanity", "--local", "--python", python, *tests],
        cwd=dest,
        capture_output=True,
        text=True,
        timeout=300,
        # an empty home: nothing cached, so a test that wanted a download would fail, not pass
        env=dict(os.environ, HOME=str(tmp_path / "home"), ANSIBLE_COLLECTIONS_PATH=str(tmp_path)),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ran = [ln for ln in res.stdout.splitlines() if ln.startswith('Running sanity test "')]
    assert len(ran) == len(OFFLINE_SANITY), res.stdout


def ansible_doc() -> dict:
    res = subprocess.run(
        [ansible_tool("ansible-doc"), "--json", "gputopo.proxmox.topology"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO)),
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["gputopo.proxmox.topology"]


def test_ansible_doc_reads_the_options_the_argument_spec_declares():
    info = ansible_doc()
    options = info["doc"]["options"]
    spec = load_module().ARGUMENT_SPEC
    assert set(options) == set(spec)
    for name, arg in spec.items():
        opt = options[name]
        assert opt.get("type", "str") == arg.get("type", "str"), name
        assert opt.get("default") == arg.get("default"), name
        assert opt.get("choices") == arg.get("choices"), name
        assert opt.get("required", False) == arg.get("required", False), name
        assert sorted(opt.get("aliases", [])) == sorted(arg.get("aliases", [])), name
        # a secret is never logged nor shown; validate-modules wants every name that looks like
        # one (token, pass, secret, key) to say so either way
        if any(w in name for w in ("password", "secret")):
            assert arg.get("no_log") is True, name
        elif any(w in name for w in ("token", "pass", "key")):
            assert arg.get("no_log") is False, name
        else:
            assert "no_log" not in arg, name
    # community.proxmox's names for the API and its certificate
    assert {"api_host", "api_port", "api_user", "api_password", "api_token_id", "api_token_secret"} <= set(
        spec
    )
    assert {"validate_certs", "ca_bundle", "fingerprint"} <= set(spec) and spec["ca_bundle"]["aliases"] == [
        "ca_path"
    ]
    attributes = info["doc"]["attributes"]
    assert (attributes["check_mode"]["support"], attributes["diff_mode"]["support"]) == ("full", "full")
    assert "platforms" in attributes["platform"]
    assert info["return"].keys() == doc("RETURN").keys()


class _Module:
    def __init__(self, params):
        self.params = params


def _params(**given):
    params = {name: arg.get("default") for name, arg in load_module().ARGUMENT_SPEC.items()}
    params.update(given)
    return params


def test_the_result_holds_every_documented_return_from_the_start():
    """The module fills one result from its first command on (check mode, a failure too), so
    every RETURN value is there whatever ends the task; the runs themselves are checked in
    tests/cluster/test_ansible_module.py."""
    mod = load_module()
    result = mod.Gputopo(_Module(_params()), "gputopo", []).result
    returns = doc("RETURN")
    assert set(result) - {"changed"} == set(returns)
    for key, entry in returns.items():
        assert entry["returned"] == "always", key
        assert type(result[key]).__name__ == {"str": "str", "list": "list", "dict": "dict"}[entry["type"]], (
            key
        )


def test_every_gputopo_option_the_module_passes_is_named_as_the_module_names_it():
    """gputopo's messages name its command-line options (``pass --ca-bundle ...``); the module
    says its own option instead, for each one it passes."""
    mod = load_module()
    params = _params(
        api_host="pve1",
        api_user="root@pam",
        api_token_id="gputopo",
        ca_bundle="/etc/pve/pve-root-ca.pem",
        fingerprint="AB",
        validate_certs=False,
        api_timeout=5.0,
    )
    passed = [a for a in mod.source_args(params) if a.startswith("--")]
    assert len(passed) == 7
    for option in passed:
        said = mod.module_words(f"use {option} here", params)
        assert option not in said and said.startswith("use ") and said.endswith(" here"), said
    assert mod.module_words("set GPUTOPO_PVE_PASSWORD, or --insecure", params) == (
        "set api_password, or validate_certs=false"
    )
    # an option's name inside another word is left alone
    assert mod.module_words("--user-agent --users", params) == "--user-agent --users"
