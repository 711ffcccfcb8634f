"""BAR sizes from sysfs ``resource``: the kernel's format (drivers/pci/pci-sysfs.c
``resource_show``), discovery, and the fixtures' files as the real lspci reads them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gputopo.facts.bars import format_size, parse_resource
from gputopo.facts.discover import discover

# A 96 GB RTX PRO 6000 Blackwell with resizable BAR on, as resource_show prints it: BAR0 32-bit,
# BAR1 128 GiB and BAR3 32 MiB 64-bit prefetchable, BAR5 I/O, the ROM; lines 7-12 (SR-IOV) empty.
REAL = (
    "0x00000000f4000000 0x00000000f7ffffff 0x0000000000040200\n"
    "0x0000020000000000 0x0000021fffffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000022000000000 0x0000022001ffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x000000000000e000 0x000000000000e07f 0x0000000000040101\n"
    "0x00000000f8000000 0x00000000f807ffff 0x0000000000046200\n"
    + "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    * 6
)


def test_parse_resource_sizes_kinds_and_flags():
    bars = parse_resource(REAL)
    assert [(b.index, b.kind, b.prefetchable, format_size(b.size)) for b in bars] == [
        (0, "mem32", False, "64M"),
        (1, "mem64", True, "128G"),
        (3, "mem64", True, "32M"),
        (5, "io", False, "128"),
        (6, "rom", True, "512K"),
    ]
    assert bars[1].start == 0x20000000000 and bars[1].size == 128 << 30
    assert bars[1].flags == 0x14220C


@pytest.mark.parametrize("text", [None, "", "garbage\n", "0x0 0x0\n"])
def test_parse_resource_unreadable_is_empty(text):
    assert parse_resource(text) == []


def test_parse_resource_stops_at_a_broken_line():
    text = REAL.splitlines(keepends=True)
    assert [b.index for b in parse_resource(text[0] + "0xzz 0x1 0x200\n" + "".join(text[1:]))] == [0]


def test_discovery_reads_the_seed_gpus_128_gib_bar(materialized):
    facts = discover(materialized("seed"))
    for g in facts.gpus:
        big = [b for b in g.bars if b.kind == "mem64" and b.size == 128 << 30]
        assert len(big) == 1 and big[0].index == 1 and big[0].prefetchable, g.address
        assert sum(b.size for b in g.bars if b.kind == "mem64") == (128 << 30) + (32 << 20)


LSPCI = shutil.which("lspci")


@pytest.mark.skipif(LSPCI is None, reason="lspci (pciutils) is not installed")
def test_lspci_reads_the_fixture_bars_like_a_real_card(materialized):
    root = materialized("seed")
    out = subprocess.run(
        [LSPCI, "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", "-v", "-s", "81:00.0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "(64-bit, prefetchable) [size=128G]" in out
    assert "(64-bit, prefetchable) [size=32M]" in out
    assert "(32-bit, non-prefetchable) [size=64M]" in out
    assert "Expansion ROM at" in out and "[size=512K]" in out
