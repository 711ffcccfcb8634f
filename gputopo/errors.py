"""The one error hierarchy of gputopo: a class per phase, each carrying the data that caused it.

Every error formats itself as one line (``str(err)``) that names the culprit; the CLI prints that
line and exits with ``err.exit_code``. Unexpected exceptions keep their traceback (``--debug``).
Exit codes: 2 = bad input or a refused plan (nothing was changed), 1 = a failure while acting
or verifying, 3 = a device needs a human (a sysfs write hung), 4 = another apply holds the lock.
This module imports nothing of gputopo's.
"""

from __future__ import annotations

import errno as _errno
import os


class GputopoError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str = ""):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


# --- input -------------------------------------------------------------------------------


class InputError(GputopoError):
    """Bad input from the operator; nothing was touched."""

    exit_code = 2


class AddressError(InputError):
    def __init__(self, text: str):
        self.text = text
        super().__init__(f"not a PCI address: {text!r} (expected dddd:bb:dd.f)")


class RootError(InputError):
    """``--root`` does not hold a sysfs tree."""

    def __init__(self, root: str, reason: str):
        self.root = root
        self.reason = reason
        super().__init__(f"{root or repr(root)}: not a sysfs root ({reason})")


class SpecError(InputError):
    """A spec file is invalid. Names the file, the field path and what was expected."""

    def __init__(self, file: str, field: str, expected: str):
        self.file = file
        self.field = field
        self.expected = expected
        where = f"{file}: {field}" if field else file
        super().__init__(f"{where}: {expected}")


class ConfigError(InputError):
    """Bad command-line or environment configuration (credentials, URLs, options)."""


class OutputError(InputError):
    """An output path given on the command line cannot be written; nothing else was touched."""

    def __init__(self, path: str, err: OSError):
        self.path = path
        self.errno = err.errno
        super().__init__(f"{path}: cannot write: {err.strerror or err}")


class UnavailableCommand(GputopoError):
    """A command whose module cannot be imported (a dependency is missing or broken)."""

    def __init__(self, name: str, cause: ImportError):
        self.name = name
        self.cause = cause
        super().__init__(
            f"command {name!r} is unavailable: {str(cause).splitlines()[0] if str(cause) else type(cause).__name__}"
        )


class SnapshotError(InputError):
    """A snapshot could not be written or read. Names the file."""

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class FixtureError(InputError):
    """A host description is missing or invalid. Names the file or host and the problem."""

    def __init__(self, where: str, problem: str):
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")


class PveFormatError(InputError):
    """A value does not follow a Proxmox format. ``what`` names the value or key."""

    def __init__(self, what: str, reason: str):
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


class NvsmiParseError(GputopoError):
    """nvidia-smi output did not have the expected shape. Names the line and what was wrong."""

    def __init__(self, line: str, reason: str):
        self.line = line
        self.reason = reason
        super().__init__(f"nvidia-smi output: {reason}: {line!r}")


class SimHostError(InputError):
    """A simulated host directory cannot be created or opened. Names the directory."""

    def __init__(self, where: str, reason: str):
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}")


class SimGuestError(GputopoError):
    """``gputopo sim guest``: a simulated guest's start or stop failed, in Proxmox's words.
    Refused before anything happened (no such guest, already running): exit 2; a task that
    failed: exit 1."""

    def __init__(self, message: str, bad_input: bool = False):
        if bad_input:
            self.exit_code = 2
        super().__init__(message)


# --- discovery ---------------------------------------------------------------------------


class DiscoveryError(GputopoError):
    exit_code = 2


# --- plan --------------------------------------------------------------------------------


class Refusal(InputError):
    """One reason a plan cannot be carried out. ``address`` names the GPU when there is one."""

    def __init__(self, address: str | None, reason: str, code: str = "refused"):
        self.address = address
        self.reason = reason
        self.code = code
        super().__init__(f"{address}: {reason}" if address else reason)


class PlanRefused(InputError):
    """The plan was refused; ``refusals`` lists every reason (each one line)."""

    def __init__(self, refusals: list[Refusal]):
        self.refusals = refusals
        super().__init__("\n".join(f"refused: {r}" for r in refusals))


# --- acting ------------------------------------------------------------------------------


class SysfsWriteError(GputopoError):
    """A sysfs write failed with an errno, as the kernel reported it."""

    def __init__(self, path: str, value: str, err: int, detail: str = ""):
        self.path = path
        self.value = value
        self.errno = err
        name = _errno.errorcode.get(err, str(err))
        extra = f" ({detail})" if detail else ""
        super().__init__(f"writing {value!r} to {path} failed: {name} {os.strerror(err)}{extra}")


