"""gputopo's Proxmox file readers and writers against Proxmox's own files (fixtures/pve/, see
SOURCES.md there).

The expected values are Proxmox's, worked out from its parsers, not from gputopo's:
pve-container src/PVE/LXC/Config.pm ``parse_pct_config`` / ``write_pct_config``, qemu-server
src/PVE/QemuServer.pm ``parse_vm_config`` / ``write_vm_config``, pve-common
src/PVE/SectionConfig.pm ``parse_config`` / ``write_config`` with pve-ha-manager's Rules.pm,
Groups.pm, Resources.pm and pve-guest-common's Mapping/PCI.pm, and pve-guest-common
AbstractConfig.pm ``load_current_config`` for what the API's GET shows. Where Proxmox's own test
suite has the expected result (qemu-server src/test/parse-config-expected/, pve-ha-manager
src/test/rules_cfgs/*.expect, pve-container's snapshot-expected files written by
``write_pct_config``) that is used.
"""

import hashlib

import pytest

from gputopo.adapters.pvefiles import PveFiles
from gputopo.formats.hacfg import parse_section_config, write_section_config
from gputopo.formats.hostpci import parse_hostpci
from gputopo.formats.lxcconf import parse_lxc_conf, write_lxc_conf
from gputopo.formats.mapline import map_paths
from gputopo.formats.pcicfg import map_entry_problems, parse_map_entry, parse_pci_cfg, write_pci_cfg
from gputopo.formats.propstring import sha1_digest
from gputopo.formats.qemuconf import parse_qemu_conf, write_qemu_conf
from gputopo.topo.owners import mapping_addresses
from helpers import REPO

PVE = REPO / "fixtures" / "pve"


def _text(rel: str) -> str:
    return (PVE / rel).read_text()


# --- container configs (parse_pct_config / write_pct_config) ---------------------------

SNAP_MAIN = {
    "arch": "amd64",
    "cpulimit": "1",
    "cpuunits": "1024",
    "hostname": "test",
    "memory": "2048",
    "net0": "bridge=vmbr0,hwaddr=12:34:56:78:90:12,ip=dhcp,ip6=dhcp,name=eth0,type=veth",
    "ostype": "redhat",
    "rootfs": "local:snapshotable-disk-1",
    "swap": "512",
}


def test_container_snapshots_read_as_proxmox_does():
    conf = parse_lxc_conf(_text("lxc/snapshot-create-102.conf"))
    assert conf.options == {**SNAP_MAIN, "parent": "test2"}
    assert conf.description is None and conf.lxc == [] and conf.pending.is_empty()
    assert sorted(conf.snapshots) == ["test", "test2"]
    # a '#' line is the section's description: decode_text($1) . "\n"
    assert conf.snapshots["test"].description == "test comment\n"
    assert conf.snapshots["test"].options == {**SNAP_MAIN, "snaptime": "1234567890"}
    assert conf.snapshots["test2"].options == {**SNAP_MAIN, "parent": "test", "snaptime": "1234567890"}


@pytest.mark.parametrize("name", ["snapshot-create-102.conf", "snapshot-delete-106.conf"])
def test_container_file_written_by_proxmox_writes_back_byte_identical(name):
    text = _text(f"lxc/{name}")
    assert write_lxc_conf(parse_lxc_conf(text)) == text


def test_container_mount_point_in_main_section_and_snapshot():
    conf = parse_lxc_conf(_text("lxc/snapshot-delete-106.conf"))
    mp0 = "local:unsnapshotable-disk-1,mp=/invalid/mountpoint"
    assert conf.options["mp0"] == mp0 and conf.snapshots["test"].options["mp0"] == mp0


