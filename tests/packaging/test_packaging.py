"""How gputopo is installed: ``--version`` naming the install, the simulator's TLS library as an
optional extra, the man pages and bash completion generated from the CLI, and the node packages.

The tests marked ``deb`` inspect the Debian packages that ``packaging/build-deb.sh`` builds (those
in ``$GPUTOPO_DEB_DIR`` when set, as CI does, else they build them, which needs PyPI). Installing
a package and using it, as an operator does, is ``packaging/test-deb.sh`` (run by ``.ci/run``).
"""

from __future__ import annotations

import importlib.util
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers import REPO

SRC = REPO
PACKAGING = SRC / "packaging"
RELEASES = {"bookworm": "3.11", "trixie": "3.13"}  # Debian 12 / Proxmox VE 8, Debian 13 / PVE 9

needs_checkout = pytest.mark.skipif(not PACKAGING.is_dir(), reason="not a source checkout: no packaging/")


def run_gputopo(args: list[str], cwd: Path, block_cryptography: bool = False) -> subprocess.CompletedProcess:
    """``python -m gputopo ARGS`` in a fresh interpreter; with ``block_cryptography`` the
    ``cryptography`` package cannot be imported there, as in an install without the [sim] extra."""
    prelude = "import sys\nsys.modules['cryptography'] = None\n" if block_cryptography else "import sys\n"
    code = prelude + f"sys.argv = ['gputopo', *{args!r}]\nfrom gputopo.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)


# --- gputopo --version says which install it is ------------------------------------------------


def test_version_names_the_python_and_the_directory_it_runs_from(tmp_path):
    import gputopo

    p = subprocess.run(
        [sys.executable, "-m", "gputopo", "--version"], capture_output=True, text=True, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        f"gputopo, version {gputopo.__version__}",
        f"Python {platform.python_version()} ({sys.executable})",
        f"running from {os.path.dirname(os.path.abspath(gputopo.__file__))}",
    ]


def test_version_keeps_a_percent_sign_in_the_path(monkeypatch):
    import gputopo
    from gputopo.cli import version_message

    monkeypatch.setattr(gputopo, "__file__", "/srv/100%s/gputopo/__init__.py")
    # click fills in the message the way version_option does
    text = version_message() % {"prog": "gputopo", "package": "gputopo", "version": "9"}
    assert text.splitlines()[0] == "gputopo, version 9"
    assert text.splitlines()[2] == "running from /srv/100%s/gputopo"


# --- cryptography: only the simulated host needs it --------------------------------------------


def test_cryptography_is_only_in_the_sim_extra():
    import tomllib

    project = (
        tomllib.loads((SRC / "pyproject.toml").read_text())["project"]
        if (SRC / "pyproject.toml").is_file()
        else None
    )
    if project is None:
        pytest.skip("not a source checkout: no pyproject.toml")
    assert not any(d.lower().startswith("cryptography") for d in project["dependencies"])
    assert any(d.startswith("cryptography") for d in project["optional-dependencies"]["sim"])
    assert "gputopo[sim]" in project["optional-dependencies"]["test"]


