"""What ``systemctl show`` prints and a process's ``/proc/<pid>/cmdline``, parsed. Pure.

``systemctl show -p A -p B UNIT`` prints ``Key=value`` lines; ``ExecStart`` reads
``{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m x --tp 8 ; ignore_errors=no ; ... }``
(systemd's bus_print_property for exec commands).
"""

from __future__ import annotations

import re

_ARGV = re.compile(r"argv\[\]=(.*?) ;")


def parse_show_properties(text: str) -> dict[str, str]:
    """``systemctl show`` output (``Key=value`` lines) as a dict (the first of a key wins)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key not in out:
            out[key] = value
    return out


def exec_start_command(value: str) -> str | None:
    """The command of an ``ExecStart`` property value: its ``argv[]`` part; None when it has none
    (or several commands, as after a reset: the last one wins)."""
    command = None
    for m in _ARGV.finditer(value):
        command = m.group(1).strip()
    return command


def parse_systemctl_show(text: str) -> tuple[bool, str | None]:
    """(active, exec_start command) from ``systemctl show -p ActiveState -p ExecStart UNIT``;
    activating and reloading count as active."""
    return show_state(parse_show_properties(text))


def show_state(props: dict[str, str]) -> tuple[bool, str | None]:
    """(active, exec_start command) of ``systemctl show`` properties already parsed."""
    active = props.get("ActiveState", "").strip() in ("active", "reloading", "activating")
    return active, exec_start_command(props.get("ExecStart", ""))


def parse_cmdline(raw: bytes | str) -> str | None:
    """``/proc/<pid>/cmdline`` (NUL-separated arguments) as one space-joined line; None when empty."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    words = [w for w in text.split("\0") if w]
    return " ".join(words) or None
