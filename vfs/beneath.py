"""Reaching entries of SRC without following a symlink anywhere on the way.

The daemon often runs as root for many users, and a user who may write one folder of SRC can
swap an entry the mount already knows (a file, a folder on its path) for a symlink between the
daemon's look at it and its use. Whatever the daemon then does by path — open, chmod, mkdir,
rename — it would do as root to the link's target: /etc/shadow read, chmod 0666, overwritten.
So every such call starts from a descriptor of SRC and walks one component at a time with
O_NOFOLLOW (what openat2's RESOLVE_NO_SYMLINKS does, without needing Linux 5.6): a link met
anywhere fails with ELOOP (or ENOTDIR), as the entry is not there for the mount.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from vfs.acl import acl_stat
from vfs.written import mark_written

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_ROOT = os.O_PATH | os.O_DIRECTORY | _CLOEXEC  # SRC itself is the operator's: it may be a link


def parts_below(root: Path, path: Path) -> tuple[str, ...] | None:
    """The components of `path` below `root` (() for root itself), None if not below it."""
    try:
        return path.relative_to(root).parts
    except ValueError:
        return None


def parent_fd(root: Path, path: Path, each: Callable[[int], None] | None = None) -> int:
    """An O_PATH descriptor of the folder holding `path`, reached from `root` without following
    a link (a `path` outside `root`: its folder opened with O_NOFOLLOW on the last part).
    `each(fd)` is called on `root` and on every folder below it on the way, the parent last:
    what it checks is the folder walked, not one found again by path (it raises to stop)."""
    parts = parts_below(root, path)
    if parts is None or not parts:
        return os.open(path.parent, _DIR)
    fd = os.open(root, _ROOT)
    try:
        for part in parts[:-1]:
            if each is not None:
                each(fd)
            nfd = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
        if each is not None:
            each(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_beneath(root: Path, path: Path, flags: int, mode: int = 0o600) -> int:
    """`os.open(path, flags)` with no link followed from `root` down (O_NOFOLLOW added)."""
    if parts_below(root, path) == ():
        return os.open(root, flags | _CLOEXEC, mode)
    dfd = parent_fd(root, path)
    try:
        return os.open(path.name, flags | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
    finally:
        os.close(dfd)


def makedirs_beneath(
    root: Path, path: Path, mode: int = 0o777, owner: tuple[int, int] | None = None
) -> None:
    """`path.mkdir(parents=True, exist_ok=True)` with no link followed from `root` down: each
    missing folder is made beside its parent's descriptor, and a component that is a link (to
    a folder elsewhere, say) fails with ELOOP/ENOTDIR instead of being made or walked into.
    With `owner` (uid, gid), each folder made is given to them, with exactly `mode`."""
    parts = parts_below(root, path)
    if parts is None:
        raise OSError(errno.EXDEV, f"not below {root}", str(path))
    fd = os.open(root, _ROOT)
    try:
        for part in parts:
            try:
                nfd = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                made = False
                with suppress(FileExistsError):  # made meanwhile: opened below as it is
                    os.mkdir(part, mode, dir_fd=fd)
                    made = True
                if made and owner is not None:
                    _give(part, fd, mode, owner)
                    mark_written(fd, part)  # a writer's folder: as it was made through the mount
                nfd = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)


def _give(name: str, dfd: int, mode: int, owner: tuple[int, int]) -> None:
    """The folder just made at `name` (in `dfd`) to `owner`, with exactly `mode`."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        with suppress(PermissionError):  # not root: the daemon's user's own
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def fsync_beneath(root: Path, path: Path) -> None:
    """fsync the file or folder at `path`, reached from `root` without following a link."""
    fd = open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def not_shown(path: Path, st: os.stat_result) -> OSError:
    """The error for an entry that is no longer a regular file or folder (a FIFO, a device)."""
    return OSError(errno.EACCES, f"no longer a file or folder (mode {stat.filemode(st.st_mode)})",
                   str(path))  # fmt: skip


def stat_beneath(root: Path, path: Path) -> os.stat_result:
    """lstat of `path` reached from `root` without following a link on the way, its mode
    narrowed by its ACL (vfs.acl: the mount shows no more than SRC grants)."""
    fd = open_beneath(root, path, os.O_PATH)
    try:
        return acl_stat(fd, os.fstat(fd))
    finally:
        os.close(fd)


def read_beneath(root: Path, path: Path, limit: int) -> bytes:
    """The whole regular file at `path`, opened from `root` without following a link and
    without waiting (a FIFO or device is refused, not read). A file over `limit` bytes is
    EFBIG, not read: its size is attacker input (a sparse file costs its maker nothing)."""
    return read_beneath_stat(root, path, limit)[0]


def read_beneath_stat(root: Path, path: Path, limit: int) -> tuple[bytes, os.stat_result]:
    """`read_beneath`, and the fstat of the very file read: what is shown from its bytes is
    judged later by that file's modes, not those of whatever its path names by then."""
    fd = open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_shown(path, st)
        if st.st_size <= limit:
            with os.fdopen(fd, "rb", closefd=False) as fh:
                # The size fstat gave and a byte more, to see it grew since (then up to the
                # limit and a byte). read(limit + 1) sized every buffer by the limit: 0.135 s
                # against 0.055 s for the 64 chunks of a 512 MiB image read here.
                raw = fh.read(st.st_size + 1)
                if len(raw) > st.st_size:
                    raw += fh.read(limit + 1 - len(raw))
            if len(raw) <= limit:
                return raw, st
        why = f"larger than the {limit} bytes this file may have"
        raise OSError(errno.EFBIG, why, str(path))
    finally:
        os.close(fd)


def not_listed(st: os.stat_result, ino: int, uid: int) -> bool:
    """Whether `st` is another file than the one listed with inode `ino` and owner `uid` (0 and
    -1: not known). The owner too: an inode number freed is soon given to a new file (ext4)."""
    return bool(ino) and (st.st_ino != ino or (uid >= 0 and st.st_uid != uid))


@contextmanager
def entry_path(root: Path, path: Path, ino: int = 0, uid: int = -1) -> Iterator[str]:
    """A path naming exactly the file or folder at `path` as reached without links (its
    /proc/self/fd magic link), for calls that take no descriptor: chmod, chown, utime. With
    `ino` and `uid` (the inode and owner the mount listed there), ESTALE unless it is that
    file (see Node.ino)."""
    fd = open_beneath(root, path, os.O_PATH)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise not_shown(path, st)
        if not_listed(st, ino, uid):
            raise OSError(errno.ESTALE, "not the file listed (replaced since)", str(path))
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


__all__ = [
    "entry_path",
    "fsync_beneath",
    "makedirs_beneath",
    "not_listed",
    "not_shown",
    "open_beneath",
    "parent_fd",
    "read_beneath",
    "read_beneath_stat",
    "stat_beneath",
]


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_libc = None


def rename_noreplace(src: str | Path, dst: str, dst_dir_fd: int) -> None:
    """`os.rename(src, dst, dst_dir_fd=...)` that never replaces what is at `dst` (FileExistsError
    then): renameat2(RENAME_NOREPLACE), which Python does not wrap. Where the filesystem or the
    kernel lacks it, OSError (EINVAL or ENOSYS): the caller picks a fresh name instead."""
    global _libc
    import ctypes

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    done = _libc.renameat2(_AT_FDCWD, os.fsencode(src), dst_dir_fd, os.fsencode(dst),
                           _RENAME_NOREPLACE)  # fmt: skip
    if done != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(src), None, dst)
