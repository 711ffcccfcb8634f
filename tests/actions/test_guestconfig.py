"""The digest-guarded config change that container and VM steps share
(:mod:`gputopo.actions.guestconfig`): only what differs is PUT, with the digest of the read
right before it, and undo restores exactly the keys the step touched."""

from __future__ import annotations

from gputopo.actions.guestconfig import ConfigBefore, GuestConfig
from gputopo.formats.devn import is_devn_key


class _Guest:
    """A guest config whose digest changes on every write; records each PUT."""

    def __init__(self, config):
        self.config, self.n, self.puts = dict(config), 0, []

    def read(self):
        return {**self.config, "digest": f"d{self.n}"}

    def write(self, sets, deletes, digest):
        assert digest == f"d{self.n}", "PUT with a stale digest"
        self.puts.append((dict(sets), list(deletes)))
        self.config.update(sets)
        for k in deletes:
            self.config.pop(k)
        self.n += 1


def _cfg(g: _Guest) -> GuestConfig:
    return GuestConfig(g.read, g.write)


def test_before_drops_the_digest():
    g = _Guest({"dev0": "/dev/nvidia0", "cores": "4"})
    assert _cfg(g).before() == ConfigBefore(config={"dev0": "/dev/nvidia0", "cores": "4"})


def test_change_puts_only_what_differs():
    g = _Guest({"dev0": "/dev/nvidia0", "dev1": "/dev/nvidia1"})
    _cfg(g).change(
        {"dev0": "/dev/nvidia0", "dev2": "/dev/nvidia2"},
        ["dev1", "dev9"],
        more=lambda cfg: {"dev3": f"/dev/nvidia{len(cfg)}"},
    )
    assert g.puts == [({"dev2": "/dev/nvidia2", "dev3": "/dev/nvidia3"}, ["dev1"])]
    _cfg(g).change({"dev2": "/dev/nvidia2"}, ["dev1"])
    assert len(g.puts) == 1  # nothing differs: no PUT


def test_restore_puts_back_touched_keys_only():
    g = _Guest({"hostpci0": "mapping=a", "cores": "4"})
    old = _cfg(g).before().config
    _cfg(g).change({"hostpci0": "mapping=b", "hostpci1": "mapping=b"}, [])
    g.config["cores"] = "8"  # someone else's change, not the step's
    g.config["dev5"] = "/dev/x"
    assert _cfg(g).restore(old, {"hostpci0", "hostpci1"}) is True
    assert g.config == {"hostpci0": "mapping=a", "cores": "8", "dev5": "/dev/x"}
    assert _cfg(g).restore(old, {"hostpci0", "hostpci1"}) is False


def test_restore_also_takes_keys_the_step_did_not_list():
    g = _Guest({"dev0": "/dev/nvidia0"})
    old = _cfg(g).before().config
    g.config.update({"dev1": "/dev/nvidia7"})  # resolved at apply time, not in the action
    del g.config["dev0"]
    assert _cfg(g).restore(old, set(), also=is_devn_key) is True
    assert g.config == {"dev0": "/dev/nvidia0"}


# --- a running container's pending section -----------------------------------------------------


def _pend(current, pending=None, delete=()):
    from gputopo.actions.guestconfig import LxcPending

    return LxcPending(current=current, pending=pending or {}, delete=list(delete))


def test_what_a_step_queued_is_reverted_and_the_deletes_it_took_off_are_queued_again():
    from gputopo.actions.guestconfig import pending_restore

    now4 = {f"dev{n}": f"/dev/nvidia{n}" for n in range(8)}
    old = _pend(now4, delete=["dev4", "dev5", "dev6", "dev7"])
    # the give-back set dev4..dev7: dev6 and dev7 differ, so they wait (no hot-plug of a key the
    # running container has); the set took every key off the delete queue
    now = _pend(now4, pending={"dev6": "/dev/nvidia7", "dev7": "/dev/nvidia6"})
    keys = set(now4)
    assert pending_restore(old, now, keys) == (["dev6", "dev7"], {}, ["dev4", "dev5", "dev6", "dev7"])
    # a pending value of old's is set again after the revert; a key hot-plugged is queued for deletion
    old = _pend({"dev0": "/dev/nvidia0"}, pending={"dev0": "/dev/nvidia2"})
    now = _pend({"dev0": "/dev/nvidia0", "dev1": "/dev/nvidia1"}, pending={"dev0": "/dev/nvidia3"})
    assert pending_restore(old, now, {"dev0", "dev1"}) == (["dev0"], {"dev0": "/dev/nvidia2"}, ["dev1"])
    # nothing queued differs: nothing to do
    assert pending_restore(old, old, {"dev0"}) == ([], {}, [])


def test_restore_pending_reverts_first_then_sets_and_deletes_each_under_a_fresh_digest():
    from gputopo.actions.guestconfig import LxcPending

    calls = []
    items = [
        {"key": "digest", "value": "d0"},
        {"key": "dev6", "value": "/dev/nvidia6", "pending": "/dev/nvidia7"},
        {"key": "memory", "value": 4096},
    ]
    cfg = GuestConfig(
        lambda: {"digest": f"d{len(calls)}"},
        lambda s, d, digest: calls.append(("put", s, d, digest)),
        lambda: items,
        lambda r, digest: calls.append(("revert", r, digest)),
    )
    old, digest = LxcPending.of(items)
    assert (old.current["memory"], old.pending, digest) == ("4096", {"dev6": "/dev/nvidia7"}, "d0")
    old = _pend({"dev6": "/dev/nvidia6", "memory": "4096"}, delete=["dev6"])
    assert cfg.restore_pending(old, set(), also=is_devn_key)
    assert calls == [("revert", ["dev6"], "d0"), ("put", {}, ["dev6"], "d1")]
