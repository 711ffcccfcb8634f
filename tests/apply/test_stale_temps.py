"""A host file write killed between its temp file and the rename: recover leaves no file of
gputopo's behind, whether it rolls back or finishes, and the undo of a file that did not change
removes the temp a killed write left beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gputopo.actions.hostfile import FileBefore, WriteHostFile
from gputopo.adapters.hostfiles import RealHostFiles
from gputopo.apply.journal import find_unfinished
from helpers import TESTS, applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

DRIVER = TESTS / "helpers" / "crashdriver.py"


@pytest.fixture
def new_host(template):
    made = []

    def make():
        base = Path(tempfile.mkdtemp(prefix="gputopo-temps-", dir=applysim.fast_tmp()))
        h = applysim.copy_host(template, base / "sim")
        made.append((h, base))
        return h

    yield make
    for h, base in made:
        h.stop()
        applysim.cleanup(base)


def _drive(host, *args: str, at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if at:
        env["GPUTOPO_CRASH_AT"] = at
    return subprocess.run(
        [sys.executable, str(DRIVER), *args, "--sim", str(host.dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _gputopo_temps(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "etc").rglob(".*gputopo*"))


def _killed_in_first_write(host) -> None:
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.seed_spec_text(host))
    res = _drive(host, "apply", "--spec", str(spec), "--yes", "--no-verify", "--timeout", "30", at="temp:1")
    assert res.returncode == -signal.SIGKILL, res.stderr
    left = _gputopo_temps(host.paths.root)
    assert left and all(Path(p).name.startswith(".90-gputopo") for p in left), left  # the kill point


def test_recover_after_a_kill_inside_the_first_host_file_write_leaves_no_temp_file(new_host):
    host = new_host()
    before = applysim.fingerprint(host)
    _killed_in_first_write(host)
    rec = _drive(host, "recover")
    assert rec.returncode == 0, (rec.stdout, rec.stderr)
    assert "recovered:" in rec.stdout + rec.stderr
    assert find_unfinished(host.paths.root) is None
    assert _gputopo_temps(host.paths.root) == []
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_recover_finish_after_a_kill_inside_the_first_host_file_write_leaves_no_temp_file(new_host):
    host = new_host()
    _killed_in_first_write(host)
    rec = _drive(host, "recover", "--finish")
    assert rec.returncode == 0, (rec.stdout, rec.stderr)
    assert find_unfinished(host.paths.root) is None
    assert _gputopo_temps(host.paths.root) == []
    assert applysim.fingerprint(host)["service"][0] == "active"


class _Ctx:
    def __init__(self, root: Path):
        self.ports = type("P", (), {"files": RealHostFiles(root)})()


@pytest.mark.parametrize("existed", [True, False])
def test_undo_of_an_unchanged_file_removes_the_temp_beside_it(tmp_path, existed):
    rules = tmp_path / "etc/udev/rules.d"
    rules.mkdir(parents=True)
    target = rules / "90-gputopo-vfio.rules"
    if existed:
        target.write_text("old\n")
        os.chmod(target, 0o644)
    stale = rules / ".90-gputopo-vfio.rules.k2j4h5l1"
    stale.touch(mode=0o600)
    step = WriteHostFile(path="etc/udev/rules.d/90-gputopo-vfio.rules", content="new\n")
    ctx = _Ctx(tmp_path)
    before = step.before(ctx) if existed else FileBefore(content=None)
    assert step.undo(before, ctx) == ""  # the file itself is as it was
    assert not stale.exists()
    assert (target.read_text() if existed else target.exists()) == ("old\n" if existed else False)


def test_a_retried_write_already_done_removes_the_temp_beside_it(tmp_path):
    rules = tmp_path / "etc/udev/rules.d"
    rules.mkdir(parents=True)
    (rules / "90-gputopo-vfio.rules").write_text("new\n")
    os.chmod(rules / "90-gputopo-vfio.rules", 0o644)
    stale = rules / ".90-gputopo-vfio.rules.k2j4h5l1"
    stale.touch(mode=0o600)
    WriteHostFile(path="etc/udev/rules.d/90-gputopo-vfio.rules", content="new\n").do(_Ctx(tmp_path))
    assert not stale.exists()
