"""Snapshots capture what discovery reads, and nothing it must not read."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gputopo.errors import RootError, SnapshotError
from gputopo.facts.discover import discover
from gputopo.facts.snapshot import extract, opened_root, snapshot
from gputopo.sim.hostroot import list_hosts


def _facts(root) -> dict:
    d = discover(root).model_dump(by_alias=True)
    d.pop("root")
    return d


@pytest.mark.parametrize("host", list_hosts())
@pytest.mark.slow
def test_snapshot_rediscovers_identically(host, materialized, fast_tmp, tmp_path):
    r = materialized(host)
    out = fast_tmp / f"{host}.tar.gz"
    counts = snapshot(r, out)
    assert counts["pci_functions"] == len(os.listdir(r / "sys/bus/pci/devices"))
    with opened_root(out, tmp_dir=fast_tmp) as x:
        assert _facts(x) == _facts(r)


@pytest.mark.slow
def test_snapshot_keeps_links_and_skips_bars_secrets(fresh_host, tmp_path):
    r = fresh_host("seed")
    dev = (r / "sys/bus/pci/devices/0000:01:00.0").resolve()
    (dev / "resource0").write_bytes(b"\0" * 4096)
    (dev / "rom").write_bytes(b"\x55\xaa")
    (dev / "vpd").write_bytes(b"secret-ish")
    (dev / "config").write_bytes((dev / "config").read_bytes() + b"\x01" * 3840)  # 4 KiB like PCIe
    (r / "proc/4242/fd").mkdir(parents=True)
    (r / "proc/4242/environ").write_text("PASSWORD=hunter2")
    (r / "etc").mkdir(exist_ok=True)
    (r / "etc/shadow").write_text("root:x")
    out = tmp_path / "s.tar.gz"
    snapshot(r, out)
    with tarfile.open(out) as t:
        names = {m.name: m for m in t.getmembers()}
        cfg = t.extractfile(names[os.path.relpath(dev / "config", r)]).read()
    assert len(cfg) == 256
    assert not any(
        n.endswith(("resource0", "/rom", "/vpd", "environ")) or n.startswith(("etc", "proc/4242"))
        for n in names
    )
    link = names["sys/bus/pci/devices/0000:01:00.0"]
    assert link.issym() and link.linkname == "../../../devices/pci0000:00/0000:00:01.1/0000:01:00.0"
    assert names[
        "sys/bus/pci/devices/0000:01:00.0".replace("devices/0000:01:00.0", "drivers/nvidia/0000:01:00.0")
    ].issym()
    assert names["dev/nvidia3"].size == 0
    assert json.loads(t_read(out, "dev/.devices.json"))["nvidia3"] == ["c", 195, 3]
    assert "proc/cmdline" in names and "usr/share/misc/pci.ids" in names


def t_read(tar_path: Path, name: str) -> bytes:
    with tarfile.open(tar_path) as t:
        return t.extractfile(name).read()


def test_extract_refuses_escaping_members(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as t:
        ti = tarfile.TarInfo("sys/bus/pci/devices/x")
        ti.type, ti.linkname = tarfile.SYMTYPE, "../../../../../../etc/passwd"
        t.addfile(ti)
    with pytest.raises(SnapshotError, match="outside"):
        extract(bad, tmp_path / "out")
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar")
    with pytest.raises(SnapshotError) as e:
        extract(junk, tmp_path / "out2")
    assert "\n" not in str(e.value)


def test_snapshot_of_non_root(tmp_path):
    with pytest.raises(RootError):
        snapshot(tmp_path, tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


@pytest.mark.slow
def test_cli_snapshot_then_discover_tarball(materialized, tmp_path):
    from gputopo.cli import cli

    out = tmp_path / "snap.tar.gz"
    res = CliRunner().invoke(cli, ["snapshot", str(out), "--root", str(materialized("esc8000a"))])
    assert res.exit_code == 0, res.output
    assert "PCI functions" in res.output
    res = CliRunner().invoke(cli, ["discover", "--root", str(out), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["root"] == str(out) and len(data["gpus"]) == 4
    x = tmp_path / "x"
    extract(out, x)
    assert _facts(x) == _facts(materialized("esc8000a"))


def test_snapshot_never_opens_bars_rom_or_for_writing(fresh_host, tmp_path, monkeypatch):
    import builtins
    import re

    r = fresh_host("seed")
    for addr in ("0000:01:00.0", "0000:63:00.0"):
        dev = (r / "sys/bus/pci/devices" / addr).resolve()
        for name in ("resource0", "resource1_wc", "rom", "vpd"):
            (dev / name).write_bytes(b"\0" * 64)
    opened: list[tuple[str, str]] = []
    real_open = builtins.open

    def recording_open(path, mode="r", *a, **k):
        opened.append((os.path.realpath(path) if isinstance(path, (str, os.PathLike)) else str(path), mode))
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", recording_open)
    snapshot(r, tmp_path / "s.tar.gz")
    monkeypatch.undo()
    root = str(r.resolve())
    inside = [(p, m) for p, m in opened if p.startswith(root + "/")]
    assert any(p.endswith("/0000:01:00.0/config") for p, _ in inside)  # the recorder sees reads
    assert not [p for p, _ in inside if re.search(r"/(resource\d+(_wc)?|rom|vpd)$", p)]
    assert all(set(m) <= {"r", "b", "t"} for _, m in inside), [x for x in inside if "r" not in x[1]]


@pytest.mark.slow
def test_a_snapshot_carries_its_discovery_and_a_cluster_plan_reads_only_that(
    materialized, tmp_path, monkeypatch
):
    """The first member is discovery's result when the snapshot was taken: the same facts as
    discovering the unpacked tree, read without unpacking it. Another gputopo version's record
    is not trusted: the tree is discovered again."""
    import gputopo
    from gputopo.cluster.gather import load_facts
    from gputopo.facts import snapshot as snapmod

    out = tmp_path / "pve1.tar.gz"
    snapshot(materialized("seed"), out)
    with tarfile.open(out) as t:
        first = t.next()
        assert first.name == ".gputopo-facts.json"
        assert json.loads(t.extractfile(first).read())["gputopo"] == gputopo.__version__

    def data(facts) -> dict:
        return {k: v for k, v in json.loads(facts.to_json()).items() if k != "root"}

    with opened_root(out) as root:
        want = data(discover(root))
    recorded = snapmod.facts_of_snapshot(out)
    assert recorded is not None and data(recorded) == want and recorded.root == str(out)

    discovered = []
    monkeypatch.setattr("gputopo.facts.discover.discover", lambda r: discovered.append(r) or discover(r))
    assert data(load_facts(out)) == want and discovered == []  # nothing unpacked
    monkeypatch.setattr(gputopo, "__version__", "0.0.1")
    assert snapmod.facts_of_snapshot(out) is None
    assert data(load_facts(out)) == want and len(discovered) == 1  # the tree, again
