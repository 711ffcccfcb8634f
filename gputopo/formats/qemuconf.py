"""VM configs ``/etc/pve/qemu-server/<vmid>.conf``. Pure, no I/O.

qemu-server's ``parse_vm_config`` / ``write_vm_config`` (``PVE/QemuServer.pm``):

* lines ``key: value``, keys matching ``^([a-z][a-z_\\-]*\\d*):\\s*(.+?)\\s*$``; ``args:`` is
  taken verbatim; a value the schema refuses is dropped with a warning (the VM then starts
  without it), so a bad ``hostpciN`` is a device the VM silently does not get;
* ``#`` lines (before any section) are the description; ``[PENDING]`` starts the pending
  changes (``delete:`` only there), ``[special:cloudinit]`` a special section, ``[name]`` a
  snapshot;
* the writer puts the description first as ``#`` lines, then every key sorted, then
  ``[PENDING]``, the special sections and the snapshots, each after a blank line.

:func:`validate_qemu_conf` adds what qemu-server only finds when the VM starts (``PCI.pm``
``parse_hostpci_devices``, ``Memory.pm`` ``config``, the ``taskset`` of ``affinity``,
``print_hostpci_devices``' x-vga): gputopo checks a config with it before writing one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gputopo.errors import PveFormatError
from gputopo.formats.hostpci import (
    HOSTPCI_KEY,
    MAX_NUMA,
    NUMA_KEY,
    parse_cpuset,
    parse_hostpci,
    parse_numa_node,
    split_args,
)
from gputopo.formats.propstring import bool_check, decode_text, encode_text, enum_check, int_check

_KEY_RE = re.compile(r"^([a-z][a-z_\-]*\d*):\s*(.+?)\s*$")
_ARGS_RE = re.compile(r"^(args):\s*(.*\S)\s*$")
_MACHINE_RE = re.compile(
    r"^(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?"
    r"|virt(?:-\d+(\.\d+)+)?(\+pve\d+)?)$"
)

# the keys gputopo reads or writes and their checks (the rest of qemu-server's schema is not
# gputopo's to judge: an unknown key is left alone)
CHECKS = {
    "bios": enum_check({"seabios", "ovmf"}),
    "numa": bool_check,
    "hugepages": enum_check({"any", "2", "1024"}),
    "sockets": int_check(1),
    "cores": int_check(1),
    "agent": None,  # a property string whose default key is a boolean: checked below
}


@dataclass
class QemuConf:
    """A parsed VM config: the main keys, the description, ``[PENDING]`` (with its ``delete``),
    special sections and snapshots (name -> keys), and what Proxmox's parser would drop."""

    options: dict[str, str] = field(default_factory=dict)
    description: str | None = None
    pending: dict[str, str] = field(default_factory=dict)
    special: dict[str, dict[str, str]] = field(default_factory=dict)
    snapshots: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def pending_delete(self) -> list[str]:
        return [k.lstrip("!") for k in re.split(r"[,;\s]+", self.pending.get("delete", "")) if k]


def parse_qemu_conf(text: str) -> QemuConf:
    """Parse VM config text as qemu-server's non-strict parser does (``QemuServer.pm``
    ``parse_vm_config``). Never raises: a line it would warn about and skip is recorded in
    ``problems``.

    Like Proxmox: ``#`` lines and ``description:`` values belong to the section they are in
    (the main one's is :attr:`QemuConf.description`, another section's its ``description`` key),
    with trailing whitespace removed; a repeated section replaces the earlier one; a main
    ``snapstate`` is dropped.
    """
    conf = QemuConf()
    section: dict[str, str] | None = conf.options
    name = ""
    descr: str | None = None
    seen_pending = False

    def finish() -> None:
        # parse_vm_config's $finish_description: the text so far belongs to the section it
        # was read in, trailing whitespace removed
        nonlocal descr
        if descr is not None and section is not None:
            if section is conf.options:
                conf.description = descr.rstrip()
            else:
                section["description"] = descr.rstrip()
        descr = None

    for line in text.split("\n"):
        if not line.strip():
            continue
        m = re.match(r"^\[(.*)\]\s*$", line)
        if m:
            finish()
            section, name = _open_section(conf, m.group(1), seen_pending)
            seen_pending = seen_pending or name == "pending"
            continue
        if section is None:
            continue
        if line.startswith("#"):
            descr = (descr or "") + decode_text(line[1:]) + "\n"
            continue
        dm = re.match(r"^description:\s*(.*\S)\s*$", line)
        if dm:
            descr = (descr or "") + decode_text(dm.group(1))
            continue
        sm = re.search(r"snapstate:\s*(prepare|delete)\s*$", line)
        if sm:
            section["snapstate"] = sm.group(1)
            continue
        setting = _setting(line, name == "pending", conf.problems)
        if setting is not None:
            section[setting[0]] = setting[1]
    finish()
    conf.options.pop("snapstate", None)  # parse_vm_config: delete $res->{snapstate}
    return conf


