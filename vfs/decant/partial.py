"""Part of a page without the whole plane: which plane rows a range of the page's on-disk bytes
needs, those bytes rebuilt from just those rows (striped or tiled, chunky or planar, edge tiles;
the caller converts byte order before `extract`), and the blosc blocks holding those rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import xxhash

from vfs.cache import PageCache
from vfs.decant.blosc_blocks import (
    BloscChunkError,
    BloscHeader,
    block_spans,
    decode_blocks,
    parse_header,
)
from vfs.decant.chunks import ArraySpec
from vfs.decant.digestmap import block_key, layout_key, table_key, unpack_layout
from vfs.decant.limits import compressed_bound
from vfs.decant.manifest import PageRecord
from vfs.decant.store import Store
from vfs.errors import CorruptArchiveError
from vfs.threads import aside

# Streams of the blocks a read needs that lie at most this far apart in the chunk are read in one
# range (the bytes between them fetched and unused): c-blosc's threads store a chunk's streams in
# the order they finished, so a read over neighbouring blocks may find them apart, and one more
# GET of an object store costs more than this many bytes of the same GET (~1.2 ms, against
# ~0.3 ms for 256 KiB at the 800 MB/s of one GET on the bench host).
MERGE_GAP = 256 * 1024


class PageGeometry:
    """A page's serialized bytes as runs ("pieces"), each a rectangle of the plane in C order:
    one per tile (and sample, when planar), or one per sample plane of a striped page.

    Worked out from the grid, not listed: a page of 2^21 1×1 tiles listed its pieces in ~450
    MiB (red team 84). Pieces follow tile_grid's order: sample planes, then bands of tiles (a
    band is a row of tiles, `tilelength` rows high but the last), then tiles left to right;
    an edge tile holds only the plane's pixels."""

    def __init__(self, page: PageRecord, itemsize: int) -> None:
        y, x = page.shape[0], page.shape[1]
        s = page.shape[2] if len(page.shape) == 3 else 1
        self.shape = (y, x, s)
        self.plane_rowbytes = x * s * itemsize
        if page.tilewidth:
            planar = page.planarconfig == 2
            self._tile_y, self._tile_x = page.tilelength, page.tilewidth
        else:
            planar = page.planarconfig == 2 and s > 1
            self._tile_y, self._tile_x = y, x
        self.chunky = not planar  # a piece holds every sample of its pixels
        self._planes = s if planar else 1
        self._pixel_bytes = s * itemsize if self.chunky else itemsize
        self._plane_bytes = y * x * self._pixel_bytes
        self.nbytes = self._planes * self._plane_bytes
        bands = -(-y // self._tile_y) if y else 0
        self.count = self._planes * bands * (-(-x // self._tile_x) if x else 0)  # pieces

    def _touched(self, start: int, stop: int) -> Iterator[tuple[int, int, int, int, int, int, int]]:
        """(sample, y0, y1, x0, rowbytes, a, b) of each piece [start, stop) overlaps: sample -1
        for every sample, the piece's first and end plane rows, first column and bytes a row,
        and the bytes [a, b) of it the range holds."""
        y, x, _s = self.shape
        px, band_full = self._pixel_bytes, self._tile_y * x * self._pixel_bytes
        pos, stop = max(start, 0), min(stop, self.nbytes)
        while pos < stop:
            plane, within = divmod(pos, self._plane_bytes)
            band, into = divmod(within, band_full)
            y0 = band * self._tile_y
            high = min(self._tile_y, y - y0)
            tile = into // (high * self._tile_x * px)
            x0 = tile * self._tile_x
            rowbytes = min(self._tile_x, x - x0) * px
            first = pos - into + high * x0 * px  # where the piece starts
            end = first + high * rowbytes
            sample = plane if not self.chunky else -1
            yield sample, y0, y0 + high, x0, rowbytes, pos - first, min(stop, end) - first
            pos = end

    def cuts(self, start: int, stop: int, most: int | None) -> list[tuple[int, int]] | None:
        """[start, stop) cut where pieces meet, or None past `most` pieces (None: no bound)."""
        out = []
        for _sample, _y0, _y1, _x0, _rowbytes, a, b in self._touched(start, stop):
            if most is not None and len(out) == most:
                return None
            out.append((start, start + b - a))  # the pieces touched follow one another
            start += b - a
        return out

    def rows_for(self, start: int, stop: int) -> tuple[int, int]:
        """Plane rows [r0, r1) that hold the serialized bytes [start, stop)."""
        r0, r1 = self.shape[0], 0
        for _sample, y0, _y1, _x0, rowbytes, a, b in self._touched(start, stop):
            r0 = min(r0, y0 + a // rowbytes)
            r1 = max(r1, y0 - (-b // rowbytes))
        return (r0, r1) if r0 < r1 else (0, 0)

    def extract(self, rows: np.ndarray[Any, Any], r0: int, start: int, stop: int) -> bytes:
        """Serialized bytes [start, stop) from `rows`, the plane's rows [r0, r0 + len(rows)) as a
        (rows, X, S) array already in the file's byte order."""
        parts = []
        for sample, y0, _y1, x0, rowbytes, a, b in self._touched(start, stop):
            ya, yb = y0 + a // rowbytes, y0 - (-b // rowbytes)
            block = rows[ya - r0 : yb - r0, x0 : x0 + rowbytes // self._pixel_bytes]
            if sample >= 0:
                block = block[:, :, sample]
            skip = a - (ya - y0) * rowbytes
            parts.append(block.tobytes()[skip : skip + b - a])
        return parts[0] if len(parts) == 1 else b"".join(parts)


_UNSPLIT = "unsplit"
_FIRST_READ = 4096  # cached in place of a block table: this chunk is decoded whole


class BlockSource:
    """Decoded blosc blocks of one array's chunks, each cached on its own, for reads that need
    a small part of a plane: a 4 KiB read decodes one block (256 KiB for a 2048×2048 uint16
    plane at the default codec) instead of the whole 8 MiB.

    The header, the block table and each needed block's stream are read by range
    (`Store.get_range`): two or three small preads instead of the whole compressed plane. What
    checks them depends on the store's digest map (`digests`, kept by the mount's index once
    the original verified):
    - with block entries for the chunk (vfs.decant.digestmap), the header and table and each
      block's stream are checked against their xxh3 before anything is decoded;
    - with only the chunk's own digest (a map recorded before block entries existed, or a chunk
      past their bound), the chunk is read whole with `Store.get`, which checks that digest,
      and kept in the cache so later reads of the plane decode from it;
    - without a map they are unchecked (the zip CRC-32 covers whole entries only): the mount
      serves such reads of an unverified original with its sha256 check still to come (hash
      as served, and a background verification when a handle read only part of the file).
    """

    def __init__(self, store: Store, spec: ArraySpec, cache: PageCache, key: Any) -> None:
        self.store = store
        self.spec = spec
        self.cache = cache
        self.key = key
        codec = spec.compressor
        self.usable = getattr(codec, "codec_id", None) == "blosc" and not spec.filters

    def read(self, chunk: str, lo: int, hi: int, cached_only: bool) -> bytes | memoryview | None:
        """Decoded bytes [lo, hi) of the chunk at store key `chunk`; None when this chunk is not
        decoded block by block (other codecs, other blosc formats), or, with `cached_only`,
        when something needed is not cached."""
        if not self.usable:
            return None
        table = self._get((self.key, "bt", chunk), lambda: self._table(chunk), cached_only)
        if table is None or table == _UNSPLIT:
            return None
        h, spans = table
        blocks = h.blocks_for(lo, hi)
        parts = []
        fetched: dict[int, memoryview] = {}  # blocks decoded with an earlier one's read
        for j in blocks:
            block = self._get(
                (self.key, "bb", chunk, j),
                lambda j=j: (
                    fetched.pop(j, None) or self._blocks(chunk, h, spans, j, blocks, fetched)
                ),
                cached_only,
            )
            if block is None:
                return None
            first = j * h.blocksize
            parts.append(block[max(lo - first, 0) : min(hi - first, len(block))])
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _get(self, key: tuple[Any, ...], load: Callable[[], Any], cached_only: bool) -> Any:
        return self.cache.get(key) if cached_only else self.cache.get_or_load(key, load)

    def _table(self, chunk: str) -> tuple[BloscHeader, list[tuple[int, int]]] | str:
        try:
            if self._whole_checked(chunk):
                raw = self._checked_chunk(chunk)
                h = parse_header(raw, len(raw))
                head = raw
            else:
                length = self.store.entry_size(chunk)
                if length is None:
                    return _UNSPLIT
                recorded = self._recorded_table(chunk, length)
                if recorded is not None:
                    return recorded
                # One read holds the header and a table of up to 1020 blocks (32 for a plane at
                # the default codec); a longer table takes a second.
                head = self.store.get_range(chunk, 0, min(length, _FIRST_READ))
                h = parse_header(head, length)
                if h is not None and not h.memcpyed and h.table_end > len(head):
                    head = self.store.get_range(chunk, 0, h.table_end)
                if self.store.digests is not None:  # a header now unsplit fails this too
                    end = h.table_end if h is not None else len(head)
                    table = memoryview(head)[:end]
                    self._check(chunk, table_key(chunk), "header and block table", table)
            if h is None:
                return _UNSPLIT
            if h.nbytes != self.spec.chunk_nbytes:
                raise BloscChunkError(
                    f"states {h.nbytes} decoded bytes, expected {self.spec.chunk_nbytes}"
                )
            return h, block_spans(h, head)
        except BloscChunkError as exc:
            raise CorruptArchiveError(f"{self.store.name}: chunk {chunk!r} {exc}") from None

    def _recorded_table(
        self, chunk: str, length: int
    ) -> tuple[BloscHeader, list[tuple[int, int]]] | None:
        """The header and table the digest map's layout entry keeps for `chunk` (and, told to
        the store, where its bytes start), when the entry is there and its table matches the
        table's digest: then a cold read of one block is one read of the archive, not two."""
        digests = self.store.digests
        layout = unpack_layout(digests.get(layout_key(chunk))) if digests is not None else None
        if layout is None or digests is None:
            return None
        table, data_offset = layout
        if xxhash.xxh3_64_intdigest(table) != digests.get(table_key(chunk)):
            return None  # a damaged index entry: read the table from the archive
        try:
            h = parse_header(table, length)
            if h is None or h.table_end != len(table) or h.nbytes != self.spec.chunk_nbytes:
                return None
            spans = block_spans(h, table)
        except BloscChunkError:
            return None  # the archive's own header then reports what is wrong with it
        if data_offset is not None:
            self.store.assume_data_offset(chunk, data_offset)
        return h, spans

    def _whole_checked(self, chunk: str) -> bool:
        """Whether this chunk's reads are checked by its whole-chunk digest (see the class)."""
        digests = self.store.digests
        return digests is not None and table_key(chunk) not in digests

    def _check(self, chunk: str, key: str, what: str, data: bytes | memoryview) -> None:
        digests = self.store.digests
        assert digests is not None
        want = digests.get(key)
        if want is None:
            raise CorruptArchiveError(
                f"{self.store.name}: chunk {chunk!r} {what} has no recorded digest "
                "(changed since indexed?)"
            )
        if xxhash.xxh3_64_intdigest(data) != want:
            raise CorruptArchiveError(
                f"{self.store.name}: chunk {chunk!r} {what} does not match its recorded xxh3 digest"
            )

    def _checked_chunk(self, chunk: str) -> bytes | memoryview:
        """The whole stored chunk, its digest checked by the store, cached for later blocks."""

        def load() -> bytes | memoryview:
            raw = self.store.get(chunk, compressed_bound(self.spec.chunk_nbytes))
            if raw is None:
                raise CorruptArchiveError(f"{self.store.name}: chunk {chunk!r} is missing")
            return raw

        return self.cache.get_or_load((self.key, "bc", chunk), load)  # type: ignore[no-any-return]

    def _blocks(
        self,
        chunk: str,
        h: BloscHeader,
        spans: list[tuple[int, int]],
        j: int,
        wanted: range,
        fetched: dict[int, memoryview],
    ) -> memoryview:
        """Block `j` decoded; the other blocks of `wanted` that are not cached yet are read in
        the same range read when their streams lie near j's in the chunk (within MERGE_GAP of
        each other, in stored order: one GET, not one per block) and left decoded in
        `fetched`."""
        what = f"{self.store.name}: chunk {chunk!r}"
        try:
            if self._whole_checked(chunk):
                whole = self._checked_chunk(chunk)
                self.cache.check_blocks(h.blocksize, what)
                with self.cache.decoding(h.blocksize, h.blocksize):
                    return memoryview(decode_blocks(h, spans, range(j, j + 1), whole))
            run = _near(spans, j, [
                k for k in wanted
                if k != j and k not in fetched
                and not self.cache.present_or_loading((self.key, "bb", chunk, k))
            ])  # fmt: skip
            lo, hi = min(spans[k][0] for k in run), max(spans[k][1] for k in run)
            data = self.store.get_range(chunk, lo, hi - lo)
            if self.store.digests is not None:
                view = memoryview(data)
                for k in run:
                    stream = view[spans[k][0] - lo : spans[k][1] - lo]
                    self._check(chunk, block_key(chunk, k), f"block {k}", stream)
            others = [k for k in run if k != j]
            # The blocks decode held against the decode gate, all of them: a chunk may state
            # blocks as large as its plane, and eight readers of 512 MiB blocks each decoded
            # one per 4 KiB read outside it, 3.1 GiB under a 64 MiB cache (red team 87).
            # Their room is lent from the cache meanwhile (each is cached on its own after).
            held = h.blocksize * len(run)
            self.cache.check_blocks(held, what)
            with self.cache.decoding(held, held):
                # Half the other blocks decode on the helper thread meanwhile, when it is idle
                # (a 4 KiB read across a block boundary decodes two blocks: ~0.3 ms each here,
                # one after the other before).
                helped = aside(_decode_each, h, spans, others[::2], data, lo) if others else None
                mine = others[1::2] if helped is not None else others
                fetched.update(_decode_each(h, spans, mine, data, lo))
                block = memoryview(decode_blocks(h, spans, range(j, j + 1), data, base=lo))
                if helped is not None:
                    fetched.update(helped.result())
            return block
        except BloscChunkError as exc:
            raise CorruptArchiveError(f"{self.store.name}: chunk {chunk!r} {exc}") from None


def _decode_each(
    h: BloscHeader, spans: list[tuple[int, int]], blocks: list[int], data: Any, base: int
) -> dict[int, memoryview]:
    return {k: memoryview(decode_blocks(h, spans, range(k, k + 1), data, base)) for k in blocks}


def _near(spans: list[tuple[int, int]], j: int, others: list[int]) -> list[int]:
    """Block `j` and those of `others` whose streams (`spans`: (start, end) in the chunk) join
    it in stored order with gaps of at most MERGE_GAP."""
    ordered = sorted([j, *others], key=lambda k: spans[k][0])
    at = ordered.index(j)
    first = last = at
    while first and spans[ordered[first]][0] - spans[ordered[first - 1]][1] <= MERGE_GAP:
        first -= 1
    while (
        last + 1 < len(ordered)
        and spans[ordered[last + 1]][0] - spans[ordered[last]][1] <= MERGE_GAP
    ):
        last += 1
    return ordered[first : last + 1]
