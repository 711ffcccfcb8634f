"""The command lines answered without click (gputopo.cli.quick) answer exactly what click answers,
and the command list of ``gputopo --help`` is each command's own summary."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gputopo.cli import COMMANDS, SUMMARIES, main
from gputopo.cli.group import LazyGroup
from gputopo.cli.group import run as click_run
from gputopo.cli.quick import answer, discover_options, help_text


def outcome(capsys, f, argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``f(argv)``."""
    try:
        f(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_each_summary_is_what_click_makes_of_the_commands_docstring():
    assert set(SUMMARIES) == set(COMMANDS)
    limit = 78 - 6 - max(map(len, COMMANDS))  # click's column for a terminal 80 wide
    for name in COMMANDS:
        cmd = LazyGroup._load(name, strict=True)
        assert SUMMARIES[name] == cmd.get_short_help_str(limit), (
            f"gputopo.cli.SUMMARIES[{name!r}] should be {cmd.get_short_help_str(limit)!r}"
        )


@pytest.mark.parametrize("columns", [50, 79, 80, 100, 200])
def test_help_is_clicks_at_every_width(capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    via_click = outcome(capsys, click_run, ["--help"])
    assert via_click[0] == 0 and "Commands:" in via_click[1]
    assert outcome(capsys, main, ["--help"]) == via_click
    assert outcome(capsys, main, ["-h"]) == via_click
    assert outcome(capsys, main, [])[1] == via_click[1]  # 'gputopo' alone lists the commands too
    assert (help_text(columns) is None) == (columns < 80)  # narrower: click shortens the summaries


def test_version_is_clicks(capsys):
    quick = outcome(capsys, main, ["--version"])
    assert quick == outcome(capsys, click_run, ["--debug", "--version"])  # --debug: click's path
    assert quick[1].startswith("gputopo, version ")


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "--root", "{seed}"],
        ["--json", "--root={seed}", "--all"],
        ["--root", "{seed}", "--json", "--gpu-match", "0x1a03:0x03", "--gpu-match=0x10de"],
        ["--json", "--root", "{esc8000a}"],
        ["--json", "--root", "{snapshot}"],
        ["--json", "--root", "{missing}"],
        ["--json", "--root", "{seed}", "--gpu-match", "zz"],
    ],
)
@pytest.mark.slow
def test_discover_json_is_clicks(capsys, materialized, tmp_path, argv):
    from gputopo.facts.snapshot import snapshot

    if "{snapshot}" in argv:
        snapshot(materialized("seed"), tmp_path / "s.tar.gz")
    paths = {
        "seed": materialized("seed"),
        "esc8000a": materialized("esc8000a"),
        "snapshot": tmp_path / "s.tar.gz",
        "missing": tmp_path / "missing",
    }
    args = ["discover", *(a.format(**paths) for a in argv)]
    assert discover_options(args[1:]) is not None  # the quick path answers it
    quick = outcome(capsys, main, args)
    assert quick == outcome(capsys, click_run, args)
    assert quick[0] == (2 if "{missing}" in argv or "zz" in argv else 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["discover", "--json", "--help"],
        ["discover", "--json", "-h"],
        ["discover", "--json", "--root"],
        ["discover", "--json", "--root", "--all"],
        ["discover", "--json", "extra"],
        ["discover", "--json", "--bogus"],
        ["discover", "--json", "--root", ""],
        ["--debug", "discover", "--json"],
        ["discover"],
        ["--version", "x"],
    ],
)
def test_anything_else_is_left_to_click(argv):
    assert answer(argv) is False


def test_shell_completion_is_left_to_click(capsys, monkeypatch):
    monkeypatch.setenv("_GPUTOPO_COMPLETE", "bash_source")
    code, out, _ = outcome(capsys, main, [])
    assert code == 0 and "_gputopo_completion" in out and "Usage:" not in out
    monkeypatch.setenv("_GPUTOPO_COMPLETE", "bash_complete")
    monkeypatch.setenv("COMP_WORDS", "gputopo disc")
    monkeypatch.setenv("COMP_CWORD", "1")
    assert "discover" in outcome(capsys, main, [])[1]


@pytest.mark.slow
def test_start_up_imports_no_click(tmp_path):
    probe = (
        "import sys\nfrom gputopo.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('click', 'pydantic')), file=sys.stderr)\n"
    )
    for argv in (["--version"], ["--help"], []):
        p = subprocess.run(
            [sys.executable, "-c", probe, *argv],
            capture_output=True,
            text=True,
            env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
        )
        assert p.returncode == 0 and p.stdout, p.stderr
        assert p.stderr.strip().splitlines()[-1] == "[]", argv
    # the probe sees click when a command needs it
    p = subprocess.run([sys.executable, "-c", probe, "fixtures", "list"], capture_output=True, text=True)
    assert "click" in p.stderr.splitlines()[-1]