@pytest.mark.parametrize(
    "args", [["demo"], ["sim", "create", "{tmp}/host"], ["sim", "serve", "--dir", "{tmp}/host"]]
)
def test_simulator_commands_without_cryptography_say_what_to_install(tmp_path, args):
    args = [a.format(tmp=tmp_path) for a in args]
    p = run_gputopo(args, tmp_path, block_cryptography=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout == ""
    (line,) = p.stderr.splitlines()
    assert line.startswith(f"gputopo: error: command '{args[0]}' is unavailable: ")
    assert (
        "'cryptography'" in line
        and "pip install 'gputopo[sim]'" in line
        and "pipx inject gputopo cryptography" in line
    )
    assert not (tmp_path / "host").exists()


@pytest.mark.slow
def test_sim_option_without_cryptography_says_what_to_install(tmp_path):
    from gputopo.sim.host import SimHost

    SimHost.create(tmp_path / "host")  # made here, used where cryptography is missing
    p = run_gputopo(
        ["plan", "--sim", str(tmp_path / "host"), "--split", "numa", "--container", "101"],
        tmp_path,
        block_cryptography=True,
    )
    assert p.returncode == 1 and p.stdout == "", p.stderr
    (line,) = p.stderr.splitlines()
    assert (
        line.startswith("gputopo: error: command '--sim' is unavailable: ")
        and "pip install 'gputopo[sim]'" in line
    )


@pytest.mark.slow
def test_node_commands_run_without_cryptography(tmp_path, materialized):
    root = materialized("seed")
    p = run_gputopo(["discover", "--root", str(root)], tmp_path, block_cryptography=True)
    assert p.returncode == 0, p.stderr
    assert "0000:81:00.0" in p.stdout
    p = run_gputopo(
        [
            "plan",
            "--root",
            str(root),
            "--pve-root",
            str(tmp_path / "no-pve"),
            "--split",
            "numa",
            "--container",
            "101",
            "--vm-mapping",
            "pro6000-vm",
        ],
        tmp_path,
        block_cryptography=True,
    )
    assert p.returncode == 0, p.stderr
    assert "rebind 0000:81:00.0: nvidia -> vfio-pci" in p.stdout
    p = run_gputopo(["sim", "--help"], tmp_path, block_cryptography=True)
    assert p.returncode == 0 and "create" in p.stdout  # help is there to read even without it


# --- man pages and bash completion, generated from the CLI ------------------------------------


def gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", PACKAGING / "gen-docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_checkout
@pytest.mark.slow
def test_a_man_page_for_every_command_with_its_options(tmp_path):
    pytest.importorskip("click_man", reason="click-man (in the [test] extra) is not installed")
    from gputopo.cli import COMMANDS

    out = tmp_path / "man"
    assert gen_docs().main(["--man", str(out), "--bash", str(tmp_path / "gputopo")]) == 0
    pages = {p.name: p.read_text() for p in out.glob("*.1")}
    want = {"gputopo.1"} | {f"gputopo-{name}.1" for name in COMMANDS}
    want |= {
        "gputopo-sim-create.1",
        "gputopo-sim-serve.1",
        "gputopo-sim-cluster-ssh.1",
        "gputopo-sim-break.1",
        "gputopo-sim-heal.1",
        "gputopo-sim-shell.1",
        "gputopo-sim-guest.1",
        *(f"gputopo-sim-guest-{verb}.1" for verb in ("start", "stop", "status")),
        "gputopo-fixtures-build.1",
        "gputopo-fixtures-list.1",
        "gputopo-history-show.1",
    }
    want |= {f"gputopo-cluster-{sub}.1" for sub in ("plan", "diff", "apply", "verify")}
    assert set(pages) == want
    root = pages["gputopo.1"]
    for name in COMMANDS:
        assert f"\\fB{name}\\fP" in root and f"gputopo-{name}(1)" in root
    # the NAME line carries the command's whole first sentence, for whatis and apropos
    assert (
        "gputopo\\-verify \\- Check the host against the spec from fresh facts: converged"
        in pages["gputopo-verify.1"]
    )
    assert "\\-\\-spec" in pages["gputopo-apply.1"] and "\\-\\-from" in pages["gputopo-sim-serve.1"]
    if shutil.which("man") is None:
        pytest.skip("man (man-db) is not installed: the pages' troff is not checked")
    for name in sorted(pages):
        p = subprocess.run(
            ["man", "--warnings", "-l", str(out / name)],
            capture_output=True,
            text=True,
            env={**os.environ, "MANWIDTH": "100", "LC_ALL": "C.UTF-8"},
        )
        assert p.returncode == 0 and p.stderr == "", (name, p.stderr)
        assert "NAME" in p.stdout and "SYNOPSIS" in p.stdout


@needs_checkout
@pytest.mark.slow
def test_the_bash_completion_script_completes_commands_and_options(tmp_path):
    pytest.importorskip("click_man", reason="click-man (in the [test] extra) is not installed")
    script = tmp_path / "gputopo"
    assert gen_docs().main(["--man", str(tmp_path / "man"), "--bash", str(script)]) == 0
    # The script runs 'gputopo' from PATH to complete; this interpreter's gputopo answers.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "gputopo").write_text(f'#!/bin/sh\nexec {sys.executable} -m gputopo "$@"\n')
    (bindir / "gputopo").chmod(0o755)
    probe = f"""
        source {script}
        complete -p gputopo
        for line in "gputopo di" "gputopo sim c" "gputopo apply --sp"; do
            read -ra COMP_WORDS <<<"$line"
            COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
            COMPREPLY=()
            _gputopo_completion gputopo
            echo "$line -> ${{COMPREPLY[*]}}"
        done
    """
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "complete -o nosort -F _gputopo_completion gputopo",
        "gputopo di -> diff discover",
        "gputopo sim c -> cluster-ssh create",
        "gputopo apply --sp -> --spec",
    ]


