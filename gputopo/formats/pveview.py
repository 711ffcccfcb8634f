"""Proxmox's config files as the API's GET answers them: what the files-backed reader
(:mod:`gputopo.adapters.pvefiles`) returns, so a state read from ``/etc/pve`` has the API's
shapes. Pure: text in, dicts out."""

from __future__ import annotations

from typing import Any

from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.formats.propstring import sha1_digest
from gputopo.formats.qemuconf import parse_qemu_conf


def _drop_pending_deletes(out: dict[str, Any], keys: list[str]) -> None:
    """Remove the keys a pending ``delete`` names, as pve-guest-common AbstractConfig.pm
    ``load_current_config`` does: only a key whose value is true to Perl (not ``""``/``0``)."""
    for key in keys:
        if out.get(key) not in (None, "", "0"):
            del out[key]


def config_from_lxc_text(text: str) -> dict[str, Any]:
    """A container config as the API's GET .../config returns it: keys, the description,
    ``lxc`` pairs, digest.

    Pending values (the description too) are merged in and pending deletions removed (the API's
    default view, ``load_current_config``).
    """
    conf = parse_lxc_conf(text)
    out: dict[str, Any] = dict(conf.options)
    if conf.description:
        out["description"] = conf.description
    out.update(conf.pending.options)
    if conf.pending.description:
        out["description"] = conf.pending.description
    out.pop("delete", None)
    _drop_pending_deletes(out, conf.pending_delete)
    if conf.lxc:
        out["lxc"] = [[k, v] for k, v in conf.lxc]
    out["digest"] = sha1_digest(text)
    return out


def config_from_qemu_text(text: str) -> dict[str, Any]:
    """A VM config as the API's GET .../qemu/{vmid}/config returns it: keys with pending values
    merged in and pending deletions removed, the description, the digest."""
    conf = parse_qemu_conf(text)
    out: dict[str, Any] = dict(conf.options)
    if conf.description is not None:
        out["description"] = conf.description
    out.update({k: v for k, v in conf.pending.items() if k != "delete"})
    _drop_pending_deletes(out, conf.pending_delete)
    out["digest"] = sha1_digest(text)
    return out


def mappings_from_pci_cfg(text: str) -> list[dict[str, Any]]:
    """The mappings of ``mapping/pci.cfg`` text as GET /cluster/mapping/pci lists them: ``id``,
    ``map``, ``description`` (when set) and the file's SHA-1 as every entry's ``digest``."""
    digest = sha1_digest(text)
    out = []
    for m in parse_pci_cfg(text):
        item: dict[str, Any] = {"id": m.id, "map": list(m.maps), "digest": digest}
        if m.description is not None:
            item["description"] = m.description
        out.append(item)
    return out
