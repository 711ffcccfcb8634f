"""Proxmox file formats: the parser rules of docs proxmox.md, good and bad examples, round trips."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputopo.errors import GputopoError, PveFormatError
from gputopo.formats.lxcconf import LxcConf, LxcSection, parse_lxc_conf, write_lxc_conf
from gputopo.formats.lxcdev import format_dev_value, parse_dev_value
from gputopo.formats.lxcrules import validate_lxc_conf
from gputopo.formats.pcicfg import (
    MapEntry,
    PciMapping,
    format_map_entry,
    parse_map_entry,
    parse_pci_cfg,
    validate_pci_cfg,
    write_pci_cfg,
)
from gputopo.formats.propstring import decode_text, encode_text, sha1_digest

# --- devN ----------------------------------------------------------------------------------


def test_parse_dev_value_implicit_and_explicit_path():
    assert parse_dev_value("/dev/nvidia0,gid=44,mode=0666") == {
        "path": "/dev/nvidia0",
        "gid": 44,
        "mode": "0666",
    }
    assert parse_dev_value("path=/dev/nvidia-uvm,deny-write=1,uid=0") == {
        "path": "/dev/nvidia-uvm",
        "deny-write": True,
        "uid": 0,
    }


@pytest.mark.parametrize(
    "bad, culprit",
    [
        ("/dev/nvidia0,mode=666", "mode"),
        ("/dev/nvidia0,mode=0868", "mode"),
        ("/dev/nvidia0,gid=video", "gid"),
        ("/dev/nvidia0,uid=-1", "uid"),
        ("/dev/nvidia0,deny-write=true", "deny-write"),
        ("/tmp/nvidia0", "path"),
        ("/dev/../etc/shadow", "path"),
        ("/dev/./nvidia0", "path"),
        ("/dev/nvidia0,owner=root", "owner"),
        ("gid=44,mode=0666", "dev"),
        ("/dev/nvidia0,,gid=44", "dev"),
    ],
)
def test_parse_dev_value_rejects(bad, culprit):
    with pytest.raises(PveFormatError) as ei:
        parse_dev_value(bad)
    assert culprit in str(ei.value)
    assert "\n" not in str(ei.value)
    assert isinstance(ei.value, GputopoError)


def test_format_dev_value_canonical_order():
    assert format_dev_value("/dev/nvidia0", mode="0666", gid=44) == "/dev/nvidia0,gid=44,mode=0666"
    assert (
        format_dev_value("/dev/nvidia1", uid=0, deny_write=True, mode="0660")
        == "/dev/nvidia1,deny-write=1,mode=0660,uid=0"
    )
    assert format_dev_value("/dev/nvidiactl") == "/dev/nvidiactl"
    assert format_dev_value("/dev/nvidiactl", gid=None) == "/dev/nvidiactl"
    with pytest.raises(PveFormatError):
        format_dev_value("/dev/nvidia0", mode="666")
    with pytest.raises(PveFormatError):
        format_dev_value("/dev/nvidia0", major=195)
    with pytest.raises(PveFormatError):
        format_dev_value("nvidia0")


@given(
    minor=st.integers(0, 255),
    gid=st.none() | st.integers(0, 65535),
    mode=st.none() | st.from_regex(r"\A0[0-7]{3}\Z"),
    deny=st.none() | st.booleans(),
)
def test_dev_value_round_trip(minor, gid, mode, deny):
    text = format_dev_value(f"/dev/nvidia{minor}", gid=gid, mode=mode, deny_write=deny)
    parsed = parse_dev_value(text)
    assert parsed["path"] == f"/dev/nvidia{minor}"
    assert parsed.get("gid") == gid and parsed.get("mode") == mode and parsed.get("deny-write") == deny
    path = parsed.pop("path")
    assert format_dev_value(path, **parsed) == text


# --- container configs ---------------------------------------------------------------------

REAL_CT = """\
#LLM server%3A SGLang tp 8
#second line
arch: amd64
cores: 32
dev0: /dev/nvidia0,gid=44,mode=0666
dev1: /dev/nvidiactl,gid=44,mode=0666
features: nesting=1
hostname: llm
memory: 262144
net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth
ostype: debian
rootfs: local-lvm:vm-101-disk-0,size=200G
swap: 0
unprivileged: 0
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file

[pve:pending]
delete: dev1
dev2: /dev/nvidia2,gid=44,mode=0666