# --- the package's copyright file, written from what it bundles -----------------------------------


def fake_distribution(site: Path, name: str, metadata: str, files: dict[str, str]) -> None:
    """A distribution installed in ``site`` as pip leaves one: its files, METADATA and RECORD."""
    info = f"{name}-1.0.dist-info"
    for rel, text in {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.4\nName: {name}\nVersion: 1.0\n{metadata}",
    }.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (site / info / "RECORD").write_text(
        "".join(f"{rel},,\n" for rel in [*files, f"{info}/METADATA", f"{info}/RECORD"])
    )


def run_gen_copyright(tmp_path: Path, site: Path) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "copyright"
    p = subprocess.run(
        [
            sys.executable,
            str(PACKAGING / "gen-copyright.py"),
            str(PACKAGING / "debian/copyright"),
            str(site),
            "usr/site",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    return p, out


@needs_checkout
def test_gen_copyright_writes_a_stanza_per_distribution_with_its_licence_text(tmp_path):
    site = tmp_path / "site"
    apache = "                                 Apache License\n                           Version 2.0, January 2004\n"
    fake_distribution(
        site,
        "alpha",
        "License-Expression: MIT OR Apache-2.0\n",
        {
            "alpha/__init__.py": "",
            "alpha-1.0.dist-info/licenses/LICENSE": "Copyright (c) 2020 Ada\n\nPermission is hereby granted.\n",
            "alpha-1.0.dist-info/licenses/LICENSE.APACHE": apache,
        },
    )
    fake_distribution(site, "beta", "Author: Bo\nLicense: BSD-2-Clause\n", {"beta.py": ""})
    p, out = run_gen_copyright(tmp_path, site)
    assert p.returncode == 0, p.stderr
    stanzas = out.read_text().split("\n\n")
    (alpha,) = [
        s for s in stanzas if s.startswith("Files: usr/site/alpha/* usr/site/alpha-1.0.dist-info/*\n")
    ]
    assert alpha.splitlines() == [
        "Files: usr/site/alpha/* usr/site/alpha-1.0.dist-info/*",
        "Copyright: Copyright (c) 2020 Ada",
        "License: MIT or Apache-2.0",
        " alpha-1.0.dist-info/licenses/LICENSE:",
        " .",
        " Copyright (c) 2020 Ada",
        " .",
        " Permission is hereby granted.",
        " .",
        " alpha-1.0.dist-info/licenses/LICENSE.APACHE:",
        " On Debian systems the complete text is in /usr/share/common-licenses/Apache-2.0.",
        "Comment: alpha 1.0, as published on PyPI.",
    ]
    (beta,) = [s for s in stanzas if s.startswith("Files: usr/site/beta-1.0.dist-info/* usr/site/beta.py\n")]
    assert "Copyright: the beta authors: Bo\nLicense: BSD-2-Clause\n" in beta
    assert "@BUNDLED@" not in out.read_text()


@needs_checkout
def test_gen_copyright_stops_at_a_distribution_without_a_licence(tmp_path):
    site = tmp_path / "site"
    fake_distribution(site, "gamma", "Classifier: Programming Language :: Python\n", {"gamma.py": ""})
    p, out = run_gen_copyright(tmp_path, site)
    assert p.returncode == 1 and not out.exists()
    assert (
        p.stderr.strip()
        == "gen-copyright: error: gamma 1.0: no licence in its metadata; name it in gen-copyright.py"
    )


# --- the node packages ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> dict[str, Path]:
    """release -> its package: from $GPUTOPO_DEB_DIR, else built here (needs PyPI)."""
    given = os.environ.get("GPUTOPO_DEB_DIR")
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed: no Debian package can be built or read here")
    out = Path(given) if given else tmp_path_factory.mktemp("debs")
    found = {}
    for release in RELEASES:
        hits = sorted(out.glob(f"gputopo_*_{release}_amd64.deb"))
        if not hits:
            if given:
                pytest.fail(f"GPUTOPO_DEB_DIR={given} holds no gputopo_*_{release}_amd64.deb")
            subprocess.run([str(PACKAGING / "build-deb.sh"), release, str(out)], check=True, timeout=1200)
            hits = sorted(out.glob(f"gputopo_*_{release}_amd64.deb"))
        found[release] = hits[-1]
    return found


def unpack(deb: Path, dest: Path) -> dict[str, str]:
    """Extract ``deb``'s files into ``dest`` and return its control fields."""
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    text = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
    fields, key = {}, None
    for line in text.splitlines():
        if line[:1] in (" ", "\t") and key:
            fields[key] += "\n" + line
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


@pytest.mark.deb
@needs_checkout
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_deb_is_a_venv_for_the_releases_python(debs, tmp_path, release):
    import gputopo

    py = RELEASES[release]
    control = unpack(debs[release], tmp_path)
    assert control["Package"] == "gputopo" and control["Architecture"] == "amd64"
    assert control["Version"] == f"{gputopo.__version__}-1~deb{12 if release == 'bookworm' else 13}"
    assert f"python{py}" in [d.strip().split()[0] for d in control["Depends"].split(",")]
    assert debs[release].name == f"gputopo_{gputopo.__version__}_{release}_amd64.deb"
    venv = tmp_path / "usr/lib/gputopo"
    # relative symlinks within /usr (Debian policy 10.5)
    assert os.readlink(tmp_path / "usr/bin/gputopo") == "../lib/gputopo/bin/gputopo"
    assert os.readlink(venv / "bin/python3") == f"../../../bin/python{py}"
    assert (venv / "bin/gputopo").read_text().startswith("#!/usr/lib/gputopo/bin/python3 -I\n")
    cfg = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines())
    assert cfg["home"] == "/usr/bin" and cfg["include-system-site-packages"] == "false"
    site = venv / f"lib/python{py}/site-packages"
    assert (site / "gputopo/__init__.py").read_text() == (SRC / "gputopo/__init__.py").read_text()
    assert (site / "gputopo/_data/fixtures/hosts/seed.yaml").is_file()
    # Bytecode is made on the node (postinst) for its interpreter, never shipped.
    assert not [p for p in tmp_path.rglob("*") if p.name == "__pycache__" or p.suffix == ".pyc"]
    # Extension modules are built for the release's CPython (or its stable ABI).
    tag = f"cpython-{py.replace('.', '')}-x86_64-linux-gnu"
    wrong = [
        p.name
        for p in site.rglob("*.so")
        if not (p.name.endswith(f".{tag}.so") or p.name.endswith(".abi3.so"))
    ]
    assert not wrong, wrong
    assert any(site.rglob(f"*.{tag}.so"))
    # Nothing refers to the machine or directory it was built in.
    leaks = [
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if p.is_file() and not p.is_symlink() and b"gputopo-deb." in p.read_bytes()
    ]
    assert not leaks, leaks
    man = tmp_path / "usr/share/man/man1"
    assert (man / "gputopo.1.gz").is_file() and (man / "gputopo-apply.1.gz").is_file()
    assert (
        "_GPUTOPO_COMPLETE=bash_complete"
        in (tmp_path / "usr/share/bash-completion/completions/gputopo").read_text()
    )


@pytest.mark.deb
@needs_checkout
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_deb_holds_everything_gputopo_needs_on_the_releases_python(debs, tmp_path, release):
    """Every requirement of gputopo[sim], followed through, is met by a bundled distribution, with
    environment markers evaluated for the release's Python (not the one that built the package)."""
    import importlib.metadata as md

    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    py = RELEASES[release]
    unpack(debs[release], tmp_path)
    site = tmp_path / f"usr/lib/gputopo/lib/python{py}/site-packages"
    bundled = {canonicalize_name(d.metadata["Name"]): d for d in md.distributions(path=[str(site)])}
    env = {
        **default_environment(),
        "python_version": py,
        "python_full_version": f"{py}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
    }
    todo, seen, missing = [("gputopo", {"sim"})], set(), []
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), frozenset(extras))
        if key in seen:
            continue
        seen.add(key)
        dist = bundled[key[0]]
        for text in dist.requires or []:
            req = Requirement(text)
            wanted = req.marker is None or any(
                req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})
            )
            if not wanted:
                continue
            have = bundled.get(canonicalize_name(req.name))
            if have is None or not req.specifier.contains(have.version, prereleases=True):
                missing.append(
                    f"{dist.metadata['Name']} needs {req} (bundled: {have.version if have else 'none'})"
                )
            else:
                todo.append((req.name, set(req.extras)))
    assert not missing, missing
    listed = (tmp_path / "usr/share/doc/gputopo/bundled.txt").read_text().split("\n")
    assert sorted(f"{n} {d.version}" for n, d in bundled.items()) == sorted(
        f"{canonicalize_name(line.split()[0])} {line.split()[1]}" for line in listed if line
    )