def test_hand_written_container_config_is_rewritten_sorted():
    # write_pct_config: `foreach my $key (sort keys %$conf)`
    assert write_lxc_conf(parse_lxc_conf(_text("lxc/setup-centos10-002.conf"))) == (
        "hostname: test1\n"
        "nameserver: 127.0.0.1\n"
        "net0: name=eth0,hwaddr=12:22:33:44:55:66,bridge=vmbr0,ip=10.0.0.100/32,gw=11.0.0.1\n"
        "net1: name=eth1,hwaddr=22:33:44:55:66:77,bridge=vmbr1,ip6=fc00::1/64,gw6=fc00:1::ff\n"
        "net2: name=eth2,hwaddr=32:44:55:66:77:88,bridge=vmbr2,ip=192.168.0.1/24\n"
        "searchdomain: example.com\n"
    )
    assert write_lxc_conf(parse_lxc_conf(_text("lxc/docs-example-container.conf"))) == (
        "arch: amd64\n"
        "hostname: www\n"
        "memory: 512\n"
        "net0: bridge=vmbr0,hwaddr=66:64:66:64:64:36,ip=dhcp,name=eth0,type=veth\n"
        "ostype: debian\n"
        "rootfs: local:107/vm-107-disk-1.raw,size=7G\n"
        "swap: 512\n"
    )


def test_raw_lxc_key_with_equals_sign_is_kept_and_written_with_a_colon():
    # `m/^(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*$/`; lxc.init_cmd is a deprecated name that
    # is_valid_lxc_conf_key still accepts (a warning); the writer prints "$k: $v"
    conf = parse_lxc_conf(_text("lxc/docs-raw-lxc-key.conf"))
    assert conf.lxc == [("lxc.init_cmd", "/sbin/my_own_init")]
    assert write_lxc_conf(conf) == "lxc.init_cmd: /sbin/my_own_init\n"


# No public container config with these lines was found; the text is Proxmox's rules, line by line.
PENDING_CT = (
    "#GPU%20container\n"
    "arch: amd64\n"
    "dev0: /dev/nvidia0,gid=44,mode=0666\n"
    "onboot: yes\n"
    "cores: 08\n"
    "snapstate: prepare\n"
    "lxc.environment.runtime: A=1\n"
    "lxc.cgroup2.devices.allow: c 195:* rwm\n"
    "lxc.rootfs.path: /var/lib/lxc/101/rootfs\n"
    "lxc.bogus.key: 1\n"
    "lxc.environment.runtime: B=2\n"
    "\n"
    "[pve:pending]\n"
    "#pending%3A note\n"
    "dev1: /dev/nvidia1\n"
    "delete: onboot,!dev0\n"
)


def test_container_rules_proxmox_applies_while_parsing():
    conf = parse_lxc_conf(PENDING_CT)
    assert conf.description == "GPU container\n"
    # check_type: booleans to 1/0, integers through int(); snapstate of the main section dropped;
    # lxc.environment.runtime gathered into env (NUL-separated); lxc.rootfs.path (a message in
    # $valid_lxc_conf_keys) and an unknown key dropped
    assert conf.options == {
        "arch": "amd64",
        "dev0": "/dev/nvidia0,gid=44,mode=0666",
        "onboot": "1",
        "cores": "8",
        "env": "A=1\0B=2",
    }
    assert conf.lxc == [("lxc.cgroup2.devices.allow", "c 195:* rwm")]
    assert conf.pending.description == "pending: note\n"
    assert conf.pending.options == {"dev1": "/dev/nvidia1", "delete": "onboot,!dev0"}
    assert conf.pending_delete == ["onboot", "dev0"]
    # the writer: description, sorted keys, env as lxc.environment.runtime lines, then lxc.*
    assert write_lxc_conf(conf) == (
        "#GPU container\n"
        "arch: amd64\n"
        "cores: 8\n"
        "dev0: /dev/nvidia0,gid=44,mode=0666\n"
        "onboot: 1\n"
        "lxc.environment.runtime: A=1\n"
        "lxc.environment.runtime: B=2\n"
        "lxc.cgroup2.devices.allow: c 195:* rwm\n"
        "\n"
        "[pve:pending]\n"
        "#pending%3A note\n"
        "delete: onboot,!dev0\n"
        "dev1: /dev/nvidia1\n"
    )


def _pve_root(tmp_path, kind: str, vmid: int, text: str):
    d = tmp_path / "nodes" / "pve1" / kind
    d.mkdir(parents=True)
    (d / f"{vmid}.conf").write_text(text)
    return PveFiles(tmp_path, "pve1")


def test_files_reader_shows_the_container_as_the_api_does(tmp_path):
    files = _pve_root(tmp_path, "lxc", 101, PENDING_CT)
    cfg = files.lxc_config(101)
    # load_current_config: pending values and the pending description in; a pending delete
    # removes a key only when its value is true to Perl (dev0 is, onboot "1" is)
    assert cfg == {
        "arch": "amd64",
        "cores": "8",
        "env": "A=1\0B=2",
        "dev1": "/dev/nvidia1",
        "description": "pending: note\n",
        "lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"]],
        "digest": hashlib.sha1(PENDING_CT.encode()).hexdigest(),
    }


