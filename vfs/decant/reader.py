"""Random-access reconstruction of originals from an opened decant archive (spec §5).

Opening an original checks everything it will need against the manifest and the store — array
shapes, chunk sizes, which chunks exist — so a read either returns exactly the bytes asked for or
raises; it never allocates more than one plane or husk block, and never serves a gap as zeros.
The checks and the tables they leave are the original's plan (vfs.decant.plan), made once for
all the readers of one opened archive.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from weakref import WeakValueDictionary

import numpy as np

from vfs.cache import DropBehind, PageCache
from vfs.decant.chunks import ArraySpec, read_array_spec, read_chunk
from vfs.decant.digestmap import (
    MAX_MAP_CHUNKS,
    DigestRecorder,
    has_layout_entries,
    has_metadata_entries,
    metadata_digests,
)
from vfs.decant.layout import serialize_page
from vfs.decant.limits import (
    MAX_CHUNK_BYTES,
    MAX_MANIFEST_BYTES,
    compressed_bound,
)
from vfs.decant.manifest import (
    Manifest,
    MemberRecord,
    PageRecord,
    large_manifest,
    parse_manifest,
)
from vfs.decant.partial import BlockSource, PageGeometry
from vfs.decant.plan import HuskPlan, PixelPlan
from vfs.decant.regions import HUSK, Region
from vfs.decant.store import MANIFEST_KEY, Store, is_chunk_key, open_store, open_store_at
from vfs.errors import CorruptArchiveError, ManifestError, NotAnArchiveError
from vfs.stores.base import Folder, join_key
from vfs.stores.local import LocalFolder
from vfs.threads import name_this_thread

Plan = TypeVar("Plan", HuskPlan, PixelPlan)


@dataclass(frozen=True)
class OriginalInfo:
    """An original file an archive holds: the whole archive (modes D/V) or one series member."""

    relpath: str
    size: int
    sha256: str
    mode: str


# What an open archive holds besides its store's index and its manifest's tables: the parsed
# manifest's objects and the archive's own (~10 KiB measured for a one-original archive).
OPEN_OVERHEAD = 16 << 10
# What a built plan holds per page (page table, region index, page order): 659 bytes measured
# for a stack of 8,192 pages of 4×4 planes.
PLAN_PAGE_BYTES = 720
# A read over more regions than this copies each into its answer as it comes: a 1 MiB read of
# an archive of one-byte segments held a view of each (~200 bytes) until the join, 270 MiB.
MANY_PARTS = 64
# A read over more regions is copied GATHER_REGIONS regions at a time, in groups of about
# GATHER_BYTES (PixelReader._gather).
GATHER_REGIONS = 16384
GATHER_PAGES = 64  # a group of regions of more pages is copied a region at a time
GATHER_BYTES = 256 << 10


class DecantArchive:
    """An opened archive: its store and manifest. Originals open lazily from it."""

    def __init__(
        self,
        path: Path | str,
        store: Store,
        manifest: Manifest,
        at: tuple[Folder, str] | None = None,
    ) -> None:
        self.path = path  # a local path, or an archive's URL when it was opened `at` a folder
        self.store = store
        self.manifest = manifest
        self._at = at
        # When it was parsed: a file written a moment before may have been parsed mid-write
        # (one write() stamps its mtime as it starts), which vfs.backends.idle must not keep.
        self.opened_ns = time.time_ns()
        # Keyed by identity as well as path, so a replaced archive never serves stale cached pages.
        if store.identity is not None:
            self.cache_key: tuple[object, ...] = store.identity
        else:
            st = store.stat or os.stat(path)
            self.cache_key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)
        # Lazy maps filled as originals open; handles on several threads open them at once.
        self._lock = threading.RLock()
        self._nested: dict[str, DecantArchive] = {}  # member bundles some reader holds
        self._bundle_users: dict[str, int] = {}
        self._specs: dict[str, ArraySpec] = {}
        # Each original's plan while a reader holds it: built once, not once per handle.
        self._plans: WeakValueDictionary[str, HuskPlan | PixelPlan] = WeakValueDictionary()
        self._by_relpath: dict[str, MemberRecord] | None = None  # series members: `_member`
        self._pinned: list[HuskPlan | PixelPlan] = []  # held while the archive waits idle
        self.digests: Mapping[str, int] | None = store.digests
        self.manifest_bytes = 0  # its text's size, as read

    def held_bytes(self) -> int:
        """What holding this archive open costs in memory, about: its store's index of keys
        (a zip's central directory tables), its manifest, whose parsed tables take no more
        than its text did (vfs.decant.pagetable), and the plans of its originals some reader
        holds, and the member bundles of a nested series its readers hold."""
        with self._lock:
            plans = list(self._plans.values())
            subs = list(self._nested.values())
        pages = sum(len(p.pages) for p in plans if isinstance(p, PixelPlan))
        regions = sum(p.regions.nbytes for p in plans)  # 20-24 bytes a region
        tables = self.store.held_bytes() + self.manifest_bytes
        plans_held = pages * PLAN_PAGE_BYTES + regions
        return OPEN_OVERHEAD + tables + plans_held + sum(s.held_bytes() for s in subs)

    @classmethod
    def open(cls, path: Path, digests: Mapping[str, int] | None = None) -> DecantArchive:
        """Open an archive; with `digests` (digests.archive_digests, kept by the adapter), every
        chunk read is checked against its recorded xxh3 before it is decoded."""
        return cls._from_store(path, open_store(path), digests, None)

    @classmethod
    def open_at(
        cls, folder: Folder, key: str, digests: Mapping[str, int] | None = None
    ) -> DecantArchive:
        """The archive at `key` of a folder that need not be local (a bucket prefix)."""
        if isinstance(folder, LocalFolder):  # the local stores, with their no-symlink rules
            return cls.open(folder.root / key, digests)
        store = open_store_at(folder, key)
        return cls._from_store(store.path, store, digests, (folder, key))

    @classmethod
    def _from_store(
        cls,
        path: Path | str,
        store: Store,
        digests: Mapping[str, int] | None,
        at: tuple[Folder, str] | None,
    ) -> DecantArchive:
        store.digests = digests
        try:
            with large_manifest(store.value_size(MANIFEST_KEY)):
                raw = store.get_metadata(MANIFEST_KEY, MAX_MANIFEST_BYTES)
                if raw is None:
                    raise NotAnArchiveError(f"{path}: not a decant archive (no {MANIFEST_KEY})")
                manifest = parse_manifest(raw, str(path))
                size = len(raw)
                del raw
            archive = cls(path, store, manifest, at)
            archive.manifest_bytes = size
            return archive
        except BaseException:
            store.close()
            raise

    def pin_plans(self) -> None:
        """Hold the plans its readers held while the archive waits for its next open
        (vfs.backends.idle): a reopen then builds none again (~0.4 ms for a 128-page stack,
        seconds for 65,536 pages). Let go by `unpin_plans` once a reader holds its own."""
        with self._lock:
            self._pinned = list(self._plans.values())

    def unpin_plans(self) -> None:
        with self._lock:
            self._pinned = []

    def close(self) -> None:
        with self._lock:
            subs = list(self._nested.values())
            self._nested.clear()
            self._bundle_users.clear()
        for sub in subs:
            sub.close()
        self.store.close()

    def __enter__(self) -> DecantArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def spec(self, name: str, max_chunk_bytes: int) -> ArraySpec:
        """An array's checked `.zarray`, read once per opened archive."""
        with self._lock:
            spec = self._specs.get(f"{name}@{max_chunk_bytes}")
            if spec is None:
                spec = read_array_spec(
                    self.store, name, max_chunk_bytes, self.manifest.all_chunks_stored
                )
                self._specs[f"{name}@{max_chunk_bytes}"] = spec
            return spec

    def plan(self, husk: str, build: Callable[[], Plan]) -> Plan:
        """The plan of the original whose husk (or verbatim bytes) array is `husk`: the one a
        reader of it holds, else `build()`, under the lock so that concurrent first opens
        build it once. Kept no longer than some reader holds it."""
        with self._lock:
            plan = self._plans.get(husk)
            if plan is None:
                plan = build()
                self._plans[husk] = plan
            return plan  # type: ignore[return-value]

    def check(self) -> None:
        """Open every original once without reading it: what `describe` promises, `open` keeps."""
        probe = PageCache(0)
        for info in self.originals():
            self.open_original(info.relpath, probe).close()

    def originals(self) -> list[OriginalInfo]:
        m = self.manifest
        if m.mode != "series":
            return [OriginalInfo(m.original_name, m.original_size, m.original_sha256, m.mode)]
        mode = "series" if m.series_consolidated else "series-nested"
        return [
            OriginalInfo(mem.relpath, mem.original_size, mem.original_sha256, mode)
            for mem in m.members
        ]

    def open_original(self, relpath: str, cache: PageCache) -> OriginalReader:
        m = self.manifest
        if m.mode == "byte-exact":
            pixels = self.plan(
                "husk",
                lambda: PixelPlan(
                    self,
                    m.pages,
                    m.original_size,
                    m.original_sha256,
                    "husk",
                    m.husk_raw_size,
                    m.byteorder,
                ),
            )
            return PixelReader(self, pixels, cache)
        if m.mode == "verbatim":
            husk = self.plan(
                "original",
                lambda: HuskPlan(self, "original", m.original_size, m.original_sha256),
            )
            return VerbatimReader(self, husk, cache)
        mem = self._member(relpath)
        if m.series_consolidated:
            pixels = self.plan(
                mem.husk_array,
                lambda: PixelPlan(
                    self,
                    mem.pages,
                    mem.original_size,
                    mem.original_sha256,
                    mem.husk_array,
                    mem.husk_raw_size,
                    mem.byteorder,
                ),
            )
            return PixelReader(self, pixels, cache)
        sub = self._hold_bundle(mem.subarchive)
        try:
            got = sub.manifest
            if (got.original_size, got.original_sha256) != (mem.original_size, mem.original_sha256):
                raise ManifestError(
                    f"{self.path}: member {mem.relpath!r} claims {mem.original_size} bytes "
                    f"sha256 {mem.original_sha256[:12]}…, its bundle {mem.subarchive} holds "
                    f"{got.original_size} bytes sha256 {got.original_sha256[:12]}…"
                )
            reader = sub.open_original("", cache)
        except BaseException:
            self._let_go_bundle(mem.subarchive)
            raise
        reader.let_go = lambda: self._let_go_bundle(mem.subarchive)
        return reader

    def _member(self, relpath: str) -> MemberRecord:
        """The series member at `relpath`, by a table made once: found by a walk of the members
        each time, `check` of a series of 15,000 (which opens each) compared 112 million
        paths, 6 s of a 17 s describe (red team 103 F4)."""
        by_relpath = self._by_relpath
        if by_relpath is None:
            by_relpath = {}
            for mem in self.manifest.members:
                by_relpath.setdefault(mem.relpath, mem)  # the first, as the walk found it
            self._by_relpath = by_relpath
        mem = by_relpath.get(relpath)
        if mem is None:
            raise FileNotFoundError(f"{self.path}: no member {relpath!r}")
        return mem

    @contextmanager
    def bundle(self, name: str) -> Iterator[DecantArchive]:
        """A nested member's own bundle, open while the block runs (or other readers hold it)."""
        sub = self._hold_bundle(name)
        try:
            yield sub
        finally:
            self._let_go_bundle(name)

    def _hold_bundle(self, name: str) -> DecantArchive:
        """A nested member's own bundle (mode D or V, in this folder, no symlink), opened once
        and kept while a reader of it (or `bundle`) holds it. Kept until the series closed, a
        handle on one member and opens of each other in turn held a descriptor and the tables
        of every bundle opened: 1,801 descriptors, or 702 MiB for 8 members of a million zip
        entries each, past any budget (red team, round 32)."""
        with self._lock:
            sub = self._nested.get(name)
            if sub is None:
                sub = self._nested[name] = self._open_nested(name)
            self._bundle_users[name] = self._bundle_users.get(name, 0) + 1
            return sub

    def _let_go_bundle(self, name: str) -> None:
        with self._lock:
            left = self._bundle_users.get(name, 0) - 1
            if left > 0:
                self._bundle_users[name] = left
                return
            self._bundle_users.pop(name, None)
            sub = self._nested.pop(name, None)
        if sub is not None:
            sub.close()

    def _open_nested(self, name: str) -> DecantArchive:
        if "/" in name or name in ("", ".", ".."):
            raise ManifestError(f"{self.path}: member subarchive {name!r} is unsafe")
        if self._at is not None:  # a bucket prefix: keys, no symlinks to refuse
            folder, key = self._at
            sub = DecantArchive.open_at(
                folder, join_key(key, name), nested_digests(self.digests, name)
            )
            return self._check_nested(sub, sub.path)
        assert isinstance(self.path, Path)
        path = self.path / name
        try:
            seen = path.lstat()
        except FileNotFoundError:
            raise NotAnArchiveError(f"{path}: no such archive") from None
        except NotADirectoryError:  # an OSError would read as "cannot write" (red team 79 F2)
            raise ManifestError(f"{self.path}: its manifest names member bundles, which only "
                                "a folder archive holds") from None  # fmt: skip
        if stat.S_ISLNK(seen.st_mode):
            raise CorruptArchiveError(f"{path}: member bundle is a symlink (refused)")
        sub = DecantArchive.open(path, nested_digests(self.digests, name))
        # Opened by path after the lstat: a bundle swapped for a link in between would be read
        # through it. The file opened must be the one seen (same inode, size and mtime).
        got = sub.store.identity
        if got is not None and tuple(got[1:4]) != (seen.st_mtime_ns, seen.st_size, seen.st_ino):
            sub.close()
            raise CorruptArchiveError(f"{path}: member bundle changed while opened (refused)")
        return self._check_nested(sub, path)

    @staticmethod
    def _check_nested(sub: DecantArchive, path: Path | str) -> DecantArchive:
        if sub.manifest.mode not in ("byte-exact", "verbatim"):
            sub.close()
            raise ManifestError(f"{path}: a member bundle must be byte-exact or verbatim")
        return sub


# Reads up to this size that do not continue the previous read decode only the blosc blocks they
# need (at most 4× this much of a plane, and at most a quarter of it).
PARTIAL_LIMIT = 256 * 1024
SEQUENTIAL_RUN = 1 << 20
# Planes a sequential reader keeps queued ahead of it (8 MiB each for a 2048² uint16 stack).
READAHEAD_PLANES = 3
# Planes kept behind a forward reader of a file whose planes do not fit in the cache (the kernel
# keeps two requests in flight, so the plane before the current one may still be asked for).
DROP_BEHIND = 2


def _ranges(starts: np.ndarray[Any, Any], counts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The indexes of the ranges [starts[k], starts[k] + counts[k]), one after another."""
    before = np.cumsum(counts) - counts
    return np.arange(int(counts.sum())) + np.repeat(starts - before, counts)


class _NotCached(Exception):
    """A cached-only read needs something that is not in the cache."""


class DigestTap:
    """The store as chunk reads see it, noting the digests of every chunk's stored bytes it
    returns (bytes the store has CRC-checked). What a verified file's digest map is made of
    (vfs.decant.digestmap); `complete` says whether every chunk was seen."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.name = store.name
        self.recorder = DigestRecorder()

    def get(self, key: str, limit: int) -> bytes | memoryview | None:
        return self._note(key, self.store.get(key, limit))

    def get_scratch(self, key: str, limit: int) -> bytes | memoryview | None:
        return self._note(key, self.store.get_scratch(key, limit))

    def _note(self, key: str, data: bytes | memoryview | None) -> bytes | memoryview | None:
        if data is not None and is_chunk_key(key):
            self.recorder.note(key, data, self.store.data_offset(key))
        return data

    def complete(self) -> dict[str, int] | None:
        """The map of every chunk of the store, if at least half were read whole through here:
        the others are read now (CRC-checked, one ranged GET each from a bucket), else None
        (the caller then reads the whole archive for it). A small read decodes only the blosc
        blocks it needs (a tool reading 32 KiB at a time does so for its first MiB), and
        another reader may have decoded a plane into the shared cache: such chunks were not
        seen whole. Once, all of them were read again for the map: `sha256sum` of a 12 MiB
        stack fetched its 9.3 MiB archive twice from a bucket (20 MiB in 37 GETs)."""
        keys = []
        try:
            for key in self.store.all_keys():
                if is_chunk_key(key):
                    keys.append(key)
                    if len(keys) > MAX_MAP_CHUNKS:
                        return None  # no map for it: see MAX_MAP_CHUNKS
        except NotImplementedError:
            return None
        seen = self.recorder.chunks
        missing = [k for k in keys if k not in seen]
        if 2 * len(missing) > len(keys) or (missing and not self.store.stable):
            # A folder archive's chunk read now need not be the file whose plane was served
            # (from the cache, decoded before it was swapped): its map comes from a pass that
            # checks what it records (vfs.decant.digests.archive_digests).
            return None
        limit = compressed_bound(MAX_CHUNK_BYTES)
        for key in missing:
            self.get(key, limit)  # noted on the way (a chunk gone from the store: still None)
        if any(k not in seen for k in keys):
            return None
        found, meta = self.recorder.digest_map(keys), metadata_digests(self.store)
        return None if found is None or meta is None else {**found, **meta}


class OriginalReader:
    """read(offset, size) over one original. Thread-safe; pages decode through the shared cache.

    One per open handle, over the original's plan that every reader of it shares (vfs.decant.plan):
    the reader holds only what a handle's reads change."""

    def __init__(
        self, archive: DecantArchive, plan: HuskPlan | PixelPlan, cache: PageCache
    ) -> None:
        self.archive = archive
        self.plan = plan
        self.cache = cache
        self.key: tuple[Any, ...] = (archive.cache_key, plan.husk)
        self.size = plan.size
        self.sha256 = plan.sha256
        self.regions = plan.regions
        self._husk_spec = plan.husk_spec
        self.partial_limit = PARTIAL_LIMIT
        self._next = self._run = 0  # where the last read ended; bytes read in order up to it
        self.let_go: Callable[[], None] | None = None  # a series member's: its bundle handed back
        # Without a digest map, note each chunk's xxh3 as it is read: a first read that hashes
        # the whole file then has the map to record, instead of reading the archive again. So
        # too with a map of chunk digests only (an index older than block entries): a scrub's
        # whole read then records block entries, and small reads stop checking whole chunks;
        # and with one older than layout entries, whose cold small reads read the table first,
        # or than metadata digests (the manifest and `.zarray`s).
        digests = archive.digests
        noting = not digests or not (has_layout_entries(digests) and has_metadata_entries(digests))
        self.tap = DigestTap(archive.store) if noting else None
        self._chunks: Any = self.tap if self.tap is not None else archive.store

    def read(self, offset: int, size: int) -> bytes | memoryview:
        """The bytes at [offset, offset+size). A read inside one region is a zero-copy view of
        the cached page: pyfuse3 replies from any buffer, so a 1 MiB request costs no copy."""
        return self._read(offset, size, False)

    def read_cached(self, offset: int, size: int) -> bytes | memoryview | None:
        """The same bytes if every page and husk block they need is cached, else None: no I/O,
        no decoding, so an event loop may call it without handing the read to a thread. None
        too for a read over more than MANY_PARTS regions: copying those is CPU work, which on
        the event loop held every other user's calls (18 s for 1 MiB of one-byte regions of
        16,384 pages: red team 89)."""
        if 0 <= offset < self.size:
            last = min(offset + size, self.size) - 1
            if self.regions.locate(last) - self.regions.locate(offset) >= MANY_PARTS:
                return None
        try:
            return self._read(offset, size, True)
        except _NotCached:
            return None

    def _read(self, offset: int, size: int, cached_only: bool) -> bytes | memoryview:
        # A small read may decode just the blosc blocks it needs, unless it continues a run of
        # sequential reads already past SEQUENTIAL_RUN: such a reader gets whole planes
        # (cheaper per byte, and read ahead).
        # "Continues" allows for reordering: the kernel keeps two or more requests in flight, so
        # the next one may start before (or a little after) where the last one to finish ended.
        near = abs(offset - self._next) <= SEQUENTIAL_RUN
        run = self._run if near else 0
        small = size <= self.partial_limit and run < SEQUENTIAL_RUN
        want = max(0, min(size, self.size - offset))
        # Not for read_cached (cached_only), which declined any read over many regions: its
        # event-loop caller pays no second lookup. A negative offset: spans says EINVAL.
        many = want and offset >= 0 and not cached_only
        gathered = self._gather(offset, offset + want, False) if many else None
        if gathered is not None:
            self._next, self._run = max(offset + size, self._next if near else 0), run + size
            return gathered
        parts: list[bytes | memoryview] = []
        joined: bytearray | None = None  # past MANY_PARTS parts, copied in as they come
        filled = 0
        for region, inner, n in self.regions.spans(offset, size):
            part = self._region_bytes(region, inner, n, cached_only, small)
            if joined is None:
                parts.append(part)
                if len(parts) < MANY_PARTS:
                    continue
                joined, part = bytearray(want), b"".join(parts)
                parts = []
            joined[filled : filled + len(part)] = part
            filled += len(part)
        if joined is not None:
            out: bytes | memoryview = memoryview(joined)[:filled]
        else:
            out = parts[0] if len(parts) == 1 else b"".join(parts)
        self._next, self._run = max(offset + size, self._next if near else 0), run + size
        if len(out) != want:  # the checks at open make this unreachable: never a short read
            raise CorruptArchiveError(
                f"{self.archive.path}: read of {size} bytes at {offset} produced {len(out)}, "
                f"expected {want}"
            )
        return out

    def _gather(self, start: int, end: int, cached_only: bool) -> memoryview | None:
        """[start, end) over many regions at once (see PixelReader), or None."""
        return None

    def _cached(self, key: tuple[Any, ...], load: Any, cached_only: bool, nbytes: int) -> Any:
        if cached_only:
            value = self.cache.get(key)
            if value is None:
                raise _NotCached
            return value
        return self.cache.get_or_load(key, load, nbytes)  # room for it before it decodes

    def readahead(self, offset: int, depth: int = 2) -> None:
        """Warm the cache for what follows `offset` (pages; a verbatim file has none to decode)."""

    def loading(self, offset: int, size: int) -> Future[Any] | None:
        """A read-ahead decode that [offset, offset + size) needs, not finished yet, or None:
        the mount awaits it on its event loop, then serves the read from the cache."""
        return None

    def readahead_needed(self, offset: int, depth: int = 2) -> bool:
        """Whether `readahead(offset)` would decode anything (always, unless a reader knows)."""
        return True

    def close(self) -> None:
        let_go, self.let_go = self.let_go, None
        if let_go is not None:  # once, however often close is called
            let_go()

    def _region_bytes(
        self, region: Region, inner: int, n: int, cached_only: bool = False, small: bool = False
    ) -> bytes | memoryview:
        return self._husk(region.pos + inner, n, cached_only)

    def _husk(self, pos: int, n: int, cached_only: bool = False) -> bytes | memoryview:
        spec = self._husk_spec
        chunk = spec.chunks[0]
        parts = []
        while n > 0:
            index, inner = divmod(pos, chunk)
            held = min(chunk, spec.shape[0] - index * chunk)
            block = self._cached(
                (*self.key, "h", index),
                lambda i=index, n=held: self._husk_block(i, n),
                cached_only,
                held,
            )
            take = min(n, chunk - inner)
            parts.append(block[inner : inner + take])
            pos += take
            n -= take
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _husk_block(self, index: int, held: int) -> bytes | memoryview:
        """Husk block `index` decoded, held against the decode gate: sixteen readers of 64 MiB
        blocks decoded six at once outside it, 403 MiB under a 64 MiB cache (red team 87)."""
        with self.cache.decoding(held, 0):  # its room: get_or_load's
            return _fitted(read_chunk(self._chunks, self._husk_spec, (index,)), held)


class VerbatimReader(OriginalReader):
    def readahead(self, offset: int, depth: int = 2) -> None:
        chunk = self._husk_spec.chunks[0]
        for k in range(1, depth + 1):
            pos = (offset // chunk + k) * chunk
            if pos < self.size:
                self._husk(pos, 1)


class PixelReader(OriginalReader):
    plan: PixelPlan

    def __init__(self, archive: DecantArchive, plan: PixelPlan, cache: PageCache) -> None:
        super().__init__(archive, plan, cache)
        self.pages = plan.pages
        self.byteorder = plan.byteorder
        self._pixels = plan.pixels
        self._file_dtype = plan.file_dtype
        self._by_rank = plan.by_rank  # pages in file order
        self._rank = plan.rank
        self._blocks = BlockSource(archive.store, self._pixels, cache, archive.cache_key)
        self._prefetched = -1  # the page whose chunk read-ahead last asked the kernel for
        # Pages ranked (in file order) below `behind` were dropped behind a forward reader.
        self._dropping = DropBehind(cache, DROP_BEHIND, 64) if self._drops_behind(cache) else None
        self._large_planes = self._pixels.chunk_nbytes > cache.max_bytes // 4
        self._queued: dict[int, Future[Any]] = {}  # read-ahead decodes not finished yet
        self._queue_lock = threading.Lock()
        self._closed = False

    def _drops_behind(self, cache: PageCache) -> bool:
        """Whether a forward reader drops the planes it has passed: when the file's planes and
        the read-ahead window do not fit in the cache together. Kept, such a file's planes would
        push out every other file's, and still not serve a re-read: LRU evicts its first planes
        to make room for its last ones, so a second pass misses every plane. Dropped, their
        buffers decode the planes ahead (BufferPool): a fresh 8 MiB buffer cost its page faults
        and the kernel zeroing it, 0.5-2 s per GB decoded here against 0.2 s for the decode
        itself; a first read of a 512 MiB stack with the default 512 MiB cache took ~590 MiB of
        RSS and 1.4-2.4 s of daemon CPU per GB, ~125 MiB and 1.2 s/GB dropping behind
        (tools/bench.py mount). A file that fits stays cached whole for re-reads."""
        plane = self._pixels.chunk_nbytes
        window = (READAHEAD_PLANES + DROP_BEHIND + 1) * plane
        return len(self.pages) * plane + window > cache.max_bytes

    def _chunk_index(self, page: PageRecord) -> tuple[int, ...]:
        return self.plan.chunk_index(page)

    def _block_wise(self) -> bool:
        """Whether every read decodes just the blosc blocks it needs, whatever its size: planes
        larger than a quarter of the cache. Decoded whole, such a plane pushes out the file's
        read-ahead and every other file's planes, and is gone again before the next request:
        `sha256sum` (32 KiB reads) of a 256 MiB stack of 8 MiB planes under `--cache-size 8M`
        decoded a whole plane for every read, 106 s. Blocks (256 KiB at the default codec) are
        cached one by one. Not where the caller asked for whole planes (partial_limit 0)."""
        return self._large_planes and self.partial_limit > 0

    def _region_bytes(
        self, region: Region, inner: int, n: int, cached_only: bool = False, small: bool = False
    ) -> bytes | memoryview:
        if region.page == HUSK:
            return self._husk(region.pos + inner, n, cached_only)
        start = region.pos + inner
        if not self.cache.present_or_loading(self._page_key(region.page)):
            part = self._page_part(region.page, start, n, cached_only, small)
            if part is not None:
                return part
        return self._page(region.page, cached_only)[start : start + n]

    def _gather(self, start: int, end: int, cached_only: bool) -> memoryview | None:
        """[start, end) when it spans more than MANY_PARTS regions: copied with numpy from the
        whole pages and the husk run it needs, not a region at a time (~2.5 us a region: a
        1 MiB read of an archive of 2^21 one-byte tiles in reverse order took 2.7 s of the
        interpreter's lock, and another user's 4 KiB read waited 8-43 s behind four to sixteen
        such readers; red team 88). Not for planes read block by block (see _block_wise)."""
        i0, i1 = self.regions.locate(start), self.regions.locate(end - 1)
        if i1 - i0 < MANY_PARTS or self._block_wise():
            return None
        out = np.empty(end - start, np.uint8)
        # GATHER_REGIONS regions at a time, and those in groups of about GATHER_BYTES: the
        # columns and index arrays stay small (the whole read's at once: ~60 MiB a 1 MiB read
        # of one-byte regions, and sixteen such reads took the daemon to 990 MiB).
        for first in range(i0, i1 + 1, GATHER_REGIONS):
            last = min(first + GATHER_REGIONS - 1, i1)
            starts, ends, pages, pos = self.regions.columns(first, last)
            lo, hi = np.maximum(starts, start), np.minimum(ends, end)
            counts, src, dst = hi - lo, pos + (lo - starts), lo - start
            marks = np.arange(GATHER_BYTES, int(counts.sum()), GATHER_BYTES)
            cuts = np.unique(np.searchsorted(np.cumsum(counts), marks) + 1)
            for group in np.split(np.arange(len(counts)), cuts):
                if len(group):
                    self._gather_group(out, pages[group], counts[group], src[group],
                                       dst[group], cached_only)  # fmt: skip
        return memoryview(out)

    def _gather_group(
        self, out: np.ndarray[Any, Any], pages: np.ndarray[Any, Any],
        counts: np.ndarray[Any, Any], src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any],
        cached_only: bool,
    ) -> None:  # fmt: skip
        husk = pages == HUSK
        if husk.any():  # husk runs in file order lie in husk order: one range of the husk
            h0 = int(src[husk][0])
            h1 = int((src[husk] + counts[husk]).max())
            data = np.frombuffer(self._husk(h0, h1 - h0, cached_only), np.uint8)
            out[_ranges(dst[husk], counts[husk])] = data[_ranges(src[husk] - h0, counts[husk])]
        # Page by page, the group sorted by page once: each page compared with the whole group
        # was pages x regions (16,384 of each: 18 s a 1 MiB read; red team 89).
        pixel = np.flatnonzero(~husk)
        if not len(pixel):
            return
        order = pixel[np.argsort(pages[pixel], kind="stable")]
        ids, firsts = np.unique(pages[order], return_index=True)
        if len(ids) > GATHER_PAGES:  # a page or two a region: what a page costs is the walk's
            for page, at, n, to in zip(
                pages[pixel].tolist(),
                src[pixel].tolist(),
                counts[pixel].tolist(),
                dst[pixel].tolist(),
                strict=True,
            ):
                data = np.frombuffer(self._page(page, cached_only), np.uint8)
                out[to : to + n] = data[at : at + n]
            return
        for page, mine in zip(ids.tolist(), np.split(order, firsts[1:]), strict=True):
            data = np.frombuffer(self._page(page, cached_only), np.uint8)
            out[_ranges(dst[mine], counts[mine])] = data[_ranges(src[mine], counts[mine])]

    def _page_part(
        self, index: int, start: int, n: int, cached_only: bool, small: bool
    ) -> bytes | memoryview | None:
        """[start, start + n) of a page's bytes from the blosc blocks holding them, or None
        when the whole plane is the better (or only) way: a large or sequential read, a codec
        without blocks. Cached blocks serve any read, small or not."""
        if not small and not cached_only and not self._block_wise():
            return None  # before any geometry: a large read of many regions asks per region
        page = self.pages[index]
        geom = self.plan.geometry(page)
        native = self._file_dtype == self._pixels.dtype and geom.chunky
        if native and geom.count == 1:  # on-disk bytes are the plane's own bytes
            return self._rows_part(page, geom, start, n, cached_only, small, native)
        # Piece by piece (a tile's rows are not its neighbour's): up to a few pieces, or all of
        # them where planes are read block by block on a worker thread. Past a few pieces the
        # whole plane was decoded instead, which a plane too large for the cache is again for
        # every read: a 256 MiB plane of 64x64 tiles under a 64 MiB cache, 512 MiB a decode
        # (red team 89; the region-at-a-time walk it replaced read each tile's blocks).
        wise_thread = self._block_wise() and not cached_only
        cuts = geom.cuts(start, start + n, None if wise_thread else MANY_PARTS)
        if cuts is None:
            return None
        parts = []
        for a, b in cuts:
            part = self._rows_part(page, geom, a, b - a, cached_only, small, native)
            if part is None:
                return None
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _rows_part(
        self, page: PageRecord, geom: PageGeometry, start: int, n: int, cached_only: bool,
        small: bool, native: bool,
    ) -> bytes | memoryview | None:  # fmt: skip
        """_page_part of one piece, or of a page whose bytes are its plane's."""
        if native and geom.count == 1:
            lo, hi = start, start + n
        else:
            r0, r1 = geom.rows_for(start, start + n)
            lo, hi = r0 * geom.plane_rowbytes, r1 * geom.plane_rowbytes
        wise = self._block_wise()
        if not small and not cached_only and not wise:
            return None
        if not wise and (hi - lo > self.partial_limit * 4 or 4 * (hi - lo) > geom.nbytes):
            return None
        chunk = self._pixels.chunk_key(self._chunk_index(page))
        got = self._blocks.read(chunk, lo, hi, cached_only)
        if got is None or (native and geom.count == 1):
            return got
        _y, x, s = geom.shape
        rows = np.frombuffer(got, dtype=self._pixels.dtype).reshape(r1 - r0, x, s)
        return geom.extract(rows.astype(self._file_dtype, copy=False), r0, start, start + n)

    def _page(self, index: int, cached_only: bool = False) -> memoryview:
        return self._cached(  # type: ignore[no-any-return]
            (self.archive.cache_key, "p", index),
            lambda: self._decode_page(index),
            cached_only,
            0,  # its room in the cache is taken once it passes the decode gate
        )

    def _decode_page(self, index: int) -> memoryview:
        """Read and decode a page held against the cache's decode gate, with what the decode
        makes: the plane, and a second plane where the file's bytes are a rearranged copy
        (tiles, planar, byte order). Twenty-four readers of originals under `--cache-size 32M`
        peaked at 175-204 MiB of RSS with six decodes in flight beside the cache (the bound is
        182); gated, and with read-ahead held to the gate's room, at 150-168 MiB."""
        page = self.pages[index]
        spec, cache = self._pixels, self.cache
        dtype = spec.dtype
        file_dtype = dtype.newbyteorder(self.byteorder) if dtype.itemsize > 1 else dtype
        native = file_dtype == dtype and not page.tilewidth and page.planarconfig == 1
        with cache.decoding((1 if native else 2) * spec.chunk_nbytes, spec.chunk_nbytes):
            raw = read_chunk(self._chunks, spec, self._chunk_index(page), cache.buffers.take)
            if native:
                return memoryview(raw)  # already the on-disk bytes: no copy
            plane = np.frombuffer(raw, dtype=dtype).reshape(page.shape)
            out = serialize_page(plane.astype(file_dtype, copy=False), page)
            del plane
            cache.buffers.give(raw)  # reused once no view of it is left (the pool checks)
            return out if isinstance(out, memoryview) else memoryview(out)

    def _pages_after(self, offset: int, count: int) -> list[int]:
        pages = []
        for _ in range(count):
            page = self.regions.next_page_after(offset)
            if page is None:
                break
            start = self.regions.page_start(page)
            if start is None:  # not so: the page came from a region of its pixels
                break
            pages.append(page)
            offset = start
        return pages

    def readahead_needed(self, offset: int, depth: int = READAHEAD_PLANES) -> bool:
        """Whether `readahead(offset)` has anything to do: a page of the next `depth` is neither
        decoded, queued nor being decoded. Cheap (no I/O), so a sequential reader's every
        request can ask before it hands a read-ahead to a thread: most requests land in a plane
        whose successors are already done. Nothing for planes read block by block."""
        if self._block_wise():
            return False
        cached, queued = self.cache.present_or_loading, self._queued
        return any(
            p not in queued and not cached(self._page_key(p))
            for p in self._pages_after(offset, depth)
        )

    def readahead(self, offset: int, depth: int = READAHEAD_PLANES) -> None:
        """Queue the decode of the `depth` pages that follow the one holding `offset` on the
        decode pool, and ask the kernel to start reading the compressed chunk after them.
        Returns at once: the pool's threads decode (and digest-check) two planes at a time on
        the cores the request path leaves, while the serving thread only slices ready planes.
        A failed decode is not reported here: the read that needs the page decodes it itself.
        Planes read block by block (`_block_wise`) are not read ahead: they would not stay."""
        if self._block_wise():
            return
        pages = self._pages_after(offset, depth + 1)
        if pages:
            self._drop_behind(self._rank[pages[0]] - 1)
        if len(pages) > depth:
            ahead = pages.pop()
            if ahead != self._prefetched:  # once per chunk, not once per request
                self._prefetched = ahead
                key = self._pixels.chunk_key(self._chunk_index(self.pages[ahead]))
                self.archive.store.prefetch(key)
        submitted = []
        # No more than the decode gate has room for: under a small cache and many readers,
        # decodes queued ahead only wait in the gate before the ones readers need (and are
        # evicted before they are read).
        room = self.cache.decodes.room() // max(1, self._pixels.chunk_nbytes)
        with self._queue_lock:
            if self._closed:
                return
            for p in pages:
                if p in self._queued or self.cache.present_or_loading(self._page_key(p)):
                    continue
                if room <= 0:
                    break
                room -= 1
                self._queued[p] = future = _decode_pool().submit(self._page, p)
                submitted.append((p, future))
        for p, future in submitted:  # outside the lock: a done future calls back at once
            future.add_done_callback(lambda _f, p=p: self._dequeue(p))

    def loading(self, offset: int, size: int) -> Future[Any] | None:
        with self._queue_lock:
            if not self._queued:
                return None
            for region, _inner, _n in self.regions.spans(offset, size):
                future = self._queued.get(region.page)
                if future is not None and not future.done():
                    return future
        return None

    def _drop_behind(self, current: int) -> None:
        """Forget the planes ranked more than DROP_BEHIND before `current` (the one being read),
        when this file drops behind; a reader that jumps far ahead drops at most 64 planes."""
        if self._dropping is not None:
            self._dropping.passed(current, lambda rank: self._page_key(self._by_rank[rank]))

    def _dequeue(self, page: int) -> None:
        with self._queue_lock:
            self._queued.pop(page, None)

    def readahead_wait(self) -> None:
        """Wait for the decodes read-ahead queued (tests; close)."""
        with self._queue_lock:
            futures = list(self._queued.values())
        wait(futures)

    def close(self) -> None:
        """Queued decodes that have not started are dropped; running ones finish first (they
        use the archive's descriptor)."""
        with self._queue_lock:
            self._closed = True
            futures = list(self._queued.values())
        for future in futures:
            future.cancel()
        wait(futures)
        super().close()

    def _page_key(self, index: int) -> tuple[Any, ...]:
        return (self.archive.cache_key, "p", index)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _decode_pool() -> ThreadPoolExecutor:
    """Threads that decode read-ahead planes. At least two, so two planes decode at once: a
    plane's decode (pread, CRC or digest, blosc, and faulting in its fresh buffer) was one
    serial chain on one core while the other idled."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max(2, (os.cpu_count() or 2) - 1), "decant-decode", initializer=_name_thread
            )
        return _POOL


def _name_thread() -> None:
    name_this_thread("decant-decode")


def _fitted(block: Any, held: int) -> memoryview:
    """A husk's last chunk decodes to the whole chunk (zarr v2 stores edge chunks whole): keep
    only the bytes it holds. A 64 KiB TIFF's 256-byte husk otherwise kept a 256 KiB chunk
    alive, 80% of what 2,000 such files held in the cache (tools/bench.py rss, scenario D)."""
    view = memoryview(block)
    return view if view.nbytes <= held else memoryview(bytes(view[:held]))


def nested_digests(digests: Mapping[str, int] | None, bundle: str) -> dict[str, int] | None:
    """A nested member bundle's own map: its keys are recorded as "m0.zarr.zip/<key>"."""
    if digests is None:
        return None
    prefix = f"{bundle}/"
    return {k[len(prefix) :]: v for k, v in digests.items() if k.startswith(prefix)}
