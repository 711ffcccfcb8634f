"""Where the shipped templates and fixtures live.

In a source checkout (editable install) the top-level ``templates/`` and ``fixtures/`` are
used; a wheel carries copies under ``gputopo/_data/``.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    source = _PKG.parent / name
    if source.is_dir() and (_PKG.parent / "pyproject.toml").is_file():
        return source
    return _PKG / "_data" / name


def templates_dir() -> Path:
    """Directory of the built-in jinja2 templates."""
    return _data_dir("templates")


def fixtures_dir() -> Path:
    """Directory of the built-in fixtures (host descriptions and captures)."""
    return _data_dir("fixtures")