def _open_section(conf: QemuConf, head: str, seen_pending: bool) -> tuple[dict[str, str] | None, str]:
    """(the section the header ``[head]`` opens in ``conf``, its name): ``[PENDING]``, a
    ``special:`` section or a snapshot, each replacing one of the same name (with a problem);
    None for a header qemu-server skips. ``seen_pending``: a ``[PENDING]`` was read before."""
    if head.upper() == "PENDING":
        if seen_pending:
            conf.problems.append("duplicate section: pending")
        conf.pending = {}
        return conf.pending, "pending"
    if re.fullmatch(r"special:(cloudinit|fleecing)", head, re.IGNORECASE):
        kind = head[8:]
        if kind in conf.special:
            conf.problems.append(f"duplicate special section: {kind}")
        conf.special[kind] = {}
        return conf.special[kind], head
    if re.fullmatch(r"[a-z][a-z0-9_\-]+", head, re.IGNORECASE):
        if head in conf.snapshots:
            conf.problems.append(f"duplicate snapshot section: {head}")
        conf.snapshots[head] = {}
        return conf.snapshots[head], head
    conf.problems.append(f"skipping unknown section: '{head}'")
    return None, head


def _setting(line: str, in_pending: bool, problems: list[str]) -> tuple[str, str] | None:
    """(key, value) of a setting line; None, with a problem, for a line qemu-server skips."""
    km = _ARGS_RE.match(line) or _KEY_RE.match(line)
    if not km:
        problems.append(f"unable to parse config: {line}")
        return None
    key, value = km.group(1), km.group(2)
    if key == "delete" and not in_pending:
        problems.append("property 'delete' is only allowed in [PENDING]")
        return None
    return key, value


def write_qemu_conf(conf: QemuConf) -> str:
    """The file text qemu-server writes for ``conf`` (``write_vm_config``): in each section its
    description as ``#`` lines, then every key sorted. Raises PveFormatError for a value with a
    line break (Proxmox refuses one)."""

    def descr_lines(descr: str | None, pending: bool = False) -> str:
        if descr is None:
            return ""
        if not descr:
            return "#\n" if pending else ""
        lines = descr.split("\n")
        while lines and lines[-1] == "":
            lines.pop()  # Perl's split drops trailing empty fields
        return "".join(f"#{encode_text(line)}\n" for line in lines)

    def block(keys: dict[str, str], pending: bool = False) -> str:
        out = descr_lines(keys.get("description"), pending)
        for k in sorted(keys):
            if k == "description":
                continue
            v = str(keys[k])
            if "\n" in v or "\r" in v:
                raise PveFormatError(k, "property contains a line feed")
            out += f"{k}: {v}\n"
        return out

    # a description set as a key (an API change) is the main section's newer one
    raw = descr_lines(conf.options.get("description", conf.description))
    raw += block({k: v for k, v in conf.options.items() if k not in ("description", "snapstate")})
    if conf.pending:
        raw += "\n[PENDING]\n" + block(conf.pending, pending=True)
    for name in sorted(conf.special):
        raw += f"\n[special:{name}]\n" + block(conf.special[name])
    for name in sorted(conf.snapshots):
        raw += f"\n[{name}]\n" + block(conf.snapshots[name])
    return raw