def control_files(deb: Path) -> dict[str, str]:
    p = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as t:
        return {
            m.name.removeprefix("./"): t.extractfile(m).read().decode() for m in t.getmembers() if m.isfile()
        }


@pytest.mark.deb
@needs_checkout
def test_deb_maintainer_scripts_are_plain_sh(debs):
    scripts = control_files(debs["bookworm"])
    assert set(scripts) == {"control", "md5sums", "postinst", "prerm"}
    for name in ("postinst", "prerm"):
        assert scripts[name].startswith("#!/bin/sh\n")
        subprocess.run(["sh", "-n"], input=scripts[name], text=True, check=True)


# --- lintian-clean: changelog, copyright, stripped modules, md5sums, Installed-Size ----------------


@pytest.mark.deb
@pytest.mark.slow
@needs_checkout
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_deb_is_lintian_clean(debs, release):
    """No error or warning from lintian but those packaging/debian/lintian-overrides overrides,
    each override under its reason, and none of them stale."""
    if shutil.which("lintian") is None:
        pytest.skip("lintian is not installed (apt-get install lintian; .ci/run installs it)")
    p = subprocess.run(
        [
            "lintian",
            "--fail-on",
            "error,warning",
            "--display-info",
            "--tag-display-limit",
            "0",
            str(debs[release]),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    tags = p.stdout.splitlines()
    assert p.returncode == 0 and not [t for t in tags if t[:2] in ("E:", "W:")], p.stdout + p.stderr
    stale = [t for t in tags if "unused-override" in t or "mismatched-override" in t]
    assert not stale, stale
    overrides = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(debs[release])], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(overrides)) as t:
        lines = t.extractfile("./usr/share/lintian/overrides/gputopo").read().decode().splitlines()
    tagged = [i for i, line in enumerate(lines) if line.startswith("gputopo: ")]
    assert tagged and all(lines[i - 1].startswith("# ") for i in tagged), "an override without its reason"


