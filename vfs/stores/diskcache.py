"""A bounded on-disk cache of byte ranges fetched from an object store, reused across restarts.

Keyed by (object URL, ETag, Last-Modified, offset, length): an object replaced in the bucket has
a new ETag or a new Last-Modified, so nothing is ever invalidated, only evicted (least recently
used first, by file mtime, which a hit refreshes). The ETag alone is not enough: a single PUT's
ETag is the MD5 of its body, and two bodies of one MD5 are easy to make (collision blocks are
published): one written over the other kept its ETag, and a remount served the ranges kept from
the first as the second's bytes. A replacement within the same second as the object it
replaced, with the same MD5, is still not told apart: S3 tells no more.
The decant core asks for the same exact ranges again (a zip's tail, whole chunks), so
exact-range keys hit. Entries are written to a temp name and renamed: a crash
leaves whole entries or none.

What the cache serves is served as the object's bytes, to every user of the mount, and a plain
object (not an archive) has no digest of its own that would catch a wrong one. So each entry
ends with the xxh3-64 of its key and its bytes: one damaged on disk (or cut short), or put under
another entry's name (two of one size swapped: each still held the xxh3 of its own bytes, and
the other range was served, exit 0), is dropped and fetched again, never served. And only the
daemon's user may write the folder: one another user can write would let them plant ranges
(their names are hashes anyone can compute) or links to files they may not read; such a folder
is refused at start. Entries are opened without following links and made 0600.
A range damaged on the way (a flipped bit over plain http) is kept with the checksum of its
damaged bytes, so the mount asks the cache to `forget` an archive that failed its verification:
the entries this run got or put for its objects are dropped. Which entries those are is kept in
memory only (the names are hashes): after a restart, one damaged range fails a verification
once more, and is forgotten then.
Every method is thread-safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import stat
import threading
from collections import OrderedDict
from pathlib import Path

import xxhash

from vfs.errors import StoreError
from vfs.owned import own_folder

log = logging.getLogger(__name__)

MAX_ENTRY = 64 << 20  # larger ranges are not cached
TRAILER = 8  # each entry's bytes are followed by the xxh3-64 of its key and them, little-endian
_ENTRY = re.compile(r"[0-9a-f]{64}")  # an entry's name: its key (`DiskCache.key`)
MAX_OWNED = 50_000  # entries remembered by object for `forget` (~7 MB at most); oldest go first
_TEMP = re.compile(r"\.tmp-[0-9a-f]{64}-[0-9]+")  # an entry being written (`DiskCache.put`)


class DiskCache:
    def __init__(self, folder: Path, max_bytes: int) -> None:
        folder = self.folder = check_folder(folder)  # its real path, checked: only that one
        self.max_bytes = max_bytes
        self.hits = self.misses = 0
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}  # entry: its size on disk (bytes and trailer)
        self._owned: OrderedDict[str, set[str]] = OrderedDict()  # object → entries (`forget`)
        self._owned_count = 0
        # Only names this cache writes are counted, evicted or cleaned up: the folder may hold
        # other files (a folder the operator also keeps things in, another tool's cache), and
        # every file there was once taken for an entry, so a start deleted the oldest of them
        # down to the bound, and any `.tmp-*` file.
        for entry in os.scandir(folder):
            if _TEMP.fullmatch(entry.name):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)  # left by a crash
            elif _ENTRY.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                self._sizes[entry.name] = entry.stat(follow_symlinks=False).st_size
        self._total = sum(self._sizes.values())
        self._evict()

    @staticmethod
    def key(url: str, etag: str | None, offset: int, size: int, modified: float = 0.0) -> str:
        """The entry of bytes [offset, offset + size) of the object at `url` as it was when it
        had `etag` and Last-Modified `modified` (POSIX seconds)."""
        text = f"{url}\0{etag}\0{offset}\0{size}"
        if modified:
            text += f"\0{modified!r}"
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str, size: int, owner: str = "") -> bytes | None:
        """The entry's bytes, or None. `owner`: the object's name (see `forget`)."""
        path = self.folder / key
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self.misses += 1
            return None
        try:
            st = os.fstat(fd)
            fits = stat.S_ISREG(st.st_mode) and st.st_size == size + TRAILER
            data = os.pread(fd, size, 0) if fits else b""
            trailer = os.pread(fd, TRAILER, size) if fits else b""
        except OSError:
            data = trailer = b""
        finally:
            os.close(fd)
        if len(data) != size or _digest(key, data) != int.from_bytes(trailer, "little"):
            log.warning("disk cache %s: entry %s damaged (size or xxh3); dropped, fetched again",
                        self.folder, key)  # fmt: skip
            self._drop(key)
            self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)  # recently used
        self.hits += 1
        if owner:
            self._own(owner, key)
        return data

    def put(self, key: str, data: bytes | memoryview, owner: str = "") -> None:
        if len(data) > MAX_ENTRY or len(data) + TRAILER > self.max_bytes:
            return
        tmp = self.folder / f".tmp-{key}-{threading.get_ident()}"
        digest = _digest(key, data).to_bytes(TRAILER, "little")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)  # fmt: skip
            try:
                with os.fdopen(fd, "wb", closefd=False) as out:
                    out.write(data)
                    out.write(digest)
            finally:
                os.close(fd)
            os.replace(tmp, self.folder / key)
        except OSError as exc:  # a full disk costs a fetch, never a read
            log.debug("disk cache %s: cannot keep a range (%s)", self.folder, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        with self._lock:
            self._total += len(data) + TRAILER - self._sizes.get(key, 0)
            self._sizes[key] = len(data) + TRAILER
        if owner:
            self._own(owner, key)
        self._evict()

    def _own(self, owner: str, key: str) -> None:
        with self._lock:
            keys = self._owned.get(owner)
            if keys is None:
                keys = self._owned[owner] = set()
            else:
                self._owned.move_to_end(owner)
            if key not in keys:
                keys.add(key)
                self._owned_count += 1
            while self._owned_count > MAX_OWNED and self._owned:
                self._owned_count -= len(self._owned.popitem(last=False)[1])

    def forget(self, name: str) -> int:
        """Drop the entries this run got or put for the object `name` or the objects below it
        (a folder archive's); returns how many."""
        with self._lock:
            owners = [o for o in self._owned if o == name or o.startswith(name + "/")]
            keys = [key for o in owners for key in self._owned.pop(o)]
            self._owned_count -= len(keys)
        for key in keys:
            self._drop(key)
        return len(keys)

    def _drop(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.folder / key)
        with self._lock:
            self._total -= self._sizes.pop(key, 0)

    def _evict(self) -> None:
        with self._lock:
            if self._total <= self.max_bytes:
                return
            aged = []
            for name in self._sizes:
                try:
                    aged.append((os.lstat(self.folder / name).st_mtime, name))
                except OSError:
                    aged.append((0.0, name))
            aged.sort()
            goal = self.max_bytes * 9 // 10  # some room, so the next put does not evict again
            for _mtime, name in aged:
                if self._total <= goal:
                    break
                with contextlib.suppress(OSError):
                    os.unlink(self.folder / name)
                self._total -= self._sizes.pop(name, 0)

    @property
    def total(self) -> int:
        return self._total


def _digest(key: str, data: bytes | memoryview) -> int:
    """An entry's trailer: the xxh3-64 of its name (the range it holds) and its bytes."""
    hasher = xxhash.xxh3_64(key.encode())
    hasher.update(data)
    return hasher.intdigest()


def check_folder(folder: Path) -> Path:
    """Make `folder` (0700) or take it as it is if it is a real folder of this user's that no
    one else may write or swap; else StoreError, naming it and why. Returns its real path."""
    because = (
        "what it holds is served as the bucket's bytes, so no other user may write it; "
        "pick a folder of this user's own (it is made 0700)"
    )
    return own_folder(folder, "--disk-cache", because, error=StoreError)
