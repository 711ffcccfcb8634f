"""The same host gives the same plan on every path. For each scenario on one simulated host,
``plan --json``'s actions and signature are equal whether the state is read through ``--sim``,
over ``--api-url`` against ``gputopo sim serve`` (from a machine without ``pct``), with
``--local`` (the simulated node's ``pvesh`` and ``pct`` on PATH) or from Proxmox's files
(``--root`` with ``--pve-root``); or the path that cannot see something says so.

What a path provably cannot see, and how its plan says so:

* over ``--api-url`` without ``pct``, and from the files, the service's running command is not
  read: ``current_tp`` is null (the spec's ``service.command`` gives the command to plan with;
  without it the API path refuses, and the files' plan leaves the drop-in out and warns);
* quick mode over both cannot look for the unit inside the container: the service is not
  managed (the container restarts instead), and a warning says so;
* the files do not say whether a guest runs: a VM that uses a changing mapping is stopped and
  started again in case it runs, and a warning says why.

With ``-s`` the test prints the outcome of each cell as a markdown table; ``GPUTOPO_PATH_TABLE``
names a file to write it to as well.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from gputopo.sim import state
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.sim.nodecli import install_tools
from helpers import applysim
from helpers.cli import run

pytestmark = pytest.mark.slow  # a server, and pvesh/pct, in their own processes

COMMAND = "python3 -m sglang.launch_server --model-path /models/m --tp 4"
QUICK = ["--container", "101", "--vm-mapping", "pro6000-vm"]
PATHS = ("sim", "api", "local", "files")
SCENARIOS = (
    "split",
    "split, no command",
    "reverse",
    "vm consumer",
    "ha",
    "quick numa",
    "quick half",
    "quick auto",
)
FILES_UNKNOWN = "stopped and started again in case it runs (Proxmox's files cannot tell: plan with --local or --api-url to know)"

# the one line a path that cannot see something refuses with, by (scenario, path)
REFUSALS: dict[tuple[str, str], str] = {
    # the service's command is read inside the container (pct exec): without it in the spec, the
    # new tensor-parallel size could not be planned
    ("split, no command", "api"): (
        "gputopo: error: refused: container 101: cannot read sglang.service's command (no pct on "
        "this machine): set service.command in the spec, or run gputopo on the node (--local)"
    ),
    # the files cannot say VM 201 (stopped, its hostpci line naming the mapping) is not running
    ("reverse", "files"): (
        "gputopo: error: refused: VM 201 may be running (Proxmox's files cannot tell: plan with "
        "--local or --api-url to know) with mapping pro6000-vm (hostpci0), whose GPU(s) go to a "
        "container (0000:81:00.0, 0000:91:00.0, 0000:e1:00.0, 0000:f1:00.0 to container 101): it "
        "would be stopped and could not start again; list it in vms.consumers with "
        "when_gpus_leave: remove or repoint, or shut it down and change its hostpci lines"
    ),
}

OUTCOMES: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module")
def template():
    base = Path(tempfile.mkdtemp(prefix="gputopo-paths-", dir=applysim.fast_tmp()))
    yield base
    applysim.cleanup(base)


def _create(base: Path, name: str, *extra: str) -> SimHost:
    d = base / name.replace(" ", "-") / "sim"
    d.parent.mkdir(parents=True)
    code = subprocess.run(
        [sys.executable, "-m", "gputopo", "sim", "create", str(d), *extra], capture_output=True, text=True
    )
    assert code.returncode == 0, code.stderr
    SimKernel(d / "root").configure(time_scale=applysim.SCALE)
    return SimHost.open(d)


def _split_spec(capsys, host: SimHost, dest: Path) -> str:
    """The NUMA split ``init`` writes, with ``service.command`` set as the operator guide says
    for the API paths."""
    code, out, err = run(
        capsys,
        "init",
        "--sim",
        str(host.dir),
        "--split",
        "numa",
        *QUICK,
        "--container-mapping",
        "pro6000",
        "-o",
        str(dest),
    )
    assert code == 0, out + err
    text = dest.read_text()
    assert f"# command: {COMMAND}" in text
    text = text.replace(f"# command: {COMMAND}", f"command: {COMMAND}")
    dest.write_text(text)
    return text


def _serve(host: SimHost) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputopo", "sim", "serve", "--dir", str(host.dir), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()


def _setup(capsys, base: Path, scenario: str) -> tuple[SimHost, list[str]]:
    """The scenario's host and the plan arguments naming what to plan (spec or quick mode)."""
    if scenario == "ha":
        host = _create(base, scenario, "--ha", "ct:101", "--ha", "vm:201")
    else:
        host = _create(base, scenario)
    if scenario.startswith("quick "):
        return host, ["--split", scenario.split()[1], *QUICK]
    spec = host.dir.parent / "spec.yaml"
    text = _split_spec(capsys, host, spec)
    if scenario == "split, no command":
        spec.write_text(text.replace(f"command: {COMMAND}", f"# command: {COMMAND}"))
    if scenario == "reverse":
        code, out, err = run(capsys, "apply", "--sim", str(host.dir), "--spec", str(spec), "--yes")
        assert code == 0, out + err
        spec.write_text(applysim.reverse(text))
    elif scenario == "vm consumer":
        assert "      guests: []\n" in text
        spec.write_text(
            text.replace(
                "      guests: []\n",
                "      guests: []\n      consumers:\n        - {vmid: 201, mapping: pro6000-vm, when_gpus_leave: remove}\n",
            )
        )
    return host, ["--spec", str(spec)]


