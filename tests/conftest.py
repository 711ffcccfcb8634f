"""Shared pytest fixtures.

``materialized(name)`` builds a shipped host fixture once per test session and returns its
root. Those roots are shared: a test that changes files under one must use
``fresh_host(name)`` instead, which builds a private copy under the test's tmp_path.
Add new shared fixtures below; keep each one independent of the others.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _temp_on_tmpfs() -> None:
    """Temporary files (tmp_path, and tempfile in the tests and the commands they start) on tmpfs
    unless TMPDIR names a place: the tests build sysfs-like trees of thousands of small files, which
    a disk-backed /tmp creates several times slower. Skipped where /dev/shm has under 1 GiB free."""
    if os.environ.get("TMPDIR"):
        return
    try:
        free = os.statvfs("/dev/shm")
    except OSError:
        return
    if os.access("/dev/shm", os.W_OK) and free.f_bavail * free.f_frsize >= 1 << 30:
        os.environ["TMPDIR"] = "/dev/shm"
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


_temp_on_tmpfs()


@pytest.fixture(scope="session")
def fast_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A session directory on tmpfs when there is one: the large host is ~75,000 small files,
    which a disk-backed /tmp creates 30 times slower. Removed at the end of the session."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = Path(tempfile.mkdtemp(prefix="gputopo-tests-", dir=shm))
        yield d
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("fast")


@pytest.fixture(scope="session")
def materialized(fast_tmp: Path) -> Callable[[str], Path]:
    """Factory: host name (or yaml path) -> root built once per session (treat as read-only)."""
    from gputopo.sim.hostroot import materialize

    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            base = Path(tempfile.mkdtemp(prefix=f"host-{Path(name).stem}-", dir=fast_tmp))
            cache[name] = materialize(name, base / "root")
        return cache[name]

    return build


@pytest.fixture
def fresh_host(tmp_path: Path) -> Callable[[str], Path]:
    """Factory: host name (or yaml path) -> a private root the test may change."""
    from gputopo.sim.hostroot import materialize

    count = [0]

    def build(name: str) -> Path:
        count[0] += 1
        return materialize(name, tmp_path / f"fresh-{count[0]}-{Path(name).stem}")

    return build


# --- the crash matrix's tally (tests/helpers/crashmatrix.py) ---------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """The session's directory for the crash matrix's run records; xdist workers inherit it."""
    from helpers.crashmatrix import RECORDS_ENV

    if not hasattr(config, "workerinput"):
        d = os.path.join(tempfile.gettempdir(), f"gputopo-matrix-runs-{os.getpid()}")  # made by the first run
        os.environ[RECORDS_ENV] = d
        config.stash[_MATRIX_RUNS] = d


_MATRIX_RUNS = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The full crash matrix runs only when ``-m`` names it: CI's ``-m 'e2e or not e2e'`` would
    select it otherwise, and it takes the matrix's sample (``matrix``) instead."""
    if "matrix_full" in (config.getoption("markexpr") or ""):
        return
    full = [item for item in items if item.get_closest_marker("matrix_full")]
    if full:
        config.hook.pytest_deselected(items=full)
        items[:] = [item for item in items if not item.get_closest_marker("matrix_full")]


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The crash matrix's runs per direction and how they ended, when the session ran any."""
    import json

    from helpers.crashmatrix import CASES_ENV, COUNTS_ENV, summary, tally

    d = config.stash.get(_MATRIX_RUNS, None)
    if d is None:
        return
    counts, cases = tally(Path(d)), tally(Path(d), "case")
    shutil.rmtree(d, ignore_errors=True)
    if not counts:
        return
    terminalreporter.section("crash matrix: runs per direction")
    for line in summary(counts):
        terminalreporter.write_line(line)
    if os.environ.get(COUNTS_ENV):
        Path(os.environ[COUNTS_ENV]).write_text(json.dumps(counts, indent=1) + "\n")
    if os.environ.get(CASES_ENV):
        terminalreporter.section("crash matrix: runs per case")
        for line in summary(cases, "case"):
            terminalreporter.write_line(line)
        Path(os.environ[CASES_ENV]).write_text(json.dumps(cases, indent=1) + "\n")