class SysfsTimeout(GputopoError):
    """A sysfs write did not return in time. The device needs a human."""

    exit_code = 3

    def __init__(self, path: str, value: str, timeout: float, address: str | None = None):
        self.path = path
        self.value = value
        self.timeout = timeout
        self.address = address
        who = f"device {address} needs a human: " if address else ""
        super().__init__(f"{who}writing {value!r} to {path} did not return within {timeout:g} s")


class UdevTimeout(GputopoError):
    """udev did not process a device's event in time after a driver change: the device nodes
    and permissions its rules make may not be in place yet."""

    def __init__(self, waiting: list[str], timeout: float):
        self.waiting = waiting  # "bind of 0000:01:00.0", "add of vfio group 7"
        super().__init__(
            f"udev did not process the {', '.join(waiting)} event{'s' if len(waiting) > 1 else ''} "
            f"within {timeout:g} s (what 'udevadm settle' waits for); its rules' device nodes may be "
            "missing: see 'journalctl -u systemd-udevd'"
        )


class BindError(GputopoError):
    """A device did not end up on the driver it was meant to (read back after the write)."""

    def __init__(
        self, address: str, wanted: str | None, got: str | None, detail: str = "", native: bool = False
    ):
        self.address = address
        self.wanted = wanted  # None: its native driver, whichever that is
        self.got = got
        extra = f": {detail}" if detail else ""
        # native: whichever driver matches the device (snd_hda_intel, xhci_hcd...), not a name
        want = "its native driver" if native or wanted is None else f"driver {wanted}"
        super().__init__(f"{address}: expected {want}, found {got or 'none'}{extra}")


class ProxmoxError(GputopoError):
    """The Proxmox API refused a call. ``status`` is the HTTP status (or 500 for pvesh)."""

    def __init__(self, call: str, status: int | None, message: str, errors: dict | None = None):
        self.call = call
        self.status = status
        self.errors = errors or {}
        self.pve_message = message
        detail = "; ".join(f"{k}: {v}".strip() for k, v in self.errors.items()) if self.errors else ""
        text = f"{call}: {status or ''} {message}".replace("  ", " ").strip()
        if detail:
            text += f" ({detail})"
        super().__init__(text)


class TaskFailed(ProxmoxError):
    """A Proxmox task (UPID) ended with an exit status other than ``OK`` or ``WARNINGS: N``.
    ``what`` names the guest and the action (``CT 101 shutdown``) when known."""

    def __init__(self, upid: str, exitstatus: str | None, what: str | None = None):
        self.upid = upid
        self.exitstatus = exitstatus
        self.what = what
        if what:
            super().__init__(what, None, f"failed: {exitstatus} (task {upid})")
        else:
            super().__init__(f"task {upid}", None, f"ended with {exitstatus!r}")


class TaskTimeout(TaskFailed):
    """A Proxmox task did not finish within the step's limit (``limit`` seconds); it may still be
    running on the node. ``upid`` is None when even the call that starts it did not return."""

    def __init__(self, upid: str | None, what: str, limit: float):
        self.limit = limit
        self.upid = upid
        self.exitstatus = None
        self.what = what
        task = f"task {upid}" if upid else "its task"
        ProxmoxError.__init__(
            self, what, None, f"{task} did not finish within {limit:g} s (the step's limit)"
        )


class ExecError(GputopoError):
    """A command inside a container failed or timed out."""

    def __init__(self, vmid: int, argv: list[str], rc: int | None, stderr: str = ""):
        self.vmid = vmid
        self.argv = argv
        self.rc = rc
        self.stderr = stderr
        what = "timed out" if rc is None else f"exited {rc}"
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        super().__init__(f"CT {vmid}: {' '.join(argv)} {what}" + (f": {tail}" if tail else ""))


class HttpError(GputopoError):
    """An HTTP request got no reply. ``reason`` is short: ``timed out``, ``Connection refused``."""

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


class PreflightError(GputopoError):
    """A check before anything was changed failed; nothing was touched."""

    exit_code = 2


class LockHeld(GputopoError):
    """Another apply holds the host lock."""

    exit_code = 4

    def __init__(self, path: str, holder: str):
        self.path = path
        self.holder = holder
        super().__init__(f"another apply holds {path}: {holder}")


