"""Container configs ``/etc/pve/lxc/<vmid>.conf``. Pure, no I/O.

pve-container's ``parse_pct_config`` / ``write_pct_config``: :func:`parse_lxc_conf`,
:func:`write_lxc_conf`. What Proxmox accepts in one (:func:`validate_lxc_conf`,
:func:`check_lxc_option`) is :mod:`gputopo.formats.lxcrules`; the ``devN`` property string
(:func:`parse_dev_value`, :func:`format_dev_value`) is :mod:`gputopo.formats.lxcdev`. Their
names stay importable from here.

The writer produces byte-for-byte what Proxmox's writer produces for the same data, so a file
gputopo writes does not change when Proxmox next rewrites it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gputopo.errors import PveFormatError
from gputopo.formats.lxcdev import format_dev_value, parse_dev_value
from gputopo.formats.lxcrules import (
    DESCR_KEY_RE,
    LXC_KEY_RE,
    LXC_RAW_RE,
    PENDING_RE,
    SNAP_RE,
    check_lxc_option,
    lxc_raw_key_kept,
    validate_lxc_conf,
)
from gputopo.formats.propstring import decode_text, encode_text

__all__ = [
    "LxcConf",
    "LxcSection",
    "check_lxc_option",
    "format_dev_value",
    "lxc_raw_key_kept",
    "parse_dev_value",
    "parse_lxc_conf",
    "validate_lxc_conf",
    "write_lxc_conf",
]


@dataclass
class LxcSection:
    """One section of a container config: the main one, ``[pve:pending]`` or a snapshot.

    ``options`` keeps the keys in file order (a duplicated key: the last value, first place);
    ``lxc`` the raw ``lxc.*`` lines in order; ``description`` the decoded ``#`` lines and
    ``description:`` values exactly as Proxmox joins them (each ``#`` line ends in ``\\n``).
    """

    options: dict[str, str] = field(default_factory=dict)
    lxc: list[tuple[str, str]] = field(default_factory=list)
    description: str | None = None

    def is_empty(self) -> bool:
        return not self.options and not self.lxc and not self.description


@dataclass
class LxcConf(LxcSection):
    """A parsed container config: the main section plus ``pending`` and ``snapshots``."""

    pending: LxcSection = field(default_factory=LxcSection)
    snapshots: dict[str, LxcSection] = field(default_factory=dict)

    @property
    def pending_delete(self) -> list[str]:
        """Keys queued for deletion in ``[pve:pending]`` (a leading ``!`` = forced is dropped)."""
        raw = self.pending.options.get("delete", "")
        return [k.lstrip("!") for k in re.split(r"[,;\s]+", raw) if k]


# the typed keys ``check_type`` converts while parsing: a boolean to 1/0, an integer to int()
_LXC_BOOLEAN_KEYS = frozenset(("onboot", "template", "console", "protection", "unprivileged", "debug"))
_LXC_INTEGER_KEYS = frozenset(("tty", "cores", "cpuunits", "memory", "swap", "snaptime"))


def _typed_value(key: str, value: str) -> str:
    """``check_type``'s conversion of a boolean or integer key's value; others unchanged (a
    value that fails the check is kept as written, as the non-strict parser keeps it)."""
    if key in _LXC_BOOLEAN_KEYS:
        if value == "1" or re.fullmatch(r"on|yes|true", value, re.IGNORECASE):
            return "1"
        if value == "0" or re.fullmatch(r"off|no|false", value, re.IGNORECASE):
            return "0"
    elif key in _LXC_INTEGER_KEYS and re.fullmatch(r"\d+", value):
        return str(int(value))
    return value


def parse_lxc_conf(text: str) -> LxcConf:
    """Parse a container config the way pve-container's ``parse_pct_config`` does.

    Lenient like Proxmox: lines it cannot parse are skipped (use :func:`validate_lxc_conf` to
    see them), and so are ``lxc.*`` keys Proxmox refuses (:func:`lxc_raw_key_kept`); as Proxmox
    does, ``lxc.environment.runtime`` lines become ``env`` (NUL-separated), boolean and integer
    keys are converted (``yes`` -> ``1``, ``08`` -> ``8``) and the main section's ``snapstate``
    is dropped. Returns the :class:`LxcConf`; raises nothing for any text.
    """
    conf = LxcConf()
    section: LxcSection = conf
    descr = ""

    def close(sec: LxcSection, d: str) -> None:
        if d:
            sec.description = d

    for line in text.split("\n"):
        if re.match(r"^\s*$", line):
            continue
        opened = _open_section(conf, line)
        if opened is not None:
            close(section, descr)
            descr = ""
            section = opened
            continue
        if line.startswith("#"):
            descr += decode_text(line[1:]) + "\n"
            continue
        m = LXC_RAW_RE.match(line)
        if m:
            _add_raw(section, m.group(1), m.group(3))
            continue
        m = DESCR_KEY_RE.match(line)
        if m:
            descr += decode_text(m.group(1))
            continue
        m = re.search(r"snapstate:\s*(prepare|delete)\s*$", line)
        if m:
            section.options["snapstate"] = m.group(1)
            continue
        m = LXC_KEY_RE.match(line)
        if m:
            key = m.group(1)
            if key == "delete" and section is not conf.pending:
                continue  # Proxmox warns and drops it outside [pve:pending]
            section.options[key] = _typed_value(key, m.group(2))
    close(section, descr)
    conf.options.pop("snapstate", None)  # parse_pct_config: delete $res->{snapstate}
    return conf


def _open_section(conf: LxcConf, line: str) -> LxcSection | None:
    """The section ``line`` opens in ``conf`` (``[pve:pending]`` or a snapshot's), or None when
    it is no section header."""
    if PENDING_RE.match(line):
        conf.pending = LxcSection()
        return conf.pending
    m = SNAP_RE.match(line)
    if m:
        conf.snapshots[m.group(1)] = LxcSection()
        return conf.snapshots[m.group(1)]
    return None


def _add_raw(section: LxcSection, key: str, value: str) -> None:
    """Add the raw ``lxc.*`` line ``key`` to ``section`` as parse_pct_config does: the
    ``lxc.environment.runtime`` lines gathered into ``env``, NUL-separated; a key it refuses
    dropped."""
    if key == "lxc.environment.runtime":
        env = section.options.get("env")
        section.options["env"] = value if env is None else f"{env}\0{value}"
    elif lxc_raw_key_kept(key):
        section.lxc.append((key, value))


def _write_section(sec: LxcSection) -> str:
    # Perl's split drops trailing empty fields: "a\n" gives one line, not two
    descr_lines = (sec.description or "").split("\n")
    while descr_lines and descr_lines[-1] == "":
        descr_lines.pop()
    out = ["#" + encode_text(cl) + "\n" for cl in descr_lines]
    for key in sorted(sec.options):
        if key in ("digest", "description", "pending", "snapshots", "snapname", "env", "lxc"):
            continue
        value = sec.options[key]
        if "\n" in str(value):
            raise PveFormatError(key, "detected invalid newline inside property")
        out.append(f"{key}: {value}\n")
    # write_pct_config: ``env`` as lxc.environment.runtime lines, before the other lxc.* lines
    env = re.split("\0+", sec.options.get("env") or "")
    while env and env[-1] == "":
        env.pop()  # Perl's split drops trailing empty fields
    out += [f"lxc.environment.runtime: {v}\n" for v in env]
    for k, v in sec.lxc:
        if k != "lxc.environment.runtime":
            out.append(f"{k}: {v}\n")
    return "".join(out)


def write_lxc_conf(conf: LxcConf) -> str:
    """The text pve-container's ``write_pct_config`` writes for ``conf``.

    Description first as ``#`` lines, then the keys sorted, then ``env`` as
    ``lxc.environment.runtime`` lines, then the raw ``lxc.*`` lines in order; ``[pve:pending]``
    when it holds anything; snapshots sorted by name.
    Raises PveFormatError when a value contains a newline.
    """
    raw = _write_section(conf)
    if not conf.pending.is_empty():
        raw += "\n[pve:pending]\n" + _write_section(conf.pending)
    for name in sorted(conf.snapshots):
        raw += f"\n[{name}]\n" + _write_section(conf.snapshots[name])
    return raw
