"""Write the node package's /usr/share/doc/gputopo/copyright (machine-readable, DEP-5).

    gen-copyright.py TEMPLATE SITE_PACKAGES INSTALLED_SITE OUTPUT

TEMPLATE is packaging/debian/copyright: the header, gputopo's own stanzas and the stand-alone
licence paragraphs they name, with a line ``@BUNDLED@`` where a Files stanza for each distribution
in SITE_PACKAGES (the staged private environment) goes. A stanza names the distribution's files by
their INSTALLED_SITE paths (from its RECORD), its licence (PEP 639's License-Expression, else its
License field, else its licence classifier), the copyright lines of its licence files and their
full text; a licence Debian ships in /usr/share/common-licenses is referred to instead of copied.
A distribution whose licence cannot be named stops the build (exit 1): a new dependency gets a
look before it ships. Run by packaging/build-deb.sh with the standard library only.
"""

from __future__ import annotations

import email.utils
import importlib.metadata as md
import re
import sys
from pathlib import Path

# A licence file that is the full text of one of these is replaced by a pointer to Debian's copy.
COMMON = {
    "Apache-2.0": ("Apache License", "Version 2.0, January 2004"),
    "LGPL-2.1": ("GNU LESSER GENERAL PUBLIC LICENSE", "Version 2.1, February 1999"),
    "MPL-2.0": ("Mozilla Public License Version 2.0",),
    "GPL-2": ("GNU GENERAL PUBLIC LICENSE", "Version 2, June 1991"),
    "GPL-3": ("GNU GENERAL PUBLIC LICENSE", "Version 3, 29 June 2007"),
}
CLASSIFIERS = {  # trove classifier -> SPDX, for distributions that give nothing better
    "License :: OSI Approved :: MIT License": "MIT",
    "License :: OSI Approved :: Apache Software License": "Apache-2.0",
    "License :: OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "License :: OSI Approved :: Python Software Foundation License": "PSF-2.0",
}


def common_licence(text: str) -> str | None:
    head = text[:600]
    for name, marks in COMMON.items():
        if all(m in head for m in marks):
            return name
    return None


def licence_name(dist: md.Distribution, texts: list[str]) -> str | None:
    """The distribution's licence as a DEP-5 License value (SPDX identifiers, 'or'/'and')."""
    meta = dist.metadata
    expression = meta.get("License-Expression")
    if not expression:
        short = (meta.get("License") or "").strip()
        if short and "\n" not in short and len(short) <= 40:
            expression = short
    if not expression:
        classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
        names = {CLASSIFIERS[c] for c in classifiers if c in CLASSIFIERS}
        if "License :: OSI Approved :: BSD License" in classifiers and texts:
            # the classifier does not say which BSD licence; the text does
            names.add("BSD-3-Clause" if "Neither the name" in " ".join(texts) else "BSD-2-Clause")
        if len(names) != 1:
            return None
        (expression,) = names
    expression = re.sub(r"\b([\w.+-]+)-or-later\b", r"\1+", expression)
    return re.sub(r"\s+(OR|AND|WITH)\s+", lambda m: f" {m.group(1).lower()} ", expression)


def copyright_lines(dist: md.Distribution, texts: list[str]) -> list[str]:
    found = []
    for text in texts:
        for line in text.splitlines():
            line = line.strip()
            if re.match(r"(copyright\b|\(c\)|©)", line, re.I) and "<" not in line and line not in found:
                found.append(line)
    if found:
        return found
    # No notice in its licence files: the people its metadata names, as the holders.
    meta = dist.metadata
    people = [meta.get("Author"), meta.get("Maintainer")]
    for field in ("Author-email", "Maintainer-email"):
        people += [name for name, _ in email.utils.getaddresses([meta.get(field) or ""])]
    people = [p.strip() for p in people if p and p.strip()]
    return [
        f"the {meta['Name']} authors: {', '.join(dict.fromkeys(people))}"
        if people
        else f"the {meta['Name']} authors"
    ]


def field(name: str, lines: list[str]) -> str:
    """A deb822 field: the first line after the name, the rest indented, blank lines as ' .'."""
    first, *rest = lines
    out = [f"{name}: {first}".rstrip()]
    out += [f" {line.rstrip()}" if line.strip() else " ." for line in rest]
    return "\n".join(out)


def stanza(dist: md.Distribution, site: Path, installed: str) -> str:
    name, version = dist.metadata["Name"], dist.version
    tops = sorted({f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."})
    patterns = [f"{installed}/{t}/*" if (site / t).is_dir() else f"{installed}/{t}" for t in tops]
    licence_files = sorted(
        p
        for f in dist.files or []
        if (p := site / f).is_file() and re.search(r"\.dist-info/(licen[cs]es/|LICEN|COPYING)", str(f))
    )
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in licence_files]
    licence = licence_name(dist, texts)
    if licence is None:
        sys.exit(
            f"gen-copyright: error: {name} {version}: no licence in its metadata; name it in {Path(__file__).name}"
        )
    body = []
    for path, text in zip(licence_files, texts):
        common = common_licence(text)
        body += ["", f"{path.relative_to(site)}:"]
        if common:
            body.append(f"On Debian systems the complete text is in /usr/share/common-licenses/{common}.")
        else:
            body += ["", *text.strip("\n").splitlines()]
    copyright_texts = [t for t in texts if not common_licence(t)]
    return "\n".join(
        [
            field("Files", [" ".join(patterns)]),
            field("Copyright", copyright_lines(dist, copyright_texts)),
            field("License", [licence, *body[1:]] if body else [licence]),
            f"Comment: {name} {version}, as published on PyPI.",
        ]
    )


def main(argv: list[str]) -> int:
    template, site, installed, output = argv
    site_path = Path(site)
    dists = sorted(md.distributions(path=[site]), key=lambda d: d.metadata["Name"].lower())
    stanzas = [stanza(d, site_path, installed) for d in dists if d.metadata["Name"] != "gputopo"]
    text = Path(template).read_text()
    if text.count("\n@BUNDLED@\n") != 1:
        sys.exit(f"gen-copyright: error: {template} has no line @BUNDLED@")
    Path(output).write_text(text.replace("\n@BUNDLED@\n", "\n" + "\n\n".join(stanzas) + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
