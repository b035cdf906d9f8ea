"""A bounded on-disk cache of byte ranges fetched from an object store, reused across restarts.

Keyed by (object URL, ETag, offset, length): an object replaced in the bucket has a new ETag, so
nothing is ever invalidated, only evicted (least recently used first, by file mtime, which a
hit refreshes). The decant core asks for the same exact ranges again (a zip's tail, whole
chunks), so exact-range keys hit. Entries are written to a temp name and renamed: a crash
leaves whole entries or none; a damaged entry (wrong length) is dropped and fetched again.
Standard library only; every method is thread-safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

MAX_ENTRY = 64 << 20  # larger ranges are not cached


class DiskCache:
    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.hits = self.misses = 0
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        for entry in os.scandir(folder):
            if entry.name.startswith(".tmp-"):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)  # left by a crash
            elif entry.is_file():
                self._sizes[entry.name] = entry.stat().st_size
        self._total = sum(self._sizes.values())
        self._evict()

    @staticmethod
    def key(url: str, etag: str | None, offset: int, size: int) -> str:
        return hashlib.sha256(f"{url}\0{etag}\0{offset}\0{size}".encode()).hexdigest()

    def get(self, key: str, size: int) -> bytes | None:
        path = self.folder / key
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        if len(data) != size:
            self._drop(key)
            self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used
        self.hits += 1
        return data

    def put(self, key: str, data: bytes) -> None:
        if len(data) > MAX_ENTRY or len(data) > self.max_bytes:
            return
        tmp = self.folder / f".tmp-{key}-{threading.get_ident()}"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self.folder / key)
        except OSError as exc:  # a full disk costs a fetch, never a read
            log.debug("disk cache %s: cannot keep a range (%s)", self.folder, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        with self._lock:
            self._total += len(data) - self._sizes.get(key, 0)
            self._sizes[key] = len(data)
        self._evict()

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
                    aged.append((os.stat(self.folder / name).st_mtime, name))
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
