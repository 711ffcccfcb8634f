"""The pictures as a person sees them: drawn by a real headless Chromium into PNGs.

Chromium (Debian's ``chromium`` package) is started by the test with a fresh profile and
screenshots each picture shown 1600 px wide (narrower ones at their own size). The PNG must have
that size, must not be blank, and must show every GPU box where the SVG put it, filled with its
owner's colour and with text in it. Without Chromium the tests skip, saying so; with
``GPUTOPO_REQUIRE_CHROMIUM=1`` (CI) they fail instead.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gputopo.topo import palette
from helpers.topo_pictures import all_pictures, boxes, parse, shown_size, size

pytestmark = pytest.mark.slow  # a real headless Chromium draws every picture; the full run only

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRE = os.environ.get("GPUTOPO_REQUIRE_CHROMIUM") == "1"
VIEW_WIDTH = 1600
NAMES = [
    "esc8000a",
    "esc8000a-all",
    "iommu-off",
    "large",
    "numa-unknown",
    "seed",
    "shared-group",
    "seed-split",
    "large-split",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    if CHROMIUM is None:
        if REQUIRE:
            pytest.fail("GPUTOPO_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium): pictures not checked in a browser")
    return CHROMIUM


@pytest.fixture(scope="module")
def pictures(materialized):
    return {p.name: p for p in all_pictures(materialized)}


def screenshot(
    browser: str, svg: str, workdir: Path, view_width: int = VIEW_WIDTH, own_size: bool = False
) -> tuple[Path, float, int]:
    """Show ``svg`` in a page ``view_width`` wide and screenshot it: (png, the scale from the
    drawing's coordinates to the screenshot's pixels, page height). The picture is shown at the
    size it asks for, made narrower to fit the page; ``own_size``: as the browser shows it
    unasked (an <img> without a size), which is what a README or a review tool does."""
    workdir.mkdir(parents=True)
    (workdir / "picture.svg").write_text(svg)
    w, h = size(parse(svg))
    sw, sh = shown_size(parse(svg))
    fit = 1.0 if own_size else min(1.0, view_width / sw)
    scale = sw * fit / w
    height = math.ceil(sh * fit)
    style = "display:block" if own_size else f"display:block;width:{sw * fit:.2f}px;height:{sh * fit:.2f}px"
    (workdir / "page.html").write_text(
        '<!DOCTYPE html><html><body style="margin:0;background:#ffffff">'
        f'<img src="picture.svg" style="{style}">'
        "</body></html>"
    )
    png = workdir / "shot.png"
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={workdir / 'profile'}",
        f"--screenshot={png}",
        f"--window-size={view_width},{height}",
        (workdir / "page.html").as_uri(),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert png.is_file(), f"chromium wrote no screenshot (rc {res.returncode}): {res.stderr[-2000:]}"
    return png, scale, height


def _near(a: tuple[int, ...], b: str, tol: int = 14) -> bool:
    want = tuple(int(b[i : i + 2], 16) for i in (1, 3, 5))
    return all(abs(x - y) <= tol for x, y in zip(a[:3], want))


@pytest.mark.parametrize("name", NAMES)
def test_picture_in_chromium(chromium, pictures, tmp_path, name):
    from PIL import Image

    pic = pictures[name]
    png, scale, height = screenshot(chromium, pic.svg, tmp_path / name)
    img = Image.open(png).convert("RGB")
    assert img.size == (VIEW_WIDTH, height)
    px = img.load()
    root = parse(pic.svg)
    shown = int(size(root)[0] * scale)
    # not blank: a good share of the picture's pixels is drawn on (boxes, text, lines) ...
    step = 4
    sample = [px[x, y] for x in range(0, shown, step) for y in range(0, img.height, step)]
    inked = sum(1 for p in sample if min(p) < 250)
    assert inked / len(sample) > 0.2, f"{name}: only {inked} of {len(sample)} sampled pixels drawn"
    # ... and nothing beyond it
    assert all(
        px[x, y] == (255, 255, 255) for x in range(shown + 2, img.width, 16) for y in range(0, img.height, 16)
    )
    colours = {}
    for g, rect, (x, y, w, h) in boxes(root):
        if g.get("class") != "gpu":
            continue
        colours.setdefault(g.get("data-owner"), rect.get("fill"))
        # the box's fill, inside its bottom-right corner (below the text, clear of the outline)
        cx, cy = int((x + w - 7) * scale), int((y + h - 3.5) * scale)
        assert _near(px[cx, cy], rect.get("fill")), (
            name,
            g.get("data-address"),
            px[cx, cy],
            rect.get("fill"),
        )
        # text is drawn in it: dark pixels inside the box
        dark = sum(
            1
            for yy in range(int(y * scale) + 3, int((y + h) * scale) - 3)
            for xx in range(int(x * scale) + 3, int((x + w) * scale) - 3, 2)
            if sum(px[xx, yy]) < 300
        )
        assert dark > 40, (name, g.get("data-address"), dark)
    # every owner is there (a before/after picture also has the owners the plan replaces)
    keys = set(pic.owner_keys().values())
    assert keys <= set(colours)
    assert pic.sides == 2 or set(colours) == keys
    assert len(set(colours.values())) == len(colours)  # each owner its own colour
    assert all(
        c in {p.fill for p in (*palette.CONTAINERS, *palette.VMS, palette.FREE)} for c in colours.values()
    )


@pytest.mark.parametrize("name", ["seed-split", "large-split"])
def test_a_plan_picture_fits_1400_px_as_chromium_shows_it(chromium, pictures, tmp_path, name):
    """Shown as the browser shows it unasked, in a window wider than 1400 px: nothing is drawn
    at x >= 1400 and the drawing reaches its right margin (it is shown smaller, not cut), every
    GPU box where the picture's own scale puts it, in its owner's colour."""
    from PIL import Image

    pic = pictures[name]
    root = parse(pic.svg)
    assert size(root)[0] > 1400  # drawn wider than it is shown
    png, scale, height = screenshot(chromium, pic.svg, tmp_path / name, view_width=1800, own_size=True)
    img = Image.open(png).convert("RGB")
    px = img.load()
    inked = [x for x in range(img.width) if any(min(px[x, y]) < 250 for y in range(0, height, 2))]
    assert max(inked) < 1400, f"{name}: drawn out to x = {max(inked)}"
    # shown smaller, not cut: the rightmost box's outline is drawn where the scale puts it
    right = max(x + w for _, _, (x, _, w, _) in boxes(root)) * scale
    assert max(inked) >= right - 3, f"{name}: drawn to x = {max(inked)}, box at {right}"
    for g, rect, (x, y, w, h) in boxes(root):
        if g.get("class") == "gpu":
            cx, cy = int((x + w - 7) * scale), int((y + h - 3.5) * scale)
            assert _near(px[cx, cy], rect.get("fill")), (name, g.get("data-address"), px[cx, cy])