def check_qemu_option(key: str, value: str) -> str | None:
    """Why qemu-server's config parser refuses ``value`` for ``key`` (it then drops the line),
    or None. Keys gputopo does not write are not judged."""
    try:
        if HOSTPCI_KEY.match(key):
            parse_hostpci(value)
        elif NUMA_KEY.match(key) and int(key[4:]) < MAX_NUMA:
            parse_numa_node(value)
        elif key == "affinity":
            parse_cpuset(value)
        elif key == "machine":
            mtype = dict(p.split("=", 1) if "=" in p else ("type", p) for p in value.split(",")).get(
                "type", ""
            )
            if mtype and not _MACHINE_RE.match(mtype):
                return f"machine type {mtype!r} is not one qemu-server knows"
        elif key == "agent":
            first = value.split(",")[0]
            return bool_check(first.split("=", 1)[1] if first.startswith("enabled=") else first)
        elif CHECKS.get(key) is not None:
            return CHECKS[key](value)  # type: ignore[misc]
    except PveFormatError as e:
        return str(e)
    return None


def is_q35(options: dict[str, str]) -> bool:
    """True when the ``machine`` is q35 (``Machine.pm`` ``machine_type_is_q35``); the default
    machine (none set) is i440fx."""
    first = options.get("machine", "").split(",")[0]
    mtype = first.split("=", 1)[1] if first.startswith("type=") else first
    return "q35" in mtype


def memory_mib(options: dict[str, str]) -> int:
    """The VM's memory in MiB (``memory: 4096`` or ``memory: current=4096``; default 512)."""
    value = options.get("memory")
    if not value:
        return 512
    first = value.split(",")[0]
    return int(first.split("=", 1)[1] if first.startswith("current=") else first)


def start_problems(options: dict[str, str]) -> list[str]:
    """What qemu-server refuses only when the VM starts, for a config's main keys."""
    problems = []
    q35 = is_q35(options)
    ovmf = options.get("bios") == "ovmf"
    for key, value in sorted(options.items()):
        if not HOSTPCI_KEY.match(key):
            continue
        try:
            props = parse_hostpci(value)
        except PveFormatError:
            continue  # a format problem, reported as such
        if props.get("pcie") in ("1", "on", "yes", "true") and not q35:
            problems.append(
                f"{key}: pcie=1 needs machine q35 (this VM is i440fx): the start fails with "
                "'q35 machine model is not enabled'"
            )
        if props.get("x-vga") in ("1", "on", "yes", "true") and ovmf:
            problems.append(
                f"{key}: x-vga=1 is dropped with bios ovmf (qemu-server passes it to SeaBIOS only)"
            )
    if "affinity" in options and not options["affinity"].strip():
        problems.append("affinity is empty: taskset fails and the VM does not start")
    if "args" in options:
        try:
            split_args(options["args"])
        except PveFormatError as e:
            problems.append(str(e))
    numa = options.get("numa") in ("1", "on", "yes", "true")
    if options.get("hugepages") and not numa:
        problems.append(
            "hugepages needs numa: 1 (the start fails with 'numa needs to be enabled to use hugepages')"
        )
    nodes = {k: v for k, v in options.items() if NUMA_KEY.match(k) and int(k[4:]) < MAX_NUMA}
    total = 0.0
    for key, value in sorted(nodes.items()):
        try:
            props = parse_numa_node(value)
        except PveFormatError:
            continue
        if "memory" not in props:
            problems.append(f"{key}: missing NUMA node memory value")
        total += float(props.get("memory", 0))
        if "hostnodes" in props and "policy" not in props:
            problems.append(f"{key}: hostnodes need a policy")
        if options.get("hugepages") and "hostnodes" not in props:
            problems.append(f"{key}: numa hostnodes need to be defined to use hugepages")
    if numa and nodes and total and total != memory_mib(options):
        problems.append(
            f"total memory for NUMA nodes ({total:g}) must be equal to vm static memory "
            f"({memory_mib(options)})"
        )
    return problems


def validate_qemu_conf(text: str, allow_description: bool = True, at_start: bool = True) -> list[str]:
    """Every problem Proxmox would have with VM config ``text``: lines its parser skips, values it
    drops, and (``at_start``: for a whole config) what fails only at VM start. One line each;
    [] when it would take it as is."""
    conf = parse_qemu_conf(text)
    problems = list(conf.problems)
    if conf.description is not None and not allow_description:
        problems.append("'#' lines are the VM's description to Proxmox, not comments")
    for key, value in sorted(conf.options.items()):
        why = check_qemu_option(key, value)
        if why:
            problems.append(f"unable to parse value of '{key}' - {why}")
    return problems + (start_problems(conf.options) if at_start else [])
