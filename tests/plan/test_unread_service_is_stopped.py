"""A service the current state cannot see still stops before its GPUs move. Over ``--api-url``
from a machine without ``pct`` (the API has no exec into a container) the running container's
service is not read; the spec from ``init`` with ``service.command`` set (as its comment says)
plans the same stop and restart as ``--sim``, which reads it, and the apply over the API (``pct``
of the simulated node) completes the split and verifies."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from gputopo.adapters.pct import PctExec
from gputopo.cli.connect import Connection, build_ports
from gputopo.plan.spec import load_spec
from gputopo.sim.nodecli import install_tools
from gputopo.usecases.apply import apply
from gputopo.usecases.verify import verify
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)
from helpers.cli import run

pytestmark = pytest.mark.slow  # the simulated host's API over HTTPS, and an apply on it

COMMAND = "python3 -m sglang.launch_server --model-path /models/m --tp 4"


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-apiurl-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    h.start()
    yield h
    h.stop()
    applysim.cleanup(base)


def _actions(out: str) -> list[str]:
    return re.findall(r"^\s+\d+\. (.*)$", out, re.M)


def test_the_api_plan_stops_the_service_it_cannot_read_and_the_split_verifies(
    host, tmp_path, capsys, monkeypatch
):
    spec = tmp_path / "spec.yaml"
    code, out, err = run(capsys, "init", "--sim", str(host.dir), "-o", str(spec))
    assert code == 0, out + err
    text = spec.read_text()
    assert f"# command: {COMMAND}" in text
    spec.write_text(text.replace(f"# command: {COMMAND}", f"command: {COMMAND}"))
    password = host.credentials()["password"]
    monkeypatch.setenv("GPUTOPO_PVE_PASSWORD", password)
    monkeypatch.setenv("PATH", str(tmp_path / "no-pct"))  # no pct: the service cannot be read
    api = ["--root", str(host.paths.root), "--api-url", host.url, "--ca-bundle", str(host.api.ca_cert_path)]
    code, out, err = run(capsys, "plan", *api, "--spec", str(spec))
    assert code == 0, out + err
    over_api = _actions(out)
    assert "[stop] CT 101: stop sglang.service" in over_api, out
    assert "1 service restart" in out, out
    code, out, err = run(capsys, "plan", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 0, out + err
    assert over_api == _actions(out)

    # the apply over the API, with the node's pct (the simulated node's); the kernel is the
    # simulated one, reached in this process
    sim_ports = host.ports()
    conn = Connection(api_url=host.url, node=host.node, ca_bundle=str(host.api.ca_cert_path))
    ports = build_ports(conn, env={"GPUTOPO_PVE_PASSWORD": password})
    pct = install_tools(tmp_path / "bin", host.dir) / "pct"
    ports.exec = PctExec(pct=str(pct))
    ports.sysfs, ports.files, ports.http = sim_ports.sysfs, sim_ports.files, sim_ports.http
    loaded = load_spec(str(spec))
    res = apply(loaded, ports, root=str(host.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    assert res.status == "applied"
    assert "stop_service" in [a.kind for a in res.plan.actions]
    report = verify(loaded, ports, root=str(host.paths.root))
    assert report.ok, report.to_text()
