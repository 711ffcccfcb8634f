"""The README's words for the demo's memory figures are the figures the demo prints: nvidia-smi
and verify speak MiB, and a GiB figure in the text is the same amount divided by 1024, not by
1000 (79,043 MiB is 77.2 GiB, not 79)."""

from __future__ import annotations

import re

from helpers import REPO

FIGURES = re.compile(r"about (\d+) of ([\d.]+) GiB per GPU \(([\d,]+) of ([\d,]+) MiB\)")


def _mib(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_demos_memory_in_gib_is_its_mib_over_1024():
    readme = " ".join((REPO / "README.md").read_text().split())
    m = FIGURES.search(readme)
    assert m, "the README says how much memory the demo's GPUs use, in GiB and MiB"
    used_gib, total_gib, used_mib, total_mib = int(m[1]), float(m[2]), _mib(m[3]), _mib(m[4])
    assert round(used_mib / 1024) == used_gib
    assert round(total_mib / 1024, 1) == total_gib
    # and the MiB figures are the ones the demo's excerpt shows (verify's memory row, nvidia-smi)
    assert f"used {used_mib}/" in readme and f"of {total_mib} MiB" in readme
