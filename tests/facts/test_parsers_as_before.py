"""The parsers on discovery's path do without regular expressions, enum and itertools (importing
re costs discovery's start-up more than discovery itself): each must accept and give exactly
what it did with them, for any text."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.errors import AddressError, InputError
from gputopo.facts.discover import parse_gpu_match
from gputopo.facts.host import _natural
from gputopo.facts.names import parse_pci_ids
from gputopo.model.facts import canonical_address, normalize_address

_ADDR_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$"
)

# thousands of generated cases each (hypothesis): out of the one-minute loop
pytestmark = pytest.mark.slow


def address_by_regex(text: str) -> str | None:
    m = _ADDR_RE.match(text.strip())
    if not m or int(m.group("dev"), 16) > 0x1F:
        return None
    domain = int(m.group("domain") or "0", 16)
    return f"{domain:04x}:{int(m.group('bus'), 16):02x}:{int(m.group('dev'), 16):02x}.{m.group('fn')}"


ADDRESS_PARTS = st.text("0123456789abcdefABCDEF:.g \n\t٣", max_size=16)


@given(text=ADDRESS_PARTS | st.text(max_size=16))
@settings(max_examples=2000, deadline=None)
def test_an_address_is_read_as_its_regular_expression_read_it(text):
    want = address_by_regex(text)
    assert canonical_address(text) == want
    if want is None:
        with pytest.raises(AddressError):
            normalize_address(text)
    else:
        assert normalize_address(text) == want


def test_address_spellings():
    assert normalize_address(" 00000000:2A:00.0\n") == "0000:2a:00.0"
    assert normalize_address("2a:1f.7") == "0000:2a:1f.7"
    assert normalize_address("10000:00:01.0") == "10000:00:01.0"
    for bad in (
        "2a:20.0",
        "2a:00.8",
        "123456789:00:00.0",
        "0000:2a:00",
        "0000:2a::00.0",
        "٣:00.0",
        "+1:00.0",
    ):
        assert canonical_address(bad) is None, bad


def gpu_match_by_regex(text: str):
    vendor, _, klass = text.strip().partition(":")
    out = []
    for part, what in ((vendor, "vendor"), (klass, "class prefix")):
        part = part.strip().lower()
        if not part:
            out.append(None)
            continue
        digits = part[2:] if part.startswith("0x") else part
        if not re.fullmatch(r"[0-9a-f]{1,6}", digits):
            return InputError
        out.append("0x" + (digits.zfill(4) if what == "vendor" else digits))
    return out[0], out[1]


@given(text=st.text("0123456789abcdefABCDEFxX: \n_+٣", max_size=12) | st.text(max_size=12))
@settings(max_examples=1000, deadline=None)
def test_gpu_match_is_read_as_its_regular_expression_read_it(text):
    want = gpu_match_by_regex(text)
    if want is InputError:
        with pytest.raises(InputError):
            parse_gpu_match(text)
    else:
        assert parse_gpu_match(text) == want


def pci_ids_by_regex(text, wanted):
    """parse_pci_ids as it was: a regular expression ends a vendor's block."""
    data = text.encode() if isinstance(text, str) else text
    end = len(data)
    names = {}
    for vendor in sorted({v for v, _ in wanted}):
        key = vendor.encode()
        if data.startswith(key):
            start = 0
        else:
            start = data.find(b"\n" + key, 0, end) + 1
            if start == 0:
                continue
        nxt = re.compile(rb"\n[^\t#\n]").search(data, start, end)
        block = data[start : nxt.start() if nxt else end].decode("utf-8", "replace")
        for line in block.split("\n")[1:]:
            if line[:1] == "\t" and line[1:2] != "\t":
                did = line[1:5].lower()
                if (vendor, did) in wanted:
                    names[(vendor, did)] = line[5:].strip()
    return names


IDS = st.sampled_from(["10de", "8086", "1a03", "2bb5", "2BB5", "2Bb5", "ffff", "10", "1", ""])
LINE = st.one_of(
    st.tuples(IDS, st.text(" ÿé\r[]x", max_size=5)).map(lambda t: f"{t[0]}  {t[1]}"),  # a vendor
    st.tuples(IDS, st.text(" é\rA", max_size=5)).map(lambda t: f"\t{t[0]}  {t[1]}"),  # a device
    st.tuples(IDS, IDS).map(lambda t: f"\t\t{t[0]} {t[1]}  sub"),  # a subsystem
    st.sampled_from(["", "# comment", "C 03  Display", "\t00  VGA", " 10de", "#10de", "\t\t", "\t"]),
)


@given(
    lines=st.lists(LINE, max_size=30),
    wanted=st.sets(st.tuples(IDS, IDS), max_size=6),
    as_bytes=st.booleans(),
    tail=st.sampled_from(["", "\n", "\n\n"]),
)
@settings(max_examples=1500, deadline=None)
def test_pci_ids_names_are_what_the_regular_expression_found(lines, wanted, as_bytes, tail):
    text = "\n".join(lines) + tail
    db = text.encode() if as_bytes else text
    assert parse_pci_ids(db, wanted) == pci_ids_by_regex(db, wanted)


def test_pci_ids_blocks_longer_than_a_stretch():
    devices = "".join(f"\t{i:04x}  device {i}\n\t\t8086 0001  sub\n# note\n\n" for i in range(6000))
    db = f"10de  NVIDIA\n{devices}8086  Intel\n\t1521  I350\n\t{5999:04x}  not NVIDIA's\n"
    wanted = {("10de", "0000"), ("10de", f"{5999:04x}"), ("8086", "1521"), ("8086", "0000")}
    assert parse_pci_ids(db, wanted) == pci_ids_by_regex(db, wanted)
    assert parse_pci_ids(db.encode(), wanted)[("10de", f"{5999:04x}")] == "device 5999"


def natural_by_groupby(s: str) -> list | type:
    try:
        return [int("".join(g)) if digits else "".join(g) for digits, g in itertools.groupby(s, str.isdigit)]
    except ValueError:
        return ValueError


@given(text=st.text("ab09٣²x", max_size=12) | st.text(max_size=8))
@settings(max_examples=1000, deadline=None)
def test_the_natural_sort_key_is_what_groupby_made(text):
    try:
        got = _natural(text)
    except ValueError:
        got = ValueError
    assert got == natural_by_groupby(text)