def test_files_reader_keeps_a_pending_delete_of_a_false_value(tmp_path):
    text = "arch: amd64\nonboot: 0\n\n[pve:pending]\ndelete: onboot\n"
    cfg = _pve_root(tmp_path, "lxc", 101, text).lxc_config(101)
    assert cfg["onboot"] == "0"  # `delete $conf->{$opt} if $conf->{$opt}`


def test_files_reader_reads_a_proxmox_written_container(tmp_path):
    text = _text("lxc/snapshot-create-102.conf")
    cfg = _pve_root(tmp_path, "lxc", 102, text).lxc_config(102)
    assert cfg == {**SNAP_MAIN, "parent": "test2", "digest": hashlib.sha1(text.encode()).hexdigest()}


# --- VM configs (parse_vm_config / write_vm_config) ------------------------------------


def test_vm_sections_read_as_proxmox_does():
    conf = parse_qemu_conf(_text("qemu-server/sections.conf"))
    assert conf.pending == {"bios": "ovmf"}
    assert conf.special == {"cloudinit": {"ipconfig0": "ip=dhcp,ip6=dhcp", "name": "deb122"}}
    assert list(conf.snapshots) == ["foo"]
    assert conf.snapshots["foo"]["snaptime"] == "1737548747"
    assert conf.options["parent"] == "foo" and conf.options["unused0"] == "rbd:vm-120-disk-0"
    assert len(conf.options) == 18 and conf.problems == []


@pytest.mark.parametrize(
    "name, expected",
    [
        # qemu-server src/test/run_parse_config_tests.pl: no expected file = written back unchanged
        ("sections.conf", "sections.conf"),
        ("duplicate-sections.conf", "duplicate-sections.expected.conf"),
        ("unknown-sections.conf", "unknown-sections.expected.conf"),
        # written by write_vm_config (src/test/snapshot-test.pm)
        ("snapshot-create-102.conf", "snapshot-create-102.conf"),
    ],
)
def test_vm_config_writes_back_as_proxmox_does(name, expected):
    text = _text(f"qemu-server/{name}")
    assert write_qemu_conf(parse_qemu_conf(text)) == _text(f"qemu-server/{expected}")


def test_vm_repeated_section_replaces_the_earlier_one():
    # `$conf = $res->{pending} = {}` for each [PENDING]: the last one wins, with a warning
    conf = parse_qemu_conf(_text("qemu-server/duplicate-sections.conf"))
    assert conf.pending == {"vga": "qxl"}
    assert conf.special["cloudinit"] == {"name": "deb123"}
    assert "duplicate section: pending" in conf.problems
    assert "duplicate special section: cloudinit" in conf.problems


def test_vm_snapshot_description_belongs_to_the_snapshot():
    conf = parse_qemu_conf(_text("qemu-server/snapshot-create-102.conf"))
    # $finish_description: "test comment\n" with trailing whitespace removed, into the snapshot
    assert conf.snapshots["test"]["description"] == "test comment"
    assert conf.description is None
    assert conf.snapshots["test"]["vmstate"] == "somestorage:state-volume"


def test_vm_description_with_colon_is_rewritten_escaped():
    text = _text("qemu-server/q35-linux-hostpci-mapping.conf")
    conf = parse_qemu_conf(text)
    assert conf.description == " TEST: Config with q35, NUMA, hostpci mapping passthrough, EFI & Linux"
    assert [parse_hostpci(conf.options[f"hostpci{i}"]) for i in range(3)] == [
        {"mapping": "someNic"},
        {"mapping": "someGpu", "mdev": "some-model"},
        {"mapping": "someNic"},
    ]
    # pve-common ParseUtils.pm encode_text escapes ':' (and '%'): Proxmox rewrites the line
    assert write_qemu_conf(conf) == text.replace("# TEST: ", "# TEST%3A ", 1)


