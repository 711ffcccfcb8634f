"""The pieces ``plan --commands`` is made of (:mod:`gputopo.actions.shell`), run by a real bash:
a file's text arrives byte for byte whatever it holds, a sysfs write is what the kernel reads."""

from __future__ import annotations

import subprocess

import pytest

from gputopo.actions.shell import EOF, line, sysfs_write, with_text


def bash(script: str, cwd=None) -> str:
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize(
    "text",
    [
        "plain\nlines\n",
        "no newline at the end",
        "$HOME `id` \"quotes\" 'single' \\backslash\n",
        f"a line that is the delimiter:\n{EOF}\nafter it\n",
        "",
    ],
    ids=["heredoc", "no-final-newline", "shell-characters", "delimiter-inside", "empty"],
)
def test_a_files_text_reaches_the_command_unchanged(text):
    assert bash(with_text("cat", text)) == text


def test_words_are_quoted_for_the_shell():
    assert bash(line("printf", "%s|", "a b", "$x", "it's")) == "a b|$x|it's|"


def test_a_sysfs_write_is_the_value_and_a_newline_and_a_clear_is_a_lone_newline(tmp_path):
    (tmp_path / "sys").mkdir()
    cmd = sysfs_write("sys/override", "vfio-pci").replace("/sys/", "./sys/")
    bash(cmd, cwd=tmp_path)
    assert (tmp_path / "sys/override").read_bytes() == b"vfio-pci\n"
    bash(sysfs_write("/sys/override", None).replace("/sys/", "./sys/"), cwd=tmp_path)
    assert (tmp_path / "sys/override").read_bytes() == b"\n"
