"""One error prefix everywhere: whichever path prints it (click's usage errors, gputopo's own
errors, a refused plan's reasons, ``diff --exit-code``'s errors, the simulator's commands), every
error line on stderr starts ``gputopo: error: ``, and the exit code is the one docs/exit-codes.md's
table gives the command (:mod:`gputopo.exitcodes`). Every command of the table is walked."""

from __future__ import annotations

import pytest

from gputopo import exitcodes
from helpers.applysim import copy_host, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import run

PREFIX = "gputopo: error: "

# (command of the table, argv with {placeholders}, exit code): a usage error and bad input each
CASES = [
    ("discover", ["discover", "--bogus"], 2),
    ("discover", ["discover", "--root", "/etc"], 2),
    ("topo", ["topo", "--format", "png"], 2),
    ("topo", ["topo", "--root", "/etc"], 2),
    ("snapshot", ["snapshot"], 2),
    ("snapshot", ["snapshot", "{taken}", "--root", "{root}"], 2),
    ("schema", ["schema", "nope"], 2),
    ("init", ["init", "--split", "thirds"], 2),
    ("init", ["init", "--sim", "{sim}", "--container", "999"], 2),
    ("export", ["export", "--root", "/etc"], 2),
    ("plan", ["plan", "--bogus"], 2),
    ("plan", ["plan", "--root", "{root}"], 2),  # neither --spec nor --split
    ("plan", ["plan", "--sim", "{sim}", "--spec", "{refused}"], 2),  # a refused plan's reasons
    ("show", ["show", "{taken}"], 2),
    ("render", ["render", "--spec", "x.yaml"], 2),
    ("render", ["render", "--sim", "{sim}", "--spec", "{refused}", "--out", "{out}"], 2),
    ("diff", ["diff", "--root", "/etc", "--spec", "{spec}", "--exit-code"], 1),
    ("diff", ["diff", "--sim", "{sim}", "--spec", "{refused}"], 2),
    ("apply", ["apply", "--sim", "{sim}", "--spec", "{missing}"], 2),
    ("apply", ["apply", "--sim", "{sim}", "--spec", "{refused}", "--yes"], 2),
    ("recover", ["recover", "--sim", "{nothing}"], 2),
    ("verify", ["verify", "--sim", "{sim}", "--spec", "{missing}"], 2),
    ("history", ["history", "--sim", "{sim}", "show", "nope"], 2),
    ("history", ["history", "--sim", "{sim}", "bogus"], 2),
    ("completion", ["completion", "tcsh"], 2),
    ("cluster", ["cluster", "plan"], 2),
    ("cluster", ["cluster", "bogus"], 2),
    ("demo", ["demo", "--pace", "-1"], 2),
    ("sim", ["sim", "create", "{sim}"], 2),
    ("sim", ["sim", "guest", "start", "999", "--sim", "{sim}"], 2),
    ("sim", ["sim", "guest", "start", "201", "--sim", "{sim}"], 1),  # the task fails
    ("watch", ["watch", "--interval", "5"], 2),  # --interval without --follow
    ("watch", ["watch", "--sim", "{sim}", "--spec", "{missing}"], 2),
    ("fixtures", ["fixtures", "bogus"], 2),
    ("fixtures", ["fixtures", "build", "nope", "{out}"], 2),
    (None, ["--bogus"], 2),  # the group itself
]


@pytest.fixture(scope="module")
def where(template, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefix")
    sim = copy_host(template, tmp / "sim")
    spec = tmp / "spec.yaml"
    spec.write_text(seed_spec_text(sim))
    refused = tmp / "refused.yaml"
    refused.write_text(seed_spec_text(sim).replace("vmid: 101", "vmid: 555"))
    taken = tmp / "taken"
    taken.write_text("")
    (tmp / "taken.tar.gz").write_text("")
    return {
        "sim": str(sim.dir),
        "root": str(sim.paths.root),
        "spec": str(spec),
        "refused": str(refused),
        "taken": str(taken),
        "missing": str(tmp / "missing.yaml"),
        "nothing": str(tmp / "nothing"),
        "out": str(tmp / "out"),
    }


def test_every_command_of_the_table_is_walked():
    assert {c for c, _, _ in CASES if c} == set(exitcodes.COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, argv, code", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_every_error_line_has_the_one_prefix_and_the_tables_code(capsys, where, command, argv, code):
    got, _, err = run(capsys, *(a.format(**where) for a in argv))
    assert got == code, err
    assert command is None or code in exitcodes.COMMANDS[command]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(PREFIX)]
    assert errors, err
    # nothing else but the warnings before it: no "Error:", no bare "refused:", no traceback
    assert all(ln.startswith((PREFIX, "gputopo: warning: ")) for ln in lines), err
    assert "Traceback" not in err
