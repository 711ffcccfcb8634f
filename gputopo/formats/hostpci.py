"""The property strings and values of a VM config that PCI passthrough and placement use. Pure.

From qemu-server (``PVE/QemuServer/PCI.pm`` ``$hostpci_fmt``, ``PVE/QemuServer/Memory.pm``
``$numa_fmt``, ``PVE/QemuServer.pm`` ``affinity``/``args``) and pve-common (``CpuSet.pm``
``parse_cpuset``, ``Cmd.pm`` ``split_args``):

* ``hostpciN: [host=]<ids>|mapping=<id>[,pcie=<0|1>][,rombar=<0|1>][,x-vga=<0|1>]...``; ids
  match ``(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\\.[a-f0-9])?`` joined by ``;``: lower
  case only, so ``0000:81:00.0`` is a device and ``0000:81:00.0`` in capitals is a format error
  (the line is then dropped from the config with a warning, and the VM starts without it);
* ``affinity``: a cpuset (``0-3,8``); an empty one passes the API;
* ``numaN: cpus=<id[-id];...>[,hostnodes=<id[-id];...>][,memory=<MiB>][,policy=<bind|...>]``;
* ``args``: split like a shell (``Text::ParseWords::shellwords``), which returns NOTHING for a
  line with an unbalanced quote: QEMU then silently gets none of the arguments.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from gputopo.errors import AddressError, PveFormatError
from gputopo.formats.propstring import CONFIGID_RE, bool_check, split_property_string
from gputopo.model.facts import normalize_address, slot_of

MAX_HOSTPCI = 16  # $MAX_HOSTPCI_DEVICES
MAX_NUMA = 8  # PVE::QemuServer::Memory::$MAX_NUMA
PCIID_RE = re.compile(r"^(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?$")
_HEXID_RE = re.compile(r"^0x[0-9a-fA-F]{4}$")
_BOOL_KEYS = ("pcie", "rombar", "x-vga", "legacy-igd")
_HOSTPCI_KEYS = (
    "host",
    "mapping",
    "rombar",
    "romfile",
    "pcie",
    "x-vga",
    "legacy-igd",
    "mdev",
    "vendor-id",
    "device-id",
    "sub-vendor-id",
    "sub-device-id",
    "driver",
)
_NUMBER_SETS_RE = re.compile(r"^\d+(?:-\d+)?(?:;\d+(?:-\d+)?)*$")
_NUMA_KEYS = ("cpus", "memory", "hostnodes", "policy")
HOSTPCI_KEY = re.compile(r"^hostpci(\d+)$")
NUMA_KEY = re.compile(r"^numa(\d+)$")
FW_CFG_MMIO = "opt/ovmf/X-PciMmio64Mb"
_MMIO_ARG_RE = re.compile(r"name=" + re.escape(FW_CFG_MMIO) + r",string=(\d+)")


def parse_hostpci(value: str) -> dict[str, str]:
    """A ``hostpciN`` value as its properties (``host`` for a leading value without a key).

    Raises PveFormatError for what Proxmox's parser refuses: an unknown key, a bad boolean or
    id, an upper-case or malformed PCI address, a mapping id that is not a ``pve-configid``,
    both or neither of ``host`` and ``mapping``.
    """
    props: dict[str, str] = {}
    for i, (key, val) in enumerate(split_property_string(value, "hostpci")):
        if key is None:
            if i != 0:
                raise PveFormatError("hostpci", f"value without a key in {value!r}")
            key = "host"
        if key not in _HOSTPCI_KEYS:
            raise PveFormatError(f"hostpci {key}", "property is not defined in schema")
        if key in props:
            raise PveFormatError(f"hostpci {key}", "duplicate key in comma-separated list property")
        props[key] = val
    for key in _BOOL_KEYS:
        why = bool_check(props[key]) if key in props else None
        if why:
            raise PveFormatError(f"hostpci {key}", why)
    if "host" in props:
        for pid in props["host"].split(";"):
            if not PCIID_RE.match(pid):
                raise PveFormatError(
                    "hostpci host", f"{pid!r} is not a PCI id (lower-case hex, e.g. 0000:81:00.0)"
                )
    if "mapping" in props and not CONFIGID_RE.match(props["mapping"]):
        raise PveFormatError("hostpci mapping", f"invalid configuration ID {props['mapping']!r}")
    for key in ("vendor-id", "device-id", "sub-vendor-id", "sub-device-id"):
        if key in props and not _HEXID_RE.match(props[key]):
            raise PveFormatError(f"hostpci {key}", f"{props[key]!r} is not a hex id like 0x10de")
    if ("host" in props) == ("mapping" in props):
        raise PveFormatError("hostpci", "either 'host' or 'mapping' must be set, not both")
    return props


def format_hostpci(props: dict[str, str]) -> str:
    """``props`` as a ``hostpciN`` value: ``host`` (keyless) or ``mapping`` first, the rest sorted."""
    head = [props["host"]] if "host" in props else [f"mapping={props['mapping']}"]
    rest = [f"{k}={v}" for k, v in sorted(props.items()) if k not in ("host", "mapping")]
    return ",".join(head + rest)


def hostpci_index(key: str) -> int | None:
    """N of a ``hostpciN`` key below :data:`MAX_HOSTPCI`; None for any other key."""
    n = hostpci_number(key)
    return n if n is not None and n < MAX_HOSTPCI else None


def hostpci_number(key: str) -> int | None:
    """N of any ``hostpciN`` key (no upper bound: a config may hold one Proxmox would refuse);
    None for any other key."""
    m = HOSTPCI_KEY.match(key)
    return int(m.group(1)) if m else None


def is_hostpci_key(key: str) -> bool:
    """True for a ``hostpciN`` key (any N)."""
    return HOSTPCI_KEY.match(key) is not None


def hostpci_key(n: int) -> str:
    """The config key of passthrough line ``n``: ``hostpci<n>``."""
    return f"hostpci{n}"


def hostpci_keys(keys: Iterable[str]) -> list[str]:
    """The ``hostpciN`` keys among ``keys`` (a config dict works), in index order."""
    numbered = sorted((n, k) for k in keys if (n := hostpci_number(k)) is not None)
    return [k for _, k in numbered]


def hostpci_refs(value: str) -> tuple[list[str], str | None]:
    """(host ids, mapping id or None) of a ``hostpciN`` value, read leniently.

    The value is a property string as pve-common's ``parse_property_string`` splits it: items
    ``key=value`` in any order, empty items skipped, one item without ``=`` standing for the
    default key ``host``. ``host`` lists ids joined by ``;``: a function (``81:00.0``,
    ``0000:81:00.0``) comes back normalised (``0000:81:00.0``), a slot (``81:00``: every
    function of the card) as ``0000:81:00`` (compare with :func:`gputopo.model.facts.slot_of`).

    Lenient where :func:`parse_hostpci` is strict: unknown keys and ids that are not PCI
    addresses are ignored, and a value naming both ``host`` and ``mapping`` (Proxmox refuses
    it) returns both, so that a safety check or a picture of a broken host still sees what a
    line names.
    """
    hosts: list[str] = []
    mapping: str | None = None
    for part in value.split(","):
        key, eq, val = part.strip().partition("=")
        if not eq:
            key, val = "host", key
        key = key.strip()
        if key == "mapping" and mapping is None and val.strip():
            mapping = val.strip()
        elif key == "host":
            for text in val.split(";"):
                addr = _pci_ref(text)
                if addr is not None and addr not in hosts:
                    hosts.append(addr)
    return hosts, mapping


def _pci_ref(text: str) -> str | None:
    """``text`` as a normalised function (``0000:81:00.0``) or slot (``0000:81:00``); None when
    it is not a PCI id."""
    text = text.strip()
    if not text:
        return None
    try:
        if "." in text:
            return normalize_address(text)
        return slot_of(normalize_address(text + ".0"))
    except AddressError:
        return None


def parse_cpuset(text: str) -> set[int]:
    """The CPUs of a cpuset (``0-3,8``), as pve-common ``CpuSet::parse_cpuset`` reads it: an
    empty text is an empty set. Raises PveFormatError ("unable to parse cpuset option")."""
    cpus: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if not m:
            if text == "":
                return cpus
            raise PveFormatError("affinity", f"unable to parse cpuset option {text!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise PveFormatError("affinity", f"invalid range: {part} ({hi} < {lo})")
        cpus.update(range(lo, hi + 1))
    return cpus


def parse_numa_node(value: str) -> dict[str, str]:
    """A ``numaN`` value as its properties. Raises PveFormatError for what Proxmox refuses."""
    props: dict[str, str] = {}
    for key, val in split_property_string(value, "numa"):
        key = key or "cpus"
        if key not in _NUMA_KEYS:
            raise PveFormatError(f"numa {key}", "property is not defined in schema")
        if key in props:
            raise PveFormatError(f"numa {key}", "duplicate key in comma-separated list property")
        props[key] = val
    for key in ("cpus", "hostnodes"):
        if key in props and not _NUMBER_SETS_RE.match(props[key]):
            raise PveFormatError(f"numa {key}", f"{props[key]!r} is not a list like 0-3;8")
    if "memory" in props and not re.fullmatch(r"\d+(\.\d+)?", props["memory"]):
        raise PveFormatError("numa memory", f"type check ('number') failed - got {props['memory']!r}")
    if "policy" in props and props["policy"] not in ("preferred", "bind", "interleave"):
        raise PveFormatError(
            "numa policy", f"value {props['policy']!r} is not one of bind, interleave, preferred"
        )
    if "cpus" not in props:
        raise PveFormatError("numa cpus", "property is missing and it is not optional")
    return props


def split_args(text: str) -> list[str]:
    """The arguments QEMU gets from an ``args`` line, split like a shell.

    Raises PveFormatError for an unbalanced quote: Perl's ``shellwords`` then returns an empty
    list and QEMU silently gets none of the arguments.
    """
    try:
        return shlex.split(text)
    except ValueError:
        raise PveFormatError(
            "args", f"unbalanced quote in {text!r}: QEMU would get none of its arguments"
        ) from None


def mmio64_mb(args: str | None) -> int | None:
    """The OVMF 64-bit MMIO window (MiB) an ``args`` line sets with ``-fw_cfg``, or None."""
    if not args:
        return None
    try:
        words = split_args(args)
    except PveFormatError:
        return None
    for flag, value in zip(words, words[1:]):
        if flag == "-fw_cfg":
            m = _MMIO_ARG_RE.fullmatch(value)
            if m:
                return int(m.group(1))
    return None


def with_mmio64_mb(args: str | None, mb: int) -> str:
    """``args`` with its OVMF 64-bit MMIO window set to ``mb`` MiB: an existing setting is
    changed where it stands, otherwise ``-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=<mb>`` is
    appended; every other argument keeps its spelling."""
    entry = f"name={FW_CFG_MMIO},string={mb}"
    if args and _MMIO_ARG_RE.search(args):
        return _MMIO_ARG_RE.sub(entry, args, count=1)
    return f"{args.rstrip()} -fw_cfg {entry}" if args and args.strip() else f"-fw_cfg {entry}"
