"""The Proxmox VE file formats as one namespace (``pvefmt.parse_lxc_conf``, ``pvefmt.PciMapping``).

Each format lives in its own module: :mod:`gputopo.formats.propstring` (property strings,
value checks, ``sha1_digest``), :mod:`gputopo.formats.lxcconf` (container configs and ``devN``
values) and :mod:`gputopo.formats.pcicfg` (``mapping/pci.cfg`` and ``map`` entries). Import
from those; this module only gathers their public names for code that reads them through one
name.
"""

from gputopo.formats.lxcconf import (
    LxcConf,
    LxcSection,
    check_lxc_option,
    format_dev_value,
    parse_dev_value,
    parse_lxc_conf,
    validate_lxc_conf,
    write_lxc_conf,
)
from gputopo.formats.pcicfg import (
    MapEntry,
    PciMapping,
    format_map_entry,
    map_entry_problems,
    parse_map_entry,
    parse_pci_cfg,
    validate_pci_cfg,
    write_pci_cfg,
)
from gputopo.formats.propstring import decode_text, encode_text, sha1_digest

__all__ = [
    "LxcConf", "LxcSection", "MapEntry", "PciMapping", "check_lxc_option", "decode_text", "encode_text",
    "format_dev_value", "format_map_entry", "map_entry_problems", "parse_dev_value", "parse_lxc_conf",
    "parse_map_entry", "parse_pci_cfg", "sha1_digest", "validate_lxc_conf", "validate_pci_cfg",
    "write_lxc_conf", "write_pci_cfg",
]
