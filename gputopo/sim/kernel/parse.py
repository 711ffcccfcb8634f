"""What userspace writes to PCI sysfs attributes and reads back, parsed as the kernel does."""

from __future__ import annotations


def parse_hex_attr(text: str) -> int | None:
    """``"0x10de\\n"`` -> 0x10de; None for text that is not a hex number."""
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def parse_id_fields(text: str, limit: int) -> list[int]:
    """The leading hex fields of a new_id/remove_id write, as the kernel's sscanf("%x ...")
    reads them: parsing stops at the first field that is not hex; at most ``limit`` fields."""
    out: list[int] = []
    for tok in text.split():
        if len(out) == limit:
            break
        try:
            out.append(int(tok, 16))
        except ValueError:
            break
    return out


def parse_kstrtoul(text: str) -> int | None:
    """The kernel's ``kstrtoul(s, 0, &v)``: one optional trailing newline, an optional ``+``, a
    ``0x`` (hex) or ``0`` (octal) prefix, no spaces; None where the kernel returns -EINVAL."""
    body = text[:-1] if text.endswith("\n") else text
    body = body[1:] if body.startswith("+") else body
    digits, allowed, base = body, "0123456789", 10
    if body[:2].lower() == "0x":
        digits, allowed, base = body[2:], "0123456789abcdefABCDEF", 16
    elif body.startswith("0") and len(body) > 1:
        digits, allowed, base = body[1:], "01234567", 8
    if not digits or any(c not in allowed for c in digits):
        return None
    return int(digits, base)


def parse_override(text: str) -> str | None:
    """The value of a ``driver_override`` attribute as read back; None for ``(null)``."""
    value = text.strip()
    return None if value in ("", "(null)") else value


def bus_name(value: str) -> str:
    """A device name written to ``bind``/``unbind``/``drivers_probe``: bus_find_device_by_name
    uses sysfs_streq, so one trailing newline is ignored, nothing else."""
    return value[:-1] if value.endswith("\n") else value
