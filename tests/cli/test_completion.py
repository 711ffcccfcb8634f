"""Shell completion: ``gputopo completion bash|zsh|fish`` prints click's script, and in a real bash
the script completes commands, and addresses, vmids, mapping names, node names and apply ids
from the host named before them on the command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.applysim import copy_host, template  # noqa: F401 (fixtures)
from helpers.cli import run

BIN = Path(sys.executable).parent  # where pip put the gputopo entry point


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    out = subprocess.run(
        [str(BIN / "gputopo"), "completion", "bash"], capture_output=True, text=True, check=True
    )
    p = tmp_path_factory.mktemp("completion") / "gputopo.bash"
    p.write_text(out.stdout)
    return p


def complete(script: Path, *words: str) -> list[str]:
    """What bash offers for ``words`` (the last one is being typed), through the script's own
    completion function, as bash calls it for a command line."""
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    quoted = " ".join(f"'{w}'" for w in words)
    code = (
        f"source '{script}'\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; COMPREPLY=()\n"
        "_gputopo_completion gputopo\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    res = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0, res.stderr
    return [ln for ln in res.stdout.splitlines() if ln]


@pytest.fixture(scope="module")
def host(template, tmp_path_factory):
    return copy_host(template, tmp_path_factory.mktemp("comp") / "sim")


def test_the_scripts_are_clicks_for_each_shell(capsys):
    from click.shell_completion import get_completion_class

    from gputopo.cli import cli

    for shell in ("bash", "zsh", "fish"):
        code, out, _ = run(capsys, "completion", shell)
        assert code == 0
        assert out == get_completion_class(shell)(cli, {}, "gputopo", "_GPUTOPO_COMPLETE").source()
        assert "_GPUTOPO_COMPLETE" in out
    code, _, err = run(capsys, "completion", "tcsh")
    assert code == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in err


@pytest.mark.slow
def test_bash_completes_commands_and_choices(script):
    assert complete(script, "gputopo", "pl") == ["plan"]
    assert set(complete(script, "gputopo", "hi")) == {"history"}
    assert complete(script, "gputopo", "sh") == ["show"]
    assert complete(script, "gputopo", "schema", "sa") == ["saved-plan"]
    assert complete(script, "gputopo", "completion", "") == ["bash", "zsh", "fish"]


@pytest.mark.slow
def test_bash_completes_vmids_mappings_and_nodes_from_the_simulated_host(script, host):
    sim = str(host.dir)
    assert complete(script, "gputopo", "plan", "--sim", sim, "--container", "") == ["101"]
    assert complete(script, "gputopo", "plan", "--sim", sim, "--vm-mapping", "pro") == ["pro6000"]
    assert complete(script, "gputopo", "init", "--sim", sim, "--node", "") == ["pve1"]
    assert complete(script, "gputopo", "plan", "--sim", sim, "--container-mapping", "x") == []


@pytest.mark.slow
def test_bash_completes_gpu_addresses_and_apply_ids_from_the_root(script, host):
    root = str(host.paths.root)
    assert complete(script, "gputopo", "discover", "--root", root, "0000:8") == ["0000:81:00.0"]
    assert len(complete(script, "gputopo", "discover", "--root", root, "")) == 8
    journal = host.paths.root / "var/lib/gputopo/journal"
    journal.mkdir(parents=True, exist_ok=True)
    (journal / "20250101T000000Z-42.jsonl").write_text("")
    assert complete(script, "gputopo", "history", "--sim", str(host.dir), "show", "") == [
        "20250101T000000Z-42",
        "last",
    ]


def test_completers_read_no_more_than_the_files(host):
    """Each completer offers what the files say, with a description; nothing for a root without them."""
    import click

    from gputopo.cli.complete import complete_addresses, complete_mappings, complete_nodes, complete_vmids

    ctx = click.Context(click.Command("x"))
    ctx.params = {"sim": str(host.dir)}
    (item,) = complete_vmids(ctx, None, "1")
    assert item.value == "101" and item.help == "CT 101 on pve1 (llm)"
    assert [i.value for i in complete_mappings(ctx, None, "")] == ["pro6000"]
    assert [i.value for i in complete_nodes(ctx, None, "")] == ["pve1"]
    addrs = complete_addresses(ctx, None, "0000:0")
    assert [(i.value, i.help) for i in addrs] == [("0000:01:00.0", "nvidia")]
    ctx.params = {"sim": "/nonexistent"}
    assert (
        complete_vmids(ctx, None, "")
        == complete_addresses(ctx, None, "")
        == complete_nodes(ctx, None, "")
        == []
    )
