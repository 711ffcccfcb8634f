"""Files are never overwritten silently: ``init -o``, ``export -o``, ``plan -o`` and ``snapshot``
refuse an existing file without ``--force``; ``snapshot NAME`` writes ``NAME.tar.gz``; ``render
--out DIR`` keeps a manifest of the files it wrote, replaces and removes only those, and never
touches anyone else's."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile

import pytest

from gputopo.facts.discover import discover
from gputopo.plan.starter import init_spec
from helpers.cli import one_line, run

COMMAND = "          # command: python3 -m sglang.launch_server --model-path /models/m --tp 4"


@pytest.fixture
def seed(materialized):
    return materialized("seed")


@pytest.fixture
def spec(seed, tmp_path):
    text = init_spec(discover(str(seed)))
    assert COMMAND in text
    p = tmp_path / "spec.yaml"
    # a service whose command is known: its drop-in is rendered too
    p.write_text(
        text.replace(COMMAND, "          command: python3 -m sglang.launch_server --model-path /m --tp 8")
    )
    return p


def _render(capsys, seed, spec, out, *extra):
    return run(
        capsys,
        "render",
        "--root",
        str(seed),
        "--pve-root",
        str(out.parent / "no-pve"),
        "--spec",
        str(spec),
        "--out",
        str(out),
        *extra,
    )


DROPIN = "ct/101/etc/systemd/system/sglang.service.d/gputopo.conf"


def test_render_keeps_a_manifest_and_removes_only_its_own_stale_files(capsys, seed, spec, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    code, stdout, err = _render(capsys, seed, spec, out)
    assert code == 0, err
    manifest = json.loads((out / ".gputopo-render.json").read_text())
    assert manifest["schema_version"] == 1 and manifest["kind"] == "gputopo-render-manifest"
    assert DROPIN in manifest["files"] and "notes.txt" not in manifest["files"]
    for rel, f in manifest["files"].items():
        assert f["sha256"] == hashlib.sha256((out / rel).read_bytes()).hexdigest()
        assert f["mode"] == f"{os.stat(out / rel).st_mode & 0o7777:04o}"
    # the service is no longer managed: its drop-in is stale and goes; the pci.cfg was edited and stays
    no_service = tmp_path / "s2.yaml"
    text = spec.read_text()
    start = text.index("        service:\n")
    end = text.index("    vms:\n")
    no_service.write_text(text[:start] + text[end:])
    (out / "pve/mapping/pci.cfg").write_text("edited by hand\n")
    rendered = set(manifest["files"])
    code, stdout, err = _render(capsys, seed, no_service, out)
    assert code == 2, err
    assert one_line(err) == (
        f"gputopo: error: {out / 'pve/mapping/pci.cfg'}: exists; edited since render wrote "
        "it; pass --force to replace it"
    )
    assert (out / DROPIN).exists() and json.loads((out / ".gputopo-render.json").read_text()) == manifest
    code, stdout, err = _render(capsys, seed, no_service, out, "--force")
    assert code == 0, err
    assert f"removed {out / DROPIN} (no longer rendered)" in stdout and not (out / DROPIN).exists()
    assert (out / "notes.txt").read_text() == "mine\n"
    assert set(json.loads((out / ".gputopo-render.json").read_text())["files"]) == rendered - {DROPIN}


def test_render_refuses_a_file_in_the_way_that_it_did_not_write(capsys, seed, spec, tmp_path):
    out = tmp_path / "out"
    theirs = out / "pve/mapping/pci.cfg"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("someone's\n")
    code, _, err = _render(capsys, seed, spec, out)
    assert code == 2
    assert (
        one_line(err)
        == f"gputopo: error: {theirs}: exists; not written by render; pass --force to replace it"
    )
    assert theirs.read_text() == "someone's\n" and sorted(p.name for p in out.rglob("*") if p.is_file()) == [
        "pci.cfg"
    ]


def test_an_edited_stale_file_is_left_in_place_with_a_warning(capsys, seed, spec, tmp_path):
    out = tmp_path / "out"
    assert _render(capsys, seed, spec, out)[0] == 0
    (out / DROPIN).write_text("[Service]\n# edited\n")
    no_service = tmp_path / "s2.yaml"
    text = spec.read_text()
    no_service.write_text(text[: text.index("        service:\n")] + text[text.index("    vms:\n") :])
    code, _, err = _render(capsys, seed, no_service, out)
    assert code == 0, err
    assert f"gputopo: warning: {out / DROPIN}: no longer rendered, but edited since render wrote it" in err
    assert (out / DROPIN).read_text() == "[Service]\n# edited\n"


@pytest.mark.slow
def test_snapshot_names_its_archive_and_refuses_an_existing_one(capsys, seed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "snapshot", "pve1", "--root", str(seed))
    assert code == 0, err
    assert out.startswith("wrote pve1.tar.gz: ") and tarfile.is_tarfile(tmp_path / "pve1.tar.gz")
    size = (tmp_path / "pve1.tar.gz").stat().st_size
    code, _, err = run(capsys, "snapshot", "pve1", "--root", str(seed))
    assert code == 2 and one_line(err) == "gputopo: error: pve1.tar.gz: exists; pass --force to replace it"
    assert (tmp_path / "pve1.tar.gz").stat().st_size == size
    assert run(capsys, "snapshot", "pve1.tar.gz", "--root", str(seed), "--force")[0] == 0
    assert run(capsys, "snapshot", "b.tgz", "--root", str(seed))[0] == 0 and (tmp_path / "b.tgz").is_file()


def test_init_refuses_an_existing_file_without_force(capsys, seed, tmp_path):
    out = tmp_path / "gputopo.yaml"
    out.write_text("my spec\n")
    code, _, err = run(capsys, "init", "--root", str(seed), "-o", str(out))
    assert code == 2 and one_line(err) == f"gputopo: error: {out}: exists; pass --force to replace it"
    assert out.read_text() == "my spec\n"
    code, _, err = run(capsys, "init", "--root", str(seed), "-o", str(out), "--force")
    assert code == 0 and out.read_text().startswith("# gputopo spec")
