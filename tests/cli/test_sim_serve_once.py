"""A second ``gputopo sim serve`` on a directory that one already serves refuses in one line
naming the running server (pid, URL), and leaves its credentials alone; the record of a server
that died (SIGKILL) is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from helpers.applysim import copy_host, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # real servers in their own processes


def _serve(directory) -> tuple[subprocess.Popen, dict]:
    """``sim serve --dir DIR --http --json`` in its own process, and the line it announces."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputopo", "sim", "serve", "--dir", str(directory), "--http", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, json.loads(line)


def _login(doc: dict, password: str) -> int:
    """The HTTP status of a root@pam ticket login with ``password``."""
    body = urllib.parse.urlencode({"username": doc["user"], "password": password}).encode()
    try:
        with urllib.request.urlopen(f"{doc['api_url']}/access/ticket", data=body, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    rc = proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()
    return rc


def test_a_second_server_refuses_and_a_dead_ones_record_is_taken_over(template, tmp_path):
    host = copy_host(template, tmp_path / "sim")
    first, doc = _serve(host.dir)
    try:
        password_file = host.paths.run / "root-password"
        password = password_file.read_text().strip()
        assert _login(doc, password) == 200

        second = subprocess.run(
            [sys.executable, "-m", "gputopo", "sim", "serve", "--dir", str(host.dir), "--http"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (second.returncode, second.stdout) == (2, ""), second.stderr
        assert second.stderr == (
            f"gputopo: error: {host.dir}: already served by 'gputopo sim serve' "
            f"(pid {first.pid} at {doc['api_url']}); use that one, or stop it first\n"
        )
        # the running server's credentials are still the ones in its files, and still log in
        assert password_file.read_text().strip() == password
        assert _login(doc, password) == 200
    finally:
        _stop(first, signal.SIGKILL)  # dies without a word: its record stays behind

    record = host.paths.run / "serve.json"
    assert json.loads(record.read_text())["pid"] == first.pid
    again, doc2 = _serve(host.dir)
    try:
        assert json.loads(record.read_text()) == {"pid": again.pid, "url": doc2["api_url"]}
        assert _login(doc2, (host.paths.run / "root-password").read_text().strip()) == 200
    finally:
        assert _stop(again) == 0
    assert not record.exists()


def test_a_server_stopped_the_moment_it_announced_itself_stops_cleanly(template, tmp_path):
    """SIGTERM straight after the announcement (a script that only needed the URL, or a test's
    clean-up) is a clean stop: exit 0, "stopped", its record released. The handler is in place
    before the line is printed; after it, a loaded machine could deliver the signal first and the
    server died of it with its record left behind."""
    host = copy_host(template, tmp_path / "sim")
    for _ in range(3):
        proc, doc = _serve(host.dir)
        assert doc["api_url"].startswith("http://127.0.0.1:")
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        assert (rc, err.splitlines()[-1:]) == (0, ["stopped"]), err
        assert not (host.paths.run / "serve.json").exists()
