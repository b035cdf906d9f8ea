"""Random-access reconstruction of originals from an opened decant archive (spec §5)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vfs.cache import PageCache
from vfs.decant.layout import page_coordinate, serialize_page
from vfs.decant.manifest import Manifest, PageRecord, parse_manifest
from vfs.decant.regions import HUSK, Region, RegionIndex
from vfs.decant.store import (
    MANIFEST_KEY,
    ArraySpec,
    Store,
    open_store,
    open_store_at,
    read_array_spec,
    read_chunk,
)
from vfs.errors import ManifestError, NotAnArchiveError
from vfs.stores.base import Folder, join_key


@dataclass(frozen=True)
class OriginalInfo:
    """An original file an archive holds: the whole archive (modes D/V) or one series member."""

    relpath: str
    size: int
    sha256: str
    mode: str


class DecantArchive:
    """An opened archive: its store and manifest. Originals open lazily from it."""

    def __init__(
        self, path: Path | str, store: Store, manifest: Manifest, at: tuple[Folder, str] | None
    ) -> None:
        self.path = path  # a local path, or an archive's URL when it was opened `at` a folder
        self.store = store
        self.manifest = manifest
        self._at = at
        # Keyed by identity as well as path, so a replaced archive never serves stale cached pages.
        if store.identity is not None:
            self.cache_key: tuple[object, ...] = store.identity
        else:
            st = os.stat(path)
            self.cache_key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
        self._nested: dict[str, DecantArchive] = {}

    @classmethod
    def open(cls, path: Path) -> DecantArchive:
        return cls._from_store(path, open_store(path), None)

    @classmethod
    def open_at(cls, folder: Folder, key: str) -> DecantArchive:
        """The archive at `key` of a folder that need not be local (a bucket prefix)."""
        store = open_store_at(folder, key)
        return cls._from_store(store.name, store, (folder, key))

    @classmethod
    def _from_store(
        cls, path: Path | str, store: Store, at: tuple[Folder, str] | None
    ) -> DecantArchive:
        try:
            raw = store.get(MANIFEST_KEY)
            if raw is None:
                raise NotAnArchiveError(f"{path}: not a decant archive (no {MANIFEST_KEY})")
            return cls(path, store, parse_manifest(raw, str(path)), at)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        for sub in self._nested.values():
            sub.close()
        self.store.close()

    def __enter__(self) -> DecantArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            return PixelReader(
                self,
                m.pages,
                m.original_size,
                m.original_sha256,
                "husk",
                m.husk_raw_size,
                m.byteorder,
                cache,
            )
        if m.mode == "verbatim":
            return VerbatimReader(self, m.original_size, cache)
        for mem in m.members:
            if mem.relpath == relpath:
                break
        else:
            raise FileNotFoundError(f"{self.path}: no member {relpath!r}")
        if m.series_consolidated:
            return PixelReader(
                self,
                mem.pages,
                mem.original_size,
                mem.original_sha256,
                mem.husk_array,
                mem.husk_raw_size,
                mem.byteorder,
                cache,
            )
        sub = self._nested.get(mem.subarchive)
        if sub is None:
            name = mem.subarchive
            if "/" in name or name in ("", ".", ".."):
                raise ManifestError(f"{self.path}: member subarchive {name!r} is unsafe")
            if self._at is not None:
                folder, key = self._at
                sub = DecantArchive.open_at(folder, join_key(key, name))
            else:
                assert isinstance(self.path, Path)
                sub = DecantArchive.open(self.path / name)
            self._nested[name] = sub
        return sub.open_original("", cache)


class _NotCached(Exception):
    """A cached-only read needs something that is not in the cache."""


class OriginalReader:
    """read(offset, size) over one original. Thread-safe; pages decode through the shared cache."""

    size: int

    def __init__(self, archive: DecantArchive, cache: PageCache, key: tuple[Any, ...]) -> None:
        self.archive = archive
        self.cache = cache
        self.key = key
        self.sha256 = ""
        self.regions: RegionIndex

    def read(self, offset: int, size: int) -> bytes | memoryview:
        """The bytes at [offset, offset+size). A read inside one region is a zero-copy view of
        the cached page: pyfuse3 replies from any buffer, so a 1 MiB request costs no copy."""
        return self._read(offset, size, False)

    def read_cached(self, offset: int, size: int) -> bytes | memoryview | None:
        """The same bytes if every page and husk block they need is cached, else None: no I/O,
        no decoding, so an event loop may call it without handing the read to a thread."""
        try:
            return self._read(offset, size, True)
        except _NotCached:
            return None

    def _read(self, offset: int, size: int, cached_only: bool) -> bytes | memoryview:
        parts = [
            self._region_bytes(region, inner, n, cached_only)
            for region, inner, n in self.regions.spans(offset, size)
        ]
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def _cached(self, key: tuple[Any, ...], load: Any, cached_only: bool) -> Any:
        if cached_only:
            value = self.cache.get(key)
            if value is None:
                raise _NotCached
            return value
        return self.cache.get_or_load(key, load)

    def readahead(self, offset: int, depth: int = 2) -> None:
        """Warm the cache for what follows `offset` (pages; a verbatim file has none to decode)."""

    def close(self) -> None:
        pass

    def _region_bytes(
        self, region: Region, inner: int, n: int, cached_only: bool = False
    ) -> bytes | memoryview:
        return self._husk(region.pos + inner, n, cached_only)

    def _husk(self, pos: int, n: int, cached_only: bool = False) -> bytes | memoryview:
        spec = self._husk_spec
        chunk = spec.chunks[0]
        parts = []
        while n > 0:
            index, inner = divmod(pos, chunk)
            block = self._cached(
                (*self.key, "h", index),
                lambda i=index: memoryview(read_chunk(self.archive.store, spec, (i,))),
                cached_only,
            )
            take = min(n, chunk - inner)
            parts.append(block[inner : inner + take])
            pos += take
            n -= take
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _use_husk(self, array: str, needed: int) -> None:
        spec = read_array_spec(self.archive.store, array)
        if len(spec.shape) != 1 or spec.dtype != np.uint8:
            raise ManifestError(f"{self.archive.path}: array '{array}' is not 1-D uint8")
        if spec.shape[0] < needed:
            raise ManifestError(
                f"{self.archive.path}: array '{array}' holds {spec.shape[0]} bytes, "
                f"shorter than the {needed} the manifest needs"
            )
        self._husk_spec: ArraySpec = spec


class VerbatimReader(OriginalReader):
    def __init__(self, archive: DecantArchive, size: int, cache: PageCache) -> None:
        super().__init__(archive, cache, (archive.cache_key, "original"))
        self.size = size
        self.sha256 = archive.manifest.original_sha256
        self._use_husk("original", size)
        self.regions = RegionIndex([Region(0, size, HUSK, 0)] if size else [], size, size)

    def readahead(self, offset: int, depth: int = 2) -> None:
        chunk = self._husk_spec.chunks[0]
        for k in range(1, depth + 1):
            pos = (offset // chunk + k) * chunk
            if pos < self.size:
                self._husk(pos, 1)


class PixelReader(OriginalReader):
    def __init__(
        self,
        archive: DecantArchive,
        pages: tuple[PageRecord, ...],
        size: int,
        sha256: str,
        husk: str,
        husk_size: int,
        byteorder: str,
        cache: PageCache,
    ) -> None:
        super().__init__(archive, cache, (archive.cache_key, husk))
        source = str(archive.path)
        self.size = size
        self.sha256 = sha256
        self.pages = {p.index: p for p in pages}
        self.byteorder = byteorder
        self.regions = RegionIndex.build(pages, size, husk_size, source)
        self._use_husk(husk, husk_size)
        self._pixels = read_array_spec(archive.store, "0")
        page_ndims = {len(p.shape) for p in pages}
        if len(page_ndims) > 1:
            raise ManifestError(f"{source}: pages mix (Y, X) and (Y, X, S) shapes")
        ndim = page_ndims.pop() if page_ndims else 2
        self._leading = self._pixels.shape[: len(self._pixels.shape) - ndim]
        if self._pixels.chunks[len(self._leading) :] != self._pixels.shape[len(self._leading) :]:
            raise ManifestError(f"{source}: array '0' does not hold one plane per chunk")
        n_planes = math.prod(self._leading)
        for p in pages:
            if p.index >= n_planes or tuple(p.shape) != self._pixels.shape[len(self._leading) :]:
                raise ManifestError(f"{source}: page {p.index} does not fit array '0'")
        plane_order = archive.manifest.plane_order
        self._plane_order = plane_order if len(plane_order) == len(self._leading) else ()

    def _region_bytes(
        self, region: Region, inner: int, n: int, cached_only: bool = False
    ) -> bytes | memoryview:
        if region.page == HUSK:
            return self._husk(region.pos + inner, n, cached_only)
        start = region.pos + inner
        return self._page(region.page, cached_only)[start : start + n]

    def _page(self, index: int, cached_only: bool = False) -> memoryview:
        return self._cached(  # type: ignore[no-any-return]
            (self.archive.cache_key, "p", index), lambda: self._decode_page(index), cached_only
        )

    def _decode_page(self, index: int) -> memoryview:
        page = self.pages[index]
        coord = page_coordinate(index, self._leading, self._plane_order)
        chunk = (*coord, *([0] * len(page.shape)))
        raw = read_chunk(self.archive.store, self._pixels, chunk)
        dtype = self._pixels.dtype
        file_dtype = dtype.newbyteorder(self.byteorder) if dtype.itemsize > 1 else dtype
        if dtype.name != page.dtype:
            raise ManifestError(
                f"{self.archive.path}: page {index} dtype {page.dtype} differs from array '0' "
                f"({dtype.name})"
            )
        if file_dtype == dtype and not page.tilewidth and page.planarconfig == 1:
            return memoryview(raw)  # already the on-disk bytes: no copy
        plane = np.frombuffer(raw, dtype=dtype).reshape(page.shape).astype(file_dtype, copy=False)
        out = serialize_page(plane, page)
        return out if isinstance(out, memoryview) else memoryview(out)

    def readahead(self, offset: int, depth: int = 2) -> None:
        """Decode up to `depth` pages that follow the one holding `offset`, in file order."""
        for _ in range(depth):
            page = self.regions.next_page_after(offset)
            if page is None:
                return
            self._page(page)
            offset = self.regions.page_start[page]
