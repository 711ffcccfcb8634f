"""Output helpers shared by the commands: one place for the console and JSON printing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def console(stderr: bool = False):
    """A rich Console (imported lazily: rich is heavy to import)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    """Print ``data`` (a pydantic model or plain data) as indented JSON on stdout."""
    if hasattr(data, "model_dump_json"):
        text = data.model_dump_json(by_alias=True, indent=2)
    else:
        text = json.dumps(data, indent=2, sort_keys=False, default=str)
    sys.stdout.write(text + "\n")


def write_output(path: Path, text: str) -> None:
    """Write a file the operator named. Raises OutputError (one line, exit 2)."""
    from gputopo.errors import OutputError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise OutputError(str(path), e) from None
