"""Host files under the root: the boot-time persistence of per-address binding (modprobe.d hook,
udev rule, vfio module list). Written atomically; undone by restoring the old text and mode."""

from __future__ import annotations

from typing import Literal

from gputopo.actions.base import (
    ActionModel,
    DiffContext,
    Phase,
    PreflightContext,
    Resource,
    StepContext,
    World,
)
from gputopo.actions.shell import CommandContext, line, q, with_text
from gputopo.errors import HostFileError
from gputopo.model.filemode import FileMode
from gputopo.model.strict import Strict


class FileBefore(Strict):
    content: str | None  # None: the file did not exist
    mode: FileMode | None = None  # its permission bits and owner, restored with the content
    uid: int | None = None
    gid: int | None = None
    absent_dirs: list[str] = []  # its parent directories that did not exist, deepest first


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _read(ctx: StepContext, path: str) -> FileBefore:
    try:
        meta = ctx.ports.files.meta(path)
        content = ctx.ports.files.read(path)
        absent = [d for d in _parents(path) if not ctx.ports.files.is_dir(d)]
    except OSError as e:
        raise HostFileError(path, e) from e
    if meta is None or content is None:
        return FileBefore(content=None, absent_dirs=absent)
    return FileBefore(content=content, mode=meta.mode, uid=meta.uid, gid=meta.gid)


def _restore(ctx: StepContext, path: str, before: FileBefore) -> str:
    """Put ``path`` back as ``before`` says, and remove any temp file a write of it killed
    before its rename left beside it (whether or not the file itself changed). Raises
    HostFileError."""
    try:
        ctx.ports.files.discard_temps(path)
        now = _read(ctx, path)
        if now.model_dump(exclude={"absent_dirs"}) == before.model_dump(exclude={"absent_dirs"}) and set(
            before.absent_dirs
        ) <= set(now.absent_dirs):
            return ""
        if before.content is None:
            ctx.ports.files.remove(path)
            for d in before.absent_dirs:  # the directories the write made for it
                ctx.ports.files.remove_dir(d)
            return f"removed /{path}"
        owner = (before.uid, before.gid) if before.uid is not None and before.gid is not None else None
        ctx.ports.files.write(path, before.content, before.mode if before.mode is not None else 0o644, owner)
        return f"restored /{path}"
    except OSError as e:
        raise HostFileError(path, e) from e


class _FileStep(ActionModel):
    """What writing and removing a host file share: which file, its state before, its undo."""

    phase: Phase = "prepare"
    path: str

    Before = FileBefore
    counts_as = "boot file"
    changes_boot = True  # modprobe.d and modules-load.d are copied into the initramfs

    def after(self) -> str | None:
        """The file's text once the step is done (None: absent)."""
        raise NotImplementedError

    def preflight(self, ctx: PreflightContext) -> list[str]:
        # a read-only /etc (or a file made immutable) fails here, before anything stops, not at
        # the step with a rollback after it
        why = ctx.ports.files.unwritable(self.path)
        if why is None:
            return []
        return [f"cannot write /{self.path.lstrip('/')} ({why}): make it writable, then apply again"]

    def before(self, ctx: StepContext) -> FileBefore:
        return _read(ctx, self.path)

    def undo(self, before: FileBefore, ctx: StepContext) -> str:
        return _restore(ctx, self.path, before)

    def undo_restores(self) -> set[Resource]:
        return {Resource("file", self.path)}

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        old = ctx.current.files.get(self.path)
        if old is None:
            # and the directories the write made, as undo removes them (left when not empty)
            rmdirs = [
                line("rmdir", "--ignore-fail-on-non-empty", f"/{d}") for d in ctx.absent_dirs(self.path)
            ]
            return [line("rm", "-f", f"/{self.path}"), *rmdirs]
        mode = ctx.file_mode(self.path)
        return [write_file(self.path, old, mode if mode is not None else 0o644)]

    def expect(self, world: World) -> None:
        world.current.files[self.path] = self.after()

    def diff(self, ctx: DiffContext) -> None:
        area = ctx.area("persistence files")
        area.lines.append(self.describe())
        area.files[self.path] = ctx.unified(self.path, ctx.current.files.get(self.path), self.after())


def write_file(path: str, content: str, mode: int) -> str:
    """The command that writes ``content`` to host file ``/path`` with ``mode``, its
    directories made as apply makes them."""
    return with_text(f"install -D -m {mode:04o} /dev/stdin {q('/' + path)}", content)


class WriteHostFile(_FileStep):
    kind: Literal["write_host_file"] = "write_host_file"
    content: str
    mode: FileMode = 0o644

    def describe(self) -> str:
        return f"write host file /{self.path} ({len(self.content.splitlines())} lines)"

    def after(self) -> str | None:
        return self.content

    def commands(self, ctx: CommandContext) -> list[str]:
        return [write_file(self.path, self.content, self.mode)]

    def do(self, ctx: StepContext) -> None:
        try:
            meta = ctx.ports.files.meta(self.path)
            if ctx.ports.files.read(self.path) != self.content or meta is None or meta.mode != self.mode:
                ctx.ports.files.write(self.path, self.content, self.mode)
            else:  # done already (a retried step): a write killed before its rename left a temp
                ctx.ports.files.discard_temps(self.path)
        except OSError as e:
            raise HostFileError(self.path, e) from e


class RemoveHostFile(_FileStep):
    kind: Literal["remove_host_file"] = "remove_host_file"

    def describe(self) -> str:
        return f"remove host file /{self.path}"

    def after(self) -> str | None:
        return None

    def commands(self, ctx: CommandContext) -> list[str]:
        return [line("rm", "-f", f"/{self.path}")]

    def do(self, ctx: StepContext) -> None:
        try:
            ctx.ports.files.remove(self.path)
        except OSError as e:
            raise HostFileError(self.path, e) from e