class ApplyFailed(GputopoError):
    """An apply failed and was rolled back (``rolled_back``) or not completely.

    A rollback that did not complete, or left a device a human must look at (``needs_human``),
    leaves the journal open (``history`` says needs-human): exit 3, whatever stopped the apply
    (a Ctrl-C included), and the line ends with what is left (``left``) and what to do next
    (``next_step``: what to fix by hand, then ``gputopo recover``)."""

    def __init__(
        self,
        step: str,
        cause: BaseException,
        rolled_back: bool,
        needs_human: list[str],
        left: str | None = None,
        next_step: str | None = None,
    ):
        self.step = step
        self.cause = cause
        self.rolled_back = rolled_back
        self.needs_human = needs_human
        self.left = left
        self.next_step = next_step
        if needs_human or not rolled_back:
            self.exit_code = 3
        state = "rolled back" if rolled_back else "NOT fully rolled back"
        if left:
            state += f" ({left})"
        human = f"; needs a human: {', '.join(needs_human)}" if needs_human else ""
        then = f"; {next_step}" if next_step else ""
        super().__init__(f"apply failed at {step}: {cause}; {state}{human}{then}")


class JournalError(GputopoError):
    """A journal left by an interrupted apply could not be read or finished."""


class VerifyFailed(GputopoError):
    """Verification found at least one FAIL."""


class PreflightFailed(PreflightError):
    """Preflight found problems (``problems``: one line each); nothing was changed."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class HostChanged(PreflightError):
    """The plan made under the lock differs from the one checked and confirmed."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(
            f"the host changed since the plan was made ({detail}); nothing was changed, plan again"
        )


class HostFileError(GputopoError):
    """A host file could not be written or removed (read-only filesystem, disk full)."""

    def __init__(self, path: str, err: OSError):
        self.path = path
        self.errno = err.errno
        super().__init__(f"/{path.lstrip('/')}: {err.strerror or err}")