def _path_args(path: str, host: SimHost, doc: dict) -> list[str]:
    root = str(host.paths.root)
    return {
        "sim": ["--sim", str(host.dir)],
        "api": ["--root", root, "--api-url", doc["api_url"], "--ca-bundle", doc["ca_file"]],
        "local": ["--local", "--root", root],
        "files": ["--root", root, "--pve-root", str(host.paths.pve)],
    }[path]


UNIT_UNSEEN = {
    "api": (
        "gputopo: warning: container 101: cannot look for its inference unit (no pct on this machine); "
        "the service is not managed and its model's fit is not checked"
    ),
    "files": (
        "gputopo: warning: container 101: Proxmox's files cannot show the unit it runs; the service "
        "is not managed and its model's fit is not checked (give --service-unit, or plan with --local)"
    ),
}


def _unmanaged(capsys, host: SimHost, what: list[str]) -> dict:
    """The ``--sim`` plan of quick mode's spec without its service: what a path that cannot see
    the unit inside the container plans."""
    spec = host.dir.parent / "unmanaged.yaml"
    code, out, err = run(capsys, "init", "--sim", str(host.dir), *what, "-o", str(spec))
    assert code == 0, out + err
    doc = yaml.safe_load(spec.read_text())
    del doc["nodes"][0]["containers"][0]["service"]
    spec.write_text(yaml.safe_dump(doc))
    code, out, err = run(capsys, "plan", "--sim", str(host.dir), "--spec", str(spec), "--json")
    assert code == 0, out + err
    return json.loads(out)


def _stopped_vms(host: SimHost) -> set[int]:
    vms = state.read_state(host.paths.run, "guests", {}).get("qemu", {})
    return {int(v) for v, s in vms.items() if s != "running"}


