"""The majors of nvidia-uvm and nvidia-caps are dynamic (alloc_chrdev_region): gputopo reads them
from ``/proc/devices`` and writes a legacy container's device rules with them, never a guessed
number."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputopo.actions import UpdateContainer
from gputopo.facts.discover import discover
from gputopo.facts.host import parse_char_majors
from gputopo.plan.devices import DEFAULT_LEGACY_MAJORS
from gputopo.plan.planner import plan
from gputopo.sim.hostroot import materialize
from helpers.hosts import SEED_SPEC, seed_current, seed_facts, seed_spec

# a real node's /proc/devices (a PVE 8 host with the open driver loaded)
PROC_DEVICES = """\
Character devices:
  1 mem
 10 misc
195 nvidia
226 drm
235 nvidia-caps
236 vfio
240 nvidia-uvm
245 ptp
254 gpiochip
508 nvidia-uvm-tools

Block devices:
  8 sd
236 nvidia-uvm
"""


def test_parse_char_majors_reads_the_character_section_by_whole_name() -> None:
    assert parse_char_majors(PROC_DEVICES) == {"nvidia-caps": 235, "nvidia-uvm": 240}
    assert parse_char_majors(None) == {} and parse_char_majors("Block devices:\n 8 sd\n") == {}


@pytest.fixture(scope="module")
def seed_root(tmp_path_factory) -> Path:
    return materialize("seed", tmp_path_factory.mktemp("seed") / "root")


def test_discovery_reads_the_simulated_hosts_majors(seed_root: Path) -> None:
    facts = discover(str(seed_root))
    majors = parse_char_majors((seed_root / "proc/devices").read_text())
    assert facts.host.char_majors == majors and set(majors) == {"nvidia-uvm", "nvidia-caps"}
    assert majors != DEFAULT_LEGACY_MAJORS  # not the numbers gputopo would otherwise guess


def test_legacy_device_rules_use_the_majors_proc_devices_lists() -> None:
    text = SEED_SPEC.replace("mapping: pro6000\n", "mapping: pro6000\n        device_mode: legacy\n")
    facts = seed_facts()
    facts.host.char_majors = {"nvidia-uvm": 240, "nvidia-caps": 235}
    p = plan(facts, seed_spec(text), seed_current())
    assert not [w for w in p.warnings if "guessed char majors" in w]
    (upd,) = [a for a in p.actions if isinstance(a, UpdateContainer)]
    rules = [v for k, v in upd.lxc_add if k == "lxc.cgroup2.devices.allow"]
    assert rules == ["c 195:* rwm", "c 240:* rwm", "c 235:* rwm"]
    # the spec's own numbers still win
    given = text.replace(
        "device_mode: legacy\n", "device_mode: legacy\n        legacy_majors: {nvidia-uvm: 508}\n"
    )
    (upd,) = [
        a for a in plan(facts, seed_spec(given), seed_current()).actions if isinstance(a, UpdateContainer)
    ]
    assert ["lxc.cgroup2.devices.allow", "c 508:* rwm"] in upd.lxc_add
