"""The e2e harness's pure parts (no QEMU): these run in the fast default suite."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess

import harness
import pytest


def test_parse_apt_depends_picks_the_versioned_image():
    text = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n  Depends: linux-base\n"
    assert harness.parse_apt_depends(text) == "linux-image-6.1.0-57-amd64"
    assert harness.parse_apt_depends("linux-image-amd64\n  Depends: linux-base\n") is None


def test_exit_marker_is_the_last_one_and_is_stripped():
    out = "hello\nE2E_EXIT=3\nE2E_EXIT=0\n"
    assert harness.parse_exit_marker(out) == 0
    assert harness.parse_exit_marker("no marker\n") is None
    assert harness.strip_exit_marker(out) == "hello\n"


@pytest.mark.skipif(not shutil.which("cpio"), reason="cpio not installed")
def test_cpio_writer_round_trips_through_cpio(tmp_path):
    cw = harness.CpioWriter()
    cw.dir("e2e")
    cw.file("e2e/run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    cw.file("e2e/odd", b"abc")  # a length that needs padding
    cw.symlink("lib64", "usr/lib64")
    data = gzip.decompress(cw.gz())
    subprocess.run(["cpio", "-idm", "--quiet"], input=data, cwd=tmp_path, check=True)
    assert (tmp_path / "e2e/run.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert os.stat(tmp_path / "e2e/run.sh").st_mode & 0o777 == 0o755
    assert (tmp_path / "e2e/odd").read_bytes() == b"abc"
    assert os.readlink(tmp_path / "lib64") == "usr/lib64"


def test_static_elf_detection(tmp_path):
    def elf(interp: bool) -> bytes:
        # minimal ELF64 header with one program header (PT_INTERP=3 or PT_LOAD=1)
        hdr = bytearray(64)
        hdr[:5] = b"\x7fELF\x02"
        hdr[0x20:0x28] = (64).to_bytes(8, "little")
        hdr[0x36:0x38] = (56).to_bytes(2, "little")
        hdr[0x38:0x3A] = (1).to_bytes(2, "little")
        ph = bytearray(56)
        ph[0:4] = (3 if interp else 1).to_bytes(4, "little")
        return bytes(hdr + ph)

    (tmp_path / "dyn").write_bytes(elf(True))
    (tmp_path / "static").write_bytes(elf(False))
    (tmp_path / "script").write_bytes(b"#!/bin/sh\n")
    assert harness._is_static_elf(str(tmp_path / "static"))
    assert not harness._is_static_elf(str(tmp_path / "dyn"))
    assert not harness._is_static_elf(str(tmp_path / "script"))


def test_image_key_changes_with_the_guest_init(tmp_path, monkeypatch):
    init = tmp_path / "init"
    init.write_text("#!/bin/sh\n")
    monkeypatch.setattr(harness, "_INITRAMFS_INPUTS", [init])
    k1 = harness.image_key("linux-image-6.1.0-57-amd64")
    init.write_text("#!/bin/sh\necho changed\n")
    k2 = harness.image_key("linux-image-6.1.0-57-amd64")
    assert k1 != k2 and k1.startswith("linux-image-6.1.0-57-amd64-")
    assert harness.image_key("linux-image-6.1.0-58-amd64") != k2


def test_python_shares_skip_paths_inside_shared_ones(monkeypatch):
    monkeypatch.setattr(harness.sys, "base_prefix", "/usr")
    monkeypatch.setattr(harness.sys, "prefix", "/usr")
    repo = str(harness.REPO.resolve())
    if repo.startswith("/usr/"):
        pytest.skip("repository lives under /usr")
    assert harness.python_shares() == ["/usr", repo]


def test_guest_script_runs_this_interpreter_on_the_repo():
    s = harness.python_script(["/x/checks.py", "/out dir"])
    assert s.startswith("#!/bin/sh\n")
    assert f"export PYTHONPATH={harness.REPO.resolve()}" in s
    assert s.rstrip().endswith("'/out dir'")
    assert harness.sys.executable in s


FAKE_QEMU = r"""#!/bin/sh
# stands in for qemu-system-x86_64: writes the two serial files the way the guest would
con= out= n=0
while [ $# -gt 0 ]; do
    if [ "$1" = -serial ]; then
        n=$((n + 1)); f=${2#file:}
        if [ $n = 1 ]; then con=$f; else out=$f; fi
        shift
    fi
    shift
done
case $FAKE_QEMU_MODE in
dead) echo "qemu: could not load kernel" >&2; exit 1;;
noexit) echo "E2E_INIT_UP kernel=x" > "$con"; echo "partial" > "$out"; exit 0;;
ok) echo "E2E_INIT_UP kernel=x" > "$con"; printf 'hello\nE2E_EXIT=3\n' > "$out"; exit 0;;
esac
"""


@pytest.fixture
def fake_qemu(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    q = bindir / "qemu-system-x86_64"
    q.write_text(FAKE_QEMU)
    q.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    (tmp_path / "k").write_bytes(b"kernel")
    (tmp_path / "i").write_bytes(b"initrd")
    return harness.GuestImage(tmp_path / "k", tmp_path / "i", "x")


@pytest.mark.slow  # about half a second or more: out of the one-minute loop
def test_boot_returns_the_guest_scripts_status_and_output(fake_qemu, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_QEMU_MODE", "ok")
    run = harness.boot(fake_qemu, "true", tmp_path, ro_shares=[], full=False, timeout=20)
    assert (run.rc, run.output) == (3, "hello\n")
    assert "-serial" in run.qemu_cmd and f"path={tmp_path.resolve()}" in " ".join(run.qemu_cmd)


@pytest.mark.slow  # about half a second or more: out of the one-minute loop
def test_boot_that_never_reaches_init_means_unavailable(fake_qemu, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_QEMU_MODE", "dead")
    with pytest.raises(harness.E2EUnavailable, match="never reached /init.*could not load kernel"):
        harness.boot(fake_qemu, "true", tmp_path, ro_shares=[], full=False, timeout=20)


@pytest.mark.slow  # about half a second or more: out of the one-minute loop
def test_boot_that_dies_after_init_is_a_failure(fake_qemu, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_QEMU_MODE", "noexit")
    with pytest.raises(harness.GuestFailed, match="without an exit marker(.|\n)*partial"):
        harness.boot(fake_qemu, "true", tmp_path, ro_shares=[], full=False, timeout=20)


def test_no_qemu_means_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(harness.E2EUnavailable, match="qemu-system-x86_64 not found"):
        harness.find_qemu()


def test_guest_tools_are_real_paths_inside_the_shares(monkeypatch):
    monkeypatch.setattr(harness, "python_shares", lambda: ["/nonexistent-share"])
    assert harness.guest_tools() == {}
    monkeypatch.setattr(harness, "python_shares", lambda: ["/"])
    for env, path in harness.guest_tools().items():
        assert env.startswith("GPUTOPO_E2E_") and os.path.realpath(path) == path
        assert os.access(path, os.X_OK), env
