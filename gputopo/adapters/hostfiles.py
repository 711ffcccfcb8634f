"""Host files under the root (persistence files written by apply): the real HostFilesPort."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from gputopo.ports import FileMeta


class RealHostFiles:
    """Reads and atomically replaces files below ``root`` (``etc/...`` means ``<root>/etc/...``)."""

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = str(root)

    def _path(self, path: str) -> Path:
        rel = path.lstrip("/")
        if ".." in Path(rel).parts:
            raise ValueError(f"path escapes the root: {path}")
        return Path(self.root) / rel

    def read(self, path: str) -> str | None:
        """The file's text, or None when it does not exist."""
        try:
            return self._path(path).read_text()
        except FileNotFoundError:
            return None

    def meta(self, path: str) -> FileMeta | None:
        """The file's mode bits and owner, or None when it does not exist."""
        try:
            st = self._path(path).stat()
        except FileNotFoundError:
            return None
        return FileMeta(mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid)

    def write(self, path: str, content: str, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
        """Replace the file atomically: temp file in the same directory, fsync, rename, fsync dir.
        ``owner`` (uid, gid) is set before the rename, so the file never shows another owner."""
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            if owner is not None:
                os.chown(tmp, owner[0], owner[1])
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def remove(self, path: str) -> None:
        """Remove the file (and what a write of it killed half-way left); a file that is already
        gone is not an error."""
        target = self._path(path)
        _remove_stale_temps(target)
        try:
            target.unlink()
        except FileNotFoundError:
            pass

    def discard_temps(self, path: str) -> None:
        """Remove what a write of ``path`` killed between its temp file and the rename left
        beside it (``.<name>.XXXXXXXX``); the file itself is left as it is. Raises nothing."""
        _remove_stale_temps(self._path(path))

    def is_dir(self, path: str) -> bool:
        return self._path(path).is_dir()

    def remove_dir(self, path: str) -> None:
        """Remove the directory when it is empty; anything else leaves it (and raises nothing)."""
        try:
            self._path(path).rmdir()
        except OSError:
            pass

    def unwritable(self, path: str) -> str | None:
        """Why :meth:`write` or :meth:`remove` of ``path`` would fail, or None. Tried, not guessed
        from mode bits (root writes past them, not past a read-only mount or ``chattr +i``): a
        temp file is made and removed in the nearest directory that exists (the write makes the
        missing ones), and an existing file is opened for writing without truncating it."""
        target = self._path(path)
        d = target.parent
        while not d.exists() and d != d.parent:
            d = d.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=d)
        except OSError as e:
            return f"/{d.relative_to(self.root)}: {e.strerror or e}"
        os.close(fd)
        os.unlink(tmp)
        if target.is_file():
            try:
                os.close(os.open(target, os.O_WRONLY))
            except OSError as e:
                return f"/{path.lstrip('/')}: {e.strerror or e}"
        return None


def _remove_stale_temps(target: Path) -> None:
    """Remove the temp files an earlier write of ``target`` left when it was killed between
    creating and renaming one (``.<name>.XXXXXXXX`` beside it: only this class makes them)."""
    try:
        for p in target.parent.glob(f".{target.name}.*"):
            p.unlink(missing_ok=True)
    except OSError:
        pass
