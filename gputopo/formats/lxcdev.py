"""A container's ``devN`` values (``/dev/nvidia0,gid=44,mode=0666``): pve-container's
``pve-lxc-dev-string``, parsed and written in Proxmox's canonical order. Pure, no I/O."""

from __future__ import annotations

import re

from gputopo.errors import PveFormatError
from gputopo.formats.propstring import BOOL01, split_property_string

_DEV_KEYS = ("path", "deny-write", "gid", "mode", "uid")
_MODE_RE = re.compile(r"^0[0-7]{3}$")
_UINT_RE = re.compile(r"^\d+$")


def _check_dev_path(path: str) -> str | None:
    """Why ``path`` is not a valid ``pve-lxc-dev-string``, or None when it is."""
    if not path.startswith("/dev/"):
        return f"{path!r} is not a valid device path (must start with /dev/)"
    if re.search(r"/\.\.?/", path) or re.search(r"/\.\.?$", path):
        return f"{path!r} is not a valid device path (no /./ or /../)"
    return None


def parse_dev_value(text: str) -> dict:
    """Parse a ``devN`` value like ``/dev/nvidia0,gid=44,mode=0666``.

    Returns a dict with ``path`` (str) and, when given, ``uid``/``gid`` (int), ``mode`` (str,
    ``0NNN``) and ``deny-write`` (bool). ``path=`` may be spelled out or left implicit.
    Raises PveFormatError for an unknown key, a bad value or a missing path.
    """
    out: dict = {}
    for key, value in split_property_string(text, "dev"):
        if key is None:
            key = "path"
        if key not in _DEV_KEYS:
            raise PveFormatError(f"dev {key}", "property is not defined in schema")
        if key in out:
            raise PveFormatError(f"dev {key}", "duplicate key in comma-separated list property")
        if key == "path":
            why = _check_dev_path(value)
            if why:
                raise PveFormatError("dev path", why)
            out[key] = value
        elif key == "mode":
            if not _MODE_RE.match(value):
                raise PveFormatError(
                    "dev mode", f"value {value!r} does not match the regex pattern 0[0-7]{{3}}"
                )
            out[key] = value
        elif key in ("uid", "gid"):
            if not _UINT_RE.match(value):
                raise PveFormatError(f"dev {key}", f"type check ('integer') failed - got {value!r}")
            out[key] = int(value)
        else:
            if value not in BOOL01:
                raise PveFormatError("dev deny-write", f"type check ('boolean') failed - got {value!r}")
            out[key] = value == "1"
    if "path" not in out:
        raise PveFormatError("dev", f"no device path in {text!r}")
    return out


def format_dev_value(path: str, **opts) -> str:
    """Format a ``devN`` value in Proxmox's canonical order: the path, then the keys sorted.

    Keyword names may use ``_`` for ``-`` (``deny_write=True``); booleans become 0/1, None
    values are left out. Raises PveFormatError for an invalid path, key or value (the result
    always parses back with :func:`parse_dev_value`).
    """
    why = _check_dev_path(path)
    if why:
        raise PveFormatError("dev path", why)
    parts = [path]
    for key in sorted(k.replace("_", "-") for k in opts):
        value = opts.get(key, opts.get(key.replace("-", "_")))
        if value is None:
            continue
        if key not in _DEV_KEYS or key == "path":
            raise PveFormatError(f"dev {key}", "property is not defined in schema")
        if isinstance(value, bool):
            value = int(value)
        parts.append(f"{key}={value}")
    text = ",".join(parts)
    parse_dev_value(text)
    return text