@pytest.mark.deb
@needs_checkout
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_deb_changelog_is_the_sources_under_an_entry_for_this_build(debs, tmp_path, release):
    import gzip

    control = unpack(debs[release], tmp_path)
    path = tmp_path / "usr/share/doc/gputopo/changelog.Debian.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    first, _, rest = text.partition("\n\n -- ")
    assert first.splitlines()[0] == f"gputopo ({control['Version']}) {release}; urgency=medium"
    assert rest.split("\n\n", 1)[1] == (PACKAGING / "debian/changelog").read_text()
    if shutil.which("dpkg-parsechangelog"):
        p = subprocess.run(
            ["dpkg-parsechangelog", "-l", "-", "-S", "Version"], input=text, capture_output=True, text=True
        )
        assert (p.returncode, p.stdout.strip()) == (0, control["Version"]), p.stderr


def deb822(text: str) -> list[dict[str, str]]:
    """Paragraphs of a deb822 file (DEP-5 copyright): field -> value, continuation lines joined."""
    paragraphs = []
    for block in text.strip("\n").split("\n\n"):
        fields, key = {}, None
        for line in block.splitlines():
            if line[:1] == " " and key:
                fields[key] += "\n" + line[1:]
            else:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        paragraphs.append(fields)
    return paragraphs