def test_vm_hostpci_lines_with_short_ids():
    conf = parse_qemu_conf(_text("qemu-server/q35-linux-hostpci.conf"))
    keys = sorted(k for k in conf.options if k.startswith("hostpci"))
    assert keys == ["hostpci0", "hostpci1", "hostpci2", "hostpci3", "hostpci4", "hostpci7"]
    assert parse_hostpci(conf.options["hostpci4"]) == {"host": "d0:17.0", "pcie": "1", "rombar": "0"}


def test_vm_description_rules():
    text = (
        "#first  \n"
        "description: more%20text\n"
        "name: vm\n"
        "\n[PENDING]\n#\nmemory: 4096\n"
        "\n[snap1]\n#snapshot%3A one\nname: vm\n"
    )
    conf = parse_qemu_conf(text)
    # '#' lines add "text\n", description: adds its text; then `s/\s+$//`
    assert conf.description == "first  \nmore text"
    assert conf.pending == {"description": "", "memory": "4096"}
    assert conf.snapshots["snap1"] == {"description": "snapshot: one", "name": "vm"}
    # a pending description that is empty is written as a bare '#' (write_vm_config)
    assert write_qemu_conf(conf) == (
        "#first  \n#more text\nname: vm\n\n[PENDING]\n#\nmemory: 4096\n\n[snap1]\n#snapshot%3A one\nname: vm\n"
    )


def test_files_reader_shows_the_vm_as_the_api_does(tmp_path):
    text = _text("qemu-server/sections.conf")
    cfg = _pve_root(tmp_path, "qemu-server", 120, text).qemu_config(120)
    assert cfg["bios"] == "ovmf"  # pending value merged in
    assert cfg["digest"] == hashlib.sha1(text.encode()).hexdigest()
    assert "snaptime" not in cfg and "description" not in cfg


# --- HA section configs (SectionConfig parse_config / write_config) --------------------


def test_rules_digest_is_proxmox_s():
    # the digest pve-ha-manager's own test prints for these files (rules_cfgs/*.expect)
    assert sha1_digest(_text("ha/defaults-for-node-affinity-rules.cfg")) == (
        "c96c9de143221a82e44efa8bb4814b8248a8ea11"
    )
    assert sha1_digest(_text("ha/defaults-for-resource-affinity-rules.cfg")) == (
        "9ac7cc517f02c41e3403085ec02f6a9259f2ac94"
    )


def test_node_affinity_rules_read_and_written_as_proxmox_does():
    rules = parse_section_config(_text("ha/defaults-for-node-affinity-rules.cfg"))
    # rules_cfgs/defaults-for-node-affinity-rules.cfg.expect "--- Config ---"
    assert [(s.type, s.id, s.props) for s in rules] == [
        ("node-affinity", "node-affinity-defaults", {"resources": "vm:101", "nodes": "node1"}),
        (
            "node-affinity",
            "node-affinity-disabled",
            {"resources": "vm:102", "nodes": "node2", "disable": "1"},
        ),
        (
            "node-affinity",
            "node-affinity-disabled-explicit",
            {"resources": "vm:103", "nodes": "node2", "disable": "1"},
        ),
        ("node-affinity", "node-affinity-strict", {"resources": "vm:104", "nodes": "node3", "strict": "1"}),
    ]
    # write_config: '#' lines gone, a bare disable after the header, required keys sorted, then
    # the optional ones, a blank line after every section
    assert write_section_config(rules) == (
        "node-affinity: node-affinity-defaults\n\tnodes node1\n\tresources vm:101\n\n"
        "node-affinity: node-affinity-disabled\n\tdisable\n\tnodes node2\n\tresources vm:102\n\n"
        "node-affinity: node-affinity-disabled-explicit\n\tdisable\n\tnodes node2\n\tresources vm:103\n\n"
        "node-affinity: node-affinity-strict\n\tnodes node3\n\tresources vm:104\n\tstrict 1\n\n"
    )


def test_resource_affinity_rules_written_in_proxmox_s_order():
    rules = parse_section_config(_text("ha/defaults-for-resource-affinity-rules.cfg"))
    assert [s.props for s in rules] == [
        {"resources": "vm:101,vm:102", "affinity": "negative"},
        {"resources": "vm:201,vm:202", "affinity": "negative", "disable": "1"},
        {"resources": "vm:301,vm:302", "affinity": "negative", "disable": "1"},
    ]
    assert write_section_config(rules) == (
        "resource-affinity: resource-affinity-defaults\n\taffinity negative\n\tresources vm:101,vm:102\n\n"
        "resource-affinity: resource-affinity-disabled\n\tdisable\n\taffinity negative\n"
        "\tresources vm:201,vm:202\n\n"
        "resource-affinity: resource-affinity-disabled-explicit\n\tdisable\n\taffinity negative\n"
        "\tresources vm:301,vm:302\n\n"
    )


