"""The README stays a ten-minute read and the documentation holds together: the README is at most
:data:`README_MAX_LINES` lines, every relative link in it and in ``docs/*.md`` names a file that
exists (and, with ``#anchor``, a heading of that file), and the README links every ``docs/*.md``
page, so none is left where no reader finds it."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from helpers import REPO

README_MAX_LINES = 260
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans, where a ``[x](y)`` is not a link."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _links(path: Path) -> list[str]:
    """The targets of the Markdown links and images in ``path``'s prose."""
    return LINK.findall(_prose(path.read_text()))


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every heading anchor of the Markdown file ``path`` (a repeated heading gets ``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        slug = _slug(m[1])
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_the_readme_is_short():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail to a docs/ page"


@pytest.mark.parametrize("page", [REPO / "README.md", *PAGES], ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_points_at_something_that_exists(page: Path):
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file of the checkout
            continue
        file, _, anchor = unquote(target).partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.name}: {target}: no such file"
        if anchor:
            assert dest.suffix == ".md", f"{page.name}: {target}: an anchor into a file that is not Markdown"
            assert anchor in _anchors(dest), f"{page.name}: {target}: no such heading in {dest.name}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / unquote(t).partition("#")[0]).resolve() for t in _links(REPO / "README.md")}
    assert PAGES
    for page in PAGES:
        assert page.resolve() in linked, f"README.md does not link docs/{page.name}"


def test_the_anchor_rule_is_githubs():
    assert _slug("the same by hand: plan --commands") == "the-same-by-hand-plan---commands"
    assert _slug("spec, plan, render, diff") == "spec-plan-render-diff"
    assert _slug("`gputopo.sim` (simulated host)") == "gputoposim-simulated-host"
