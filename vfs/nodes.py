"""One presented name (`Node`) and how each kind is made: mirrored, spooled, or from an archive.

Pure data shared by the mount (which maps nodes to inodes) and the write side (which makes them).
"""

from __future__ import annotations

import copy
import os
import stat
from collections.abc import Mapping
from pathlib import Path, PosixPath, PurePath
from types import MappingProxyType

from vfs.backends.base import Backend, Entry, mode_mask_of, presented_mode

# (path, backend, member, archive version, sha256 presented): an archive described again as
# another file under the same stat (it was read mid-write: racy.RACY_NS) is another file.
NodeKey = tuple[str, str, str, tuple[int, ...], str]

# A node without extended attributes (most of them): one shared mapping, never written; a node
# given its own gets a dict (copy before changing one: `dict(node.xattrs)`).
NO_XATTRS: Mapping[str, str] = MappingProxyType({})

# The folder of the node made last: its siblings share it. Read and written by any thread with
# no lock, on purpose: a lost update only leaves one Path unshared, never a wrong one.
_last_folder: Path | None = None


def unshared(name: str) -> str:
    """An equal string that is not `name` itself, to make a `Path` of: pathlib interns the
    names it parses, and the interpreter's table of interned strings then holds every listed
    name for as long as its listing does (about 190 B per name measured)."""
    return name[:1] + name[1:]  # a new string (a 1-character one is shared anyway)


class Node:
    """One presented name. `backend` is None for a mirrored real entry.

    A folder listed holds a node per name (up to a million of them): slots, no dict of
    attributes, and `real` kept as the folder's `Path` (one for all its entries) and the name,
    a `Path` made when asked for."""

    __slots__ = ("_folder", "_name", "backend", "entry", "gid", "ino", "is_dir", "member", "mode",
                 "mtime_ns", "size", "spooled", "uid", "version", "xattrs")  # fmt: skip

    def __init__(
        self,
        is_dir: bool,
        size: int,
        mtime_ns: int,
        mode: int,
        uid: int,
        gid: int,
        real: Path,  # the real entry, or the archive holding this node
        backend: Backend | None = None,
        member: str = "",  # path inside the archive; "" for its top entry
        entry: Entry | None = None,
        xattrs: Mapping[str, str] = NO_XATTRS,
        spooled: str = "",  # relpath of a file written through the mount and not yet published
        version: tuple[int, ...] = (),  # the archive's (inode, size, mtime, ctime): new → new key
        ino: int = 0,  # the real entry's inode number as listed (0: not known, or not local)
    ) -> None:
        self.is_dir = is_dir
        self.size = size
        self.mtime_ns = mtime_ns
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.real = real
        self.backend = backend
        self.member = member
        self.entry = entry
        self.xattrs = xattrs
        self.spooled = spooled
        self.version = version
        # What the daemon acts on (as root) must be the file the kernel checked the caller's
        # rights against, by these attributes: a user who may rename entries of a folder put
        # another user's private file at their own file's name, and a chmod, a utime, an
        # open for writing or reading of that name acted on it (red team 66). `vfs.beneath`'s
        # `entry_path`, `PlainFile` and `Spool.adopt` compare the file reached with it: ESTALE.
        self.ino = ino

    @property
    def real(self) -> Path:
        if self._name is None:
            return self._folder
        return self._folder / unshared(self._name)

    @real.setter
    def real(self, path: Path) -> None:
        global _last_folder
        # Only a plain absolute path is split: a subclass may carry more than its parts (a
        # bucket's paths carry the object's identity), and a relative one may not rejoin alike.
        if type(path) is not PosixPath or not path.is_absolute() or not path.name:
            self._folder, self._name = path, None
            return
        folder, last = path.parent, _last_folder
        if last is not None and last == folder:
            folder = last
        else:
            _last_folder = folder
        self._folder, self._name = folder, path.name

    @property
    def folder(self) -> PurePath:
        """`self.real.parent` without making `real`'s Path (each made parses its parts: `ls -l`
        of 200,000 files made 2 million of them, asking whether their folders are watched)."""
        return self._folder if self._name is not None else self._folder.parent

    @property
    def key(self) -> NodeKey:
        """Identity across rescans: the same key keeps the same inode number."""
        backend = self.backend.name if self.backend else ""
        sha256 = self.entry.sha256 if self.entry is not None else None
        return (self.real_text, backend, self.member, self.version, sha256 or "")

    @property
    def real_text(self) -> str:
        """`str(self.real)`, without making the `Path`."""
        folder = str(self._folder)
        if self._name is None:
            return folder
        return f"/{self._name}" if folder == "/" else f"{folder}/{self._name}"

    @property
    def sha256(self) -> str | None:
        return self.entry.sha256 if self.entry else None

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Node)
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return (f"Node(is_dir={self.is_dir!r}, size={self.size!r}, real={self.real!r}, "
                f"backend={self.backend!r}, member={self.member!r}, spooled={self.spooled!r}, "
                f"version={self.version!r})")  # fmt: skip

    def named(self, name: str) -> Node:
        """This node holding `name` (its listing's key, equal to its real name) rather than an
        equal string of its own: one string per listed name, not two."""
        if self._name == name:
            self._name = name
        return self

    def moved(self, real: Path, spooled: str) -> Node:
        """A copy of this node at another place."""
        out = copy.copy(self)
        out.real, out.spooled = real, spooled
        return out


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


# Permission bits as shared int objects: most modes (0o644, 0o444, ...) exceed the ints Python
# keeps one object of, and a listing would hold a new one per name.
_MODES = tuple(range(0o10000))


def mirror_node(path: Path, st: os.stat_result, writable: bool = False) -> Node:
    is_dir = stat.S_ISDIR(st.st_mode)
    mode = stat.S_IMODE(st.st_mode) if writable else stat.S_IMODE(st.st_mode) & ~0o222
    return Node(
        is_dir, 0 if is_dir else st.st_size, st.st_mtime_ns, _MODES[mode], st.st_uid, st.st_gid,
        path, ino=st.st_ino,
    )  # fmt: skip


def archive_version(st: os.stat_result) -> tuple[int, int, int, int]:
    """An archive's identity as its nodes carry it (`Node.version`): replaced → new inodes.
    The ctime too: an archive rewritten in place with its mtime put back (`cp -p`, `touch -r`)
    keeps inode, size and mtime, and was served as the version verified before it."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def archive_node(
    backend: Backend, path: Path, st: os.stat_result, member: str, entry: Entry, rel: str
) -> Node:
    """A presented entry of an archive. A folder's node keeps no `entry`: its archive's tree
    (up to 100,000 members a package) is kept by the tree's bounded LRU instead, and read again
    when its children are needed (`SourceTree.children_of_archive_node`). A file's node keeps
    its own entry (opening it needs the locator); its xattrs are the entry's, not a copy."""
    xattrs: Mapping[str, str] = entry.xattrs if entry.xattrs else NO_XATTRS
    if not entry.is_dir and backend.name == "decant":
        xattrs = {**xattrs, "user.decant.archive": rel}
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
        entry=None if entry.is_dir else entry,
        xattrs=xattrs,
        version=archive_version(st),
        ino=st.st_ino,
    )
