"""A disk that remembers what was never fsynced and can lose exactly that: the power-loss model.

The live files sit in a backing directory (``data``) and every operation passes straight through to
it, so reads see what a page cache would show. Beside each change the disk keeps what it needs to
go back to the *durable* state, the state an fsync promised:

- **File data.** The first change to a file after its last fsync records its durable size; every
  write or truncate then records the bytes it replaces below that size (its before-image). An
  ``fsync``/``fdatasync`` of the file forgets them: from then on the content is durable. A file
  opened ``O_SYNC``/``O_DSYNC`` writes durably.
- **Directory entries.** The first change to a directory after its last fsync (create, mkdir,
  unlink, rmdir, rename in or out, link, symlink) records its entries as they were (name -> inode).
  An ``fsync`` of the directory forgets them. An entry that goes away (unlink, rmdir, the target of
  a rename) keeps its inode alive in ``trash`` (a hard link, or the empty directory itself) while
  some directory's durable entries still name it.

:meth:`LossyDisk.power_loss` puts the durable state back: every recorded file gets its
before-images in reverse order and its durable size; every recorded directory gets exactly its
durable entries (an entry created since goes, a removed or renamed one comes back, by inode). It
then forgets everything and refuses further operations: the caller unmounts.

What it does not model (docs/chaos.md, "Power loss"): a write torn inside itself (one write is all
or nothing), the disk reordering writes (what was fsynced survives whole, what was not is lost
whole: a real disk may keep any part of it), metadata other than sizes and entries (modes, times),
and ext4's habit of committing a new file's entry with the file's fsync (here the directory must be
fsynced, as POSIX asks).

Thread-safe: one lock orders every operation and the power loss.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DiskCut", "DropReport", "LossyDisk"]

_SYNC_FLAGS = os.O_SYNC | os.O_DSYNC


class DiskCut(OSError):
    """The power is off: every operation fails with EIO until the disk is mounted again."""

    def __init__(self) -> None:
        super().__init__(errno.EIO, "the power was cut")


@dataclass
class _FileUndo:
    durable_size: int
    before: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, old bytes), in order
    unsynced_bytes: int = 0  # bytes written or cut since the last fsync


@dataclass(frozen=True)
class DropReport:
    unsynced_bytes: int  # bytes written (or cut by truncate) since their file's last fsync
    files_reverted: int
    entries_removed: int  # directory entries created since their directory's last fsync
    entries_restored: int  # entries removed or renamed away since their directory's last fsync

    def as_json(self) -> dict[str, int]:
        return {
            "unsynced_bytes": self.unsynced_bytes,
            "files_reverted": self.files_reverted,
            "entries_removed": self.entries_removed,
            "entries_restored": self.entries_restored,
        }


class LossyDisk:
    """``data`` is the live tree; ``trash`` keeps removed inodes. Both must be on one file system
    (entries move between them by rename and link). Paths given to the methods are relative to
    ``data`` ("/" is its root)."""

    def __init__(self, data: str, trash: str) -> None:
        self.data = os.path.realpath(data)
        self.trash = os.path.realpath(trash)
        os.makedirs(self.trash, exist_ok=True)
        for leftover in os.listdir(self.trash):
            _remove(os.path.join(self.trash, leftover))
        self._lock = threading.Lock()
        self._files: dict[int, _FileUndo] = {}  # inode -> what its durable data was
        self._dirs: dict[int, dict[str, int]] = {}  # directory inode -> its durable entries
        self._fds: dict[int, tuple[int, bool]] = {}  # open fd -> (inode, writes are synchronous)
        self._cut = False

    # -- paths ------------------------------------------------------------------------------------

    def real(self, path: str) -> str:
        return os.path.join(self.data, path.lstrip("/"))

    def _parent(self, path: str) -> str:
        return os.path.dirname(self.real(path).rstrip("/"))

    def _check(self) -> None:
        if self._cut:
            raise DiskCut()

    # -- recording --------------------------------------------------------------------------------

    def _dir_dirty(self, real_dir: str) -> None:
        """Record a directory's entries before its first change since its last fsync."""
        ino = os.lstat(real_dir).st_ino
        if ino not in self._dirs:
            with os.scandir(real_dir) as it:
                self._dirs[ino] = {e.name: e.inode() for e in it}

    def _file_dirty(self, ino: int, size: int) -> _FileUndo:
        undo = self._files.get(ino)
        if undo is None:
            undo = self._files[ino] = _FileUndo(durable_size=size)
        return undo

    def _before_image(self, fd: int, ino: int, offset: int, length: int) -> None:
        """Keep the bytes [offset, offset + length) as they are, as far as they are durable."""
        size = os.fstat(fd).st_size
        undo = self._file_dirty(ino, size)
        end = min(offset + length, undo.durable_size, size)
        if end > offset:
            undo.before.append((offset, os.pread(fd, end - offset, offset)))
        undo.unsynced_bytes += length

    def _keep(self, real_path: str, always: bool = False) -> None:
        """Before the entry at ``real_path`` goes away: keep its inode alive in the trash if a
        recorded directory names it (a power loss may bring it back), else remove it now."""
        st = os.lstat(real_path)
        if not always and not any(st.st_ino in durable.values() for durable in self._dirs.values()):
            if _is_dir(real_path):
                os.rmdir(real_path)
            else:
                if st.st_nlink <= 1:
                    self._files.pop(st.st_ino, None)
                os.unlink(real_path)
            return
        kept = os.path.join(self.trash, str(st.st_ino))
        if os.path.lexists(kept):
            if os.path.isdir(real_path) and not os.path.islink(real_path):
                raise OSError(errno.EEXIST, "directory inode already kept", real_path)
            return
        if os.path.isdir(real_path) and not os.path.islink(real_path):
            os.rename(real_path, kept)  # rmdir: the (empty) directory itself moves aside
        else:
            os.link(real_path, kept, follow_symlinks=False)

    # -- files ------------------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if flags & os.O_WRONLY:  # before-images are read through the same descriptor
            flags = (flags & ~os.O_WRONLY) | os.O_RDWR
        with self._lock:
            self._check()
            real = self.real(path)
            existed = os.path.lexists(real)
            if not existed and flags & os.O_CREAT:
                self._dir_dirty(os.path.dirname(real))
            truncating = existed and flags & os.O_TRUNC and flags & os.O_RDWR
            if truncating:
                fd = os.open(real, (flags & ~os.O_TRUNC) | os.O_CLOEXEC, mode)
                st = os.fstat(fd)
                self._before_image(fd, st.st_ino, 0, st.st_size)
                os.ftruncate(fd, 0)
            else:
                fd = os.open(real, flags | os.O_CLOEXEC, mode)
            ino = os.fstat(fd).st_ino
            if not existed:  # a new file: nothing of it is durable yet (whatever its inode held before)
                self._files[ino] = _FileUndo(durable_size=0)
            self._fds[fd] = (ino, bool(flags & _SYNC_FLAGS))
            return fd

    def write(self, fd: int, data: bytes, offset: int) -> int:
        with self._lock:
            self._check()
            ino, synchronous = self._fds[fd]
            if not synchronous:
                self._before_image(fd, ino, offset, len(data))
            return os.pwrite(fd, data, offset)

    def read(self, fd: int, size: int, offset: int) -> bytes:
        with self._lock:
            self._check()
            return os.pread(fd, size, offset)

    def truncate(self, path: str, length: int) -> None:
        with self._lock:
            self._check()
            fd = os.open(self.real(path), os.O_RDWR | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if length < st.st_size:
                    self._before_image(fd, st.st_ino, length, st.st_size - length)
                else:
                    self._file_dirty(st.st_ino, st.st_size).unsynced_bytes += length - st.st_size
                os.ftruncate(fd, length)
            finally:
                os.close(fd)

    def fsync(self, fd: int) -> None:
        """The file's data and size are durable from now on (its entry is its directory's)."""
        with self._lock:
            self._check()
            self._files.pop(self._fds[fd][0], None)

    def close(self, fd: int) -> None:
        with self._lock:
            self._fds.pop(fd, None)
            os.close(fd)

    # -- directories ------------------------------------------------------------------------------

    def fsync_dir(self, path: str) -> None:
        """The directory's entries are durable from now on."""
        with self._lock:
            self._check()
            self._dirs.pop(os.lstat(self.real(path)).st_ino, None)
            self._collect_trash()

    def mkdir(self, path: str, mode: int) -> None:
        with self._lock:
            self._check()
            self._dir_dirty(self._parent(path))
            os.mkdir(self.real(path), mode)

    def symlink(self, path: str, target: str) -> None:
        with self._lock:
            self._check()
            self._dir_dirty(self._parent(path))
            os.symlink(target, self.real(path))

    def link(self, path: str, existing: str) -> None:
        with self._lock:
            self._check()
            self._dir_dirty(self._parent(path))
            os.link(self.real(existing), self.real(path), follow_symlinks=False)

    def unlink(self, path: str) -> None:
        with self._lock:
            self._check()
            real = self.real(path)
            self._dir_dirty(os.path.dirname(real))
            self._keep(real)
            if os.path.lexists(real):
                os.unlink(real)

    def rmdir(self, path: str) -> None:
        with self._lock:
            self._check()
            real = self.real(path)
            if os.listdir(real):
                raise OSError(errno.ENOTEMPTY, "directory not empty", path)
            self._dir_dirty(os.path.dirname(real))
            self._keep(real)

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            self._check()
            real_old, real_new = self.real(old), self.real(new)
            os.lstat(real_old)  # ENOENT before anything is recorded
            self._dir_dirty(os.path.dirname(real_old))
            self._dir_dirty(os.path.dirname(real_new))
            if os.path.lexists(real_new) and not os.path.samefile(real_old, real_new):
                if os.path.isdir(real_new) and not os.path.islink(real_new) and os.listdir(real_new):
                    raise OSError(errno.ENOTEMPTY, "directory not empty", new)
                self._keep(real_new)
            os.rename(real_old, real_new)

    # -- power loss -------------------------------------------------------------------------------

    def pending(self) -> dict[str, int]:
        """What a power loss now would drop, roughly: unsynced bytes, dirty files and directories."""
        with self._lock:
            return {
                "unsynced_bytes": sum(u.unsynced_bytes for u in self._files.values()),
                "dirty_files": len(self._files),
                "dirty_dirs": len(self._dirs),
            }

    def power_loss(self) -> DropReport:
        """Cut the power: refuse every operation from now on and put the durable state back."""
        with self._lock:
            self._cut = True
            for fd in list(self._fds):
                os.close(fd)
            self._fds.clear()
            unsynced = sum(u.unsynced_bytes for u in self._files.values())
            reverted = self._revert_files()
            removed, restored = self._revert_dirs()
            for leftover in os.listdir(self.trash):
                _remove(os.path.join(self.trash, leftover))
            self._files.clear()
            self._dirs.clear()
            return DropReport(unsynced, reverted, removed, restored)

    def _index(self) -> dict[int, str]:
        """Inode -> one path holding it, over the live tree and the trash."""
        where: dict[int, str] = {}
        for top in (self.data, self.trash):
            where.setdefault(os.lstat(top).st_ino, top)
            for parent, dirs, files in os.walk(top):
                for name in dirs + files:
                    p = os.path.join(parent, name)
                    where.setdefault(os.lstat(p).st_ino, p)
        return where

    def _revert_files(self) -> int:
        where = self._index()
        reverted = 0
        for ino, undo in self._files.items():
            path = where.get(ino)
            if path is None or not os.path.isfile(path) or os.path.islink(path):
                continue  # gone from every durable directory as well
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                for offset, old in reversed(undo.before):
                    os.pwrite(fd, old, offset)
                os.ftruncate(fd, undo.durable_size)
            finally:
                os.close(fd)
            reverted += 1
        return reverted

    def _revert_dirs(self) -> tuple[int, int]:
        removed = restored = 0
        where = self._index()
        # 1. Every entry a recorded directory did not have durably goes to the trash.
        for dir_ino, durable in self._dirs.items():
            dir_path = where.get(dir_ino)
            if dir_path is None:
                continue
            moved_a_directory = False
            for name in os.listdir(dir_path):
                p = os.path.join(dir_path, name)
                if durable.get(name) != os.lstat(p).st_ino:
                    moved_a_directory |= _is_dir(p)
                    self._keep(p, always=True)  # what it holds may be restored elsewhere
                    if os.path.lexists(p):
                        os.unlink(p)
                    removed += 1
            if moved_a_directory:  # the paths under it changed
                where = self._index()
        # 2. Every durable entry that is missing comes back. Directories move (one place each, and
        # each at most once: two recorded directories may both name one), and moving one moves the
        # paths under it: look again after each.
        moved: set[int] = set()
        while True:
            where = self._index()
            missing = [
                (where[d], name, ino)
                for d, durable in self._dirs.items()
                if d in where
                for name, ino in durable.items()
                if not os.path.lexists(os.path.join(where[d], name))
            ]
            dirs = [m for m in missing if m[2] in where and m[2] not in moved and _is_dir(where[m[2]])]
            if dirs:
                dir_path, name, ino = dirs[0]
                os.rename(where[ino], os.path.join(dir_path, name))
                moved.add(ino)
                restored += 1
                continue
            for dir_path, name, ino in missing:
                if ino in where and not _is_dir(where[ino]):
                    os.link(where[ino], os.path.join(dir_path, name), follow_symlinks=False)
                    restored += 1
            return removed, restored

    def _collect_trash(self) -> None:
        """Forget kept inodes that no recorded directory names any more."""
        wanted = {ino for durable in self._dirs.values() for ino in durable.values()}
        for name in os.listdir(self.trash):
            if name.isdigit() and int(name) not in wanted:
                kept = os.path.join(self.trash, name)
                if not os.path.isdir(kept) or os.path.islink(kept) or not os.listdir(kept):
                    st = os.lstat(kept)
                    if st.st_nlink <= 1:
                        self._files.pop(st.st_ino, None)
                    _remove(kept)

    def stat(self, path: str) -> os.stat_result:
        with self._lock:
            self._check()
            return os.lstat(self.real(path))

    def passthrough(self, fn: Any, path: str, *args: Any) -> Any:
        """An operation the model does not track (chmod, utimens, readlink, statvfs...)."""
        with self._lock:
            self._check()
            return fn(self.real(path), *args)


def _is_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def _remove(path: str) -> None:
    if _is_dir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)
