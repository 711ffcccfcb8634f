"""Shared pytest fixtures.

``materialized(name)`` builds a shipped host fixture once per test session and returns its
root. Those roots are shared: a test that changes files under one must use
``fresh_host(name)`` instead, which builds a private copy under the test's tmp_path.
Add new shared fixtures below; keep each one independent of the others.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def materialized(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: host name (or yaml path) -> root built once per session (treat as read-only)."""
    from gputopo.fixtures import materialize

    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            base = tmp_path_factory.mktemp(f"host-{Path(name).stem}")
            cache[name] = materialize(name, base / "root")
        return cache[name]

    return build


@pytest.fixture
def fresh_host(tmp_path: Path) -> Callable[[str], Path]:
    """Factory: host name (or yaml path) -> a private root the test may change."""
    from gputopo.fixtures import materialize

    count = [0]

    def build(name: str) -> Path:
        count[0] += 1
        return materialize(name, tmp_path / f"fresh-{count[0]}-{Path(name).stem}")

    return build
