"""systemd inside a container, driven with ``systemctl`` over the container's
:class:`gputopo.ports.ExecPort`: what a step asks of a service (its state, its command lines,
a start or restart watched until it is active).

It implements :class:`gputopo.ports.ContainerSystemdPort` over another port, for a real host and
the simulated one alike, so it lives with the adapters, above the actions that use it through
the Protocol: apply builds it with the step context (:func:`gputopo.apply.runner.step_context`),
and no action knows how ``systemctl`` is run.
"""

from __future__ import annotations

import time

from gputopo.actions.context import Timeouts
from gputopo.errors import ExecError
from gputopo.formats.systemd import exec_start_command, parse_cmdline, parse_show_properties
from gputopo.ports import ExecResult, Ports


class ExecSystemd:
    """``systemctl`` in a container through ``ports.exec`` (``pct exec``), each command within
    the exec timeout of ``timeouts``; a unit's start watched until the service timeout. A
    container ``ports.proxmox`` does not show running has every unit inactive."""

    def __init__(self, ports: Ports, timeouts: Timeouts):
        self.ports = ports
        self.timeouts = timeouts

    def _exec(
        self, vmid: int, argv: list[str], check: bool = True, timeout: float | None = None
    ) -> ExecResult:
        res = self.ports.exec.run(vmid, argv, self.timeouts.exec if timeout is None else timeout)
        if check and res.rc != 0:
            raise ExecError(vmid, argv, res.rc, res.stderr)
        return res

    def service_active(self, vmid: int, unit: str) -> bool:
        """Whether ``unit`` is active. Raises ExecError when the command times out."""
        return self.service_state(vmid, unit) == "active"

    def service_state(self, vmid: int, unit: str) -> str:
        """What ``systemctl is-active`` says of ``unit`` (``active``, ``activating`` while it
        starts, ``failed``...); ``inactive`` when its container is not running."""
        if self.ports.proxmox.guest_status("lxc", vmid) != "running":
            return "inactive"
        return self._exec(vmid, ["systemctl", "is-active", unit], check=False).stdout.strip() or "unknown"

    def _left(self, deadline: float) -> float:
        """Seconds one command may take before ``deadline``: the exec timeout at most."""
        return max(0.0, min(self.timeouts.exec, deadline - time.monotonic()))

    def wait_active(self, vmid: int, unit: str, deadline: float | None = None) -> None:
        """Wait until ``unit`` is active with no job of it still queued, until ``deadline``
        (``time.monotonic()``; the service timeout from now when None).

        A start or restart asked with ``--no-block`` is a queued job until systemd finishes it
        (systemctl(1) ``--no-block``: the job is only verified and enqueued): until then the unit
        may still show its state from before (``inactive``, ``failed``, or ``active`` before a
        restart), so a state counts only once no job is left (``Job=`` empty: ``systemctl show
        -p`` prints an asked property even when it is empty, systemd src/systemctl/systemctl.c
        ``-p``, and the Job property as its id or nothing, src/systemctl/systemctl-show.c
        print_property). Raises ExecError when it fails, or when the deadline passes first."""
        if deadline is None:
            deadline = time.monotonic() + self.timeouts.service
        argv = ["systemctl", "show", "-p", "ActiveState", "-p", "Job", unit]
        state = "not active yet"
        while True:
            try:
                res = self._exec(vmid, argv, timeout=self._left(deadline))
            except ExecError as e:
                if e.rc is None and time.monotonic() >= deadline:  # the last look ran out of time
                    break
                raise
            props = parse_show_properties(res.stdout)
            state = props.get("ActiveState", "").strip() or "unknown"
            queued = props.get("Job", "").strip() != ""
            if state == "active" and not queued:
                return
            if state in ("failed", "inactive") and not queued:
                raise ExecError(
                    vmid,
                    ["systemctl", "is-active", unit],
                    3,
                    f'{unit} is {state}: see "systemctl status {unit}" and "journalctl -xeu {unit}" for details',
                )
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self.timeouts.poll, left))
        raise ExecError(
            vmid,
            ["systemctl", "is-active", unit],
            None,
            f"{unit} is still {state} after {self.timeouts.service:g} s (the service timeout)",
        )

    def service_commands(self, vmid: int, unit: str) -> tuple[str, str | None, str | None]:
        """(state, the unit's command, the running main process's command) of ``unit``: what the
        unit file says (``ExecStart`` as systemd loaded it) against what actually runs
        (``/proc/<MainPID>/cmdline``); a command is None when it cannot be read or nothing runs.
        Raises ExecError when ``systemctl show`` itself fails."""
        res = self._exec(
            vmid, ["systemctl", "show", "-p", "MainPID", "-p", "ExecStart", "-p", "ActiveState", unit]
        )
        props = parse_show_properties(res.stdout)
        state = props.get("ActiveState", "").strip() or "unknown"
        running = None
        pid = props.get("MainPID", "0").strip()
        if pid.isdigit() and int(pid) > 0:
            raw = self._exec(vmid, ["cat", f"/proc/{pid}/cmdline"], check=False)
            running = parse_cmdline(raw.stdout) if raw.rc == 0 else None
        return state, exec_start_command(props.get("ExecStart", "")), running

    def start_service(self, vmid: int, unit: str) -> None:
        """daemon-reload, start ``unit`` and wait until it is active, all within the service
        timeout: the start is only queued (``--no-block``) and then watched, so a slow model
        load fails when that timeout says, not when one blocking command's exec limit does.
        Raises ExecError (rc None: the timeout passed)."""
        self._start(vmid, unit, "start")

    def restart_service(self, vmid: int, unit: str) -> None:
        """Restart ``unit`` and wait until it is active again, within the service timeout.
        Raises ExecError."""
        self._start(vmid, unit, "restart")

    def _start(self, vmid: int, unit: str, verb: str) -> None:
        deadline = time.monotonic() + self.timeouts.service
        if verb == "start":
            self._exec(vmid, ["systemctl", "daemon-reload"], timeout=self._left(deadline))
        self._exec(vmid, ["systemctl", verb, "--no-block", unit], timeout=self._left(deadline))
        self.wait_active(vmid, unit, deadline)
