"""The exit codes are one table (``gputopo.exitcodes``): every command's ``--help`` and docs/exit-codes.md
say what it says, every error class exits with a code of it, and every code a command documents
is seen: here, by running the command into it, or by the test named for it."""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import click
import pytest

from gputopo import errors, exitcodes
from gputopo.cli import COMMANDS
from helpers import TESTS
from helpers.applysim import copy_host, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import run

EXIT_CODES_PAGE = Path(__file__).resolve().parent.parent / "docs" / "exit-codes.md"

# (command, code) -> the test that sees it, where it takes a scenario too long to repeat here
WITNESSES = {
    ("apply", 1): "apply/test_apply.py::test_cli_apply_ends_with_verify_and_rolls_back_on_its_failure",
    (
        "apply",
        3,
    ): "apply/test_apply_scenarios.py::test_holder_appearing_after_preflight_times_out_naming_the_device",
    ("apply", 4): "apply/test_apply.py::test_concurrent_apply_refused_naming_the_first",
    ("apply", 129): "apply/test_apply_scenarios.py::test_signal_mid_switch_through_the_cli_rolls_back",
    ("apply", 130): "apply/test_apply_scenarios.py::test_signal_mid_switch_through_the_cli_rolls_back",
    ("apply", 143): "apply/test_apply_scenarios.py::test_signal_mid_switch_through_the_cli_rolls_back",
    (
        "recover",
        3,
    ): "apply/test_apply_scenarios.py::test_gpu_falling_off_the_bus_is_named_for_a_human_and_the_rest_rolled_back",
    ("verify", 0): "verify/test_verify.py::test_cli_verify_on_a_simulated_host",
    ("verify", 1): "verify/test_verify.py::test_cli_verify_on_a_simulated_host",
    ("demo", 0): "cli/test_demo.py::test_demo_ends_split_verified_and_converged",
    (
        "cluster",
        0,
    ): "cluster/test_cluster_apply.py::test_canary_first_then_the_rest_in_batches_and_a_second_run_changes_nothing",
    (
        "cluster",
        1,
    ): "cluster/test_cluster_apply.py::test_the_first_failure_stops_the_run_and_names_what_is_done",
    ("cluster", 2): "cluster/test_cluster_apply.py::test_a_spec_node_outside_the_cluster_is_refused",
    (
        "cluster",
        3,
    ): "cluster/test_cluster_apply.py::test_a_node_whose_gpu_falls_off_the_bus_stops_the_run_with_exit_3",
    ("cluster", 4): "cluster/test_cluster_apply.py::test_a_node_whose_lock_is_held_stops_the_run_with_exit_4",
    (
        "cluster",
        129,
    ): "cluster/test_cluster_account.py::test_a_signal_during_pve2s_apply_ends_with_the_account",
    (
        "cluster",
        143,
    ): "cluster/test_cluster_account.py::test_a_signal_during_pve2s_apply_ends_with_the_account",
}
# every command: Ctrl-C anywhere is 130 (main turns KeyboardInterrupt into it)
# and a reader gone early is 141 (main ends it quietly)
GENERIC = {
    130: "cli/test_cli_errors.py::test_ctrl_c_exits_130_with_one_line",
    141: "cli/test_cli_pipe.py::test_a_reader_gone_early_ends_the_command_quietly_with_141",
}


def _help_codes(capsys, *command: str) -> dict[int, str]:
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0
    block = out.split("Exit codes:", 1)[1].split("\n\n", 1)[0]
    return {int(m[1]): m[2] for m in re.finditer(r"^\s+(\d+)\s+(.+)$", block, re.M)}


def test_every_command_is_in_the_table_and_its_help_says_it(capsys):
    assert set(COMMANDS) == set(exitcodes.COMMANDS)
    for name, codes in exitcodes.COMMANDS.items():
        assert set(codes) <= set(exitcodes.MEANING), name
        assert _help_codes(capsys, name) == codes, name


def test_the_docs_table_is_the_table():
    assert exitcodes.markdown_table() in EXIT_CODES_PAGE.read_text()
    assert exitcodes.command_table("cluster") in EXIT_CODES_PAGE.read_text()


def test_every_error_exits_with_a_code_of_the_table():
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.GputopoError)
    ]
    assert len(classes) > 20
    for c in classes:
        assert c.exit_code in exitcodes.MEANING, c
    assert (
        errors.Interrupted(15).exit_code == exitcodes.SIGTERM
        and errors.Interrupted(1).exit_code == exitcodes.SIGHUP
    )
    # a declined prompt, an unreachable API, a refused login: nothing was changed
    assert errors.ApplyCancelled().exit_code == errors.ConnectFailed("c", 401, "no").exit_code == 2


def _witness(ref: str) -> None:
    """``ref`` (a path under tests/ and a test's name) names a test function that exists."""
    path, name = ref.split("::")
    tree = ast.parse((TESTS / path).read_text())
    tests = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert name in tests, f"{ref}: no such test"


@pytest.fixture(scope="module")
def seed(materialized):
    return materialized("seed")


@pytest.fixture
def sim(template, tmp_path):
    return copy_host(template, tmp_path / "sim")


