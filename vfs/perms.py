"""The kernel's mode-bit rule for one user, for checks the daemon (root) makes on a user's
behalf: an open through the mount by a caller, a collection's references by its author."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from vfs.acl import acl_stat
from vfs.beneath import parent_fd, parts_below


def user_groups(uid: int) -> set[int]:
    """The groups of the user `uid` as the user database lists them (primary and
    supplementary), or none for a uid without an entry (the check is then stricter)."""
    try:
        entry = pwd.getpwuid(uid)
        return set(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except (KeyError, OSError):
        return set()


def granted(
    st: os.stat_result,
    uid: int,
    groups: set[int],
    *,
    read: bool = False,
    write: bool = False,
    search: bool = False,
) -> bool:
    """Whether the owner, group or other bits that apply to the caller (the first class it is
    in, as the kernel picks it) hold every permission asked. Callers pass `st` narrowed by its
    ACL (vfs.acl): an ACL entry may deny what the bits seem to grant."""
    if uid == 0:
        return True
    shift = 6 if st.st_uid == uid else 3 if st.st_gid in groups else 0
    need = (read and 4) | (write and 2) | (search and 1)
    return (st.st_mode >> shift) & need == need


def readable_below(
    root: Path, target: Path, uid: int, groups: set[int] | None = None
) -> os.stat_result | None:
    """The ACL-narrowed stat of `target` if the user `uid` may search every folder from `root`
    (itself included) down to it and read it (a folder: read and search it), walked by
    descriptors with no link followed; None otherwise, or when it cannot be reached at all,
    so a caller that tells "missing" from "refused" by this tells nothing. The stat is of the
    very file checked: a caller that looks at the path again compares its (st_dev, st_ino).
    `groups`: the user's (`user_groups`), where the caller keeps them for many checks.
    Blocking."""
    if groups is None:
        groups = user_groups(uid)

    def searchable(fd: int) -> None:
        if not granted(acl_stat(fd, os.fstat(fd)), uid, groups, search=True):
            raise PermissionError("no search permission on the way")

    if not parts_below(root, target):
        return None  # `root` itself, or not below it
    try:
        dfd = parent_fd(root, target, searchable)  # `searchable` of each folder, its own too
        try:
            fd = os.open(target.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            st = acl_stat(fd, os.fstat(fd))
        finally:
            os.close(fd)
    except OSError:
        return None
    return st if granted(st, uid, groups, read=True, search=stat.S_ISDIR(st.st_mode)) else None
