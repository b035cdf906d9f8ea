"""POSIX access ACLs in SRC, as mode bits the mount may show.

The mount shows each entry with its mode bits, and the kernel checks every caller against them
(default_permissions); it never sees an entry's ACL. An ACL can deny a user or a group what the
mode bits seem to grant (`setfacl -m u:bob:- pkg.tar.c4gh` leaves `ls -l` showing 0644): shown
with those bits, bob read through the mount what he could not read in SRC (a package's
decrypted members, a plain file). So an entry carrying an extended ACL is shown with other
bits no wider than the narrowest entry that could apply to a user outside the owner, and group
bits no wider than the owning group's entry and any named user's (a named group's never
narrows what the owning group's members get: `setfacl -m g:readers:rX` on a 0775 project
folder leaves it 0775): stricter than the ACL for some users (a named user granted more than
"other" reads nothing more through the mount), never looser for any.
"""

from __future__ import annotations

import os
from collections.abc import Callable

ACCESS_XATTR = "system.posix_acl_access"
VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
ENTRY = 8  # tag u16, perm u16, id u32, little-endian
NOT_OWNER = 0o077  # what a malformed ACL leaves: the owner's bits only


def narrowed_mode(mode: int, raw: bytes) -> int:
    """`mode` (a whole st_mode) with its group and other bits cut to what the access ACL `raw`
    (the xattr's value) grants every non-owner entry at least. A minimal ACL (owner, group,
    other only: the mode bits themselves) changes nothing; one that cannot be parsed leaves
    the owner's bits alone."""
    if len(raw) < 4 or (len(raw) - 4) % ENTRY or int.from_bytes(raw[:4], "little") != VERSION:
        return mode & ~NOT_OWNER
    perms: dict[int, list[int]] = {}
    for at in range(4, len(raw), ENTRY):
        tag = int.from_bytes(raw[at : at + 2], "little")
        perms.setdefault(tag, []).append(int.from_bytes(raw[at + 2 : at + 4], "little") & 7)
    if set(perms) - {USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER}:
        return mode & ~NOT_OWNER
    users, groups = perms.get(USER, []), perms.get(GROUP, [])
    if not users and not groups and MASK not in perms:
        return mode
    mask = perms.get(MASK, [7])[0]
    least_user = least = 7
    for perm in users:
        least_user &= perm & mask
    for perm in groups:
        least &= perm & mask
    # With named entries the group bits are the mask; the owning group gets its own entry
    # under it (group::--- with mask rwx denies the group, though `ls -l` shows rwx). A
    # member of it may be a named user (that entry alone applies), never held to a named
    # group's: the kernel grants what any of a user's matching group entries grants.
    owning = perms.get(GROUP_OBJ, [0])[0] & mask
    group = (mode >> 3) & 7 & least_user & owning
    other = mode & 7 & least_user & least
    return (mode & ~NOT_OWNER) | group << 3 | other


def acl_mode(path: str | os.PathLike[str] | int, mode: int) -> int:
    """`mode` narrowed by the access ACL of `path` (never followed if a link; an int is an open
    descriptor), if it has one. One getxattr (~4-7 us here), spared where there is nothing to
    narrow."""
    if not mode & NOT_OWNER:
        return mode
    try:
        if isinstance(path, int):  # by /proc: fgetxattr refuses an O_PATH descriptor
            raw = os.getxattr(f"/proc/self/fd/{path}", ACCESS_XATTR)
        else:
            raw = os.getxattr(path, ACCESS_XATTR, follow_symlinks=False)
    except OSError:
        return mode  # ENODATA (no ACL), ENOTSUP (a file system without ACLs), gone
    return narrowed_mode(mode, raw)


def access_acl(fd_path: str | os.PathLike[str]) -> bytes | None:
    """The access ACL of the file open at `fd_path` (its /proc/self/fd link, followed), None
    if it has none (or its file system keeps none): what a copy of the file takes to be read
    by whom the file is."""
    try:
        return os.getxattr(fd_path, ACCESS_XATTR)
    except OSError:
        return None


def at(dir_fd: int, name: str) -> str:
    """A path naming `name` in the folder open at `dir_fd` (for xattr calls, which take no
    dir_fd): the folder walked to stays the one checked, whatever is renamed meanwhile."""
    return f"/proc/self/fd/{dir_fd}/{name}"


