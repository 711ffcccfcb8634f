"""The file commands of a simulated container: ``cat``, ``test``, ``rm``, ``mkdir``, ``rmdir``, ``ls /dev``."""

from __future__ import annotations

from gputopo.ports import ExecResult
from gputopo.sim.container.lifecycle import Container
from gputopo.sim.container.paths import inside, read_text
from gputopo.sim.container.shell import container_file, result

# What an LXC container's /dev holds besides the passed-through nodes.
BASE_DEV = (
    "console",
    "core",
    "fd",
    "full",
    "hugepages",
    "initctl",
    "log",
    "lxc",
    "mqueue",
    "net",
    "null",
    "ptmx",
    "pts",
    "random",
    "shm",
    "stderr",
    "stdin",
    "stdout",
    "tty",
    "tty1",
    "tty2",
    "urandom",
    "zero",
)


def ls_dev(ct: Container) -> ExecResult:
    """``ls /dev``: the base nodes of an LXC container and the passed-through ones."""
    names = set(BASE_DEV)
    for d in ct.devices():
        names.add(d[len("/dev/") :].split("/", 1)[0])
    return result(0, "".join(n + "\n" for n in sorted(names)))


def cat(ct: Container, args: list[str]) -> ExecResult:
    """``cat FILE...``, with coreutils' messages."""
    out, err, rc = "", "", 0
    for path in args:
        try:
            p = container_file(ct, path)
        except ValueError:
            p = None
        if p is not None and p.is_dir():
            err += f"cat: {path}: Is a directory\n"
            rc = 1
            continue
        text = read_text(p) if p is not None else None
        if text is None:
            err += f"cat: {path}: No such file or directory\n"
            rc = 1
        else:
            out += text
    return result(rc, out, err)


def test(ct: Container, args: list[str]) -> ExecResult:
    """``test -e|-f|-d|-c PATH``; a ``/dev`` path is answered from the container's view."""
    if len(args) != 2 or args[0] not in ("-e", "-f", "-d", "-c"):
        return result(2, err="test: unsupported expression\n")
    op, path = args
    if path.startswith("/dev/"):
        view = ct.devices()
        exists = path in view or any(v.startswith(path.rstrip("/") + "/") for v in view)
        if op == "-c":
            exists = path in view
        elif op in ("-f", "-d"):
            exists = exists and (op == "-d") == (path not in view)
        return result(0 if exists else 1)
    try:
        p = container_file(ct, path)
    except ValueError:
        return result(1)
    ok = {"-e": p.exists(), "-f": p.is_file(), "-d": p.is_dir(), "-c": False}[op]
    return result(0 if ok else 1)


def rm(ct: Container, args: list[str]) -> ExecResult:
    """``rm [-f] FILE...`` for regular files inside the container (what apply's undo needs)."""
    force = "-f" in args
    err, rc = "", 0
    for path in (a for a in args if not a.startswith("-")):
        try:
            p = inside(ct.rootfs, path)
        except ValueError:
            err, rc = err + f"rm: cannot remove '{path}': Permission denied\n", 1
            continue
        if p.is_dir():
            err, rc = err + f"rm: cannot remove '{path}': Is a directory\n", 1
        elif p.is_file() or p.is_symlink():
            p.unlink()
        elif not force:
            err, rc = err + f"rm: cannot remove '{path}': No such file or directory\n", 1
    return result(rc, err=err)


def mkdir(ct: Container, args: list[str]) -> ExecResult:
    """``mkdir [-p] DIR...`` inside the container, with coreutils' messages: without ``-p`` a
    missing parent or an existing path is an error; with ``-p`` only a file in the way is."""
    parents = "-p" in args or "--parents" in args
    paths = [a for a in args if not a.startswith("-")]
    if not paths:
        return result(1, err="mkdir: missing operand\nTry 'mkdir --help' for more information.\n")
    err, rc = "", 0
    for path in paths:
        try:
            p = inside(ct.rootfs, path)
        except ValueError:
            err, rc = err + f"mkdir: cannot create directory '{path}': Permission denied\n", 1
            continue
        if parents:
            blocker = next((q for q in [p, *p.parents] if q.exists() and not q.is_dir()), None)
            if blocker is not None:
                err, rc = err + f"mkdir: cannot create directory '{path}': Not a directory\n", 1
            else:
                p.mkdir(parents=True, exist_ok=True)
        elif p.exists():
            err, rc = err + f"mkdir: cannot create directory '{path}': File exists\n", 1
        elif not p.parent.is_dir():
            err, rc = err + f"mkdir: cannot create directory '{path}': No such file or directory\n", 1
        else:
            p.mkdir()
    return result(rc, err=err)


def rmdir(ct: Container, args: list[str]) -> ExecResult:
    """``rmdir [--ignore-fail-on-non-empty] DIR...`` with coreutils' messages: only an empty
    directory goes; a non-empty one is an error unless the flag says to ignore it."""
    ignore = "--ignore-fail-on-non-empty" in args
    paths = [a for a in args if not a.startswith("-")]
    if not paths:
        return result(1, err="rmdir: missing operand\nTry 'rmdir --help' for more information.\n")
    err, rc = "", 0
    for path in paths:
        try:
            p = inside(ct.rootfs, path)
        except ValueError:
            err, rc = err + f"rmdir: failed to remove '{path}': Permission denied\n", 1
            continue
        if not p.exists():
            err, rc = err + f"rmdir: failed to remove '{path}': No such file or directory\n", 1
        elif not p.is_dir():
            err, rc = err + f"rmdir: failed to remove '{path}': Not a directory\n", 1
        elif any(p.iterdir()):
            if not ignore:
                err, rc = err + f"rmdir: failed to remove '{path}': Directory not empty\n", 1
        else:
            p.rmdir()
    return result(rc, err=err)
