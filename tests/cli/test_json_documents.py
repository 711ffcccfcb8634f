"""Every JSON document a command prints or writes: it carries ``schema_version``, validates against
``gputopo schema NAME`` (a real JSON Schema validator), its keys have no spaces and file modes
are octal strings. Each document is made by the real command on a simulated host."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gputopo.cli.schema import DOCUMENTS
from helpers.applysim import copy_host, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import run
from helpers.clusterharness import cleanup, copy_cluster, make_template, spec_text

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

BIN = Path(sys.executable).parent
CLUSTER = (
    "cluster-diff",
    "cluster-verify",
    "cluster-apply",
)  # made on a simulated cluster (the test after the first)


def _walk(value, path="$"):
    """(path, key, value) of every key of every object in ``value``."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield path, k, v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")


def check(capsys, name: str, doc: dict) -> None:
    code, out, err = run(capsys, "schema", name)
    assert code == 0, err
    schema = json.loads(out)
    jsonschema.validators.validator_for(schema)(schema).validate(doc)
    # 1, or the document's own version (the saved plan's is 2)
    assert doc.get("schema_version") == schema["properties"]["schema_version"]["const"], name
    assert list(doc)[0] == "schema_version", name
    for path, key, value in _walk(doc):
        assert not re.search(r"\s", key), f"{name}: key {key!r} at {path} has a space"
        if key == "mode" and value is not None:
            assert isinstance(value, str) and re.fullmatch(r"0[0-7]{3}|[0-7]{4}", value), (name, path, value)


def _json(capsys, *argv) -> dict:
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def sim(template, tmp_path):
    return copy_host(template, tmp_path / "sim")


def test_every_document_validates_against_its_schema(capsys, sim, tmp_path):
    s, root = str(sim.dir), str(sim.paths.root)
    spec = tmp_path / "s.yaml"
    spec.write_text(seed_spec_text(sim))
    made = {}
    made["facts"] = _json(capsys, "discover", "--root", root, "--json")
    made["topo"] = _json(capsys, "topo", "--sim", s, "--json")
    made["plan"] = _json(capsys, "plan", "--sim", s, "--spec", str(spec), "--json")
    assert made["plan"]["summary"]["counts"]["rebind"] == 4
    saved = tmp_path / "plan.json"
    run(capsys, "plan", "--sim", s, "--spec", str(spec), "-o", str(saved))
    made["saved-plan"] = json.loads(saved.read_text())
    # show prints the saved plan's document as plan --json printed it
    assert _json(capsys, "show", str(saved), "--json") == made["plan"]
    write = [a for a in made["saved-plan"]["plan"]["actions"] if a["kind"] == "write_host_file"]
    assert write and all(a["mode"] == "0644" for a in write)
    made["diff"] = _json(capsys, "diff", "--sim", s, "--spec", str(spec), "--json")
    made["render-manifest"] = _render(capsys, s, spec, tmp_path / "out")
    made["snapshot"] = _json(capsys, "snapshot", str(tmp_path / "snap"), "--root", root, "--json")
    assert made["snapshot"]["path"] == str(tmp_path / "snap") + ".tar.gz"
    code, out, err = run(capsys, "apply", str(saved), "--sim", s, "--yes", "--json")
    assert code == 0, err
    made["apply"] = json.loads(out)
    assert made["apply"]["status"] == "applied" and len(made["apply"]["steps"]) == 12
    assert made["apply"]["verify"]["ok"] is True and made["apply"]["boot"]["ran"] is False
    assert all(st["seconds"] >= 0 and st["kind"] for st in made["apply"]["steps"])
    assert "[12/12] start" in err  # the steps went to stderr
    made["verify"] = _json(capsys, "verify", "--sim", s, "--spec", str(spec), "--json")
    recover = _json(capsys, "recover", "--sim", s, "--json")
    assert recover["status"] == "nothing-to-recover"
    check(capsys, "apply", recover)
    made["history"] = _json(capsys, "history", "--sim", s, "--json")
    made["history-entry"] = _json(capsys, "history", "--sim", s, "show", "last", "--json")
    made["sim-serve"] = _serve(tmp_path / "served")
    # a refused apply says so in the same document, with its exit code
    code, out, _ = run(capsys, "apply", str(saved), "--sim", s, "--yes", "--json")
    assert code == 2 and json.loads(out)["status"] == "error" and json.loads(out)["exit_code"] == 2
    check(capsys, "apply", json.loads(out))
    assert set(made) | set(CLUSTER) == set(DOCUMENTS), "a document without a test"
    from gputopo.cli.schema import NAMES

    assert NAMES == ["spec", *DOCUMENTS]
    for name, doc in made.items():
        check(capsys, name, doc)