@pytest.mark.deb
@needs_checkout
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_deb_copyright_names_each_bundled_distribution_and_its_licence(debs, tmp_path, release):
    """Every file of the private environment falls (DEP-5: the last matching Files stanza) under its
    own distribution's stanza, which names that distribution's licence from its metadata, its
    copyright holders and carries its licence files' text (or Debian's common-licenses copy);
    gputopo's own files fall under an MIT stanza."""
    import fnmatch
    import importlib.metadata as md

    py = RELEASES[release]
    unpack(debs[release], tmp_path)
    header, *paragraphs = deb822((tmp_path / "usr/share/doc/gputopo/copyright").read_text())
    assert header["Format"] == "https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    files = [p for p in paragraphs if "Files" in p]
    standalone = {p["License"].partition("\n")[0] for p in paragraphs if "Files" not in p}
    site_rel = f"usr/lib/gputopo/lib/python{py}/site-packages"

    def stanza_of(path: str) -> dict[str, str]:
        return [p for p in files if any(fnmatch.fnmatchcase(path, g) for g in p["Files"].split())][-1]

    wrong = []
    for dist in md.distributions(path=[str(tmp_path / site_rel)]):
        name, version = dist.metadata["Name"], dist.version
        for f in dist.files or []:
            if not (tmp_path / site_rel / f).is_file() or "__pycache__" in f.parts:
                continue
            stanza = stanza_of(f"{site_rel}/{f}")
            if name == "gputopo":
                if "_data/fixtures/" not in str(f) and stanza["Files"] != "*":
                    wrong.append(f"{f}: {stanza['Files']}")
                continue
            if not stanza.get("Comment", "").startswith(f"{name} {version},"):
                wrong.append(f"{f} ({name}) falls under {stanza.get('Comment')!r}")
        if name == "gputopo":
            continue
        metadata = next(
            f for f in dist.files if f.name == "METADATA" and f.parent.name.endswith(".dist-info")
        )
        stanza = stanza_of(f"{site_rel}/{metadata}")  # its own dist-info
        licence, _, text = stanza["License"].partition("\n")
        expression = dist.metadata.get("License-Expression")
        if expression:
            assert licence.lower() == expression.lower().replace("-or-later", "+"), (name, licence)
        assert licence and stanza["Copyright"].strip(), name
        for lf in dist.metadata.get_all("License-File") or []:
            body = next(p for p in dist.files if p.name == Path(lf).name and ".dist-info" in str(p))
            first = next(
                line.strip() for line in (tmp_path / site_rel / body).read_text().splitlines() if line.strip()
            )
            assert first in text or "/usr/share/common-licenses/" in text, (name, lf)
    assert not wrong, wrong[:10]
    for p in files:  # a short name alone is defined by a stand-alone License paragraph
        if "\n" not in p["License"]:
            assert p["License"] in standalone or "/usr/share/common-licenses/" in p["License"], p["Files"]
    assert stanza_of(f"{site_rel}/gputopo/cli/__init__.py")["License"] == "MIT" and "MIT" in standalone


