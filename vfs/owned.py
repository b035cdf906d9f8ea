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
from pathlib import Path


def not_own(path: Path, kind: str = "folder") -> str | None:
    """Why `path` is not a real `kind` ("folder" or "file") of this process's user that no one
    else may write, or None when it is (a missing path is None: nothing to trust yet)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
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
