"""The exit codes of every command, in one table: what each code means, and which codes each
command can end with. The commands' ``--help`` and docs/exit-codes.md's table are written from it, and
``tests/test_exit_codes.py`` walks it. Imports nothing.

Every command also exits 2 for a usage error (an unknown option, a bad value), 130 when
Ctrl-C stops it and 141 when the reader of its output goes away; those are listed for every
command.
"""

from __future__ import annotations

OK = 0
FAILED = 1  # a failure while acting or verifying (an apply was rolled back)
NOTHING_CHANGED = 2  # bad input, refused, declined, or the host could not be reached
NEEDS_HUMAN = 3
LOCKED = 4
SIGHUP = 129
SIGINT = 130
SIGPIPE = 141
SIGTERM = 143
# ssh's own exit status when it failed or its connection ended before the remote command did
# (what a cluster command tells from a node's answer): no gputopo command ends with it
SSH_ERROR = 255

# the signals a command ends with (their numbers on Linux; this module imports nothing) and how
# its messages name them
_SIGNALS = {2: (SIGINT, "Ctrl-C"), 15: (SIGTERM, "SIGTERM"), 1: (SIGHUP, "SIGHUP")}


def of_signal(signum: int) -> int:
    """The exit code of a command that ``signum`` (SIGINT, SIGTERM, SIGHUP) stopped: 128 + signum."""
    return _SIGNALS[signum][0] if signum in _SIGNALS else 128 + signum


def signal_name(signum: int) -> str:
    """How messages name ``signum``: "Ctrl-C", "SIGTERM", "SIGHUP"."""
    return _SIGNALS[signum][1] if signum in _SIGNALS else f"signal {signum}"


MEANING: dict[int, str] = {
    OK: "done, no changes, or all clear",
    FAILED: "a failure while acting or verifying (an apply is rolled back); a verify FAIL",
    NOTHING_CHANGED: (
        "nothing was changed: bad input, a refused plan or preflight, an API that cannot be "
        "reached or refuses the login, no pvesh on --local, a declined prompt, an existing file "
        "without --force"
    ),
    NEEDS_HUMAN: (
        "a rollback did not complete and needs a human (a sysfs write hung, a device fell off the "
        "bus, what ran before did not start again): the journal stays open; the error names what "
        "to fix, then run 'gputopo recover'"
    ),
    LOCKED: "another apply holds the lock",
    SIGHUP: "interrupted by SIGHUP (an apply in progress is rolled back first)",
    SIGINT: "interrupted by Ctrl-C (an apply in progress is rolled back first)",
    SIGPIPE: "the reader of its output went away (| head): stopped quietly, as SIGPIPE stops a command",
    SIGTERM: "interrupted by SIGTERM (an apply in progress is rolled back first)",
}

