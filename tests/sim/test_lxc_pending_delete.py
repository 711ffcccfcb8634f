"""The ``delete`` line of a container's ``[pve:pending]`` as Proxmox writes it: the queued keys
as one sorted set (pve-guest-common AbstractConfig.pm print_pending_delete), whatever order they
were queued in, so a config put back key by key reads byte for byte as before."""

from __future__ import annotations

from gputopo.formats.lxcconf import parse_lxc_conf, write_lxc_conf
from gputopo.sim.pveapi.lxc_update import apply_update

CONF = "dev4: /dev/nvidia4\ndev5: /dev/nvidia5\ndev7: /dev/nvidia7\nmemory: 512\n"


def _update(text: str, sets=None, deletes=(), reverts=()) -> str:
    conf = parse_lxc_conf(text)
    apply_update(conf, dict(sets or {}), list(deletes), list(reverts), True, 9, lambda _: None)
    return write_lxc_conf(conf)


def test_deletes_queued_one_by_one_are_written_sorted():
    text = _update(CONF, deletes=["dev7"])
    text = _update(text, deletes=["dev5", "dev4", "dev5"])
    assert text.endswith("[pve:pending]\ndelete: dev4,dev5,dev7\n"), text


def test_a_revert_takes_a_key_off_the_queue_and_keeps_the_rest_sorted():
    text = _update(CONF, deletes=["dev7", "dev4", "dev5"])
    assert _update(text, reverts=["dev5"]).endswith("[pve:pending]\ndelete: dev4,dev7\n")