def test_rule_lists_written_sorted():
    # Rules.pm encode_value: `join(',', sort keys %$value)`; NodeAffinity.pm sorts the nodes;
    # only a rule's comment is encode_text'ed
    rules = parse_section_config(
        "node-affinity: r1\n\tcomment a%3Ab\n\tresources vm:202,vm:101,vm:202\n\tnodes pve2:1,pve1\n"
    )
    assert rules[0].props["comment"] == "a:b"
    assert write_section_config(rules) == (
        "node-affinity: r1\n\tcomment a%3Ab\n\tnodes pve1,pve2:1\n\tresources vm:101,vm:202\n\n"
    )


def test_resources_read_as_proxmox_does():
    # property lines may be indented with spaces (`^\s+(\S+)(\s+(.*\S))?\s*$`), '#' lines skip
    res = parse_section_config(_text("ha/docs-resources.cfg"))
    assert [(s.sid, s.props) for s in res] == [
        ("vm:501", {"state": "started", "max_relocate": "2"}),
        ("ct:102", {}),
    ]
    assert write_section_config(res) == "vm: 501\n\tmax_relocate 2\n\tstate started\n\nct: 102\n\n"


def test_resource_comment_is_kept_as_written():
    # Resources.pm has no decode_value/encode_value: the comment is not url-decoded
    res = parse_section_config("vm: 201\n\tcomment gpu%3Avm\n\tstate started\n")
    assert res[0].props["comment"] == "gpu%3Avm"
    assert write_section_config(res) == "vm: 201\n\tcomment gpu%3Avm\n\tstate started\n\n"


def test_groups_read_as_proxmox_does():
    text = _text("ha/group-migrate1-groups.cfg")
    groups = parse_section_config(text)
    assert [(s.id, s.props) for s in groups] == [
        ("group1", {"nodes": "node1", "restricted": "1"}),
        ("group2", {"nodes": "node2:2,node3", "nofailback": "1"}),
    ]
    # Groups.pm encode_value writes `keys(%$value)`, Perl's hash order, so the order of two
    # nodes is not fixed; the rest is write_config's, with the blank line after the last section
    assert write_section_config(groups) == text + "\n"
    docs = parse_section_config(_text("ha/docs-groups.cfg"))
    assert [(s.id, s.props) for s in docs] == [
        ("prefer_node1", {"nodes": "node1"}),
        ("mygroup1", {"nodes": "node2:1,node4,node1:2,node3:1"}),
        ("mygroup2", {"nodes": "node2,node1", "restricted": "1"}),
    ]


# --- PCI mappings (Mapping/PCI.pm on SectionConfig) ------------------------------------


def test_mapping_path_without_function_and_uppercase_id_are_valid():
    # $map_fmt: id `^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}$`; path `(?:PCI;)*PCI` with the function
    # optional ("If the function is omitted, the whole device is mapped")
    line = "id=10DE:27B0,iommugroup=16,node=pve,path=0000:07:00,subsystem-id=10de:16fa"
    assert map_entry_problems(line) == []
    assert parse_map_entry(line).path == "0000:07:00"
    assert map_entry_problems("id=10de:27b0,node=pve,path=0000:07:00.a") == []
    assert map_entry_problems("id=10de:27b0,node=pve,path=0000:07:00.") != []


def test_whole_device_mapping_owns_its_gpu():
    line = "id=10de:27b0,iommugroup=16,node=pve,path=0000:07:00,subsystem-id=10de:16fa"
    assert mapping_addresses([line], "pve") == {"0000:07:00.0"}
    assert map_paths(line) == ["0000:07:00.0"]


def test_mapping_file_ends_with_a_blank_line():
    # write_config: `$out .= "$data\n"` for every section, the last one too
    text = "gpu\n\tmap id=10de:27b0,node=pve,path=0000:07:00\n\tdescription one GPU\n\n"
    assert write_pci_cfg(parse_pci_cfg(text)) == text
