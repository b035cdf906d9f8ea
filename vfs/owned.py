"""Folders the daemon keeps its own state in: what makes one safe to trust.

The daemon runs as root for many users. What it keeps on disk and reads back is trusted as its
own: the persistent index (which archives verified, their chunk digests), the ranges kept from a
bucket (--disk-cache), an inbox (published as the daemon's user). A user who may write such a
folder, or who made it first in a shared place, could plant what the daemon then believes or
serves, or links to files they may not read. So each is used only if it is a real folder of the
daemon's user that no one else may write.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from vfs.errors import DecantError


def not_own(path: Path, kind: str = "folder") -> str | None:
    """Why `path` is not a real `kind` ("folder" or "file") of this process's user that no one
    else may write, or None when it is (a missing path is None: nothing to trust yet)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return why_not_own(st, kind)


def why_not_own(st: os.stat_result, kind: str = "file") -> str | None:
    """`not_own` for what `st` describes (an `fstat` of a descriptor opened with O_NOFOLLOW:
    the file checked is the file used)."""
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if not is_kind:
        return f"not a {kind}"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this daemon's user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def own_folder(
    folder: Path,
    option: str,
    because: str,
    *,
    mode: int = 0o700,
    files: tuple[str, ...] = (),
    error: type[DecantError] = DecantError,
) -> Path:
    """Make `folder` (`mode`) if it is missing, then refuse it unless it and its `files` (those
    there) are this user's own and no one else may write them or swap them (see
    `swappable_by_others`): `error`, naming `option`, the folder, why, and `because` (what
    another user could do with it). Returns the folder's real path, the one checked: use that
    one (a link on the way given, someone else's, could be pointed elsewhere later)."""
    try:
        folder.mkdir(mode=mode, parents=True, exist_ok=True)
        real = folder.resolve(strict=True)
    except OSError as exc:
        raise error(f"{option} {folder}: {exc.strerror}") from None
    why = not_own(folder) or swappable_by_others(real)
    for name in files:
        if why is None:
            found = not_own(folder / name, "file")
            why = None if found is None else f"{name} is {found}"
    if why is not None:
        raise error(f"{option} {folder}: {why}: {because}")
    return real


def swappable_by_others(folder: Path) -> str | None:
    """Why another user could rename `folder` (a real path, no link on the way) away and put
    their own, or a link, in its place after it was checked (the daemon opens what it holds by
    path later), or None (see `open_to_others`: a folder above it is theirs, or writable)."""
    why = open_to_others(folder.resolve().parents)
    return None if why is None else f"{why}: the folder could be swapped"


def open_to_others(folders: Iterable[Path]) -> str | None:
    """Why another user could replace an entry of one of `folders` (real paths): it is
    theirs, or group or others may write it without the sticky bit (/tmp has it); None if no
    such folder (one that cannot be looked at is passed over)."""
    for folder in folders:
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if st.st_uid not in (0, os.geteuid()):
            return f"{folder} is owned by uid {st.st_uid}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def not_trusted(st: os.stat_result) -> str | None:
    """Why a file the daemon takes settings or secrets from (a key, a passphrase, the allowed
    writers) is not to be trusted, or None: it must be a regular file of this user's or root's
    that no one else may write. One another user holds or may write would let them add their
    own writer, or have their key taken."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


class Untrusted(ValueError):
    """A settings or secrets file `read_trusted` refused; the message says why."""


class TooLarge(Untrusted):
    """Refused for its size alone (who may write it was fine)."""


def read_trusted(
    path: Path, limit: int, check: Callable[[os.stat_result], None] | None = None
) -> bytes:
    """The bytes of a file the daemon takes settings or secrets from, read from the descriptor
    that was checked (`check`, which raises its own refusal, then `not_trusted`): the file
    checked is the file read. Opened non-blocking, so a FIFO put at the path cannot hang the
    daemon's start; links are followed, as the tools that write these files do. At most `limit`
    bytes: a longer file is refused, never cut (a writers list cut short drops writers without
    a word). Raises Untrusted (TooLarge for the size), naming why, or OSError."""
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
        st = os.fstat(f.fileno())
        if check is not None:
            check(st)
        why = not_trusted(st)
        if why is not None:
            raise Untrusted(why)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"larger than {_size(limit)}")
    return data


def _size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


MAX_LINKS = 40  # as the kernel's ELOOP bound


def resolve_trusting_no_one(path: Path) -> Path:
    """`path`'s real path, as `Path.resolve` gives it, but through no link another user could
    have made or re-pointed: ValueError, saying which and why, otherwise. A path the operator
    names in a shared place (`--spool /var/tmp/decant-spool`) may not exist yet; a user who
    put a link there first had `resolve` carry the daemon, as root, to the folder of their
    choice, where the checks that refuse a link then saw only a real folder of root's (a spool
    linked to /etc was made 0700 and its `files/` published into SRC). A link is followed
    only if it is this user's or root's and sits in a folder no one else may swap (see
    `open_to_others`); from what is missing or cannot be looked at on, the path is taken as
    written (a link put there later is refused where the path is used, by lstat)."""
    todo = list(reversed(path.absolute().parts[1:]))
    real = Path("/")
    links = 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            real = real.parent
            continue
        here = real / name
        try:
            st = os.lstat(here)
        except OSError:  # missing, or a stale mount (ENOTCONN): where it is used says what
            return Path(real, name, *reversed(todo))
        if not stat.S_ISLNK(st.st_mode):
            real = here
            continue
        links += 1
        if links > MAX_LINKS:
            raise ValueError(f"{path}: too many levels of symbolic links")
        if st.st_uid not in (0, os.geteuid()):
            raise ValueError(f"{here} is a symlink of uid {st.st_uid}: its owner may point it "
                             "anywhere")  # fmt: skip
        why = open_to_others((real, *real.parents))
        if why is not None:
            raise ValueError(f"{here} is a symlink in a folder another user could swap: {why}")
        target = Path(os.readlink(here))
        todo.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
        if target.is_absolute():
            real = Path("/")
    return real
