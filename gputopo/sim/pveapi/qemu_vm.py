"""A VM's start, stop and guest agent through the simulated API (see :mod:`gputopo.sim.qemu`).

A start applies the VM's pending changes, then does what qemu-server's ``vm_start`` does with
its config (:func:`gputopo.sim.qemu.runtime.start`); a stop releases its devices. The agent
endpoints are ``POST .../agent/ping``, ``POST .../agent/exec`` and ``GET .../agent/exec-status``
(:mod:`gputopo.sim.qemu.guest`); their errors are qemu-server's ``die`` messages (500).

A start of a VM listed in the run state :data:`START_FAILS` (vmid -> message) fails on this node
with that message, as QEMU dying at start does (``start failed: QEMU exited with code 1``).
"""

from __future__ import annotations

from typing import Any

from gputopo.formats.qemuconf import parse_qemu_conf, write_qemu_conf
from gputopo.sim import state
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.passthrough import PassthroughError
from gputopo.sim.pveapi.answers import die
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.qemu_config import apply_pending
from gputopo.sim.qemu import guest, runtime

START_FAILS = "qemu-start-fails"


class QemuVmHandlers:
    """VM start/stop and guest agent handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def _qemu_pci_start(self, vmid: int, text: str) -> None:
        """Start VM ``vmid``. Raises PassthroughError with qemu-server's message (fails the task)."""
        with self._lock:
            conf = parse_qemu_conf(self._load("qemu", vmid))
            if conf.pending:
                apply_pending(conf)
                atomic_write(self.conf_path("qemu", vmid), write_qemu_conf(conf), PMXCFS_MODE)
        fails = (state.read_state(self.run_dir, START_FAILS, {}) or {}).get(str(vmid))
        if fails:  # QEMU died on this node (qemu-server QemuServer.pm vm_start_nolock)
            raise PassthroughError(fails)
        _, maps = self._read_mappings()
        runtime.start(vmid, conf, self.sysfs_root, self.run_dir, self._passthrough(), maps)

    def _qemu_stop(self, vmid: int) -> None:
        runtime.stop(vmid, self.sysfs_root, self.run_dir, self._passthrough())

    def _agent_config(self, vmid: int) -> dict[str, str]:
        return parse_qemu_conf(self._load("qemu", vmid)).options

    def h_agent_ping(self, caller: Caller, p: dict) -> Any:
        try:
            guest.assert_agent(self.run_dir, p["vmid"], self._agent_config(p["vmid"]))
        except guest.AgentError as e:
            raise die(str(e)) from None
        return {"result": {}}

    def h_agent_exec(self, caller: Caller, p: dict) -> Any:
        try:
            return guest.exec_command(
                self.run_dir, p["vmid"], self._agent_config(p["vmid"]), p.get("command") or []
            )
        except guest.AgentError as e:
            raise die(str(e)) from None

    def h_agent_exec_status(self, caller: Caller, p: dict) -> Any:
        try:
            return guest.exec_status(self.run_dir, p["vmid"], self._agent_config(p["vmid"]), p["pid"])
        except guest.AgentError as e:
            raise die(str(e)) from None
