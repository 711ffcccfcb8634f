"""Proxmox property strings and values: the pieces the file formats share. Pure, no I/O.

* :func:`split_property_string` -- ``a=b,c=d,plain`` as pve-common's ``parse_property_string``
  splits it;
* :func:`encode_text` / :func:`decode_text` -- Proxmox's ``%XX`` escaping of free text;
* the value checks of Proxmox's JSONSchema (``integer``, ``number``, ``boolean``, enumerations),
  worded like Proxmox's own messages: each returns why a value is refused, or None;
* :func:`sha1_digest` -- the ``digest`` Proxmox reports for a config file.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from urllib.parse import quote, unquote

from gputopo.errors import PveFormatError

# A check takes a value as written in a file and returns why Proxmox refuses it, or None.
Check = Callable[[str], str | None]

CONFIGID_RE = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)
NODE_RE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?$")
BOOL01 = {"0", "1"}


def sha1_digest(text: str) -> str:
    """The ``digest`` Proxmox reports for a config file: SHA-1 hex of its raw bytes."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# --- property strings --------------------------------------------------------------------


def split_property_string(text: str, what: str) -> list[tuple[str | None, str]]:
    """Split ``a=b,c=d,plain`` into ``[(key, value)]``; a part without ``=`` has key None.

    Raises PveFormatError on an empty part (``a=1,,b=2``) or an empty key.
    """
    parts: list[tuple[str | None, str]] = []
    for part in text.split(","):
        if part == "":
            raise PveFormatError(what, f"empty element in {text!r}")
        if "=" in part:
            k, v = part.split("=", 1)
            if not k:
                raise PveFormatError(what, f"empty key in {text!r}")
            parts.append((k, v))
        else:
            parts.append((None, part))
    return parts


# --- free text ---------------------------------------------------------------------------

# uri_escape's unsafe set in Proxmox is "^\x20-\x39\x3b-\x7e": printable ASCII but ':' is safe
_TEXT_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if c != 0x3A)


def decode_text(text: str) -> str:
    """Proxmox's ``decode_text``: URI-unescape (``%3A`` -> ``:``), UTF-8."""
    return unquote(text, encoding="utf-8", errors="replace")


def encode_text(text: str) -> str:
    """Proxmox's ``encode_text``: escape control, non-ASCII and ``:`` characters as ``%XX``."""
    return quote(text, safe=_TEXT_SAFE, encoding="utf-8")


# --- JSONSchema value checks --------------------------------------------------------------

_INT_RE = re.compile(r"^[+-]?\d+$")
_NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")


def range_check(kind: str, pattern: re.Pattern, lo: float | None, hi: float | None) -> Check:
    """A checker for JSONSchema's ``integer``/``number`` with optional bounds, worded like Proxmox."""

    def check(v: str) -> str | None:
        if not pattern.match(v):
            return f"type check ('{kind}') failed - got {v!r}"
        n = float(v)
        if lo is not None and n < lo:
            return f"value must have a minimum value of {lo:g}"
        if hi is not None and n > hi:
            return f"value must have a maximum value of {hi:g}"
        return None

    return check


def int_check(lo: int | None = None, hi: int | None = None) -> Check:
    """The check of an ``integer`` between ``lo`` and ``hi`` (inclusive; None = unbounded)."""
    return range_check("integer", _INT_RE, lo, hi)


def number_check(lo: float | None = None, hi: float | None = None) -> Check:
    """The check of a ``number`` between ``lo`` and ``hi`` (inclusive; None = unbounded)."""
    return range_check("number", _NUMBER_RE, lo, hi)


def bool_check(v: str) -> str | None:
    """Why ``v`` is not a Proxmox ``boolean``, or None."""
    # the config parser goes through JSONSchema::parse_boolean
    if v.lower() in ("0", "1", "yes", "no", "on", "off", "true", "false"):
        return None
    return f"type check ('boolean') failed - got {v!r}"


def enum_check(values: set[str]) -> Check:
    """The check of a value that must be one of ``values``."""

    def check(v: str) -> str | None:
        if v in values:
            return None
        return f"value {v!r} does not have a value in the enumeration {', '.join(sorted(values))!r}"

    return check


def string_check(v: str) -> str | None:
    """A free ``string``: every value is accepted."""
    return None