@pytest.fixture
def sim_cluster(tmp_path):
    template = make_template()
    c = copy_cluster(template, tmp_path / "cluster")
    try:
        yield c
    finally:
        c.stop()
        cleanup(template.parent)


def test_the_cluster_documents_validate_and_hold_each_nodes_diff_document(capsys, sim_cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sim_cluster, split=["pve1", "pve2"], whole=["pve3"]))
    s = str(sim_cluster.dir)
    made = {"cluster-diff": _json(capsys, "cluster", "diff", "--sim", s, "--spec", str(spec), "--json")}
    code, out, err = run(capsys, "cluster", "verify", "--sim", s, "--spec", str(spec), "--json")
    assert code == 1, err  # not converged: the plan has actions
    made["cluster-verify"] = json.loads(out)
    code, out, err = run(
        capsys, "cluster", "apply", "--yes", "--no-verify", "--sim", s, "--spec", str(spec), "--json"
    )
    assert code == 0, err
    made["cluster-apply"] = json.loads(out)
    assert [(n["node"], n["outcome"]) for n in made["cluster-apply"]["nodes"]] == [
        ("pve1", "applied-and-kept"),
        ("pve2", "applied-and-kept"),
        ("pve3", "applied-and-kept"),
    ]
    # each node's entry holds the document ``gputopo apply --json`` printed on that node
    for entry in made["cluster-apply"]["nodes"]:
        check(capsys, "apply", entry["apply"])
    assert set(made) == set(CLUSTER)
    for name, doc in made.items():
        check(capsys, name, doc)
    diff = made["cluster-diff"]
    assert not diff["is_empty"] and diff["ha"] and diff["ha_files"]
    assert [n["node"] for n in diff["nodes"]] == ["pve1", "pve2", "pve3"]
    # each node's entry is the document ``gputopo diff --json`` prints on that node
    for entry in diff["nodes"]:
        check(capsys, "diff", {"schema_version": 1, **entry})
    assert diff["nodes"][0]["areas"]["driver_bindings"]["title"] == "driver bindings"
    converged = {c["name"]: c for c in made["cluster-verify"]["checks"]}["converged"]
    assert converged["status"] == "FAIL"
    assert [n["node"] for n in made["cluster-verify"]["nodes"]] == ["pve1", "pve2", "pve3"]


def _render(capsys, s, spec, out: Path) -> dict:
    code, _, err = run(capsys, "render", "--sim", s, "--spec", str(spec), "--out", str(out))
    assert code == 0, err
    return json.loads((out / ".gputopo-render.json").read_text())


def _serve(d: Path) -> dict:
    p = subprocess.Popen(
        [str(BIN / "gputopo"), "sim", "serve", "--dir", str(d), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = p.stdout.readline()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    doc = json.loads(line)
    for key in ("password_file", "token_secret_file"):
        assert os.stat(doc[key]).st_mode & 0o777 == 0o600
        secret = Path(doc[key]).read_text().strip()
        assert len(secret) > 8 and secret not in line  # the files hold the secrets; the line names them
    return doc


def test_the_documents_module_stays_light():
    """print_json loads gputopo.model.documents for every --json command: it must not pull in the
    planner or jinja2 (a diff document's file changes are described there, not imported)."""
    import subprocess
    import sys

    probe = (
        "import sys\nimport gputopo.model.documents\n"
        "print(sorted(m for m in ('jinja2', 'gputopo.plan.planner', 'gputopo.plan.diff') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