class Interrupted(GputopoError):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) stopped the apply; ``exit_code`` is 128 + its number."""

    def __init__(self, signum: int):
        import signal  # here: importing it costs every command's start-up, and only apply is signalled

        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted ({signal.Signals(signum).name})")


class ApplyCancelled(GputopoError):
    """The operator declined the plan; nothing was changed."""

    exit_code = 2  # nothing was changed, as for every other refusal

    def __init__(self) -> None:
        super().__init__("apply cancelled; nothing was changed")


class ContainerStartError(GputopoError):
    """Proxmox refused to start a container (the task fails with this message)."""


class UnfinishedApply(JournalError):
    """An earlier apply did not finish; its journal must be recovered first.

    ``needs_human`` and ``pending`` (0-based step indices) are set when the journal's last word
    is a rollback that needed a human; ``description`` is the journal's one-line summary.
    """

    exit_code = 2

    def __init__(
        self,
        path: str,
        description: str,
        needs_human: list[str] | None = None,
        pending: list[int] | None = None,
        left: str | None = None,
        next_step: str | None = None,
    ):
        self.path = path
        self.needs_human = needs_human
        self.pending = pending
        if needs_human is not None:
            what = []
            if needs_human:
                what.append(f"devices: {', '.join(needs_human)}")
            if pending:
                what.append("undo of step(s) " + ", ".join(str(i + 1) for i in pending) + " not complete")
            if left and not pending:
                what.append(left)
            super().__init__(
                f"an earlier apply's rollback needs a human ({'; '.join(what) or 'see the journal'}): {path}; "
                + (next_step or "fix what it names, then run 'gputopo recover'")
            )
            return
        super().__init__(
            f"an earlier apply did not finish: {description}; run 'gputopo recover' to roll it back "
            "(or 'gputopo recover --finish' to complete it)"
        )


class OutputExists(InputError):
    """A file the operator named exists and ``--force`` was not given; nothing was written."""

    def __init__(self, path: str, hint: str = "pass --force to replace it"):
        self.path = path
        super().__init__(f"{path}: exists; {hint}")


class ConnectFailed(ProxmoxError):
    """The Proxmox API could not be reached or refused the login (exit 2: nothing was changed).
    ``hint`` is the known fix, when there is one (a CA bundle for an untrusted certificate)."""

    exit_code = 2

    def __init__(self, call: str, status: int | None, message: str, hint: str = ""):
        self.hint = hint
        super().__init__(call, status, message)
        if hint:
            self.message += f"; {hint}"


class LoginFailed(ConnectFailed):
    """The Proxmox API refused the login (a 401: wrong password or token secret) or presented a
    certificate other than the one pinned: nothing was done, like bad input."""


class SavedPlanStale(PreflightError):
    """A saved plan no longer matches the host: ``changes`` names what moved since it was made."""

    def __init__(self, path: str, changes: list[str]):
        self.path = path
        self.changes = changes
        more = f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
        super().__init__(
            f"{path}: the host changed since this plan was made: {'; '.join(changes[:3])}{more}; "
            "nothing was changed, make a new plan"
        )


class SavedPlanEdited(InputError):
    """A saved plan was edited since ``plan -o`` wrote it: ``edits`` names each part."""

    def __init__(self, path: str, edits: list[str]):
        self.path = path
        self.edits = edits
        super().__init__(
            f"{path}: edited since 'gputopo plan -o' wrote it: {'; '.join(edits)}; "
            "nothing was changed, make a new plan"
        )


class HistoryError(InputError):
    """A ``gputopo history`` id that names no journal (or names several)."""


class HostCommandError(GputopoError):
    """A command on the host itself could not be started, failed or timed out."""

    def __init__(self, argv: list[str], reason: str):
        self.argv = argv
        self.reason = reason
        super().__init__(f"{' '.join(argv)}: {reason}")


# --- cluster -----------------------------------------------------------------------------


class NodeUnreachable(GputopoError):
    """A cluster node could not be reached over SSH (refused, timed out, host key or login
    refused), or the session ended without an answer. Whether the command ran depends on when:
    a rolling apply tells a failure before the command was sent from one after it (unknown)."""

    exit_code = 2

    def __init__(self, node: str, reason: str):
        self.node = node
        self.reason = reason
        super().__init__(f"node {node}: unreachable over SSH: {reason}")


class UnknownNode(InputError):
    """A node named on the command line is not in the spec or not a member of the cluster."""

    def __init__(self, node: str, where: str, known: list[str]):
        self.node = node
        self.known = known
        super().__init__(f"unknown node {node!r}: not {where} (have {', '.join(known) or 'none'})")


class VersionMismatch(InputError):
    """A node runs another gputopo version than the caller: plans made here would not be the
    plans it makes."""

    def __init__(self, node: str, ours: str, theirs: str):
        self.node = node
        self.ours = ours
        self.theirs = theirs
        super().__init__(
            f"node {node} runs gputopo {theirs}, this is gputopo {ours}: install gputopo {ours} "
            "on every node first; nothing was changed"
        )


class RemoteCommandFailed(GputopoError):
    """A gputopo command on a cluster node failed; ``reason`` is its one-line error."""

    def __init__(self, node: str, command: str, rc: int, reason: str):
        self.node = node
        self.command = command
        self.rc = rc
        self.reason = reason
        self.exit_code = rc if rc in (1, 2, 3, 4) else 1
        super().__init__(f"node {node}: {command} exited {rc}: {reason}")


class MappingConflict(GputopoError):
    """A node's own lines of a PCI mapping changed between its plan and its write (an edit by
    hand): the write is refused rather than overwriting it."""

    def __init__(self, mapping: str, node: str, detail: str = ""):
        self.mapping = mapping
        self.node = node
        more = f" ({detail})" if detail else ""
        super().__init__(
            f"mapping {mapping}: node {node}'s entries changed since the plan{more}; "
            "not overwritten: plan again"
        )


class ClusterApplyFailed(GputopoError):
    """A rolling apply stopped at a node. The line names it and why, then what the rollout left:
    the nodes applied and kept (a node whose verification failed keeps its changes too), those
    that need a human or whose outcome is unknown, and those not started. ``exit_code`` is the
    rollout's: 2 or 4 only when nothing was changed anywhere, 3 when a node needs a human or its
    outcome is unknown, else 1.
    ``account``: every node's outcome (:class:`gputopo.cluster.account.RollingResult`)."""

    def __init__(
        self,
        node: str | None,
        reason: str,
        exit_code: int,
        *,
        kept: list[str],
        not_started: list[str],
        unknown: list[str] = (),
        needs_human: list[str] = (),
        account: object = None,
    ):
        self.node = node
        self.reason = reason
        self.exit_code = exit_code
        self.kept = list(kept)
        self.not_started = list(not_started)
        self.unknown = list(unknown)
        self.needs_human = list(needs_human)
        self.account = account
        parts = [f"applied and kept: {', '.join(self.kept) if self.kept else 'none'}"]
        if self.needs_human:
            parts.append(f"needs a human: {', '.join(self.needs_human)}")
        if self.unknown:
            parts.append(f"outcome unknown: {', '.join(self.unknown)} (see its 'gputopo history')")
        if self.not_started:
            parts.append(f"not started: {', '.join(self.not_started)}")
        head = f"stopped at node {node}" if node else "stopped at the HA placement, every node done"
        super().__init__(f"{head}: {reason}; " + "; ".join(parts))
