"""VM configs as qemu-server reads and writes them, and what it only finds at VM start.

The rules, each from qemu-server's sources (``PVE/QemuServer.pm`` ``parse_vm_config`` and
``write_vm_config``, ``PVE/QemuServer/PCI.pm`` ``$hostpci_fmt`` and ``parse_hostpci_devices``,
``PVE/QemuServer/Memory.pm`` ``config``) and pve-common (``CpuSet.pm``, ``Cmd.pm`` ``split_args``):

1. ``key: value`` lines, keys sorted by the writer; ``#`` lines at the top are the description;
   ``[PENDING]`` holds pending values and ``delete:`` (only there); ``[name]`` a snapshot.
2. ``args:`` is kept verbatim, and split like a shell at start: an unbalanced quote makes QEMU
   get none of the arguments.
3. ``hostpciN``: ``host`` (the default key) or ``mapping``, never both; PCI ids lower case
   (``(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\\.[a-f0-9])?``): a capital makes the line a
   format error, dropped with a warning, the VM starting without the device.
4. ``pcie=1`` needs machine q35 (the default machine is i440fx): accepted by the config API,
   the start dies with "q35 machine model is not enabled".
5. ``x-vga=1`` is dropped when the VM boots OVMF (``print_hostpci_devices``).
6. ``affinity`` is a cpuset; an empty one passes the API and the start's taskset fails.
7. ``hugepages`` needs ``numa: 1``; ``numaN`` with hostnodes needs a policy, with hugepages
   hostnodes, and the nodes' memory must add up to the VM's.
"""

from __future__ import annotations

import pytest

from gputopo.errors import PveFormatError
from gputopo.formats.hostpci import (
    format_hostpci,
    mmio64_mb,
    parse_cpuset,
    parse_hostpci,
    parse_numa_node,
    split_args,
    with_mmio64_mb,
)
from gputopo.formats.qemuconf import (
    is_q35,
    memory_mib,
    parse_qemu_conf,
    start_problems,
    validate_qemu_conf,
    write_qemu_conf,
)

# A VM config as qemu-server writes it (keys sorted, description first, pending and a snapshot).
REAL_VM = """\
#GPU VM%3A four RTX PRO 6000
agent: 1
args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576 -smbios 'type=0,vendor=FOO'
bios: ovmf
cores: 32
cpu: host
hostpci0: mapping=pro6000-vm,pcie=1
hostpci1: mapping=pro6000-vm,pcie=1
hostpci5: 0000:22:00.0
machine: q35
memory: 131072
name: gpu-vm
numa: 1
numa0: cpus=0-31,hostnodes=1,memory=131072,policy=bind
sockets: 1

[PENDING]
affinity: 64-127,192-255
delete: hostpci5

[before-gpus]
cores: 32
machine: q35
memory: 131072
"""


def test_round_trip_is_qemu_server_canonical():
    conf = parse_qemu_conf(REAL_VM)
    assert conf.description == "GPU VM: four RTX PRO 6000"
    assert (
        conf.options["args"]
        == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576 -smbios 'type=0,vendor=FOO'"
    )
    assert conf.pending == {"affinity": "64-127,192-255", "delete": "hostpci5"}
    assert conf.pending_delete == ["hostpci5"]
    assert list(conf.snapshots) == ["before-gpus"]
    assert write_qemu_conf(conf) == REAL_VM
    assert validate_qemu_conf(REAL_VM) == []


def test_writer_sorts_keys_as_strings_and_puts_the_description_first():
    conf = parse_qemu_conf("memory: 512\nhostpci10: mapping=a1\nhostpci2: mapping=a1\n#notes\n")
    assert write_qemu_conf(conf) == "#notes\nhostpci10: mapping=a1\nhostpci2: mapping=a1\nmemory: 512\n"


def test_parser_skips_what_qemu_server_warns_about():
    conf = parse_qemu_conf("cores: 2\ndelete: hostpci0\naffinity:\n[weird section]\nmemory: 4\n")
    assert conf.options == {"cores": "2"}
    assert conf.problems == [
        "property 'delete' is only allowed in [PENDING]",
        "unable to parse config: affinity:",
        "skipping unknown section: 'weird section'",
    ]


def test_hostpci_property_string():
    assert parse_hostpci("mapping=pro6000-vm,pcie=1") == {"mapping": "pro6000-vm", "pcie": "1"}
    assert parse_hostpci("0000:81:00.0;0000:81:00.1,x-vga=1") == {
        "host": "0000:81:00.0;0000:81:00.1",
        "x-vga": "1",
    }
    assert parse_hostpci("host=81:00,rombar=0") == {"host": "81:00", "rombar": "0"}
    assert (
        format_hostpci({"x-vga": "1", "pcie": "1", "mapping": "m1", "rombar": "0"})
        == "mapping=m1,pcie=1,rombar=0,x-vga=1"
    )
    assert format_hostpci({"host": "0000:81:00.0", "pcie": "1"}) == "0000:81:00.0,pcie=1"