@pytest.mark.deb
@needs_checkout
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_deb_extension_modules_are_stripped_and_record_and_md5sums_match(debs, tmp_path, release):
    import base64
    import csv
    import hashlib

    py = RELEASES[release]
    unpack(debs[release], tmp_path)
    site = tmp_path / f"usr/lib/gputopo/lib/python{py}/site-packages"
    modules = sorted(site.rglob("*.so"))
    assert modules
    if shutil.which("readelf"):
        for so in modules:
            sections = subprocess.run(
                ["readelf", "-S", "-W", str(so)], check=True, capture_output=True, text=True
            )
            assert ".symtab" not in sections.stdout and ".debug_" not in sections.stdout, so.name
    mismatched = []
    for record in site.glob("*.dist-info/RECORD"):
        for row in csv.reader(record.read_text().splitlines()):
            if row[1] and (site / row[0]).is_file():  # not the console scripts the build drops
                data = (site / row[0]).read_bytes()
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                if row[1:] != [f"sha256={digest}", str(len(data))]:
                    mismatched.append(row[0])
    assert not mismatched, mismatched
    sums = dict(
        reversed(line.split("  ", 1)) for line in control_files(debs[release])["md5sums"].splitlines()
    )
    shipped = {
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()
    }
    assert set(sums) == shipped
    assert all(hashlib.md5((tmp_path / p).read_bytes()).hexdigest() == s for p, s in sums.items())


def release_python(py: str) -> str | None:
    """The release's interpreter (python3.X) if one runs here, else None."""
    found = shutil.which(f"python{py}")
    if found is None:
        return None
    p = subprocess.run(
        [found, "-c", "import sys; print(*sys.version_info[:2], sep='.')"], capture_output=True, text=True
    )
    return found if p.returncode == 0 and p.stdout.strip() == py else None


@pytest.mark.deb
@pytest.mark.slow
@needs_checkout
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_deb_installed_size_counts_the_bytecode_postinst_compiles(debs, tmp_path, release):
    """Installed-Size against the package's files (from its data tarball, in KiB as dpkg-gencontrol
    counts: each file and symlink rounded up, anything else 1) plus the bytecode postinst makes,
    compiled here by the release's Python as postinst runs it. Within 3 %: a package built where
    the release's python3.X is missing counts the build's Python's bytecode instead (3.11's is
    6.6 % larger than 3.13's, 2 % of the whole), while leaving the bytecode out is 29 % short."""
    py = RELEASES[release]
    python = release_python(py)
    if python is None:
        pytest.skip(f"no python{py} here to compile the bytecode (test-deb.sh checks it on the release)")
    deb = debs[release]
    declared = int(unpack(deb, tmp_path)["Installed-Size"])
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        members = t.getmembers()
    files = sum(
        -(-m.size // 1024) if m.isfile() else -(-len(m.linkname) // 1024) if m.issym() else 1 for m in members
    )
    subprocess.run(
        [
            python,
            "-I",
            "-m",
            "compileall",
            "-q",
            "-d",
            "/usr/lib/gputopo/lib",
            str(tmp_path / "usr/lib/gputopo/lib"),
        ],
        capture_output=True,
        timeout=600,
    )
    cached = [p for p in tmp_path.rglob("*") if "__pycache__" in p.parts]
    bytecode = sum(-(-p.stat().st_size // 1024) if p.is_file() else 1 for p in cached)
    assert bytecode > 0.2 * files  # the compile did happen
    real = files + bytecode
    assert abs(declared - real) <= 0.03 * real, (declared, files, bytecode)