# command -> {code: what it means for that command}; codes must be keys of MEANING
_COMMON = {NOTHING_CHANGED: "bad input", SIGINT: "interrupted"}
COMMANDS: dict[str, dict[int, str]] = {
    "discover": {OK: "the facts", **_COMMON},
    "topo": {OK: "the picture", **_COMMON},
    "snapshot": {OK: "written", **_COMMON, NOTHING_CHANGED: "bad input or an existing file without --force"},
    "schema": {OK: "the schema", **_COMMON},
    "init": {
        OK: "the starter spec",
        **_COMMON,
        NOTHING_CHANGED: "bad input or an existing file without --force",
    },
    "export": {
        OK: "the spec",
        **_COMMON,
        NOTHING_CHANGED: "bad input, an unreachable API or an existing file",
    },
    "plan": {
        OK: "a plan, or no changes",
        **_COMMON,
        NOTHING_CHANGED: "bad input, a refused plan or an existing -o file without --force",
    },
    "show": {
        OK: "the saved plan",
        **_COMMON,
        NOTHING_CHANGED: "bad input: not a saved plan, or one edited since plan -o wrote it",
    },
    "render": {
        OK: "written",
        **_COMMON,
        NOTHING_CHANGED: "bad input, a refused plan, or a file that is not gputopo's without --force",
    },
    "diff": {
        OK: "no difference (or a difference without --exit-code)",
        FAILED: "with --exit-code: any error, bad input included",
        NOTHING_CHANGED: "differences with --exit-code, else bad input",
        SIGINT: "interrupted",
    },
    "apply": {
        OK: "applied (a signal after the last step stops only the verification), or no changes",
        FAILED: "a step or the verification failed (rolled back)",
        NOTHING_CHANGED: "refused before anything changed (a stale saved plan, a declined prompt too)",
        NEEDS_HUMAN: "the rollback did not complete (history: needs-human), a signal's too",
        LOCKED: "another apply holds the lock",
        SIGHUP: "SIGHUP before the last step ended (rolled back)",
        SIGINT: "Ctrl-C before the last step ended (rolled back)",
        SIGTERM: "SIGTERM before the last step ended (rolled back)",
    },
    "recover": {
        OK: "settled, nothing to recover, or --dry-run",
        FAILED: "a step failed (rolled back where it could), or --finish after a rollback began",
        NOTHING_CHANGED: "bad input",
        NEEDS_HUMAN: "what is left still needs a human (the journal stays open)",
        LOCKED: "an apply holds the lock",
        SIGINT: "interrupted",
    },
    "verify": {OK: "all clear", FAILED: "a FAIL (or a WARN with --strict)", **_COMMON},
    "watch": {
        OK: "checked and written (drift, a FAIL, an apply in progress are in it); --follow: SIGTERM",
        **_COMMON,
        NOTHING_CHANGED: "bad input, or the host could not be read (the metrics say gputopo_watch_up 0)",
    },
    "history": {OK: "the applies", **_COMMON, NOTHING_CHANGED: "bad input or no apply with that id"},
    "completion": {OK: "the script", **_COMMON},
    "cluster": {
        OK: "a plan, all clear, applied or no changes (diff: no difference)",
        FAILED: "apply: a node failed (rolled back there, or its verify failed and its changes "
        "stay), or a node was changed and kept before a later one failed (refused, locked, "
        "unreachable); verify: a FAIL; diff --exit-code: any error",
        NOTHING_CHANGED: "nothing was changed anywhere: bad input, a refused plan, an unreachable "
        "node or another gputopo version, a node refusing before any node changed; diff "
        "--exit-code: differences",
        NEEDS_HUMAN: "apply: a node needs a human, or its outcome is unknown (the connection was "
        "lost during its apply: the account names the next step)",
        LOCKED: "apply: a node's lock is held, and nothing was changed anywhere",
        SIGHUP: "apply: SIGHUP (the session it ran in dropped), with the account; the nodes "
        "applying then answer or are unknown",
        SIGINT: "interrupted (apply: with the account)",
        SIGTERM: "apply: SIGTERM, with the account; the nodes applying then answer or are unknown",
    },
    "demo": {OK: "the demo ran", FAILED: "a step of the demo failed", **_COMMON},
    "sim": {
        OK: "done (serve, cluster-ssh: stopped by Ctrl-C or SIGTERM)",
        FAILED: "guest: the start or stop task failed",
        **_COMMON,
        NOTHING_CHANGED: "bad input (guest: no such guest, or Proxmox refused it: already running)",
    },
    "fixtures": {OK: "done", **_COMMON},
}
# every command: its output's reader gone (gputopo.cli.main ends it quietly)
for _codes in COMMANDS.values():
    _codes[SIGPIPE] = "its output's reader went away"


def help_text(command: str) -> str:
    """The ``Exit codes:`` paragraph of ``command``'s help, one code a line (click keeps the
    lines of a paragraph that starts with ``\\b``). Raises KeyError for a command not in the table."""
    codes = COMMANDS[command]
    return "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {codes[code]}" for code in sorted(codes))


def with_exit_codes(command: str):
    """Decorator for a click command function: appends ``help_text(command)`` to its docstring,
    which click shows as its help."""

    def decorate(f):
        import inspect

        f.__doc__ = inspect.cleandoc(f.__doc__ or "") + "\n\n" + help_text(command) + "\n"
        return f

    return decorate


def markdown_table() -> str:
    """docs/exit-codes.md's table: each code, its meaning and the commands that end with it."""
    lines = ["| code | meaning | commands |", "|---|---|---|"]
    for code in sorted(MEANING):
        having = [c for c in sorted(COMMANDS) if code in COMMANDS[c]]
        cmds = "every command" if len(having) == len(COMMANDS) else ", ".join(f"`{c}`" for c in having)
        lines.append(f"| {code} | {MEANING[code]} | {cmds} |")
    return "\n".join(lines)


def command_table(command: str) -> str:
    """docs/exit-codes.md's table of what each code means for one ``command`` (the cluster commands':
    whether anything changed anywhere)."""
    lines = ["| code | " + f"`{command}` |", "|---|---|"]
    lines += [f"| {code} | {text} |" for code, text in sorted(COMMANDS[command].items())]
    return "\n".join(lines)
