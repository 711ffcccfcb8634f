"""Prometheus's own checker, ``promtool`` (Debian's ``prometheus`` package), run on what the drift
watch writes and on the example alert rules. Without promtool the caller is skipped, unless
``GPUTOPO_REQUIRE_PROMTOOL=1`` (CI), where it fails instead."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REQUIRE = os.environ.get("GPUTOPO_REQUIRE_PROMTOOL") == "1"


def promtool() -> str:
    """promtool's path; skips the test (fails it under GPUTOPO_REQUIRE_PROMTOOL=1) without one."""
    path = shutil.which("promtool")
    if path is None:
        if REQUIRE:
            pytest.fail("GPUTOPO_REQUIRE_PROMTOOL=1 but no promtool on PATH (apt-get install prometheus)")
        pytest.skip("no promtool (apt-get install prometheus)")
    return path


def check_metrics(text: str) -> subprocess.CompletedProcess:
    """``promtool check metrics`` of ``text`` (the exposition format, on its stdin)."""
    return subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``promtool ARGS``."""
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd)
