"""The one lenient reader of a ``hostpciN`` value (``formats.hostpci.hostpci_refs``).

Proxmox reads the value as a property string (qemu-server ``PVE/QemuServer/PCI.pm``
``$hostpci_fmt`` with ``default_key => 'host'``, pve-common ``parse_property_string``): items
``key=value`` in any order, one bare item standing for ``host``; ``host`` holds ``BB:DD.F``,
``BB:DD`` or ``DDDD:BB:DD.F`` ids joined by ``;``; ``mapping=<id>`` names a mapping instead."""

from __future__ import annotations

import pytest

from gputopo.formats.hostpci import hostpci_refs


@pytest.mark.parametrize(
    "value, hosts, mapping",
    [
        # mapping or host not first
        ("pcie=1,mapping=vmgpus", [], "vmgpus"),
        ("x-vga=1,pcie=1,mapping=vmgpus,rombar=0", [], "vmgpus"),
        ("x-vga=1,host=81:00.0", ["0000:81:00.0"], None),
        ("pcie=1,host=0000:e1:00.0;0000:e1:00.1", ["0000:e1:00.0", "0000:e1:00.1"], None),
        # the bare default key, first or not
        ("0000:81:00.0,pcie=1,x-vga=1", ["0000:81:00.0"], None),
        ("pcie=1,81:00.0", ["0000:81:00.0"], None),
        ("mapping=vmgpus", [], "vmgpus"),
        # several host ids, slots and functions, short and long domains
        ("81:00.0;81:00.1", ["0000:81:00.0", "0000:81:00.1"], None),
        ("host=81:00;0001:91:00.0,pcie=1", ["0000:81:00", "0001:91:00.0"], None),
        ("81:00", ["0000:81:00"], None),
        ("00000000:81:00.0", ["0000:81:00.0"], None),
        # unknown keys, empty items, junk ids: what is readable still shows
        ("future-key=7,pcie=1,mapping=vmgpus,other=x", [], "vmgpus"),
        ("bogus=1,,host=not-an-id;81:00.0", ["0000:81:00.0"], None),
        ("x-vga=1", [], None),
        ("", [], None),
        # Proxmox refuses both at once; a reader for safety sees both
        ("host=81:00.0,mapping=vmgpus", ["0000:81:00.0"], "vmgpus"),
    ],
)
def test_hostpci_refs(value, hosts, mapping):
    assert hostpci_refs(value) == (hosts, mapping)