def acl_stat(path: str | os.PathLike[str] | int, st: os.stat_result) -> os.stat_result:
    """`st` (an lstat of `path`, or an fstat of descriptor `path`) with its mode narrowed by
    its access ACL."""
    return _with_mode(st, acl_mode(path, st.st_mode))


def acl_stat_at(dir_fd: int, name: str, st: os.stat_result) -> os.stat_result:
    """`acl_stat` of `name` in the folder open at `dir_fd`, `st` its lstat there (a scandir's).
    The ACL is read by the name again: one the folder's owner swapped meanwhile (another
    user's file, its ACL denying someone, out; one with no ACL in; and back) lent it the
    other file's ACL, and it was shown with its bits alone. Unless the name holds the same
    inode, unchanged (a rename or a setfacl moves its ctime), after the read: the owner's
    bits only, until the next listing."""
    if not st.st_mode & NOT_OWNER:
        return st  # nothing to narrow, nothing read
    narrowed = acl_stat(at(dir_fd, name), st)
    return _unless_swapped(
        st, narrowed, lambda: os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    )


def acl_lstat(path: str) -> os.stat_result:
    """lstat of `path` narrowed by its ACL, as `acl_stat_at` takes it by a folder's
    descriptor: the owner's bits only unless the name still holds that inode, unchanged,
    after its ACL is read."""
    st = os.lstat(path)
    if not st.st_mode & NOT_OWNER:
        return st
    return _unless_swapped(st, acl_stat(path, st), lambda: os.lstat(path))


def _unless_swapped(
    st: os.stat_result, narrowed: os.stat_result, again: Callable[[], os.stat_result]
) -> os.stat_result:
    """`narrowed` (`st` narrowed by an ACL read by name) if the name, stat'ed `again` after
    that read, still holds the same inode unchanged; else `st` with the owner's bits only."""
    try:
        now = again()
    except OSError:
        return _with_mode(st, st.st_mode & ~NOT_OWNER)
    if (now.st_ino, now.st_ctime_ns) != (st.st_ino, st.st_ctime_ns):
        return _with_mode(st, st.st_mode & ~NOT_OWNER)
    return narrowed


def _with_mode(st: os.stat_result, mode: int) -> os.stat_result:
    """`st` with `mode` for its st_mode."""
    if mode == st.st_mode:
        return st
    fields = list(st)
    fields[0] = mode
    extra = {
        name: getattr(st, name)
        for name in dir(st)
        if name.startswith("st_") and name not in os.stat_result.__match_args__
    }
    return os.stat_result(fields, extra)


DEFAULT_XATTR = "system.posix_acl_default"


def inherited_access(default: bytes, mode: int) -> bytes | None:
    """The access ACL a file made with `mode` in a folder whose default ACL is `default` gets
    from the kernel (acl(5), "Object creation and default ACLs"): the default's entries, its
    owner, group class (the mask, else the owning group) and other entries cut to `mode`'s
    bits. None for a value that cannot be parsed (the kernel would not have stored it)."""
    if len(default) < 4 or (len(default) - 4) % ENTRY:
        return None
    if int.from_bytes(default[:4], "little") != VERSION:
        return None
    tags = {int.from_bytes(default[at : at + 2], "little") for at in range(4, len(default), ENTRY)}
    group_class = MASK if MASK in tags else GROUP_OBJ
    shifts = {USER_OBJ: 6, group_class: 3, OTHER: 0}
    out = bytearray(default)
    for at in range(4, len(default), ENTRY):
        tag = int.from_bytes(default[at : at + 2], "little")
        if tag in shifts:
            perm = int.from_bytes(default[at + 2 : at + 4], "little") & (mode >> shifts[tag]) & 7
            out[at + 2 : at + 4] = perm.to_bytes(2, "little")
    return bytes(out)


def inherit_default(folder: str, fd: int, mode: int) -> bool:
    """Give the file open at `fd` (made with `mode` elsewhere, to be linked into `folder`: a
    path with no link on the way, e.g. /proc/self/fd/N) the access ACL the folder's default
    ACL gives a file made in it, as one made there directly gets: a default ACL denying a
    user covered what was made in SRC, not what was written through the mount. Whether the
    folder has one."""
    try:
        default = os.getxattr(folder, DEFAULT_XATTR)
    except OSError:
        return False  # ENODATA (none), ENOTSUP (a file system without ACLs), gone
    value = inherited_access(default, mode)
    if value is not None:
        os.setxattr(fd, ACCESS_XATTR, value)
    return True