def _outcome(scenario: str, path: str, refs: dict, doc: dict, err: str, host: SimHost) -> str:
    """'equal', 'equal to ...' naming what the path provably cannot see (and asserting that its
    plan says so), or 'DIFFERS: ...' (a bug)."""
    ref, notes = refs["sim"], []
    signed = True  # False once actions are taken out of either plan: its signature signs them all
    container = doc["containers"][0]
    if path in UNIT_UNSEEN and scenario.startswith("quick ") and container.get("service") is None:
        assert UNIT_UNSEEN[path] in err.splitlines(), err
        ref = refs["unmanaged"]
        notes.append("the service unmanaged: the unit inside the container cannot be seen (warns)")
    elif path in UNIT_UNSEEN and container.get("service"):
        # the running command is not read here: the spec's service.command stands in for it
        assert container["service"]["current_tp"] is None
    actions = doc["actions"]
    if path == "files" and container.get("service") and container["service"]["command"] is None:
        # nor the unit's command: the drop-in (the new tensor-parallel size) is not planned
        unit = container["service"]["unit"]
        assert (
            f"container 101: {unit} has no known command (set service.command); its drop-in is not managed"
            in (doc["warnings"])
        ), doc["warnings"]
        ref = {**ref, "actions": [a for a in ref["actions"] if a["kind"] != "write_service_dropin"]}
        signed = False
        notes.append("the drop-in unplanned: the files do not show the unit's command (warns)")
    if path == "files":
        # the files cannot say whether a VM runs: one using a changing mapping restarts in case
        # it does, and the plan warns about each
        extra = [a for a in actions if a not in ref["actions"] and a["kind"] in ("stop_guest", "start_guest")]
        vmids = sorted({a["vmid"] for a in extra if a.get("guest") == "qemu"})
        if vmids and set(vmids) <= _stopped_vms(host):
            for vmid in vmids:
                assert f"VM {vmid}: {FILES_UNKNOWN}" in doc["warnings"], doc["warnings"]
            actions = [a for a in actions if a not in extra]
            signed = False
            notes.append(
                f"VM {', '.join(map(str, vmids))} restarted in case it runs: the files cannot tell (warns)"
            )
    if actions == ref["actions"] and (not signed or doc["signature"] == ref["signature"]):
        return "equal" if not notes else "equal but " + "; ".join(notes)
    extra = [a.get("description") for a in actions if a not in ref["actions"]]
    missing = [a.get("description") for a in ref["actions"] if a not in actions]
    return f"DIFFERS: signature {doc['signature']} vs {ref['signature']}; only here {extra}; only in --sim {missing}"


def _plan(capsys, monkeypatch, path: str, host: SimHost, doc: dict, what: list[str], bin_dir: Path):
    with monkeypatch.context() as m:
        if path == "local":
            m.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        elif path == "api":
            m.setenv("PATH", str(bin_dir.parent / "no-pct"))  # no pct: the service cannot be read
        return run(capsys, "plan", *_path_args(path, host, doc), *what, "--json")


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if not OUTCOMES:
        return
    lines = ["| scenario | " + " | ".join(PATHS) + " |", "|---" * (len(PATHS) + 1) + "|"]
    for scenario in SCENARIOS:
        if scenario in OUTCOMES:
            row = OUTCOMES[scenario]
            lines.append(f"| {scenario} | " + " | ".join(row.get(p, "") for p in PATHS) + " |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if os.environ.get("GPUTOPO_PATH_TABLE"):
        Path(os.environ["GPUTOPO_PATH_TABLE"]).write_text(text)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_path_plans_the_same(scenario, template, capsys, monkeypatch):
    host, what = _setup(capsys, template, scenario)
    bin_dir = install_tools(host.dir.parent / "bin", host.dir)
    proc, doc = _serve(host)
    row: dict[str, str] = {}
    OUTCOMES[scenario] = row
    try:
        monkeypatch.setenv("GPUTOPO_PVE_PASSWORD", Path(doc["password_file"]).read_text().strip())
        results = {p: _plan(capsys, monkeypatch, p, host, doc, what, bin_dir) for p in PATHS}
    finally:
        _stop(proc)
    code, out, err = results["sim"]
    assert code == 0, out + err
    refs = {"sim": json.loads(out)}
    if scenario.startswith("quick "):
        refs["unmanaged"] = _unmanaged(capsys, host, what)
    row["sim"] = "equal"
    for path in PATHS[1:]:
        code, out, err = results[path]
        expected = REFUSALS.get((scenario, path))
        if code != 0:
            line = err.strip().splitlines()[-1] if err.strip() else ""
            row[path] = "refused: " + line.removeprefix("gputopo: error: ").removeprefix("refused: ")
            assert expected is not None, f"{path}: {out}{err}"
            assert (code, err) == (2, expected + "\n")
            continue
        assert expected is None, f"{path} plans where it should refuse: {out}"
        row[path] = _outcome(scenario, path, refs, json.loads(out), err, host)
    assert not [v for v in row.values() if v.startswith("DIFFERS")], row
