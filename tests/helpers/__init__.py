"""Code the tests share, in one place: test modules import from here, never from each other.

``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject.toml), so every test imports
``from helpers.X import ...``. This module imports nothing heavy: the e2e guest imports
``helpers.kernel_scenarios`` with nothing but the standard library.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent  # the tests/ directory
REPO = TESTS.parent  # the source checkout (pyproject.toml, fixtures/, README.md)


def planted_package(where: Path, files: dict[str, str]) -> Path:
    """A ``gputopo`` package under ``where`` holding ``files`` (relative path -> text): the trees
    the source-scanning tests plant a violation in, to show their check can fail."""
    pkg = where / "gputopo"
    for rel, text in files.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return pkg