def _scenarios(capsys, seed, sim, tmp_path, monkeypatch):
    """(command, code) -> what runs into it: a callable returning the exit code seen."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(seed_spec_text(sim))
    R, S = str(seed), str(sim.dir)
    taken = tmp_path / "taken"
    taken.write_text("")
    (tmp_path / "taken.tar.gz").write_text("")

    def go(*argv):
        return lambda: run(capsys, *argv)[0]

    def declined():
        monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
        monkeypatch.setattr(click, "confirm", lambda *a, **k: False)
        return run(capsys, "apply", "--sim", S, "--spec", str(spec))[0]

    def locked():
        from gputopo.apply.lock import HostLock

        with HostLock(str(sim.paths.root)):
            return run(capsys, "recover", "--sim", S)[0]

    def finish_after_undo():
        from gputopo.actions import WriteHostFile
        from gputopo.apply.journal import Begin, Header, Journal, UndoBegin

        a = WriteHostFile(path="etc/x.conf", content="x\n")
        j = Journal.create(sim.paths.root, Header(pid=1, started=1.0, node="pve1", actions=[a]))
        j.append(Begin(step=0, action=a, before={"content": None}))
        j.append(UndoBegin(step=0))
        return run(capsys, "recover", "--sim", S, "--finish")[0]

    def shown():
        saved = tmp_path / "saved.json"
        assert run(capsys, "plan", "--sim", S, "--spec", str(spec), "-o", str(saved))[0] == 0
        return run(capsys, "show", str(saved))[0]

    def demo_not_converged():
        import gputopo.usecases.demo as demo

        monkeypatch.setattr(
            demo,
            "run_demo",
            lambda *a, **k: SimpleNamespace(
                ok=False, spec_path="s", applied=SimpleNamespace(stop_window_s=None, wall_s=0.0, journal=None)
            ),
        )
        return run(capsys, "demo", "--dir", str(tmp_path / "demo"))[0]

    return {
        ("discover", 0): go("discover", "--root", R),
        ("discover", 2): go("discover", "--root", "/etc"),
        ("topo", 0): go("topo", "--root", R),
        ("topo", 2): go("topo", "--root", "/etc"),
        ("snapshot", 0): go("snapshot", str(tmp_path / "s1"), "--root", R),
        ("snapshot", 2): go("snapshot", str(taken), "--root", R),
        ("schema", 0): go("schema", "facts"),
        ("schema", 2): go("schema", "bogus"),
        ("init", 0): go("init", "--root", R),
        ("init", 2): go("init", "--root", R, "-o", str(taken)),
        ("export", 0): go("export", "--root", R, "--pve-root", str(sim.paths.pve)),
        ("export", 2): go("export", "--root", "/etc"),
        ("plan", 0): go("plan", "--root", R, "--spec", str(spec)),
        ("plan", 2): go("plan", "--root", "/etc"),
        ("show", 0): shown,
        ("show", 2): go("show", str(taken)),
        ("render", 0): go("render", "--root", R, "--spec", str(spec), "--out", str(tmp_path / "r")),
        ("render", 2): go("render", "--root", R, "--spec", str(spec), "--out", str(taken)),
        ("diff", 0): go("diff", "--root", R, "--spec", str(spec)),
        ("diff", 1): go("diff", "--root", "/etc", "--spec", str(spec), "--exit-code"),
        ("diff", 2): go("diff", "--root", R, "--spec", str(spec), "--exit-code"),
        ("apply", 0): go("apply", "--sim", S, "--spec", str(spec), "--dry-run"),
        ("apply", 2): declined,
        ("recover", 0): go("recover", "--sim", S),
        ("recover", 1): finish_after_undo,
        ("recover", 2): go("recover", "--sim", str(tmp_path / "nothing")),
        ("recover", 4): locked,
        ("verify", 2): go("verify", "--sim", S, "--spec", str(tmp_path / "missing.yaml")),
        ("watch", 0): go("watch", "--sim", S, "--spec", str(spec)),
        ("watch", 2): go("watch", "--sim", S, "--spec", str(tmp_path / "missing.yaml")),
        ("history", 0): go("history", "--sim", S),
        ("history", 2): go("history", "--sim", S, "show", "nope"),
        ("completion", 0): go("completion", "bash"),
        ("completion", 2): go("completion", "tcsh"),
        ("demo", 1): demo_not_converged,
        ("demo", 2): go("demo", "--pace", "-1"),
        ("sim", 0): go("sim", "create", str(tmp_path / "sim2"), "--from", "shared-group"),
        ("sim", 1): go("sim", "guest", "start", "201", "--sim", S),  # its mapping does not exist yet
        ("sim", 2): go("sim", "create", str(sim.dir)),
        ("fixtures", 0): go("fixtures", "list"),
        ("fixtures", 2): go("fixtures", "build", "nope", str(tmp_path / "f")),
    }


@pytest.mark.slow
def test_every_documented_code_of_every_command_is_seen(capsys, seed, sim, tmp_path, monkeypatch):
    scenarios = _scenarios(capsys, seed, sim, tmp_path, monkeypatch)
    unseen = []
    for command, codes in exitcodes.COMMANDS.items():
        for code in codes:
            key = (command, code)
            if key in scenarios:
                got = scenarios[key]()
                assert got == code, f"gputopo {command}: exit {got}, expected {code}"
            elif key in WITNESSES or code in GENERIC:
                _witness(WITNESSES.get(key) or GENERIC[code])
            else:
                unseen.append(key)
    assert not unseen, f"documented but never seen: {unseen}"
    assert not set(scenarios) - {(c, k) for c, codes in exitcodes.COMMANDS.items() for k in codes}
