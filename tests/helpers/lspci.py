"""The real pciutils ``lspci`` pointed at a built fixture tree, and parsers of its output."""

from __future__ import annotations

import re
import shutil
import subprocess

LSPCI = shutil.which("lspci")

LINE_RE = re.compile(
    r"^(?P<addr>[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) .*?\[(?P<cls>[0-9a-f]{4})\]: "
    r".*\[(?P<ven>[0-9a-f]{4}):(?P<dev>[0-9a-f]{4})\]"
)
TOKEN_RE = re.compile(
    r"\[(?P<hdr>[0-9a-f]{4,}:[0-9a-f]{2})\]"
    r"|(?P<df>[0-9a-f]{2}\.[0-7])(?:-\[(?P<sec>[0-9a-f]{2})(?:-[0-9a-f]{2})?\])?"
)


def lspci(root, *args: str) -> str:
    return subprocess.run(
        [LSPCI, "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def parse_lspci_nn(text: str) -> dict[str, tuple[str, str, str]]:
    """``lspci -D -nn`` -> {address: (vendor, device, class-subclass)}."""
    out = {}
    for line in text.splitlines():
        m = LINE_RE.match(line)
        assert m, line
        out[m["addr"]] = (m["ven"], m["dev"], m["cls"])
    return out


def parse_lspci_tree(text: str) -> dict[str, str | None]:
    """``lspci -t`` -> {address: parent bridge address or None on a root bus}.

    Children of a bridge start right after it on its line, and later siblings sit in the same
    column on following lines, so a column remembers which bus its devices are on.
    """
    parents: dict[str, str | None] = {}
    column: dict[int, tuple[str, str, str | None]] = {}  # col -> (domain, bus, parent)
    for line in text.splitlines():
        ctx = None
        for m in TOKEN_RE.finditer(line):
            if m["hdr"]:
                dom, bus = m["hdr"].split(":")
                ctx = (dom, bus, None)
                continue
            col = m.start("df")
            if ctx is None:
                ctx = column[col]
            column[col] = ctx
            dom, bus, parent = ctx
            addr = f"{dom}:{bus}:{m['df']}"
            parents[addr] = parent
            ctx = (dom, m["sec"], addr) if m["sec"] else None
    return parents
