"""The drift watch's systemd units (packaging/systemd): what they run is a command line gputopo
accepts, the timer starts the one-pass service, and the package ships them disabled."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from gputopo.cli.watchcmd import watch
from helpers import REPO

UNITS = REPO / "packaging" / "systemd"
NAMES = ("gputopo-watch.service", "gputopo-watch.timer", "gputopo-watch-follow.service")
pytestmark = pytest.mark.skipif(not UNITS.is_dir(), reason="not a source checkout: no packaging/")


def unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str  # systemd's keys are case-sensitive
    cp.read_string((UNITS / name).read_text())
    return cp


@pytest.mark.parametrize("name", ["gputopo-watch.service", "gputopo-watch-follow.service"])
def test_each_service_runs_a_watch_command_line_gputopo_accepts(name):
    argv = shlex.split(unit(name)["Service"]["ExecStart"])
    assert argv[:2] == ["/usr/bin/gputopo", "watch"]  # the package's link to its launcher
    ctx = watch.make_context("watch", argv[2:])  # click refuses an unknown option or a bad value
    assert ctx.params["fmt"] == "prometheus" and ctx.params["follow"] == (
        name == "gputopo-watch-follow.service"
    )


def test_the_timer_starts_the_one_pass_service_and_can_be_enabled():
    timer = unit("gputopo-watch.timer")
    assert timer["Install"]["WantedBy"] == "timers.target"
    # no Unit=: a timer starts the service of its own name
    assert "Unit" not in timer["Timer"] and (UNITS / "gputopo-watch.service").is_file()
    assert unit("gputopo-watch.service")["Service"]["Type"] == "oneshot"
    assert "gputopo-watch.timer" in unit("gputopo-watch-follow.service")["Unit"]["Conflicts"].split()


def test_the_enable_command_is_the_one_the_docs_give():
    assert "systemctl enable --now gputopo-watch.timer" in (REPO / "docs" / "watch.md").read_text()


def test_build_deb_installs_every_unit():
    script = (REPO / "packaging" / "build-deb.sh").read_text()
    line = next(ln for ln in script.splitlines() if "packaging/systemd/" in ln and ln.startswith("install "))
    assert line.endswith("gputopo-watch{.service,.timer,-follow.service}")
    assert sorted(p.name for p in UNITS.iterdir()) == sorted(NAMES)


@pytest.mark.deb
@pytest.mark.parametrize("release, unitdir", [("bookworm", "lib"), ("trixie", "usr/lib")])
def test_the_package_ships_the_units_disabled(release, unitdir, tmp_path):
    given = os.environ.get("GPUTOPO_DEB_DIR")
    if not given:
        pytest.skip("GPUTOPO_DEB_DIR is not set (CI builds the packages once and sets it)")
    deb = sorted(Path(given).glob(f"gputopo_*_{release}_amd64.deb"))[-1]
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "root")], check=True)
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "control")], check=True)
    for name in NAMES:
        shipped = tmp_path / "root" / unitdir / "systemd/system" / name
        assert shipped.read_text() == (UNITS / name).read_text(), name
    assert not (tmp_path / "root/etc/systemd").exists()  # no enablement link in the package
    scripts = "".join(
        p.read_text() for p in (tmp_path / "control").iterdir() if p.name in ("postinst", "preinst")
    )
    assert "gputopo-watch" not in scripts  # and none made at install


SPEC_PATH = re.compile(r"/etc/gputopo/[\w.-]+\.ya?ml")
PLAYBOOK = REPO / "ansible_collections/gputopo/proxmox/playbooks/rolling_apply.yml"
NAMING_THE_SPEC = [
    UNITS / "gputopo-watch.service",
    UNITS / "gputopo-watch-follow.service",
    PLAYBOOK,
    REPO / "ansible_collections/gputopo/proxmox/README.md",
    REPO / "ansible_collections/gputopo/proxmox/plugins/modules/topology.py",
    REPO / "docs/watch.md",
    REPO / "docs/clusters.md",
]


def test_one_default_spec_path_in_the_watch_its_units_the_playbook_and_the_docs():
    """Where the playbook leaves the spec is where the watch and its units read it: the watch's
    default, the CLI's, every node spec path the units, the collection and the docs name."""
    from gputopo.watch.run import DEFAULT_SPEC

    assert {p.name: p.default for p in watch.params}["spec_file"] == DEFAULT_SPEC
    for name in ("gputopo-watch.service", "gputopo-watch-follow.service"):
        argv = shlex.split(unit(name)["Service"]["ExecStart"])
        assert watch.make_context("watch", argv[2:]).params["spec_file"] == DEFAULT_SPEC, name
    named = {str(p.relative_to(REPO)): set(SPEC_PATH.findall(p.read_text())) for p in NAMING_THE_SPEC}
    assert {p: paths - {DEFAULT_SPEC} for p, paths in named.items()} == {p: set() for p in named}
    assert DEFAULT_SPEC in named["docs/watch.md"] and DEFAULT_SPEC in named["docs/clusters.md"]
    tasks = yaml.safe_load(PLAYBOOK.read_text())[0]["tasks"]
    copy = next(t["ansible.builtin.copy"] for t in tasks if "ansible.builtin.copy" in t)
    assert copy["dest"] == "{{ gputopo_spec_path | default('" + DEFAULT_SPEC + "') }}"