[before-split]
#snapshot notes
arch: amd64
hostname: llm
snaptime: 1700000000
"""


def test_parse_lxc_conf_sections():
    conf = parse_lxc_conf(REAL_CT)
    assert conf.description == "LLM server: SGLang tp 8\nsecond line\n"
    assert list(conf.options)[:3] == ["arch", "cores", "dev0"]
    assert conf.options["dev0"] == "/dev/nvidia0,gid=44,mode=0666"
    assert conf.lxc == [
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.mount.entry", "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file"),
    ]
    assert conf.pending.options == {"delete": "dev1", "dev2": "/dev/nvidia2,gid=44,mode=0666"}
    assert conf.pending_delete == ["dev1"]
    assert list(conf.snapshots) == ["before-split"]
    assert conf.snapshots["before-split"].description == "snapshot notes\n"
    assert conf.snapshots["before-split"].options["snaptime"] == "1700000000"


def test_write_lxc_conf_is_proxmox_canonical():
    assert write_lxc_conf(parse_lxc_conf(REAL_CT)) == REAL_CT


def test_writer_sorts_keys_moves_comments_up_and_raw_lines_last():
    text = "memory: 512\nlxc.apparmor.profile = unconfined\ndev10: /dev/nvidia10\n# note\ndev2: /dev/nvidia2\narch: amd64\n"
    assert write_lxc_conf(parse_lxc_conf(text)) == (
        "# note\narch: amd64\ndev10: /dev/nvidia10\ndev2: /dev/nvidia2\nmemory: 512\n"
        "lxc.apparmor.profile: unconfined\n"
    )


def test_duplicate_key_last_wins_and_delete_outside_pending_dropped():
    conf = parse_lxc_conf("cores: 2\ncores: 4\ndelete: dev0\n")
    assert conf.options == {"cores": "4"}


def test_write_rejects_newline_in_value():
    with pytest.raises(PveFormatError, match="hostname"):
        write_lxc_conf(LxcConf(options={"hostname": "a\nb"}))


def test_empty_pending_not_written():
    conf = LxcConf(options={"arch": "amd64"}, pending=LxcSection())
    assert write_lxc_conf(conf) == "arch: amd64\n"


def test_text_encoding_matches_proxmox():
    assert encode_text("a: b 100% é") == "a%3A b 100% %C3%A9"
    assert decode_text("a%3A b %C3%A9") == "a: b é"


def test_sha1_digest_of_empty():
    assert sha1_digest("") == "da39a3ee5e6b4b0d3255bfef95601890afd80709"


def test_validate_lxc_conf_accepts_real_config():
    assert validate_lxc_conf(REAL_CT) == []


@pytest.mark.parametrize(
    "line, needle",
    [
        ("Cores: 4", "unable to parse config"),
        ("gpus: 4", "unknown setting 'gpus'"),
        ("dev256: /dev/nvidia0", "dev256"),
        ("dev0: /dev/nvidia0,mode=666", "mode"),
        ("dev0: nvidia0", "not a valid device path"),
        ("dev0: /dev/../etc/passwd", "/../"),
        ("dev0: /dev/nvidia0,uid=root", "uid"),
        ("dev0: /dev/nvidia0,deny-write=2", "deny-write"),
        ("cores: many", "integer"),
        ("onboot: maybe", "boolean"),
        ("arch: sparc", "enumeration"),
        ("cmode: serial", "enumeration"),
        ("tty: 9", "maximum"),
        ("net32: name=eth0", "net32"),
        ("hostname:", "unable to parse config"),
        ("lxc.rootfs.path: /tmp", "not allowed"),
        ("lxc.cgroup.devices.allow: c 195:* rwm", "cgroup v1 key is deprecated"),
        ("delete: dev0", "only allowed in [pve:pending]"),
        ("[Bad Section]", "section"),
    ],
)
def test_validate_lxc_conf_rejects(line, needle):
    problems = validate_lxc_conf(f"arch: amd64\n{line}\n")
    assert len(problems) == 1, problems
    assert needle in problems[0] and problems[0].startswith("line 2:")


@pytest.mark.parametrize(
    "line",
    [
        "dev0: path=/dev/nvidia0",
        "dev255: /dev/nvidia-caps/nvidia-cap1,mode=0600",
        "dev3: /dev/nvidia-uvm,deny-write=0",
        "onboot: 1",
        "cpulimit: 1.5",
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "description: free text",
        "mp0: /data,mp=/data",
        "tags: gpu;llm",
    ],
)
def test_validate_lxc_conf_accepts(line):
    assert validate_lxc_conf(f"arch: amd64\n{line}\n") == []


def test_validate_lxc_conf_comment_rules():
    assert validate_lxc_conf("#notes\narch: amd64\n") == []
    late = validate_lxc_conf("arch: amd64\n# generated by a tool\n")
    assert late and "line 2" in late[0] and "description" in late[0]
    strict = validate_lxc_conf("#notes\narch: amd64\n", allow_description=False)
    assert strict and "line 1" in strict[0]
    assert validate_lxc_conf("arch: amd64\n\n[pve:pending]\ndelete: dev0\n") == []


# --- PCI mappings --------------------------------------------------------------------------

PCI_CFG = """\
pro6000
\tmap id=10de:2bb5,iommugroup=12,node=pve1,path=0000:01:00.0,subsystem-id=10de:204e
\tmap id=10de:2bb5,iommugroup=20,node=pve1,path=0000:11:00.0,subsystem-id=10de:204e
\tdescription RTX PRO 6000 on NUMA node 0

