"""Parameter formats of the simulated API, checked as Proxmox's JSONSchema checks them.

Each format returns the converted value or raises ValueError with Proxmox's message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gputopo.formats.pcicfg import map_entry_problems

# Container options by type: the wire takes 0/1 for booleans, a config answer types both.
INT_KEYS = {"cores", "memory", "swap", "cpuunits", "tty", "snaptime"}
BOOL_KEYS = {"onboot", "unprivileged", "protection", "console", "template", "debug"}


def fmt_int(v: Any) -> int:
    if isinstance(v, bool) or not re.match(r"^[+-]?\d+$", str(v)):
        raise ValueError(f"type check ('integer') failed - got '{v}'")
    return int(v)


def fmt_vmid(v: Any) -> int:
    n = fmt_int(v)
    if n < 100:
        raise ValueError("value must have a minimum value of 100")
    return n


def fmt_bool(v: Any) -> bool:
    if v is True or v is False:
        return v
    if str(v) in ("0", "1"):
        return str(v) == "1"
    raise ValueError(f"type check ('boolean') failed - got '{v}'")


def fmt_node(v: Any) -> str:
    if not re.match(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?$", str(v)):
        raise ValueError("invalid format - value does not look like a valid node name\n")
    return str(v)


def fmt_configid(v: Any) -> str:
    if not re.match(r"^[a-z][a-z0-9_-]+$", str(v), re.IGNORECASE):
        raise ValueError(f"invalid format - invalid configuration ID '{v}'\n")
    return str(v)


def fmt_configid_list(v: Any) -> list[str]:
    items = [x for x in re.split(r"[,;\s]+", ",".join(v) if isinstance(v, list) else str(v)) if x]
    for x in items:
        fmt_configid(x.lstrip("!"))
    return items


def fmt_string(max_len: int | None = None) -> Callable[[Any], str]:
    def f(v: Any) -> str:
        if isinstance(v, list):
            raise ValueError("type check ('string') failed - got ARRAY")
        if max_len is not None and len(str(v)) > max_len:
            raise ValueError(f"value may only be {max_len} characters long")
        return str(v)

    return f


def fmt_string_array(v: Any) -> list[str]:
    """An array of strings (repeated form fields); a single value is an array of one."""
    return [str(x) for x in (v if isinstance(v, list) else [v])]


def fmt_enum(*values: str) -> Callable[[Any], str]:
    def f(v: Any) -> str:
        if str(v) not in values:
            raise ValueError(f"value '{v}' does not have a value in the enumeration '{', '.join(values)}'")
        return str(v)

    return f


class ItemErrors(ValueError):
    """Errors of an array parameter's items, keyed ``<name>[<i>]`` (JS:check_prop)."""

    def __init__(self, errors: dict[int, str]):
        super().__init__("; ".join(errors.values()))
        self.by_index = errors


def fmt_map_array(v: Any) -> list[str]:
    # a single scalar is an array of one (RH:$normalize_legacy_param_formats)
    items = v if isinstance(v, list) else [v]
    errs = {}
    for i, item in enumerate(items):
        problems = map_entry_problems(str(item))
        if problems:
            errs[i] = "invalid format - format error\n" + "".join(f"map[{i}].{p}\n" for p in problems)
    if errs:
        raise ItemErrors(errs)
    return [str(x) for x in items]


@dataclass(frozen=True)
class P:
    """A parameter: its format and whether it may be left out."""

    fmt: Callable[[Any], Any]
    optional: bool = True


NODE = P(fmt_node, False)
VMID = P(fmt_vmid, False)
DIGEST = P(fmt_string(64))


def perl_str(v: Any) -> Any:
    """A JSON value as Perl's ``ne`` sees it: numbers and booleans compare as their text."""
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v) if isinstance(v, (int, float)) else v
