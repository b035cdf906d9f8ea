"""Local byte sources: a file read with `os.pread` on one descriptor, a folder read with `open`.

OSErrors pass through with their errno (the mount's errno boundary keeps it), as before byte
sources existed; only a read past the end becomes `CorruptArchiveError` (see `check_range`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from vfs.errors import ArchiveChangedError, CorruptArchiveError
from vfs.stores.base import ObjectInfo, check_range, join_key
from vfs.stores.direct import open_direct, pread_direct
from vfs.walk import walk

log = logging.getLogger("decant-mount")

# Set by the daemon: SRC is resolved at start and its tree follows no link, so a path it opens
# names its file with no link on the way. Its maker may swap a folder on that way for a link
# between the listing and the open (the daemon, often root, would then read a file the user
# cannot reach, and show its name and size): such an open fails. Off for the command line,
# where a user's own paths may go through links.
EXACT_OPENS = False


def open_exact(path: Path, flags: int) -> int:
    """`os.open(path, flags)`; with EXACT_OPENS, refused (ELOOP) when the path ends in a link or
    the file opened is not at `path` itself (a link on the way, a file moved). A path through
    one of this process's descriptors (/proc/self/fd/N/...: a folder opened safely already, as
    the AcqStore view and publishing use) is its own check."""
    flags |= getattr(os, "O_CLOEXEC", 0)
    if not EXACT_OPENS or str(path).startswith(_OWN_FDS):
        return os.open(path, flags)
    fd = os.open(path, flags | os.O_NOFOLLOW)
    try:
        opened = os.readlink(f"{_OWN_FDS}{fd}")
    except OSError:  # no /proc: at least the last component was not followed
        return fd
    if opened != os.path.abspath(path):
        os.close(fd)
        raise OSError(errno.ELOOP, "reached through a link or moved while opened", str(path))
    return fd


_OWN_FDS = "/proc/self/fd/"

# Set by the daemon: a folder archive's file is read only if it is the folder owner's or readable
# by all (vfs.decant.store.DirectoryStore). The daemon, often root, reads the files of a folder
# archive lazily, after the check that the caller may read each (vfs.mount.access): a user who
# may rename in a folder without the sticky bit could rename another user's private file over
# one of their own archive's chunks in between. Off for the command line, which reads as its
# user.
OWNER_FILES_ONLY = False


class LocalFile:
    """One file on one descriptor: its size and identity are those of the very file read, so a
    file replaced by rename after opening is never mixed with its successor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        # Non-blocking: a FIFO put at the path (renamed over a file listed a moment ago) would
        # hold the opening thread until a writer came, for good if its maker unlinks it.
        self._fd = open_exact(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            self.stat = os.fstat(self._fd)
            if not stat.S_ISREG(self.stat.st_mode):
                # ESTALE: not the file listed (the mount lists its names again and the kernel's
                # retry finds what is there now).
                raise OSError(errno.ESTALE, "not a regular file", self.name)
            os.set_blocking(self._fd, True)
        except OSError:
            os.close(self._fd)
            raise
        self.size = self.stat.st_size
        self._direct: int | None = None  # the O_DIRECT descriptor, opened on first use
        self._direct_ok = True  # until the system or file system refuses it (decided once)
        self._direct_lock = threading.Lock()

    @property
    def identity(self) -> tuple[object, ...]:
        st = self.stat
        # The ctime too: a file rewritten in place with its mtime put back is another file.
        return (self.name, st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)

    def check_unchanged(self) -> None:
        """ArchiveChangedError if the file was written since it was opened, as its size and
        mtime tell (a write moves the mtime before it changes a byte). Not its ctime: a rename
        over the file, a `chmod` or a new link moves that too, and the bytes stay the opened
        version's; readers of an archive the write side replaced would fail for nothing. A
        rewrite that puts size and mtime back (`cp -p` of an archive of the same size) is
        caught later, as damage is: by a verified archive's digests, else the hash's verdict."""
        st, was = os.fstat(self._fd), self.stat
        if (st.st_size, st.st_mtime_ns) != (was.st_size, was.st_mtime_ns):
            raise ArchiveChangedError(
                f"{self.name}: written since it was opened (its size or mtime changed); "
                "reopen it to read the new version"
            )

    def read(self, offset: int, size: int) -> bytes:
        check_range(self, offset, size)
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise CorruptArchiveError(
                f"{self.name}: short read at {offset} ({len(data)} of {size} bytes; file shrank?)"
            )
        return data

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read(off, n) for off, n in ranges]

    def fileno(self) -> int:
        """The descriptor, for readers with their own fast paths (preadv2 into reused buffers,
        RWF_NOWAIT, fadvise): the c4gh SegmentReader. Valid until `close`."""
        return self._fd

    def read_past_cache(self, offset: int, size: int, keep_up_to: int) -> memoryview | None:
        """Up to `size` bytes at `offset` (short only at the end), read past the page cache
        into this thread's reused buffer (vfs.stores.direct: valid until the thread's next such
        read; kept while at most `keep_up_to` bytes). None where O_DIRECT is refused: the caller
        reads through the page cache then, as it does for this file from then on."""
        if not self._direct_ok:
            return None
        try:
            return pread_direct(self._direct_fd(), size, offset, keep_up_to)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            log.debug("%s: no O_DIRECT reads (%s): through the page cache", self.name, exc)
            self._direct_ok = False
            return None

    def _direct_fd(self) -> int:
        with self._direct_lock:
            if self._direct is None:
                if self._fd < 0:
                    raise OSError(errno.EBADF, "read after close", self.name)
                self._direct = open_direct(self._fd)
                if self._direct is None:
                    raise OSError(errno.EINVAL, "O_DIRECT refused", self.name)
            return self._direct

    def prefetch(self, offset: int, size: int) -> None:
        """Ask the kernel to start reading [offset, offset + size) (read-ahead of a chunk)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._fd, offset, size, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        with self._direct_lock:
            if self._direct is not None:
                os.close(self._direct)
                self._direct = None
            self._direct_ok = False
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalFolder:
    """A folder as a `Folder`: keys are relative paths below it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = str(root)

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def open(self, key: str) -> LocalFile:
        return LocalFile(self._path(key))

    def sub(self, prefix: str) -> LocalFolder:
        return LocalFolder(self._path(prefix))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # vfs.walk, not os.walk: that recursed once per level (RecursionError at ~1,000, in
        # a folder archive anyone may nest); a key is never too deep to list, only too long.
        for dirpath, _dirs, files in walk(self._path(prefix), max_depth=sys.maxsize):
            rel = os.path.relpath(dirpath, self.root)
            for name in sorted(files):
                key = join_key("" if rel == "." else rel.replace(os.sep, "/"), name)
                info = self.stat(key)
                if info is not None:
                    yield info

    def list_dir(self, prefix: str = "") -> tuple[list[str], list[ObjectInfo]]:
        dirs: list[str] = []
        files: list[ObjectInfo] = []
        with os.scandir(self._path(prefix)) as it:
            for entry in it:
                if entry.is_dir():
                    dirs.append(entry.name)
                elif entry.is_file():
                    st = entry.stat()
                    files.append(ObjectInfo(join_key(prefix, entry.name), st.st_size, st.st_mtime))
        return sorted(dirs), sorted(files, key=lambda i: i.key)

    def close(self) -> None:
        pass
