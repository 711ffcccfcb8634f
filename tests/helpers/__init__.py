"""Code the tests share, in one place: test modules import from here, never from each other.

``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject.toml), so every test imports
``from helpers.X import ...``. This module imports nothing heavy: the e2e guest imports
``helpers.kernel_scenarios`` with nothing but the standard library.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent  # the tests/ directory
REPO = TESTS.parent  # the source checkout (pyproject.toml, fixtures/, README.md)
