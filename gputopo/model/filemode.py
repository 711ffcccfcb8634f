"""A file's permission bits as data: an ``int`` in Python, an octal string (``"0644"``) in JSON.

JSON has no octal numbers, so a mode written as a number reads as 420 instead of 0644; every
JSON document gputopo writes (a plan, a journal, a render manifest) carries modes as strings.
Reading accepts both, so journals written before stay readable.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_OCTAL = re.compile(r"^0?[0-7]{3,4}$")


def parse_mode(value: Any) -> Any:
    """``"0644"`` -> 0o644; an int is kept (validation checks it). Raises ValueError for a
    string that is not 3 or 4 octal digits."""
    if isinstance(value, str):
        if not _OCTAL.match(value):
            raise ValueError(f'a file mode such as "0644" expected (got {value!r})')
        return int(value, 8)
    return value


def format_mode(mode: int) -> str:
    """0o644 -> ``"0644"``."""
    return f"{mode:04o}"


FileMode = Annotated[
    int,
    BeforeValidator(parse_mode),
    PlainSerializer(format_mode, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": r"^[0-7]{4}$", "description": "octal permission bits"}),
]
