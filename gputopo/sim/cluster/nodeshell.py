"""The login shell of a simulated cluster node: what ``ssh root@<node> -- <command>`` runs there.

sshd runs it as its ``ForceCommand`` (``python -m gputopo.sim.cluster.nodeshell NODE_DIR``)
with the client's command in ``SSH_ORIGINAL_COMMAND``; without sshd the same module runs with
the command as arguments. It answers the commands the cluster code runs on a node, on that
node's simulated parts:

* ``gputopo ...``: the gputopo installed for this interpreter, pointed at the node: ``--sim NODE_DIR`` for
  the commands that take it and ``cluster node-read`` (a real node's default is the local
  pvesh and pct), ``--root NODE_DIR/root`` for ``discover`` and ``snapshot``. ``history``,
  ``show``, ``export`` and ``watch`` read the node's files, run in its home directory
  (``/root`` of the node's root) with their absolute paths under the node's root: ``watch``'s
  spec is the node's ``/etc/gputopo/spec.yaml``, as on a real node. Any other gputopo command
  is refused in one line (exit 2): none of them may read the machine the simulator runs on;
* ``pct exec VMID -- ARGV``: the node's containers (:class:`gputopo.sim.container.SimExec`);
* ``cat FILE...``, ``stat -c FMT FILE``, ``test -d DIR``: files of the node's root, with
  coreutils' messages;
* anything else: ``sh: 1: NAME: not found``, exit 127, as a login shell says.

The command line is split like a POSIX shell would (``shlex``); operators such as ``;`` or
``|`` are not offered.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

SIM_COMMANDS = {
    "plan",
    "render",
    "diff",
    "apply",
    "recover",
    "verify",
    "init",
    "topo",
    "history",
    "export",
    "watch",
}
ROOT_COMMANDS = {"discover", "snapshot"}
# the commands that read or write the node's own files by path: run in the node's home, their
# absolute paths under the node's root
NODE_FILES = {"history", "show", "export", "watch"}
PATH_OPTIONS = {"--spec", "-o", "--output", "--textfile-dir"}
WATCH_SPEC = "/etc/gputopo/spec.yaml"  # gputopo watch's default spec on a node


class NotOnNode(Exception):
    """A gputopo command the simulated node does not run (it would read the real machine)."""


def answered() -> str:
    """The gputopo commands a simulated node runs, for the refusal's message."""
    return ", ".join(sorted(SIM_COMMANDS | ROOT_COMMANDS | NODE_FILES | {"cluster node-read"}))


def on_node(path: str, node_dir: Path) -> str:
    """A path named on the node's command line, as a path of the simulator: an absolute one under
    the node's root; a relative one stays (the command runs in the node's home)."""
    return str(_under(node_dir, path)) if path.startswith("/") else path


def _node_paths(cmd: str, rest: list[str], node_dir: Path) -> list[str]:
    """``rest`` of a :data:`NODE_FILES` command with its paths on the node (and ``watch``'s
    default spec, the node's)."""
    out: list[str] = []
    it = iter(rest)
    for a in it:
        name, eq, value = a.partition("=")
        if a in PATH_OPTIONS:
            out += [a, on_node(next(it, ""), node_dir)]
        elif eq and name in PATH_OPTIONS:
            out.append(f"{name}={on_node(value, node_dir)}")
        elif cmd == "show" and not a.startswith("-"):
            out.append(on_node(a, node_dir))  # the saved plan
        else:
            out.append(a)
    if cmd == "watch" and not any(a == "--spec" or a.startswith("--spec=") for a in rest):
        out = ["--spec", on_node(WATCH_SPEC, node_dir), *out]
    return out


