"""Reaching a real node with ``--api-url``, through the real entry point against the simulated
API on loopback: the node the API serves must be this host for apply, plan names the spec's
node, TLS is checked, pinned or (loudly) not, token ids as the web UI shows them, a wrong
secret or a spec nested too deeply is bad input (exit 2, one line)."""

from __future__ import annotations

import hashlib
import socket
import ssl
import time

import pytest

from gputopo.apply.journal import End, Header, Journal
from gputopo.sim import state
from gputopo.sim.host import SERVICE_COMMANDS
from gputopo.sim.pveapi import PveApiServer
from helpers.applysim import copy_host, fingerprint, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run

pytestmark = pytest.mark.slow  # the real entry point against the simulated API over HTTPS; the full run only


@pytest.fixture
def sim(template, tmp_path):
    h = copy_host(template, tmp_path / "sim")
    state.write_state(h.paths.run, "latencies", {"auth.fail": 0.0})
    h.start()
    yield h
    h.stop()


# the sim's sglang command without its tensor-parallel flag (the drop-in adds it)
COMMAND = SERVICE_COMMANDS["sglang"].removesuffix(" --tp {tp}")


@pytest.fixture
def spec(sim):
    """The seed spec with ``service.command``: over --api-url this machine cannot read the
    service's command from the container (no pct here), so the spec gives it."""
    p = sim.dir / "s.yaml"
    unit = "          unit: sglang.service\n"
    text = seed_spec_text(sim)
    assert unit in text
    p.write_text(text.replace(unit, f'{unit}          command: "{COMMAND}"\n'))
    return p


@pytest.fixture
def env(monkeypatch, sim):
    for var in ("GPUTOPO_PVE_URL", "GPUTOPO_PVE_TOKEN", "GPUTOPO_PVE_TOKEN_SECRET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GPUTOPO_PVE_PASSWORD", sim.credentials()["password"])
    # the machine running the tests is not the node: only the host root names it
    monkeypatch.setattr(socket, "gethostname", lambda: "workstation")
    return monkeypatch


def _api(sim) -> list[str]:
    return ["--api-url", f"https://127.0.0.1:{sim.api.port}", "--root", str(sim.paths.root)]


def _served_fingerprint(port: int) -> str:
    der = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port)))
    h = hashlib.sha256(der).hexdigest().upper()
    return ":".join(h[i : i + 2] for i in range(0, 64, 2))


# --- which node ---------------------------------------------------------------------------


def test_plan_with_api_url_names_the_specs_node_not_the_local_hostname(capsys, sim, spec, env):
    code, out, err = run(
        capsys, "plan", *_api(sim), "--ca-bundle", str(sim.api.ca_cert_path), "--spec", str(spec)
    )
    assert code == 0, err
    assert "[switch]" in out and "workstation" not in out + err


def test_plan_over_api_url_without_pct_refuses_a_service_it_cannot_read(capsys, sim, spec, env, tmp_path):
    """Without service.command and without pct here, the service's command cannot be read: the
    plan is refused (exit 2) naming both ways out, instead of leaving the new tp size out."""
    env.setenv("PATH", str(tmp_path))  # no pct on this machine, whatever it has installed
    bare = sim.dir / "bare.yaml"
    bare.write_text(seed_spec_text(sim))
    code, out, err = run(
        capsys, "plan", *_api(sim), "--ca-bundle", str(sim.api.ca_cert_path), "--spec", str(bare)
    )
    assert code == 2 and out == ""
    assert one_line(err) == (
        "gputopo: error: refused: container 101: cannot read sglang.service's command (no pct on this machine): set "
        "service.command in the spec, or run gputopo on the node (--local)"
    )
    # with service.command the plan is made, its drop-in the spec's command with the new tp size
    code, out, err = run(
        capsys, "plan", *_api(sim), "--ca-bundle", str(sim.api.ca_cert_path), "--spec", str(spec)
    )
    assert code == 0, err
    assert (
        "CT 101: write /etc/systemd/system/sglang.service.d/gputopo.conf (sglang.service, tensor parallel 4"
        in out
    )
    # the model's files are inside the container, which this machine cannot look into: one line says so
    assert (
        "  - container 101: capacity not checked: the model's footprint could not be read (the container "
        "cannot be looked into here: no pct on this machine)\n" in out
    )