@pytest.mark.parametrize(
    "value, needle",
    [
        ("0000:81:00.0,mapping=m1", "either 'host' or 'mapping'"),
        ("pcie=1", "either 'host' or 'mapping'"),
        ("0000:C1:00.0", "lower-case"),
        ("host=0000:81:00.0,speed=16", "not defined in schema"),
        ("mapping=m1,pcie=maybe", "boolean"),
        ("mapping=9gpu", "configuration ID"),
        ("mapping=m1,vendor-id=10de", "hex id"),
        ("mapping=m1,,pcie=1", "empty element"),
    ],
)
def test_hostpci_refused(value, needle):
    with pytest.raises(PveFormatError) as e:
        parse_hostpci(value)
    assert needle in str(e.value)


def test_a_capital_in_an_address_drops_the_line():
    problems = validate_qemu_conf("machine: q35\nhostpci0: 0000:81:00.0\nhostpci1: 0000:C1:00.0\n")
    assert len(problems) == 1 and problems[0].startswith("unable to parse value of 'hostpci1'")


def test_cpuset():
    assert parse_cpuset("64-127,192-255") == set(range(64, 128)) | set(range(192, 256))
    assert parse_cpuset("") == set()
    for bad in ("4-2", "a", "0-3,,5"):
        with pytest.raises(PveFormatError):
            parse_cpuset(bad)


def test_numa_node():
    assert parse_numa_node("cpus=0-31,hostnodes=1,memory=131072,policy=bind")["hostnodes"] == "1"
    for bad in ("memory=1", "cpus=0-3,policy=firsttouch", "cpus=0-3,hostnodes=1,2"):
        with pytest.raises(PveFormatError):
            parse_numa_node(bad)


def test_args_split_like_a_shell():
    assert split_args("-smbios 'type=0,vendor=FOO' -no-reboot") == [
        "-smbios",
        "type=0,vendor=FOO",
        "-no-reboot",
    ]
    with pytest.raises(PveFormatError) as e:
        split_args("-smbios 'type=0,vendor=FOO -no-reboot")
    assert "none of its arguments" in str(e.value)


def test_mmio_window_in_args():
    assert mmio64_mb(None) is None and mmio64_mb("-no-reboot") is None
    args = with_mmio64_mb("-smbios 'type=0,vendor=FOO'", 1048576)
    assert args == "-smbios 'type=0,vendor=FOO' -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"
    assert mmio64_mb(args) == 1048576
    # an existing setting is changed where it stands; the other arguments keep their spelling
    assert (
        with_mmio64_mb(args, 65536)
        == "-smbios 'type=0,vendor=FOO' -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"
    )
    assert with_mmio64_mb(None, 65536) == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"
    # a broken line: QEMU gets none of it, so it sets no window either
    assert mmio64_mb("-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536 -smbios 'x") is None


def test_machine_and_memory():
    assert not is_q35({}) and not is_q35({"machine": "pc-i440fx-9.0"})
    assert is_q35({"machine": "q35"}) and is_q35({"machine": "pc-q35-8.1+pve0,viommu=virtio"})
    assert is_q35({"machine": "type=q35,viommu=intel"})
    assert memory_mib({}) == 512 and memory_mib({"memory": "current=4096"}) == 4096


@pytest.mark.parametrize(
    "lines, needle",
    [
        ("hostpci0: mapping=m1,pcie=1\n", "needs machine q35"),
        ("machine: pc-i440fx-9.0\nhostpci0: mapping=m1,pcie=1\n", "needs machine q35"),
        ("machine: q35\nbios: ovmf\nhostpci0: mapping=m1,x-vga=1\n", "x-vga=1 is dropped with bios ovmf"),
        ("affinity: \n", "unable to parse cpuset option"),  # qemu-server's parser drops it
        ("args: -smbios 'type=0\n", "unbalanced quote"),
        ("hugepages: 1024\nmemory: 4096\n", "hugepages needs numa: 1"),
        (
            "numa: 1\nhugepages: 1024\nmemory: 4096\nnuma0: cpus=0-3,memory=4096\n",
            "hostnodes need to be defined",
        ),
        ("numa: 1\nmemory: 4096\nnuma0: cpus=0-3,hostnodes=1,memory=4096\n", "need a policy"),
        ("numa: 1\nmemory: 8192\nnuma0: cpus=0-3,hostnodes=1,memory=4096,policy=bind\n", "must be equal"),
    ],
)
def test_what_only_a_vm_start_finds(lines, needle):
    problems = validate_qemu_conf(lines)
    assert any(needle in p for p in problems), problems


def test_an_empty_affinity_set_through_the_api_fails_at_start():
    assert start_problems({"affinity": ""}) == ["affinity is empty: taskset fails and the VM does not start"]
    assert start_problems({"affinity": "64-127"}) == []


def test_a_whole_gpu_vm_passes():
    text = (
        "affinity: 64-127,192-255\nagent: 1\nargs: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576\nbios: ovmf\n"
        "cores: 32\n"
        + "".join(f"hostpci{i}: mapping=pro6000-vm,pcie=1\n" for i in range(4))
        + "hugepages: 1024\nmachine: q35\nmemory: 131072\nnuma: 1\n"
        "numa0: cpus=0-31,hostnodes=1,memory=131072,policy=bind\nsockets: 1\n"
    )
    assert validate_qemu_conf(text, allow_description=False) == []
    assert validate_qemu_conf("#note\n" + text, allow_description=False) == [
        "'#' lines are the VM's description to Proxmox, not comments"
    ]
