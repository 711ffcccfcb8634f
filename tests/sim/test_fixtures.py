"""Host fixtures: the built trees have the kernel's layout, and bad descriptions are refused."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from gputopo.errors import FixtureError
from gputopo.sim.hostroot import HostSpec, list_hosts, load_host, materialize
from helpers import REPO

SEED_GPUS = [
    "0000:01:00.0",
    "0000:11:00.0",
    "0000:61:00.0",
    "0000:71:00.0",
    "0000:81:00.0",
    "0000:91:00.0",
    "0000:e1:00.0",
    "0000:f1:00.0",
]


def test_list_hosts_has_the_required_hosts():
    assert {"seed", "esc8000a", "shared-group", "numa-unknown", "iommu-off", "large"} <= set(list_hosts())


def test_load_host_expands_and_validates():
    seed = load_host("seed")
    assert isinstance(seed, HostSpec)
    assert seed.hostname == "pve1"
    assert sum(d.preset == "rtx-pro-6000" for d in seed.devices) == 8
    assert len(load_host("large").devices) > 100  # generated, not hand-written


def test_seed_device_dirs_nest_along_the_bridges(materialized):
    r = materialized("seed")
    link = r / "sys/bus/pci/devices/0000:81:00.0"
    assert link.is_symlink()
    assert os.readlink(link) == "../../../devices/pci0000:80/0000:80:01.1/0000:81:00.0"
    assert link.resolve() == (r / "sys/devices/pci0000:80/0000:80:01.1/0000:81:00.0").resolve()
    vga = (r / "sys/bus/pci/devices/0000:63:00.0").resolve()
    assert vga.parent.name == "0000:62:00.0" and vga.parent.parent.name == "0000:60:05.2"


def test_seed_driver_links_both_ways(materialized):
    r = materialized("seed")
    dev = r / "sys/bus/pci/devices/0000:01:00.0"
    assert os.readlink(dev / "driver").endswith("bus/pci/drivers/nvidia")
    assert (dev / "driver").resolve() == (r / "sys/bus/pci/drivers/nvidia").resolve()
    back = r / "sys/bus/pci/drivers/nvidia/0000:01:00.0"
    assert back.is_symlink() and back.resolve() == dev.resolve()
    for f in ("bind", "unbind", "new_id", "remove_id"):
        assert (r / "sys/bus/pci/drivers/vfio-pci" / f).is_file()
    assert (r / "sys/bus/pci/drivers_probe").is_file()


def test_vfio_driver_dir_only_when_module_loaded(materialized):
    assert (materialized("seed") / "sys/bus/pci/drivers/vfio-pci").is_dir()
    off = materialized("iommu-off")
    assert not (off / "sys/bus/pci/drivers/vfio-pci").exists()
    assert "vfio" not in (off / "proc/modules").read_text()


def test_iommu_groups_links_and_absence(materialized):
    r = materialized("seed")
    dev = r / "sys/bus/pci/devices/0000:01:00.0"
    g = dev / "iommu_group"
    n = os.readlink(g).rsplit("/", 1)[1]
    member = r / "sys/kernel/iommu_groups" / n / "devices/0000:01:00.0"
    assert member.is_symlink() and member.resolve() == dev.resolve()
    assert os.listdir(r / "sys/kernel/iommu_groups" / n / "devices") == ["0000:01:00.0"]
    off = materialized("iommu-off")
    assert os.listdir(off / "sys/kernel/iommu_groups") == []
    assert not (off / "sys/bus/pci/devices/0000:01:00.0/iommu_group").exists()


def test_shared_group_puts_switch_gpu_and_nvme_together(materialized):
    r = materialized("shared-group")
    gdir = os.readlink(r / "sys/bus/pci/devices/0000:03:00.0/iommu_group")
    members = sorted(
        os.listdir(
            (r / "sys/bus/pci/devices/0000:03:00.0" / gdir).resolve().parent
            / gdir.rsplit("/", 1)[1]
            / "devices"
        )
    )
    assert members == [
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:02:01.0",
        "0000:03:00.0",
        "0000:03:00.1",
        "0000:04:00.0",
    ]


def test_attribute_files_have_sysfs_format(materialized):
    d = materialized("seed") / "sys/bus/pci/devices/0000:e1:00.0"

    def rd(n):
        return (d / n).read_text()

    assert rd("vendor") == "0x10de\n" and rd("device") == "0x2bb5\n"
    assert rd("subsystem_vendor") == "0x10de\n" and rd("subsystem_device") == "0x204e\n"
    assert rd("class") == "0x030200\n"
    assert rd("numa_node") == "1\n"
    assert rd("local_cpulist") == "64-127,192-255\n"
    assert rd("driver_override") == "(null)\n"
    assert rd("current_link_speed") == "32.0 GT/s PCIe\n" and rd("current_link_width") == "16\n"
    assert rd("reset_method") == "flr bus\n"
    assert re.fullmatch(r"([0-9a-f]{8},){7}[0-9a-f]{8}\n", rd("local_cpus"))
    assert not (d / "boot_vga").exists()  # a 3D controller has no boot_vga
    vga = materialized("seed") / "sys/bus/pci/devices/0000:63:00.0"
    assert (vga / "boot_vga").read_text() == "1\n"


def test_config_header_is_valid(materialized):
    r = materialized("seed")
    cfg = (r / "sys/bus/pci/devices/0000:01:00.0/config").read_bytes()
    vendor, device = struct.unpack_from("<HH", cfg, 0)
    assert (vendor, device) == (0x10DE, 0x2BB5)
    assert cfg[0x0B] == 0x03 and cfg[0x0A] == 0x02 and cfg[0x0E] & 0x7F == 0
    assert struct.unpack_from("<HH", cfg, 0x2C) == (0x10DE, 0x204E)
    cap = cfg[0x34]
    assert cfg[cap] == 0x10  # PCI Express capability
    lnksta = struct.unpack_from("<H", cfg, cap + 0x12)[0]
    assert lnksta & 0xF == 5 and (lnksta >> 4) & 0x3F == 16
    bridge = (r / "sys/bus/pci/devices/0000:60:05.2/config").read_bytes()
    assert bridge[0x0E] & 0x7F == 1
    assert (bridge[0x18], bridge[0x19], bridge[0x1A]) == (0x60, 0x62, 0x63)


def test_proc_and_dev(materialized):
    r = materialized("seed")
    for line in (r / "proc/modules").read_text().splitlines():
        assert re.fullmatch(r"\w+ \d+ \d+ (-|(\w+,)+) Live 0x[0-9a-f]{16}( \(\w+\))?", line), line
    info = (r / "proc/driver/nvidia/gpus/0000:61:00.0/information").read_text()
    keys = [ln.split(":", 1)[0] for ln in info.splitlines()]
    assert keys == [
        "Model",
        "IRQ",
        "GPU UUID",
        "Video BIOS",
        "Bus Type",
        "DMA Size",
        "DMA Mask",
        "Bus Location",
        "Device Minor",
        "GPU Excluded",
    ]
    assert re.search(r"Device Minor:\s+3\n", info)
    assert (r / "proc/sys/kernel/hostname").read_text() == "pve1\n"
    assert "amd_iommu=on" in (r / "proc/cmdline").read_text()
    assert (r / "sys/module/kvm_amd/parameters/sev_snp").read_text() == "Y\n"
    for n in [
        "nvidia0",
        "nvidia7",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
        "nvidia-caps/nvidia-cap1",
        "nvidia-caps/nvidia-cap2",
        "vfio/vfio",
    ]:
        assert (r / "dev" / n).is_file(), n
    majors = json.loads((r / "dev/.devices.json").read_text())
    assert majors["nvidia3"] == ["c", 195, 3]
    assert (r / "sys/devices/system/node/node1/cpulist").read_text() == "64-127,192-255\n"
    assert (r / "sys/devices/system/node/online").read_text() == "0-1\n"


def test_vfio_group_nodes_follow_vfio_bound_groups(materialized):
    r = materialized("shared-group")
    g = os.readlink(r / "sys/bus/pci/devices/0000:06:00.0/iommu_group").rsplit("/", 1)[1]
    assert sorted(os.listdir(r / "dev/vfio")) == sorted(["vfio", g])


def test_large_host_shape(materialized):
    r = materialized("large")
    addrs = os.listdir(r / "sys/bus/pci/devices")
    assert len(addrs) >= 2000
    assert {a.split(":")[0] for a in addrs} >= {"0000", "0001", "10000"}
    assert (r / "sys/devices/pci10000:00").is_dir()
    gpus = [
        a
        for a in addrs
        if (r / "sys/bus/pci/devices" / a / "class").read_text().startswith("0x03")
        and (r / "sys/bus/pci/devices" / a / "vendor").read_text() == "0x10de\n"
    ]
    assert len(gpus) >= 64
    nvsw = [a for a in addrs if (r / "sys/bus/pci/devices" / a / "class").read_text() == "0x068000\n"]
    assert len(nvsw) == 2
    broken = [a for a in addrs if (r / "sys/bus/pci/devices" / a / "vendor").read_text() == "0xffff\n"]
    assert len(broken) == 1
    assert (r / "sys/devices/system/node/node2/cpulist").read_text() == "\n"
    pf = [
        a
        for a in gpus
        if (r / "sys/bus/pci/devices" / a / "sriov_numvfs").exists()
        and (r / "sys/bus/pci/devices" / a / "sriov_numvfs").read_text() != "0\n"
    ]
    assert len(pf) == 1
    vf = (r / "sys/bus/pci/devices" / pf[0] / "virtfn0").resolve()
    assert (vf / "physfn").resolve() == (r / "sys/bus/pci/devices" / pf[0]).resolve()


def _write_host(tmp_path: Path, devices: str) -> Path:
    p = tmp_path / "h.yaml"
    p.write_text("hostname: t\ncmdline: ro\nnuma: [{id: 0, cpus: '0-3'}]\ndevices:\n" + devices)
    return p


@pytest.mark.parametrize(
    "devices, problem",
    [
        ("  - {addr: '00:01.0', preset: no-such}\n", "unknown preset 'no-such'"),
        (
            "  - {addr: '00:01.0', preset: nvme}\n  - {addr: '01:00.0', parent: '00:01.0', preset: nvme}\n",
            "parent 0000:00:01.0 is not a bridge",
        ),
        ("  - {addr: '01:00.0', parent: '00:01.1', preset: nvme}\n", "parent 0000:00:01.1 is not listed"),
        ("  - {addr: '00:01.0', preset: nvme, bogus: 1}\n", "bogus"),
    ],
)
def test_bad_descriptions_are_refused_in_one_line(tmp_path, devices, problem):
    with pytest.raises(FixtureError) as e:
        materialize(_write_host(tmp_path, devices), tmp_path / "root")
    assert problem in str(e.value) and "\n" not in str(e.value)


def test_unknown_host_and_nonempty_dest(tmp_path):
    with pytest.raises(FixtureError, match="no such host"):
        load_host("does-not-exist")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    with pytest.raises(FixtureError, match="not empty"):
        materialize("iommu-off", tmp_path / "x")


def test_cli_list_and_build(tmp_path):
    from gputopo.cli import cli

    res = CliRunner().invoke(cli, ["fixtures", "list"])
    assert res.exit_code == 0 and "seed" in res.output and "large" in res.output
    res = CliRunner().invoke(cli, ["fixtures", "build", "iommu-off", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r/sys/bus/pci/devices/0000:01:00.0/vendor").read_text() == "0x10de\n"


# --- packaging: a non-editable install carries the templates and fixtures ---------------------

SRC = REPO


@pytest.mark.slow
def test_wheel_ships_templates_and_fixtures_and_resources_find_them(tmp_path):
    import subprocess
    import sys
    import zipfile

    pytest.importorskip(
        "hatchling", reason="hatchling (the build backend, in the [test] extra) is not installed"
    )
    if not (SRC / "pyproject.toml").is_file():
        pytest.skip("not a source checkout: no pyproject.toml next to tests/")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(SRC), "-w", str(tmp_path / "w")],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "w").glob("gputopo-*.whl")
    shipped = {}
    for top in ("templates", "fixtures"):
        for f in (SRC / top).rglob("*"):
            if f.is_file():
                shipped[f"gputopo/_data/{f.relative_to(SRC).as_posix()}"] = f.read_bytes()
    assert any(n.endswith(".j2") for n in shipped) and any(n.endswith("seed.yaml") for n in shipped)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert set(shipped) <= names, sorted(set(shipped) - names)
        assert all(z.read(n) == data for n, data in shipped.items())
    target = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    # Run from tmp_path with the install first on the path, so the checkout cannot answer.
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = (
        "import json, gputopo, gputopo.resources as r, gputopo.sim.hostroot as f, gputopo.plan.render as t\n"
        "print(json.dumps([gputopo.__file__, str(r.templates_dir()), str(r.fixtures_dir()),\n"
        "                  f.list_hosts(), t.render_udev_rules(['0000:81:00.0'])]))\n"
    )
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    pkg, templates, fixtures, hosts, rules = json.loads(p.stdout)
    assert Path(pkg).parent == target / "gputopo"
    assert Path(templates) == target / "gputopo/_data/templates"
    assert Path(fixtures) == target / "gputopo/_data/fixtures"
    assert hosts == list_hosts()
    assert "0000:81:00.0" in rules and "vfio-pci" in rules
    out = tmp_path / "seed-root"
    p = subprocess.run(
        [sys.executable, "-m", "gputopo", "fixtures", "build", "seed", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert (out / "sys/bus/pci/devices/0000:f1:00.0/vendor").read_text() == "0x10de\n"


def test_unquoted_addresses_are_addresses_not_base_60_numbers(tmp_path):
    # YAML 1.1 reads 01:00.0 as the number 60.0; a description is read like a spec
    path = tmp_path / "h.yaml"
    path.write_text("hostname: h\ncmdline: quiet\ndevices:\n  - {addr: 01:00.0, preset: rtx-pro-6000}\n")
    assert load_host(path).devices[0].addr == "01:00.0"


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "hostname: h\ncmdline: 'q\n",
            "h.yaml: YAML syntax error at line 3, column 1: found unexpected end of stream",
        ),
        (
            "hostname: h\ncmdline: q\ndevices:\n  - {addr: 01:00.0, presett: x}\n",
            "h.yaml: devices[0].preset: required key is missing (+1 more)",
        ),
    ],
)
def test_bad_yaml_names_the_line_or_the_field(tmp_path, text, problem):
    path = tmp_path / "h.yaml"
    path.write_text(text)
    with pytest.raises(FixtureError) as e:
        load_host(path)
    assert str(e.value) == f"{tmp_path}/{problem}"
