"""The rehearsal of the split and its reverse in docs/simulator.md, run as written: its two specs
(``split.yaml``, ``back.yaml``) and the commands after them, on a simulated host made by the first
command. Each command must exit 0 and print exactly the lines the page shows under it (none
shown: not compared); then what runs must be what the page says: every GPU back on nvidia, held
by the container's service, and VM 201 running without GPUs."""

from __future__ import annotations

import re
import shlex

import pytest

from helpers import TESTS
from helpers.applysim import running_service
from helpers.cli import run

pytestmark = pytest.mark.slow  # two applies on a simulated host

PAGE = TESTS.parent / "docs" / "simulator.md"


def _blocks() -> tuple[dict[str, str], str]:
    """({file name: spec text}, the console block after them)."""
    text = PAGE.read_text()
    specs = {m[1]: m[2] for m in re.finditer(r"```yaml\n# (split\.yaml|back\.yaml)\n(.*?)```", text, re.S)}
    assert set(specs) == {"split.yaml", "back.yaml"}
    after = text[text.index("# back.yaml\n") :]
    console = re.search(r"```\n(\$ gputopo sim create .*?)```", after, re.S)
    assert console, "no console block after the specs"
    return specs, console[1]


def _steps(console: str) -> list[tuple[list[str], int | None, list[str]]]:
    """(argv after 'gputopo', N of a '| tail -N' after it, the lines shown under it) of each
    '$ gputopo' line."""
    steps: list[tuple[list[str], int | None, list[str]]] = []
    for line in console.splitlines():
        if line.startswith("$ "):
            command, _, tail = line[2:].partition(" | tail -")
            argv = shlex.split(command, comments=True)
            assert argv[0] == "gputopo", line
            steps.append((argv[1:], int(tail.split()[0]) if tail else None, []))
        else:
            steps[-1][2].append(line)
    return steps


def test_the_readme_split_and_reverse_run_as_written(capsys, tmp_path, monkeypatch):
    specs, console = _blocks()
    for name, text in specs.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)  # the specs by the names the page gives them
    host_dir = str(tmp_path / "pve1")
    steps = _steps(console.replace("/tmp/pve1", host_dir))
    assert [a[:3] for a, _, _ in steps][:2] == [["sim", "create", host_dir], ["apply", "--sim", host_dir]]
    for argv, tail, shown in steps:
        code, out, err = run(capsys, *argv)
        assert code == 0, (argv, err)
        if shown:
            assert out.splitlines()[-tail if tail else 0 :] == shown, argv

    from gputopo.facts.discover import discover
    from gputopo.sim import state

    root = tmp_path / "pve1" / "root"
    gpus = discover(str(root)).gpus
    assert len(gpus) == 8 and {g.driver for g in gpus} == {"nvidia"}
    _, held = running_service(root, 101, "sglang.service")
    assert len(held) >= 8  # the service holds every GPU's node again
    run_dir = tmp_path / "pve1" / "run"
    assert state.guest_status(run_dir, "qemu", 201) == "running"
    vm_conf = next((tmp_path / "pve1" / "pve").rglob("qemu-server/201.conf")).read_text()
    assert "hostpci" not in vm_conf