def test_verify_with_api_url_names_this_hosts_node_of_a_two_node_spec(capsys, sim, spec, env):
    import json

    two = spec.read_text().replace("\npolicy:", "\n  - name: pve9\npolicy:")
    spec.write_text(two)
    code, out, err = run(
        capsys,
        "verify",
        *_api(sim),
        "--ca-bundle",
        str(sim.api.ca_cert_path),
        "--spec",
        str(spec),
        "--json",
        "--timeout",
        "1",
    )
    # pct is not on this machine, so the container's checks fail; the API was read for pve1
    assert "hostname lookup" not in err and "workstation" not in out + err
    report = json.loads(out)
    assert report["node"] == "pve1" and code == 1


def test_apply_refuses_an_api_whose_node_is_not_this_host(capsys, sim, spec, env, tmp_path):
    other = PveApiServer(
        tmp_path / "o" / "pve", tmp_path / "o" / "run", sim.paths.root, node="pve2", auth_fail_delay=0.0
    ).start()
    try:
        env.setenv("GPUTOPO_PVE_PASSWORD", other.root_password)
        before = fingerprint(sim)
        url = f"https://127.0.0.1:{other.port}"
        conn = ["--api-url", url, "--root", str(sim.paths.root), "--ca-bundle", str(other.ca_cert_path)]
        # recover with no open journal has nothing to do: it says so before it asks the API
        code, out, err = run(capsys, "recover", *conn)
        assert code == 0 and "nothing to recover" in out, err
        # an open journal of this host's apply: recover would change the host, and is refused
        journal = Journal.create(sim.paths.root, Header(pid=1, started=time.time(), node="pve1"))
        for argv in (["apply", "--spec", str(spec), "--yes"], ["recover"]):
            code, _, err = run(capsys, *argv, *conn)
            assert code == 2, err
            line = one_line(err)
            assert line.startswith(f"gputopo: error: the Proxmox API via {url} serves node(s) pve2, ")
            assert "this host is pve1" in line and line.endswith("(nothing was changed)")
        assert fingerprint(sim) == before and len(Journal.load(journal.path).records) == 1
        journal.append(End(result="rolled-back"))
    finally:
        other.stop()
    # the host's own API passes that check (a dry run, which changes nothing)
    env.setenv("GPUTOPO_PVE_PASSWORD", sim.credentials()["password"])
    code, out, err = run(
        capsys,
        "apply",
        *_api(sim),
        "--ca-bundle",
        str(sim.api.ca_cert_path),
        "--spec",
        str(spec),
        "--dry-run",
    )
    assert code == 0, err
    assert "[switch]" in out


# --- TLS ------------------------------------------------------------------------------------


def test_fingerprint_pins_the_nodes_certificate_as_proxmox_clients_do(capsys, sim, spec, env):
    fp = _served_fingerprint(sim.api.port)
    for secret_env in (
        {},
        {"GPUTOPO_PVE_TOKEN": f"{sim.credentials()['token_id']}={sim.credentials()['token_value']}"},
    ):
        for k, v in secret_env.items():
            env.setenv(k, v)
        # no CA: the pinned fingerprint alone is trusted, in lower case too, the login included
        code, out, err = run(capsys, "plan", *_api(sim), "--fingerprint", fp.lower(), "--spec", str(spec))
        assert code == 0, err
        assert "[switch]" in out and "warning" not in err
    env.delenv("GPUTOPO_PVE_TOKEN")
    wrong = "AB:" * 31 + "CD"
    code, _, err = run(capsys, "plan", *_api(sim), "--fingerprint", wrong, "--spec", str(spec))
    assert code == 2
    assert one_line(err) == (
        f"gputopo: error: connect https://127.0.0.1:{sim.api.port}: the certificate's "
        f"SHA-256 fingerprint is {fp}, not the pinned {wrong}"
    )
    assert sim.credentials()["password"] not in err
    code, _, err = run(capsys, "plan", *_api(sim), "--fingerprint", "AB:CD", "--spec", str(spec))
    assert code == 2 and one_line(err).startswith(
        "gputopo: error: --fingerprint AB:CD: a SHA-256 fingerprint is"
    )
    # apply refuses in one line too, before anything changes
    before = fingerprint(sim)
    code, _, err = run(capsys, "apply", *_api(sim), "--fingerprint", wrong, "--spec", str(spec), "--yes")
    assert code == 2 and "not the pinned" in one_line(err) and fingerprint(sim) == before


