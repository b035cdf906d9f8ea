"""One presented name (`Node`) and how each kind is made: mirrored, spooled, or from an archive.

Pure data shared by the mount (which maps nodes to inodes) and the write side (which makes them).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from vfs.backends.base import Backend, Entry, mode_mask_of, presented_mode

NodeKey = tuple[str, str, str, tuple[int, ...]]


@dataclass
class Node:
    """One presented name. `backend` is None for a mirrored real entry."""

    is_dir: bool
    size: int
    mtime_ns: int
    mode: int
    uid: int
    gid: int
    real: Path  # the real entry, or the archive holding this node
    backend: Backend | None = None
    member: str = ""  # path inside the archive; "" for its top entry
    entry: Entry | None = None
    xattrs: dict[str, str] = field(default_factory=dict)
    spooled: str = ""  # relpath of a file written through the mount and not yet published
    version: tuple[int, ...] = ()  # the archive file's (inode, size, mtime): replaced → new key

    @property
    def key(self) -> NodeKey:
        """Identity across rescans: the same key keeps the same inode number."""
        backend = self.backend.name if self.backend else ""
        return (str(self.real), backend, self.member, self.version)

    @property
    def sha256(self) -> str | None:
        return self.entry.sha256 if self.entry else None


def spooled_node(path: Path, relpath: str, st: os.stat_result) -> Node:
    return Node(
        False,
        st.st_size,
        st.st_mtime_ns,
        stat.S_IMODE(st.st_mode),
        st.st_uid,
        st.st_gid,
        path,
        spooled=relpath,
    )


def mirror_node(path: Path, st: os.stat_result, writable: bool = False) -> Node:
    is_dir = stat.S_ISDIR(st.st_mode)
    mode = stat.S_IMODE(st.st_mode) if writable else stat.S_IMODE(st.st_mode) & ~0o222
    return Node(
        is_dir, 0 if is_dir else st.st_size, st.st_mtime_ns, mode, st.st_uid, st.st_gid, path
    )


def archive_node(
    backend: Backend, path: Path, st: os.stat_result, member: str, entry: Entry, rel: str
) -> Node:
    xattrs = dict(entry.xattrs)
    if not entry.is_dir and backend.name == "decant":
        xattrs["user.decant.archive"] = rel
    return Node(
        is_dir=entry.is_dir,
        size=0 if entry.is_dir else entry.size,
        mtime_ns=st.st_mtime_ns,
        mode=presented_mode(st.st_mode, mode_mask_of(backend), entry.is_dir),
        uid=st.st_uid,
        gid=st.st_gid,
        real=path,
        backend=backend,
        member=member,
        entry=entry,
        xattrs=xattrs,
        version=(st.st_ino, st.st_size, st.st_mtime_ns),
    )
