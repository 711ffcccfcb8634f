"""The connection options: one definition shared by every command that reads or changes a host,
each command offering only the groups it uses, and an option the chosen source would ignore
refused in one line naming it."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from gputopo.cli import COMMANDS, LazyGroup
from helpers.applysim import copy_host, fingerprint, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run

API = [
    "--api-url",
    "--local",
    "--user",
    "--token-name",
    "--secret-file",
    "--ca-bundle",
    "--fingerprint",
    "--insecure",
    "--api-timeout",
]
# command -> the connection options it offers (gputopo.cli.connect's table)
OFFERED = {
    "plan": ["--root", "--pve-root", "--sim", *API, "--node"],
    "render": ["--root", "--pve-root", "--sim", *API, "--node"],
    "diff": ["--root", "--pve-root", "--sim", *API, "--node"],
    "init": ["--root", "--sim", *API, "--node"],
    "export": ["--root", "--pve-root", "--sim", *API, "--node"],
    "history": ["--root", "--sim"],
    "history show": ["--root", "--sim"],
    "apply": ["--root", "--sim", *API, "--node"],
    "recover": ["--root", "--sim", *API, "--node"],
    "verify": ["--root", "--sim", *API, "--node"],
    "watch": ["--root", "--sim", *API, "--node"],
    "topo": ["--root", "--pve-root", "--sim", "--node"],
    "discover": ["--root"],
    "snapshot": ["--root"],
    "cluster plan": ["--pve-root", "--sim", *API],
    "cluster diff": ["--pve-root", "--sim", *API],
    "cluster apply": ["--sim", *API],
    "cluster verify": ["--sim", *API],
    "cluster node-read": ["--sim"],
}
CONNECTION = {"--root", "--pve-root", "--sim", "--node", *API}


def _commands() -> dict[str, click.Command]:
    """Every command by its path ('sim create' included)."""
    out: dict[str, click.Command] = {}
    for name in COMMANDS:
        cmd = LazyGroup._load(name, strict=True)
        assert cmd is not None, name
        stack = [(name, cmd)]
        while stack:
            path, c = stack.pop()
            out[path] = c
            if isinstance(c, click.Group):
                stack += [(f"{path} {n}", sub) for n, sub in c.commands.items()]
    return out


def _options(cmd: click.Command) -> dict[str, click.Option]:
    return {
        p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0]: p
        for p in cmd.params
        if isinstance(p, click.Option)
    }


def test_every_option_of_every_command_has_a_help_text():
    missing = [
        f"{path} {name}"
        for path, cmd in _commands().items()
        for name, opt in _options(cmd).items()
        if not (opt.help or "").strip()
    ]
    assert missing == []


def test_each_command_offers_exactly_its_connection_options():
    commands = _commands()
    for name, offered in OFFERED.items():
        got = [o for o in _options(commands[name]) if o in CONNECTION]
        assert got == offered, name
    others = {
        p: sorted(set(_options(c)) & CONNECTION)
        for p, c in commands.items()
        if p not in OFFERED and not p.startswith("sim ")
    }
    assert all(not v for v in others.values()), others


def test_the_options_are_one_definition():
    commands = _commands()
    for option in CONNECTION - {"--root"}:
        seen = {
            (o.help, o.envvar, o.show_envvar, repr(o.type.to_info_dict()), o.default)
            for name in OFFERED
            if option in OFFERED[name]
            for o in [_options(commands[name])[option]]
        }
        assert len(seen) == 1, (option, seen)
    # --root differs only in what it accepts: a snapshot archive where discovery reads it
    for name in (n for n in OFFERED if "--root" in OFFERED[n]):
        opt = _options(commands[name])["--root"]
        assert opt.default is None and opt.help.startswith("Host root holding sys/, proc/, dev/, etc/")
        assert opt.type.file_okay == (
            name in ("plan", "render", "diff", "init", "export", "discover", "topo")
        ), name


def test_help_shows_the_environment_variable(capsys):
    for name in ("plan", "apply", "verify"):
        code, out, _ = run(capsys, name, "--help")
        assert code == 0 and "env var: GPUTOPO_PVE_URL" in " ".join(out.split())
        assert "GPUTOPO_PVE_PASSWORD" in out and "GPUTOPO_PVE_TOKEN_SECRET" in out


@pytest.fixture
def sim(template, tmp_path):
    return copy_host(template, tmp_path / "sim")


@pytest.fixture
def spec(sim) -> Path:
    p = sim.dir / "s.yaml"
    p.write_text(seed_spec_text(sim))
    return p


@pytest.mark.parametrize(
    "argv, option",
    [
        (["history", "--api-url", "https://pve1"], "--api-url"),
        (["init", "--pve-root", "/etc/pve"], "--pve-root"),
        (["discover", "--sim", "x"], "--sim"),
        (["snapshot", "out.tar.gz", "--node", "pve1"], "--node"),
        (["apply", "--spec", "s.yaml", "--pve-root", "/etc/pve"], "--pve-root"),
        (["verify", "--spec", "s.yaml", "--pve-root", "/etc/pve"], "--pve-root"),
    ],
)
def test_an_option_a_command_does_not_take_is_a_usage_error_naming_it(capsys, argv, option):
    code, _, err = run(capsys, *argv)
    assert code == 2
    line = one_line(err)
    assert "No such option" in line and option in line


@pytest.mark.parametrize(
    "command, extra, culprit",
    [
        ("apply", ["--insecure"], "--insecure applies to --api-url only"),
        ("apply", ["--user", "root@pam"], "--user applies to --api-url only"),
        ("apply", ["--api-timeout", "5"], "--api-timeout applies to --api-url and --local only"),
        ("verify", ["--token-name", "gputopo"], "--token-name applies to --api-url only"),
        ("recover", ["--ca-bundle", "ca.pem"], "--ca-bundle applies to --api-url only"),
        ("verify", ["--fingerprint", "AB:" * 31 + "AB"], "--fingerprint applies to --api-url only"),
        ("plan", ["--secret-file", "pw"], "--secret-file applies to --api-url only"),
        ("diff", ["--api-timeout", "5"], "--api-timeout applies to --api-url and --local only"),
    ],
)
@pytest.mark.slow
def test_an_api_option_the_simulated_host_would_ignore_is_refused(capsys, sim, spec, command, extra, culprit):
    before = fingerprint(sim)
    argv = [command, "--sim", str(sim.dir), *extra] + ([] if command == "recover" else ["--spec", str(spec)])
    argv += ["--yes"] if command == "apply" else []
    code, _, err = run(capsys, *argv)
    assert code == 2, err
    assert one_line(err) == f"gputopo: error: {culprit}"
    assert fingerprint(sim) == before


def test_an_api_option_without_an_api_is_refused(capsys, sim, spec):
    root = str(sim.paths.root)
    code, _, err = run(capsys, "plan", "--spec", str(spec), "--root", root, "--insecure")
    assert code == 2 and one_line(err) == "gputopo: error: --insecure applies to --api-url only"
    code, _, err = run(capsys, "plan", "--spec", str(spec), "--root", root, "--local", "--user", "root@pam")
    assert code == 2 and one_line(err) == "gputopo: error: --user applies to --api-url only"


@pytest.mark.slow
def test_the_environment_url_yields_to_the_command_line(capsys, monkeypatch, sim, spec):
    monkeypatch.setenv("GPUTOPO_PVE_URL", "https://127.0.0.1:1")
    monkeypatch.setenv("GPUTOPO_PVE_PASSWORD", "pw")
    root = str(sim.paths.root)
    # without another source the environment's API is the source (and is not there)
    code, _, err = run(capsys, "plan", "--spec", str(spec), "--root", root)
    assert code != 0 and "connect https://127.0.0.1:1" in one_line(err)
    # --sim or --pve-root on the command line set it aside
    code, out, err = run(capsys, "plan", "--spec", str(spec), "--sim", str(sim.dir))
    assert code == 0, err
    assert "[switch]" in out
    code, out, err = run(
        capsys, "plan", "--spec", str(spec), "--root", root, "--pve-root", str(sim.paths.pve)
    )
    assert code == 0, err
    # an --api-url typed with --sim is still a contradiction
    code, _, err = run(
        capsys, "plan", "--spec", str(spec), "--sim", str(sim.dir), "--api-url", "https://127.0.0.1:1"
    )
    assert code == 2 and "--sim excludes --api-url and --local" in one_line(err)


def test_init_on_a_simulated_host(capsys, sim, tmp_path):
    code, out, err = run(capsys, "init", "--sim", str(sim.dir))
    assert code == 0, err
    assert f"name: {sim.node}" in out
    code, _, err = run(capsys, "init", "--sim", str(sim.dir), "--node", "elsewhere")
    assert code == 2
    assert (
        one_line(err)
        == f"gputopo: error: --node elsewhere: the simulated host in {sim.dir} is node {sim.node}"
    )
    code, _, err = run(capsys, "init", "--sim", str(tmp_path))
    assert code == 2 and "not a simulated host" in one_line(err)