def test_insecure_warns_and_does_not_mix_with_a_ca_bundle(capsys, sim, spec, env):
    code, out, err = run(capsys, "plan", *_api(sim), "--insecure", "--spec", str(spec))
    assert code == 0, err
    assert one_line(err).startswith("gputopo: warning: --insecure: the API's TLS certificate is not checked")
    for extra in (
        ["--ca-bundle", str(sim.api.ca_cert_path)],
        ["--fingerprint", _served_fingerprint(sim.api.port)],
    ):
        code, _, err = run(capsys, "plan", *_api(sim), "--insecure", *extra, "--spec", str(spec))
        assert code == 2
        line = one_line(err)
        assert line.startswith(f"gputopo: error: {extra[0]} and --insecure exclude each other"), line


# --- tokens ---------------------------------------------------------------------------------


def test_a_token_name_as_the_web_ui_shows_it_works(capsys, sim, spec, env):
    env.delenv("GPUTOPO_PVE_PASSWORD")
    env.setenv("GPUTOPO_PVE_TOKEN_SECRET", sim.credentials()["token_value"])
    ca = ["--ca-bundle", str(sim.api.ca_cert_path)]
    for name in ("root@pam!gputopo", "gputopo"):
        code, out, err = run(capsys, "plan", *_api(sim), *ca, "--token-name", name, "--spec", str(spec))
        assert code == 0, (name, err)
    code, _, err = run(
        capsys,
        "plan",
        *_api(sim),
        *ca,
        "--token-name",
        "ops@pve!gputopo",
        "--user",
        "other@pve",
        "--spec",
        str(spec),
    )
    assert code == 2
    assert (
        one_line(err)
        == "gputopo: error: --token-name ops@pve!gputopo is a token of ops@pve, not of --user other@pve"
    )


def test_a_wrong_token_secret_is_bad_input_and_apply_changes_nothing(capsys, sim, spec, env):
    env.delenv("GPUTOPO_PVE_PASSWORD")
    env.setenv("GPUTOPO_PVE_TOKEN_SECRET", "00000000-0000-0000-0000-000000000000")
    base = [
        *_api(sim),
        "--ca-bundle",
        str(sim.api.ca_cert_path),
        "--token-name",
        "gputopo",
        "--spec",
        str(spec),
    ]
    before = fingerprint(sim)
    code, _, err = run(capsys, "apply", *base, "--yes")
    assert code == 2
    assert one_line(err) == (
        "gputopo: error: cannot use the Proxmox API (GET /version: 401 Authentication failed! "
        "(API token root@pam!gputopo)); nothing was changed"
    )
    assert fingerprint(sim) == before
    code, _, err = run(capsys, "plan", *base)
    assert code == 2 and "401 Authentication failed!" in one_line(err)
    assert "00000000-0000-0000-0000-000000000000" not in err


# --- the spec file --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nest",
    [
        lambda n: "[" * n + "]" * n,
        lambda n: "{a: " * n + "1" + "}" * n,
        lambda n: "\n" + "".join("  " * (i + 2) + "- \n" for i in range(n)),
    ],
)
def test_a_spec_nested_500_levels_deep_is_one_line_and_exit_2(capsys, sim, tmp_path, nest):
    p = tmp_path / "deep.yaml"
    text = seed_spec_text(sim) + "extra: " + nest(500) + "\n"
    p.write_text(text)
    first = text.count("\n", 0, text.index("extra:")) + 1
    for argv in (["plan", "--sim", str(sim.dir)], ["apply", "--sim", str(sim.dir), "--yes"]):
        code, _, err = run(capsys, *argv, "--spec", str(p))
        assert code == 2, err
        line = one_line(err)
        assert line.startswith(
            f"gputopo: error: {p}: nested too deeply to be a spec (more than 32 levels at line "
        )
        assert int(line.split(" at line ")[1].split(",")[0]) >= first
