"""Proxmox's indexed config keys (``hostpciN`` of a VM, ``devN`` of a container) are recognised,
built and ordered only in ``gputopo/formats/`` (``formats.hostpci``: ``is_hostpci_key``,
``hostpci_number``, ``hostpci_key``, ``hostpci_keys``; ``formats.devn``: ``is_devn_key``,
``devn_key``, ``dev_sort``). This scans every other module of the package for a regex of such a
key (``hostpci\\d``, ``dev(?P<n>\\d+)``...), a ``startswith``/``removeprefix`` of its prefix
or a slice compared with it, and code that builds one (an f-string, ``"hostpci" + str(i)``, a
``%`` or ``.format`` template); the scanner itself is tested on planted code so that a scan
finding nothing means something."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = REPO / "gputopo"
FORMATS = PACKAGE / "formats"

# a regex text naming the key: hostpci\d, dev(\d+), hostpci[0-9], (numa|hostpci|net)\d+,
# dev(?P<n>\d+), hostpci(?:\d+) ...
_KEY_REGEX = re.compile(
    r"(?<![\w/])(?:hostpci|dev)(?:\|[^)\s]*)?\)?"
    r"(?:\((?:\?P<\w+>|\?<\w+>|\?:)?)?(?:\\d|\[0-9\]|\[\\d\])"
)
_PREFIXES = ("hostpci", "dev")
# a text ending in the bare prefix, that code completes with a number: "hostpci" + str(i)
_PREFIX_END = re.compile(r"(?:^|[^\w/])(?:hostpci|dev)$")
# a template of the key: "hostpci{}".format(i), "dev%d" % i, "hostpci{n}".format_map(...)
_KEY_TEMPLATE = re.compile(r"(?:^|[^\w/])(?:hostpci|dev)(?:\{[^{}]*\}|%[-+ #0]*\d*[dis])")
# methods that take the prefix off a key or test for it: k.startswith("dev"), k.removeprefix(...)
_PREFIX_METHODS = ("startswith", "removeprefix")


def _names_prefix(node: ast.AST) -> str | None:
    """The prefix ``node`` is (``"hostpci"``) or holds (``("hostpci", "net")``), or None."""
    if isinstance(node, ast.Constant) and node.value in _PREFIXES:
        return node.value
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return next((p for e in node.elts if (p := _names_prefix(e))), None)
    return None


def _is_slice(node: ast.AST) -> bool:
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)


def offences(source: str) -> list[str]:
    """``line: what`` for each place in ``source`` that handles a hostpciN or devN key itself."""
    found: list[str] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and _KEY_REGEX.search(tok.string):
            found.append(f"{tok.start[0]}: key regex {tok.string}")
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _PREFIX_METHODS
            and node.args
            and (prefix := _names_prefix(node.args[0]))
        ):
            found.append(f"{node.lineno}: {node.func.attr}({prefix!r})")
        if isinstance(node, ast.Compare) and any(map(_is_slice, [node.left, *node.comparators])):
            prefix = next(filter(None, map(_names_prefix, [node.left, *node.comparators])), None)
            if prefix:
                found.append(f"{node.lineno}: a slice compared with {prefix!r}")
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Add)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str)
            and _PREFIX_END.search(node.left.value)
        ):
            found.append(f"{node.lineno}: {node.left.value!r} + ... builds a key")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _KEY_TEMPLATE.search(node.value)
        ):
            found.append(f"{node.lineno}: template of a key {node.value!r}")
        if isinstance(node, ast.JoinedStr):
            for part, nxt in zip(node.values, node.values[1:]):
                if (
                    isinstance(part, ast.Constant)
                    and isinstance(nxt, ast.FormattedValue)
                    and _PREFIX_END.search(str(part.value))
                ):
                    found.append(f"{node.lineno}: f-string builds a key after {part.value!r}")
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if FORMATS not in p.parents)


def test_key_helpers_only_in_formats():
    assert len(_modules()) > 100  # the scan sees the package
    bad = {str(p.relative_to(PACKAGE)): off for p in _modules() if (off := offences(p.read_text()))}
    assert not bad, f"use gputopo.formats.hostpci / gputopo.formats.devn instead: {bad}"


@pytest.mark.parametrize(
    "planted",
    [
        'KEY = re.compile(r"^hostpci(\\d+)$")',
        'ok = re.fullmatch(r"hostpci\\d+", k)',
        'ok = re.match(r"^dev\\d+$", key)',
        'ok = re.fullmatch(r"dev[0-9]+", key)',
        'ANY = re.compile(r"^(numa|hostpci|net)\\d+$")',
        'ok = k.startswith("hostpci") and k[7:].isdigit()',
        'ok = any(k.startswith("dev") for k in keys)',
        'key = f"hostpci{i}"',
        'free = [f"dev{i}" for i in range(256)]',
        'key = "hostpci" + str(i)',
        'key = "dev" + str(n)',
        'key = "dev%d" % i',
        'key = "hostpci%s" % (i,)',
        'key = "hostpci{}".format(i)',
        'key = "dev{n}".format(n=i)',
        'ok = k[:7] == "hostpci"',
        'ok = "dev" != key[0:3]',
        'ok = k[:3] in ("dev", "net")',
        'n = int(k.removeprefix("hostpci"))',
        'ok = k.startswith(("hostpci", "net"))',
        'ok = any(k.startswith(["dev", "mp"]) for k in keys)',
        'KEY = re.compile(r"^dev(?P<n>\\d+)$")',
        'KEY = re.compile(r"^hostpci(?:\\d+)$")',
        'KEY = re.compile(r"^hostpci(?<n>\\d+)$")',
        'ok = re.fullmatch(r"dev[\\d]+", k)',
    ],
)
def test_scanner_finds_planted_key_handling(planted):
    assert offences(planted + "\n")


@pytest.mark.parametrize(
    "clean",
    [
        'MINOR = re.compile(r"^/dev/nvidia(\\d+)$")',
        'path = f"/dev/nvidia{minor}"',
        "ok = is_hostpci_key(k) or is_devn_key(k)",
        'ok = text.startswith("/dev/nvidia") or text.startswith("devices")',
        'NET = re.compile(r"^net\\d+$")',
        'msg = f"needs {n} hostpci line(s)"',
        'path = "/dev/" + name',
        'path = "/dev/nvidia%d" % minor',
        'path = "/dev/nvidia{}".format(minor)',
        'path = "/dev/dri/card{n}".format(n=n)',
        'ok = text[:5] == "/dev/"',
        'rest = path.removeprefix("/dev/")',
        'ok = name.startswith(("/dev/nvidia", "/dev/dri"))',
        'msg = "%d hostpci line(s), %s" % (n, dev)',
        'msg = "hostpci lines: {}".format(n)',
        'CARD = re.compile(r"/dev/dri/card(?P<n>\\d+)")',
        'RENDER = re.compile(r"^/dev/dri/renderD(?:\\d+)$")',
        'label = "device" + str(n)',
    ],
)
def test_scanner_leaves_other_code_alone(clean):
    assert offences(clean + "\n") == []


def test_the_helpers():
    from gputopo.formats.devn import devn_key, is_devn_key
    from gputopo.formats.hostpci import (
        hostpci_index,
        hostpci_key,
        hostpci_keys,
        hostpci_number,
        is_hostpci_key,
    )

    assert is_hostpci_key("hostpci0") and is_hostpci_key("hostpci17") and not is_hostpci_key("hostpcix")
    assert not is_hostpci_key("hostpci") and not is_hostpci_key("xhostpci1")
    assert hostpci_number("hostpci17") == 17 and hostpci_index("hostpci17") is None  # past MAX_HOSTPCI
    assert hostpci_keys({"hostpci10": "", "numa0": "", "hostpci2": "", "hostpci0": ""}) == [
        "hostpci0",
        "hostpci2",
        "hostpci10",
    ]
    assert hostpci_key(3) == "hostpci3" and is_hostpci_key(hostpci_key(3))
    assert (
        is_devn_key("dev0")
        and is_devn_key(devn_key(255))
        and not is_devn_key("device")
        and not is_devn_key("dev")
    )
