"""Whether a caller may change a folder's entries, or read a file where it lies: for what the
mount does on a caller's behalf that the kernel's own check (default_permissions) does not
cover.

Writing into a published file moves it into the spool and publishes it again (a new archive, a
new name in the folder): on a local filesystem that needs write and search permission on the
folder, not only on the file, and the daemon, often root, must never do more for a caller than
the caller could do.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from vfs.acl import acl_stat, acl_stat_at
from vfs.beneath import parent_fd, parts_below
from vfs.perms import granted as _granted
from vfs.perms import user_groups


def caller_groups(pid: int, gid: int) -> set[int]:
    """The caller's primary and supplementary groups (/proc/PID/status), or just its primary
    group where those cannot be read (the check is then stricter, never looser)."""
    groups = {gid}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                groups.update(int(g) for g in line.split()[1:])
                break
    except (OSError, ValueError):
        pass
    return groups


def may_change_entries(folder: Path, uid: int, gid: int, pid: int) -> bool:
    """Whether the caller may add and remove names in `folder` (write and search permission,
    as the kernel would judge them). Blocking (a stat, a /proc read): not on the event loop."""
    if uid == 0:
        return True
    st = acl_stat(folder, os.stat(folder, follow_symlinks=False))
    if not stat.S_ISDIR(st.st_mode):
        return False
    return _granted(st, uid, caller_groups(pid, gid), write=True, search=True)


def readable_beneath(
    root: Path, target: Path, uid: int, gid: int, pid: int
) -> tuple[int, int] | None:
    """(st_dev, st_ino) of `target` if the caller could read it by its real path from `root`:
    search permission on `root` and every folder below it on the way, read permission on
    `target` (and search, for a folder, and read on everything in it: a synthesized TIFF is
    made of the chunk files in its image folder); None otherwise. For what the daemon reads on a
    caller's behalf from files the kernel never checked the caller against (an AcqStore view's
    members are files elsewhere in the collection, maybe in another user's private folder).

    The walk holds each folder by a descriptor and checks that one, never following a link,
    so a folder swapped on the way (renameat2 in a folder others may write) cannot pass the
    check as one folder and be read as another; the caller compares the identity returned
    with what it then opened. Blocking: not on the event loop."""
    parts = parts_below(root, target)
    if not parts:
        return None
    groups = caller_groups(pid, gid) if uid != 0 else set()

    def searchable(fd: int) -> None:
        if not _granted(acl_stat(fd, os.fstat(fd)), uid, groups, search=True):
            raise PermissionError(errno.EACCES, "no search permission on the way", str(target))

    try:
        dfd = parent_fd(root, target, searchable)
        try:
            st = os.stat(target.name, dir_fd=dfd, follow_symlinks=False)
            st = acl_stat_at(dfd, target.name, st)
            is_dir = stat.S_ISDIR(st.st_mode)
            if not (is_dir or stat.S_ISREG(st.st_mode)):
                return None  # a link (never followed), a FIFO, a device
            if not _granted(st, uid, groups, read=True, search=is_dir):
                return None
            if is_dir and uid != 0 and not _tree_readable(dfd, target.name, uid, groups):
                return None
        except _TooDeep:
            _warn_once(target, f"{target}: nested more than {MAX_TREE_DEPTH} folders deep; "
                       "not read for users other than root (EACCES)")  # fmt: skip
            return None
        finally:
            os.close(dfd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


MAX_TREE_DEPTH = 64  # folders below a checked folder (an image's chunk keys nest a few levels)


def _tree_readable(parent: int, name: str, uid: int, groups: set[int]) -> bool:
    """Whether the caller may read every file and list every folder below the folder `name`
    of `parent` (a folder read whole on the caller's behalf: an image's chunk files, which a
    synthesized TIFF serves as pixels). Links are not followed (the daemon never reads through
    one); a FIFO or device is not read either. Costs a stat per entry.

    A subfolder is opened when its turn comes (and its own mode checked on that descriptor),
    so the walk holds one descriptor per level: opening each as it was found held them all,
    and a folder of 25,000 empty subfolders took the daemon past its descriptor limit on every
    open, failing other users' opens of anything with EMFILE."""
    stack: list[tuple[int, list[str]]] = [(_open_dir(name, parent), [])]
    try:
        stack[0] = (stack[0][0], _checked_entries(stack[0][0], uid, groups))
        while stack:
            fd, folders = stack[-1]
            if not folders:
                os.close(fd)
                stack.pop()
                continue
            if len(stack) > MAX_TREE_DEPTH:
                raise _TooDeep
            child = _open_dir(folders.pop(), fd)
            stack.append((child, []))
            if not _granted(acl_stat(child, os.fstat(child)), uid, groups, read=True, search=True):
                return False
            stack[-1] = (child, _checked_entries(child, uid, groups))
    except _Refused:
        return False
    finally:
        for fd, _folders in stack:
            os.close(fd)
    return True


class _Refused(Exception):
    """An entry the caller may not read (or list)."""


class _TooDeep(Exception):
    """A folder nested deeper than MAX_TREE_DEPTH below the folder checked."""


log = logging.getLogger(__name__)
_warned: set[Path] = set()


def _warn_once(path: Path, message: str) -> None:
    """One log line per path (bounded): every open by every user meets the same refusal."""
    if path not in _warned and len(_warned) < 10_000:
        _warned.add(path)
        log.warning("%s", message)


def _checked_entries(fd: int, uid: int, groups: set[int]) -> list[str]:
    """The subfolders of the folder open at `fd`, every entry in it checked first (_Refused)."""
    folders = []
    with os.scandir(fd) as entries:
        for entry in entries:
            st = acl_stat_at(fd, entry.name, entry.stat(follow_symlinks=False))
            folder = stat.S_ISDIR(st.st_mode)
            if not (folder or stat.S_ISREG(st.st_mode)):
                continue
            if not _granted(st, uid, groups, read=True, search=folder):
                raise _Refused
            if folder:
                folders.append(entry.name)
    return folders


def _open_dir(name: str, parent: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)


def may_list_folder_of(root: Path, target: Path, uid: int) -> bool:
    """Whether the user `uid` may list the folder holding `target` by its real path from
    `root`: search permission on `root` and every folder on the way, read and search on the
    folder itself. For names the daemon tells a user (`.decant-status`) that the user could not
    otherwise see: a folder of theirs another user moved into a private folder under a new
    name. Blocking: not on the event loop."""
    if uid == 0:
        return True
    groups: set[int] | None = None

    def check(st: os.stat_result, read: bool) -> bool:
        nonlocal groups
        if st.st_uid != uid and groups is None:
            groups = user_groups(uid)
        return _granted(st, uid, groups or set(), read=read, search=True)

    def searchable(fd: int) -> None:
        if not check(acl_stat(fd, os.fstat(fd)), read=False):
            raise PermissionError(errno.EACCES, "no search permission on the way", str(target))

    try:
        dfd = parent_fd(root, target, searchable)
        try:
            return check(acl_stat(dfd, os.fstat(dfd)), read=True)
        finally:
            os.close(dfd)
    except OSError:
        return False
