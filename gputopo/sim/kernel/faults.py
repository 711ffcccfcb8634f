"""Injected faults, latencies and the time scale of the simulated kernel.

They live in the shared state file (:mod:`gputopo.sim.kernel.statefile`), so a test, the demo
or a rehearsal configures them in one process and every process writing to the same root obeys.
"""

from __future__ import annotations

import errno
import time

# Seconds per operation before time_scale; "<driver>.<op>" wins over "<op>". The nvidia numbers
# are what an unbind/bind of one large GPU costs on a real host (teardown of the GSP firmware).
DEFAULT_LATENCY: dict[str, float] = {
    "nvidia.unbind": 2.0,
    "nvidia.bind": 0.5,
    "vfio-pci.unbind": 0.05,
    "vfio-pci.bind": 0.1,
}

FAULT_KINDS = ("errno", "hang", "noop", "fall_off", "dead")
FAULT_OPS = ("override", "unbind", "bind", "probe", "new_id", "remove_id", "*")


class Fail(Exception):
    """An errno on its way out of a write (an injected fault, or a write the kernel refuses)."""

    def __init__(self, err: int, detail: str = ""):
        self.err = err
        self.detail = detail


class Faults:
    """Faults and latencies of :class:`gputopo.sim.kernel.SimKernel` (a mixin over its state
    file, tree reader and tree changes)."""

    # --- configuration (tests, demo, rehearsal) -------------------------------------------

    def configure(
        self,
        *,
        time_scale: float | None = None,
        latency: dict[str, float] | None = None,
        address_latency: dict[str, dict[str, float]] | None = None,
    ) -> None:
        """Set the global time scale and per-op (``"nvidia.unbind"``, ``"bind"``) or
        per-address (``{"0000:01:00.0": {"unbind": 3.0}}``) latencies in seconds."""
        with self._state() as st:
            if time_scale is not None:
                st["time_scale"] = float(time_scale)
            if latency:
                st["latency"].update(latency)
            if address_latency:
                for a, ops in address_latency.items():
                    st["address_latency"].setdefault(a, {}).update(ops)

    def inject(
        self, address: str, op: str, kind: str, err: int | None = None, times: int | None = None
    ) -> int:
        """Add a fault for ``address`` (or ``"*"``) on ``op`` and return its id.

        ``op``: override, unbind, bind (any attach: bind, drivers_probe, new_id), probe
        (drivers_probe itself), new_id, remove_id or ``"*"``. ``kind``: ``errno`` (the write
        fails with ``err``, default EBUSY), ``hang`` (the write blocks until :meth:`release`),
        ``noop`` (reports success, changes nothing), ``fall_off`` (the device leaves the bus
        during the write, which fails with ENODEV), ``dead`` (config space reads 0xff from then
        on; the write goes ahead). ``times``: how many writes it hits (None: every one).
        Raises ValueError for an unknown op or kind.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (one of {', '.join(FAULT_KINDS)})")
        if op not in FAULT_OPS:
            raise ValueError(f"unknown fault op {op!r} (one of {', '.join(FAULT_OPS)})")
        with self._state() as st:
            fid = st["next_fault"]
            st["next_fault"] = fid + 1
            st["faults"].append(
                {
                    "id": fid,
                    "address": address,
                    "op": op,
                    "kind": kind,
                    "errno": err if err is not None else errno.EBUSY,
                    "times": times,
                }
            )
            return fid

    def release(self, address: str | None = None) -> None:
        """Let hung writes for ``address`` (all addresses when None) return; they then act."""
        with self._state() as st:
            st["faults"] = [
                f
                for f in st["faults"]
                if not (f["kind"] == "hang" and (address is None or f["address"] in (address, "*")))
            ]

    def clear_faults(self, address: str | None = None) -> None:
        """Remove every fault (for ``address`` only, when given), hangs included."""
        with self._state() as st:
            st["faults"] = [f for f in st["faults"] if address is not None and f["address"] != address]

    def fall_off(self, address: str) -> None:
        """The device leaves the bus now (surprise removal): its directory, its links and its
        driver's side effects disappear. Raises KeyError for an unknown address."""
        with self._state() as st:
            if address not in self._addresses():
                raise KeyError(address)
            self._remove_device(st, address)

    def removed(self) -> list[str]:
        """The devices removed or fallen off the bus, which a rescan would find again."""
        return list(self._read_state().get("removed", []))

    def kill_device(self, address: str) -> None:
        """The device stops answering (config space reads 0xff); it stays bound and listed."""
        with self._state():
            self._make_dead(address)

    # --- faults and latency ------------------------------------------------------------------

    def _take_fault(self, st: dict, addr: str, op: str) -> dict | None:
        for f in st["faults"]:
            if f["address"] in (addr, "*") and f["op"] in (op, "*"):
                if f["kind"] != "hang" and f["times"] is not None:
                    f["times"] -= 1
                    if f["times"] <= 0:
                        st["faults"].remove(f)
                return dict(f)
        return None

    def _wait_released(self, fault_id: int) -> None:
        while True:
            st = self._read_state()
            if not any(f["id"] == fault_id for f in st["faults"]):
                return
            time.sleep(self.poll)

    def _fault(self, addr: str, op: str) -> str | None:
        """Apply an injected fault; returns ``"noop"`` when the write must do nothing."""
        with self._state() as st:
            f = self._take_fault(st, addr, op)
            if f is None:
                return None
            if f["kind"] == "fall_off":
                self._remove_device(st, addr)
            elif f["kind"] == "dead":
                self._make_dead(addr)
        if f["kind"] == "fall_off":
            raise Fail(errno.ENODEV, f"{addr} fell off the bus")
        if f["kind"] == "errno":
            raise Fail(f["errno"], "injected")
        if f["kind"] == "hang":
            self._wait_released(f["id"])
        return "noop" if f["kind"] == "noop" else None

    def _sleep(self, addr: str, drv: str, op: str) -> float:
        """Wait the operation's latency; returns it in seconds."""
        st = self._read_state()
        per = st["address_latency"].get(addr, {})
        lat = st["latency"]
        seconds = per.get(op, lat.get(f"{drv}.{op}", lat.get(op, 0.0)))
        delay = float(seconds) * float(st["time_scale"])
        if delay > 0:
            time.sleep(delay)
        return delay
