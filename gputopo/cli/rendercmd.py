"""``gputopo render --out DIR``: the files a plan stands for, in a directory gputopo keeps a
manifest of.

``DIR/.gputopo-render.json`` (``gputopo schema render-manifest``) lists every file this command
wrote there with its SHA-256 and mode. A later render replaces its own files, removes those of
its own it no longer renders, and never touches anyone else's: a file that is not in the
manifest, or one of ours that was edited since, is refused (``--force`` replaces it) and is
never removed. Everything is checked before anything is written.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gputopo.cli.connect import Connection
from gputopo.cli.inputs import TEMPLATES_HELP, source_of, spec_options, state_options
from gputopo.exitcodes import with_exit_codes

MANIFEST = ".gputopo-render.json"


def _digest(data: bytes) -> str:
    import hashlib  # here, not at the top: --help imports this module

    return hashlib.sha256(data).hexdigest()


def _sha(path: Path) -> str | None:
    try:
        return _digest(path.read_bytes())
    except OSError:
        return None


def read_manifest(out: Path) -> dict[str, dict]:
    """The files the manifest in ``out`` lists (relative path -> sha256, mode); {} when none.
    Raises OutputError for a manifest that is not gputopo's (a human must look at it)."""
    from gputopo.errors import OutputError
    from gputopo.model.documents import RenderManifest

    path = out / MANIFEST
    if not path.exists():
        return {}
    try:
        doc = RenderManifest.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise OutputError(
            str(path), OSError(0, f"not a gputopo render manifest ({str(e).splitlines()[0]})")
        ) from None
    return {rel: f.model_dump() for rel, f in doc.files.items()}


def plan_writes(
    out: Path, files: dict[str, str], old: dict[str, dict], force: bool
) -> tuple[list[str], list[tuple[str, str]]]:
    """(stale files of ours to remove, (path, why) of each file refused). A file in the way is
    refused unless ``force``: it is not ours, or ours but edited since it was written."""
    refused: list[tuple[str, str]] = []
    for rel in sorted(files):
        dest = out / rel
        if not dest.exists() or force:
            continue
        mine = old.get(rel)
        if mine is None:
            refused.append((str(dest), "not written by render; pass --force to replace it"))
        elif _sha(dest) != mine["sha256"] and _sha(dest) != _digest(files[rel].encode()):
            refused.append((str(dest), "edited since render wrote it; pass --force to replace it"))
    stale = [rel for rel in sorted(old) if rel not in files]
    return stale, refused


@click.command()
@spec_options
@state_options
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="Directory to write the files to."
)
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None, help=TEMPLATES_HELP)
@click.option(
    "--force",
    is_flag=True,
    help="Replace files in the way that render did not write (or that were "
    "edited since); files that are not render's are still never removed.",
)
@with_exit_codes("render")
def render(conn: Connection, out, templates, force, **quick):
    """Write the files the plan stands for under --out, with a manifest of them; files of an
    earlier render that the plan no longer has are removed, anyone else's are left alone."""
    from gputopo.cli.output import print_refused, warn, write_output
    from gputopo.errors import OutputExists, PlanRefused
    from gputopo.model.documents import ManifestFile, RenderManifest
    from gputopo.usecases.render import RenderRequest
    from gputopo.usecases.render import render as render_files

    outdir = Path(out)
    old = read_manifest(outdir)
    try:
        files = render_files(RenderRequest(conn, source_of(quick), templates))
    except PlanRefused as e:
        print_refused(e)
        sys.exit(e.exit_code)
    stale, refused = plan_writes(outdir, files, old, force)
    if refused:
        path, why = refused[0]
        raise OutputExists(
            path, why + (f" (+{len(refused) - 1} more file(s) in the way)" if len(refused) > 1 else "")
        )
    written: dict[str, ManifestFile] = {}
    for rel, text in sorted(files.items()):
        dest = outdir / rel
        write_output(dest, text)
        written[rel] = ManifestFile(
            sha256=_digest(text.encode()), mode=f"{os.stat(dest).st_mode & 0o7777:04o}"
        )
        click.echo(str(dest))
    for rel in stale:
        dest = outdir / rel
        if not dest.exists():
            continue
        if _sha(dest) != old[rel]["sha256"]:
            warn(f"{dest}: no longer rendered, but edited since render wrote it: left in place")
            continue
        dest.unlink()
        click.echo(f"removed {dest} (no longer rendered)")
    doc = RenderManifest(files=written)
    write_output(outdir / MANIFEST, doc.model_dump_json(indent=2) + "\n")