def _command_at(args: list[str]) -> int:
    """Where the command is in ``gputopo`` arguments: after the global options (--debug,
    --version); ``len(args)`` when there is none."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 1
    return i


def with_node(args: list[str], node_dir: Path) -> list[str]:
    """``gputopo`` arguments pointed at the simulated node in ``node_dir``. Raises NotOnNode for
    a command the node does not run."""
    i = _command_at(args)
    if i >= len(args):
        return args
    cmd, rest = args[i], args[i + 1 :]
    rest = [a for a in rest if a != "--local"]  # the node's own API is the simulated one
    if "--help" in rest or "-h" in rest:
        return args  # the command's help reads nothing
    node_read = cmd == "cluster" and rest[:1] == ["node-read"]
    if not node_read and cmd not in SIM_COMMANDS | ROOT_COMMANDS | NODE_FILES:
        raise NotOnNode(f"gputopo {cmd}{' ' + rest[0] if cmd == 'cluster' and rest else ''}")
    if cmd in NODE_FILES and cmd != "history":
        rest = _node_paths(cmd, rest, node_dir)
    if node_read and "--sim" not in rest:
        rest = ["node-read", "--sim", str(node_dir), *rest[1:]]  # the node's containers and root
    elif cmd in SIM_COMMANDS and "--sim" not in rest:
        rest = ["--sim", str(node_dir)] + rest
    elif cmd in ROOT_COMMANDS and "--root" not in rest:
        rest = ["--root", str(node_dir / "root")] + rest
    return args[:i] + [cmd] + rest


def _under(node_dir: Path, path: str) -> Path:
    return node_dir / "root" / path.lstrip("/")


def _cat(node_dir: Path, args: list[str]) -> int:
    rc = 0
    for path in (a for a in args if a != "--"):
        try:
            sys.stdout.write(_under(node_dir, path).read_text())
        except FileNotFoundError:
            sys.stderr.write(f"cat: {path}: No such file or directory\n")
            rc = 1
        except IsADirectoryError:
            sys.stderr.write(f"cat: {path}: Is a directory\n")
            rc = 1
    return rc


def _stat(node_dir: Path, args: list[str]) -> int:
    files = [a for a in args if a not in ("-c", "--") and not a.startswith("%")]
    path = files[-1] if files else ""
    try:
        st = _under(node_dir, path).stat()
    except FileNotFoundError:
        sys.stderr.write(f"stat: cannot statx '{path}': No such file or directory\n")
        return 1
    sys.stdout.write(f"{st.st_mode & 0o7777:o} {st.st_uid} {st.st_gid}\n")
    return 0


def _pct(node_dir: Path, args: list[str]) -> int:
    from gputopo.sim.container import SimExec

    if len(args) < 3 or args[0] != "exec" or "--" not in args:
        sys.stderr.write("400 not enough arguments\npct exec <vmid> [<extra-args>]\n")
        return 255
    vmid = int(args[1])
    argv = args[args.index("--") + 1 :]
    res = SimExec(node_dir).run(
        vmid, argv, timeout=60.0, input=None if sys.stdin.isatty() else sys.stdin.read()
    )
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    return res.rc


def run(node_dir: Path, words: list[str]) -> int:
    """Run one command line on the node in ``node_dir``; returns its exit status."""
    if not words:
        sys.stderr.write("this node runs commands only\n")
        return 1
    name, args = os.path.basename(words[0]), words[1:]
    if name == "gputopo":
        try:
            argv = with_node(args, node_dir)
        except NotOnNode as e:
            sys.stderr.write(
                f"gputopo: error: '{e}' does not run on a simulated node (it runs: {answered()})\n"
            )
            return 2
        at = _command_at(argv)
        if at < len(argv) and argv[at] in NODE_FILES:
            home = node_dir / "root" / "root"  # root's home on the node, where ssh starts
            home.mkdir(parents=True, exist_ok=True)
            os.chdir(home)
        # the node's installed gputopo (this interpreter's), in its own process
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "gputopo", *argv])
    if name == "pct":
        return _pct(node_dir, args)
    if name == "cat":
        return _cat(node_dir, args)
    if name == "stat":
        return _stat(node_dir, args)
    if name == "test" and len(args) == 2 and args[0] == "-d":
        return 0 if _under(node_dir, args[1]).is_dir() else 1
    sys.stderr.write(f"sh: 1: {name}: not found\n")
    return 127


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("usage: python -m gputopo.sim.cluster.nodeshell NODE_DIR [COMMAND...]\n")
        sys.exit(2)
    node_dir = Path(argv[0]).resolve()
    from gputopo.sim.cluster.reach import refusal, unreachable

    if unreachable(node_dir):
        # broken with 'gputopo sim break node-unreachable': as the client says for a node that
        # refuses the connection (reach.py)
        sys.stderr.write(refusal(node_dir) + "\n")
        sys.exit(255)
    command = os.environ.get("SSH_ORIGINAL_COMMAND")
    words = shlex.split(command) if command is not None else argv[1:]
    code = run(node_dir, words)
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