pro6000-vm
\tmap id=10de:2bb5,iommugroup=40,node=pve1,path=0000:81:00.0,subsystem-id=10de:204e
\tmap id=10de:2bb5,iommugroup=52,node=pve1,path=0000:91:00.0;0000:91:00.1,subsystem-id=10de:204e
\tdescription RTX PRO 6000 on NUMA node 1 for VM passthrough
\tlive-migration-capable 0
\tmdev 0

"""


def test_parse_pci_cfg():
    maps = parse_pci_cfg(PCI_CFG)
    assert [m.id for m in maps] == ["pro6000", "pro6000-vm"]
    assert maps[0].description == "RTX PRO 6000 on NUMA node 0"
    assert maps[1].maps[1].endswith("path=0000:91:00.0;0000:91:00.1,subsystem-id=10de:204e")
    assert maps[1].mdev is False and maps[1].live_migration_capable is False
    assert maps[1].entries()[1].paths == ["0000:91:00.0", "0000:91:00.1"]


def test_write_pci_cfg_round_trip_is_canonical():
    assert write_pci_cfg(parse_pci_cfg(PCI_CFG)) == PCI_CFG
    assert write_pci_cfg([]) == ""


def test_write_pci_cfg_puts_map_first_and_sorts_rest():
    mp = PciMapping(id="gpu", maps=["id=10de:2bb5,node=pve1,path=0000:01:00.0"], description="d", mdev=True)
    assert (
        write_pci_cfg([mp])
        == "gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n\tdescription d\n\tmdev 1\n\n"
    )
    with pytest.raises(PveFormatError, match="map"):
        write_pci_cfg([PciMapping(id="gpu")])
    with pytest.raises(PveFormatError, match="ID"):
        write_pci_cfg([PciMapping(id="1gpu", maps=["id=10de:2bb5,node=pve1,path=0000:01:00.0"])])


def test_parse_pci_cfg_drops_comments_and_unparseable_lines():
    text = "# header comment\ngpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n# inner\n\tdescription x\n"
    maps = parse_pci_cfg(text)
    assert maps == [PciMapping(id="gpu", maps=["id=10de:2bb5,node=pve1,path=0000:01:00.0"], description="x")]
    assert "#" not in write_pci_cfg(maps)


def test_map_entry_round_trip_and_order():
    text = "id=10de:2bb5,iommugroup=40,node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"
    e = parse_map_entry(text)
    assert e == MapEntry(
        id="10de:2bb5", node="pve1", path="0000:81:00.0", iommugroup=40, subsystem_id="10de:204e"
    )
    assert format_map_entry(e) == text
    reordered = parse_map_entry("node=pve1,path=0000:81:00.0,id=10de:2bb5")
    assert format_map_entry(reordered) == "id=10de:2bb5,node=pve1,path=0000:81:00.0"
    assert format_map_entry(
        MapEntry(id="10de:2bb5", node="pve1", path="0000:81:00.0", description="left")
    ) == ("id=10de:2bb5,node=pve1,path=0000:81:00.0,description=left")


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("node=pve1,path=0000:81:00.0", "id: property is missing"),
        ("id=10de:2bb5,path=0000:81:00.0", "node: property is missing"),
        ("id=10de:2bb5,node=pve1", "path: property is missing"),
        ("id=0x10de:0x2bb5,node=pve1,path=0000:81:00.0", "id:"),
        ("id=10dg:2bb5,node=pve1,path=0000:81:00.0", "id:"),
        ("id=10de:2bb5,node=pve1,path=81:00.0", "path:"),
        ("id=10de:2bb5,node=pve1,path=0000:81:00.0;", "path:"),
        ("id=10de:2bb5,node=pve1,path=0000:8A:00.0", "path:"),
        ("id=10de:2bb5,node=pve_1,path=0000:81:00.0", "node:"),
        ("id=10de:2bb5,node=pve1,path=0000:81:00.0,iommugroup=x", "iommugroup:"),
        ("id=10de:2bb5,node=pve1,path=0000:81:00.0,subsystem-id=204e", "subsystem-id:"),
        ("id=10de:2bb5,node=pve1,path=0000:81:00.0,numa=1", "numa: property is not defined"),
        ("id=10de:2bb5,node=pve1,node=pve2,path=0000:81:00.0", "duplicate"),
    ],
)
def test_parse_map_entry_rejects(bad, needle):
    with pytest.raises(PveFormatError) as ei:
        parse_map_entry(bad)
    assert needle in str(ei.value)
    problems = validate_pci_cfg(f"gpu\n\tmap {bad}\n")
    assert any(needle in p for p in problems), problems


def test_validate_pci_cfg_accepts_canonical():
    assert validate_pci_cfg(PCI_CFG) == []


@pytest.mark.parametrize(
    "text, needle",
    [
        ("pci: gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n", "bare id"),
        ("1gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n", "invalid configuration ID"),
        ("g\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n", "invalid configuration ID"),
        ("gpu\n    map id=10de:2bb5,node=pve1,path=0000:01:00.0\n", "tab"),
        ("gpu\n\tdescription only\n", "required option 'map'"),
        ("gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n\tmdev true\n", "mdev"),
        (
            "gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n\tlive-migration-capable yes\n",
            "live-migration-capable",
        ),
        ("gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n\tnuma 1\n", "numa"),
        ("# generated\ngpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n", "dropped"),
        (
            "gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n\tdescription a\n\tdescription b\n",
            "duplicate attribute",
        ),
        (
            "gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\nvm\n\tmap id=10de:2bb5,node=pve1,path=0000:81:00.0\n",
            "no blank line",
        ),
        (
            "gpu\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n\ngpu\n\tmap id=10de:2bb5,node=pve1,path=0000:81:00.0\n",
            "duplicate section",
        ),
        ("gpu\n\tmap\n", "without a value"),
    ],
)
def test_validate_pci_cfg_rejects(text, needle):
    problems = validate_pci_cfg(text)
    assert any(needle in p for p in problems), problems
    assert all(p.startswith("line ") for p in problems)


_hex4 = st.from_regex(r"\A[0-9a-f]{4}\Z")
_addr = st.builds(
    lambda b, d, f: f"0000:{b:02x}:{d:02x}.{f}", st.integers(0, 255), st.integers(0, 31), st.integers(0, 7)
)


@given(
    st.lists(
        st.builds(
            MapEntry,
            id=st.builds(lambda a, b: f"{a}:{b}", _hex4, _hex4),
            node=st.from_regex(r"\A[a-z][a-z0-9]{0,8}\Z"),
            path=st.lists(_addr, min_size=1, max_size=3).map(";".join),
            iommugroup=st.none() | st.integers(0, 500),
            subsystem_id=st.none() | st.builds(lambda a, b: f"{a}:{b}", _hex4, _hex4),
        ),
        min_size=1,
        max_size=4,
    ),
    st.none() | st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9 .]{0,30}[A-Za-z0-9]\Z"),
)
@pytest.mark.slow
def test_pci_cfg_round_trip(entries, description):
    mp = PciMapping(id="gpu-vm", maps=[format_map_entry(e) for e in entries], description=description)
    text = write_pci_cfg([mp, PciMapping(id="other", maps=mp.maps[:1])])
    assert validate_pci_cfg(text) == []
    back = parse_pci_cfg(text)
    assert back[0] == mp
    assert back[0].entries() == entries
    assert write_pci_cfg(back) == text
