"""What a TIFF's layout allows: mode D page records and plane order, or the reason for mode V."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import tifffile

from vfs.decant.layout import axis_rank, real_segments
from vfs.decant.limits import (
    MAX_CHUNK_BYTES,
    MAX_PAGES,
    MAX_SEGMENTS,
    PAGE_OVERHEAD,
    PAGES_OVERHEAD_FREE,
    SEGMENT_OVERHEAD,
    SEGMENTS_OVERHEAD_FREE,
    human,
)
from vfs.decant.manifest import PageRecord

_AXES = {"T": "t", "C": "c", "Z": "z"}


@dataclass(frozen=True)
class TiffLayout:
    """A TIFF that mode D can hold: its pages, in storage order, and how they stack."""

    byteorder: str
    dtype: np.dtype[Any]  # in file byte order
    page_shape: tuple[int, ...]  # (Y, X) or (Y, X, S)
    pages: tuple[PageRecord, ...]
    plane_order: tuple[str, ...]  # storage order of the leading axes
    storage_leading: tuple[int, ...]

    @property
    def canonical_leading(self) -> tuple[int, ...]:
        order = sorted(range(len(self.plane_order)), key=lambda i: axis_rank(self.plane_order[i]))
        return tuple(self.storage_leading[i] for i in order)

    @property
    def canonical_axes(self) -> tuple[str, ...]:
        return tuple(sorted(self.plane_order, key=axis_rank))

    @property
    def pixel_bytes(self) -> int:
        return sum(p.nbytes for p in self.pages)


class NotByteExact(Exception):
    """Why a file cannot be held in mode D."""


def scan_tiff(
    path: Path, size: int, max_plane: int = MAX_CHUNK_BYTES, max_segments: int = MAX_SEGMENTS
) -> TiffLayout:
    """Describe `path` for mode D, or raise NotByteExact saying why it needs mode V. A page
    of more than `max_plane` bytes needs mode V (a chunk holds one), and so does a file of
    more than `max_segments` strips/tiles (the daemon's bound: its cache's)."""
    try:
        with open(path, "rb") as fh:
            subifds = _check_declared(fh, max_segments)
        with tifffile.TiffFile(path) as tif:
            # Page by page, without keeping tifffile's page objects (a few KiB each: a hostile
            # file of 18-byte IFDs would cost ~40x its size), and no further than mode D's
            # bound (the reader's: mode D must stay readable).
            first, records = None, []
            offsets: set[int] = set()
            for i, page in enumerate(tif.pages):
                if i >= MAX_PAGES:
                    raise NotByteExact(f"more than the {MAX_PAGES} pages of mode D")
                # tifffile follows an IFD chain that loops back (a 216-byte file read as 2^18
                # pages: ~30 s, twice per publish, holding the pack worker for every user).
                if page.offset in offsets:
                    raise NotByteExact(f"page {i}'s IFD (at {page.offset}) is an earlier page's")
                offsets.add(page.offset)
                if first is None:
                    first = page
                record = _page_record(i, page, max_plane)  # type: ignore[arg-type]
                if records and (record.shape, record.dtype) != (records[0].shape, records[0].dtype):
                    raise NotByteExact("pages differ in shape or dtype")
                records.append(record)
                # Pages alike, `_check_overhead` of all of them refuses what this refuses of
                # the first n: said as soon as it is so, not after 200,000 records of 2x2 pages
                # (~0.9 KiB each: the daemon at cache + 160 MiB, 35 s of the pack worker for a
                # 34 MB file a user wrote in; red team 71, F2).
                if (
                    record.nbytes < PAGE_OVERHEAD
                    and len(records) * PAGE_OVERHEAD > PAGES_OVERHEAD_FREE
                ):
                    raise NotByteExact(
                        f"more than {len(records) - 1} pages of {human(record.nbytes)}: mode "
                        "D would cost more per page than its pixels"
                    )
            if first is None:
                raise NotByteExact("the TIFF has no pages")
            segments = sum(len(r.dataoffsets) for r in records)
            if segments > max_segments:
                raise NotByteExact(_too_many(segments, max_segments))
            _check_overhead(records)
            byteorder = tif.byteorder
            leading_axes, leading_shape = _leading(tif, len(records), subifds)
    except NotByteExact:
        raise
    except Exception as exc:  # tifffile raises many types on malformed input
        raise NotByteExact(
            f"not a TIFF tifffile can read ({exc.__class__.__name__}: {exc})"
        ) from None
    dtype = np.dtype(first.dtype.name)  # type: ignore[union-attr]
    dtype = dtype.newbyteorder(byteorder) if dtype.itemsize > 1 else dtype
    shape = records[0].shape
    _check_disjoint(records, size)
    return TiffLayout(byteorder, dtype, shape, tuple(records), leading_axes, leading_shape)


def _check_overhead(records: list[PageRecord]) -> None:
    """Mode V for many pages too tiny to carry mode D's cost per page (any user may write such
    a file in, and the pack worker is shared)."""
    pixels = sum(r.nbytes for r in records)
    if len(records) * PAGE_OVERHEAD > max(PAGES_OVERHEAD_FREE, pixels):
        raise NotByteExact(
            f"{len(records)} pages of {human(pixels // len(records))} on average: mode D "
            f"would cost more per page than its pixels"
        )
    _check_segments(sum(len(r.dataoffsets) for r in records), pixels)


def _too_many(segments: int, most: int, how: str = "") -> str:
    if most >= MAX_SEGMENTS:
        return f"{segments} strips/tiles{how}, more than the {MAX_SEGMENTS} of mode D"
    return (f"{segments} strips/tiles{how}, more than the {most} this daemon packs in mode D "
            "(each costs ~1 KiB to pack: the bound is half its cache's worth)")  # fmt: skip


def _check_segments(segments: int, pixels: int) -> None:
    """Mode V for many strips or tiles too small to carry mode D's cost per segment; `pixels`
    may be an upper bound (the file's size, before tifffile reads the pages)."""
    if segments * SEGMENT_OVERHEAD > max(SEGMENTS_OVERHEAD_FREE, pixels):
        raise NotByteExact(
            f"{segments} strips/tiles of {human(pixels // segments)} on average at most: mode "
            "D would cost more per strip or tile than its pixels"
        )


# StripOffsets (273) and TileOffsets (324) are the tags whose counts _check_declared sums, and
# their byte counts (279, 325): bounded as the strips/tiles are, not as other values.
_SEGMENT_TAGS = (273, 279, 324, 325)
_MAX_TAGS = 4096  # entries of one IFD: tifffile refuses more ("suspicious number of tags")
_MAX_ENTRIES = 64 * MAX_PAGES  # entries of every IFD together (a page has ~10-30)
# Values stored apart from their entries (too large for its value field), which tifffile reads
# for each page: numbers become Python ints in tuples (~36 bytes of memory per 2-byte SHORT),
# BYTE, ASCII and UNDEFINED values bytes or str. Entries of one IFD may all point at one blob,
# and IFDs of many pages at one too: a 4 MB file of 20 such entries took the daemon to 1.6 GiB,
# and a 9 MB one of 2,500 pages held the pack worker 3 minutes (red team 75). Bounded an IFD
# (what one page costs in memory) and for the chain (what reading every page costs), with an
# allowance a page past which a file goes as mode V (its bytes kept whole).
_BYTE_TYPES = (1, 2, 7)  # BYTE, ASCII, UNDEFINED: read as bytes or str
# Bytes a value of each TIFF type code takes (0: no such type), and numbers it is read as
# (RATIONAL and SRATIONAL: two).
_TYPE_SIZES_BY_CODE = np.array([0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8, 8, 8, 0])
_TYPE_NUMBERS_BY_CODE = np.array([1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1])
_UIC1TAG = 33628
_UIC1_ENTRY_NUMBERS = 32  # ~1 KiB an entry, against ~36 bytes a number
MAX_IFD_NUMBERS = 1 << 20
MAX_IFD_BYTES = 64 << 20
_PAGE_NUMBERS = 64  # what a page of a large file may hold in all (its resolutions, colour maps)
_PAGE_BYTES = 16 << 10  # (per-plane metadata as text: MicroManager's, a few KiB a page)
_SUBIFDS = 330  # the SubIFDs tag: offsets of more IFDs (a pyramid's lower resolutions)
# SubIFDs a file's series may parse (pyramid levels: a few per page); past this its axes are
# not asked of tifffile, which parses each one as a page (see _leading).
MAX_SERIES_SUBIFDS = 1 << 12


def _check_declared(fh: BinaryIO, max_segments: int = MAX_SEGMENTS) -> int:
    """Raise NotByteExact if the IFD chain declares more strips/tiles than mode D holds (or
    more pages), from the entries' headers alone, before tifffile reads any; else return the
    SubIFDs its pages declare, all told (as far as the walk went). tifffile keeps each
    page's offsets and byte counts as tuples of Python ints, ~21 bytes of memory per strip
    declared (1.3 GiB for a 512 MiB sparse file, 4 KiB on disk, declaring 2^26 one-row
    strips), all of it read before the pages' sum could be checked. What the walk reads is
    bounded too (_MAX_TAGS an IFD, _MAX_ENTRIES in all). A chain that loops or leaves the
    file, or an IFD tifffile refuses, ends the walk: tifffile then says what is wrong."""
    size = fh.seek(0, 2)  # the end: what the strips/tiles hold at most
    fh.seek(0)
    head = fh.read(16)
    order = {b"II": "<", b"MM": ">"}.get(head[:2])
    if order is None or len(head) < 8:
        return
    magic = struct.unpack(order + "H", head[2:4])[0]
    if magic == 42:
        count_fmt, next_fmt, count_type = "H", "I", "u4"
        offset = struct.unpack(order + "I", head[4:8])[0]
    elif magic == 43 and len(head) == 16:
        count_fmt, next_fmt, count_type = "Q", "Q", "u8"
        offset = struct.unpack(order + "Q", head[8:16])[0]
    else:
        return
    entry = np.dtype([("tag", order + "u2"), ("type", order + "u2"), ("count", order + count_type),
                      ("value", "V4" if magic == 42 else "V8")])  # fmt: skip
    count_size, next_size = struct.calcsize(count_fmt), struct.calcsize(next_fmt)
    seen: set[int] = set()
    declared = counted = entries = subifds = numbers = nbytes = 0
    while offset and offset not in seen:
        if len(seen) >= MAX_PAGES:
            raise NotByteExact(f"more than the {MAX_PAGES} pages of mode D")
        seen.add(offset)
        fh.seek(offset)
        raw = fh.read(count_size)
        if len(raw) != count_size:
            return subifds
        n = struct.unpack(order + count_fmt, raw)[0]
        if n > _MAX_TAGS:
            return subifds
        entries += n
        if entries > _MAX_ENTRIES:
            raise NotByteExact(f"its IFDs hold more than the {_MAX_ENTRIES} entries of mode D")
        table = fh.read(n * entry.itemsize + next_size)
        if len(table) != n * entry.itemsize + next_size:
            return subifds
        tags = np.frombuffer(table, entry, n)
        codes = tags["tag"]
        # Python ints: BigTIFF counts summed as uint64 could wrap past the bound.
        declared += sum(map(int, tags["count"][(codes == 273) | (codes == 324)]))
        counted += sum(map(int, tags["count"][(codes == 279) | (codes == 325)]))
        if max(declared, counted) > max_segments:
            raise NotByteExact(_too_many(max(declared, counted), max_segments, " declared"))
        # Before tifffile reads them (its offsets alone took ~320 MB for 2 million strips):
        # the file's size bounds what they hold.
        _check_segments(max(declared, counted), size)
        subifds += sum(map(int, tags["count"][codes == _SUBIFDS]))
        ifd_numbers, ifd_bytes = _values_apart(tags, 4 if magic == 42 else 8)
        if ifd_numbers > MAX_IFD_NUMBERS or ifd_bytes > MAX_IFD_BYTES:
            raise NotByteExact(
                f"IFD {len(seen)}'s tag values: {ifd_numbers} numbers and {human(ifd_bytes)}; "
                f"mode D reads up to {MAX_IFD_NUMBERS} and {human(MAX_IFD_BYTES)} of a page"
            )
        numbers, nbytes = numbers + ifd_numbers, nbytes + ifd_bytes
        if numbers > MAX_IFD_NUMBERS + _PAGE_NUMBERS * len(seen) or (
            nbytes > MAX_IFD_BYTES + _PAGE_BYTES * len(seen)
        ):
            raise NotByteExact(
                f"the tag values of its first {len(seen)} IFDs: {numbers} numbers and "
                f"{human(nbytes)}, more than mode D reads for so many pages"
            )
        offset = struct.unpack_from(order + next_fmt, table, n * entry.itemsize)[0]
    return subifds


def _page_record(index: int, page: tifffile.TiffPage, max_plane: int) -> PageRecord:
    if page.compression != 1:
        raise NotByteExact(f"page {index} is compressed ({page.compression.name})")
    if int(page.predictor) != 1:
        raise NotByteExact(f"page {index} uses predictor {int(page.predictor)}")
    if page.imagedepth != 1 or page.tiledepth not in (0, 1):
        raise NotByteExact(f"page {index} is a volumetric (SGI) image")
    if page.dtype is None or page.dtype.kind not in "uif" or page.fillorder != 1:
        raise NotByteExact(f"page {index} has a sample format mode D does not serialize")
    if page.bitspersample != page.dtype.itemsize * 8:
        raise NotByteExact(f"page {index} has {page.bitspersample}-bit samples")
    y, x, s = page.imagelength, page.imagewidth, page.samplesperpixel
    if min(y, x, s) < 1:  # no plane to hold: the manifest's own check refuses an empty axis
        raise NotByteExact(f"page {index} has an empty axis ({y} x {x} x {s})")
    shape = (y, x) if s == 1 else (y, x, s)
    if y * x * s * page.dtype.itemsize > min(max_plane, MAX_CHUNK_BYTES):
        bound = min(max_plane, MAX_CHUNK_BYTES)
        raise NotByteExact(f"page {index} is larger than the {human(bound)} of a chunk")
    tile = (page.tilelength, page.tilewidth) if page.is_tiled else None
    segments = real_segments(
        shape,
        page.dtype.itemsize,
        page.planarconfig,
        page.rowsperstrip,
        tile,
        page.dataoffsets,
        page.databytecounts,
    )
    if segments is None:
        raise NotByteExact(f"page {index} has strips or tiles shorter than its pixels")
    return PageRecord(
        index=index,
        shape=shape,
        dtype=page.dtype.name,
        dataoffsets=tuple(o for o, _ in segments),
        databytecounts=tuple(c for _, c in segments),
        samplesperpixel=s,
        planarconfig=int(page.planarconfig),
        predictor=1,
        rowsperstrip=0 if tile else min(page.rowsperstrip or y, y),
        tilewidth=tile[1] if tile else 0,
        tilelength=tile[0] if tile else 0,
    )


def _values_apart(tags: np.ndarray[Any, Any], field: int) -> tuple[int, int]:
    """(numbers, bytes) of the values of an IFD's entries stored apart from it (larger than
    `field`, the entry's value field), strips and tiles left out (bounded as such). In float64:
    BigTIFF counts are 64-bit, and a bound needs no exact sum of such."""
    kinds = np.minimum(tags["type"], len(_TYPE_SIZES_BY_CODE) - 1)
    counts = tags["count"].astype(np.float64)
    sizes = _TYPE_SIZES_BY_CODE[kinds] * counts  # an unknown type (size 0): tifffile skips it
    # MetaMorph's UIC1tag: tifffile reads `count` entries at the value's offset whatever its
    # type and size, each into a dict of up to two 255-character strings (~1 KiB): 2^20 of
    # them took the daemon to 1 GiB (red team 77, F1a). Counted as that many numbers each.
    expanded = tags["tag"] == _UIC1TAG
    apart = (sizes > field) & ~np.isin(tags["tag"], _SEGMENT_TAGS) & ~expanded
    as_bytes = np.isin(kinds, _BYTE_TYPES)
    numbers = (counts * _TYPE_NUMBERS_BY_CODE[kinds])[apart & ~as_bytes].sum()
    numbers += counts[expanded].sum() * _UIC1_ENTRY_NUMBERS
    return int(min(numbers, 2**63)), int(min(sizes[apart & as_bytes].sum(), 2**63))


def _leading(
    tif: tifffile.TiffFile, n_pages: int, subifds: int
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Storage-order leading axes from the file's one series (ImageJ, OME, or the shape
    tifffile wrote), else a flat z stack.

    Any other file's series is tifffile's generic or uniform one, whose axes (I, then the
    page's) give a flat stack here anyway, and the generic one compares each page with every
    earlier one of its shape and parses every SubIFD as a page: a 4 MB file declaring 2^20
    SubIFDs held the pack worker, which every user's files share, for over 30 minutes, and a
    SIGTERM waited for it (red team 56). Those are not asked for; nor is a series of more
    SubIFDs than MAX_SERIES_SUBIFDS."""
    flat = (("z",), (n_pages,))
    named = tif.is_imagej or tif.is_ome or tif.is_shaped
    if not named or subifds > MAX_SERIES_SUBIFDS or not _declares_at_most(tif, n_pages):
        return flat
    if len(tif.series) != 1 or len(tif.series[0].pages) != n_pages:
        return flat
    series = tif.series[0]
    axes, shape = [], []
    for letter, n in zip(series.axes, series.shape, strict=True):
        if letter in "YXS":
            continue
        if letter not in _AXES:
            return flat
        axes.append(_AXES[letter])
        shape.append(n)
    if not axes or len(set(axes)) != len(axes) or math.prod(shape) != n_pages:
        return flat
    return tuple(axes), tuple(shape)


# What an OME-XML may not hold for its series to be asked of tifffile: a companion metadata
# file, Modulo axes (their sizes come from the XML too). Nor may it name another file (a UUID
# not its own): tifffile opens it, relative to the file's folder (in the daemon that folder is
# /proc/self/fd: "0" would be its stdin).
_OME_REFUSED = ("BinaryOnly", "Modulo")
# Past these, a file's metadata is not parsed for its axes: it is packed as a flat z stack
# (its bytes and description kept as they are). An OME-XML's elements and attributes: ~20 a
# plane (a Plane, a TiffData, a UUID and their attributes), so 32 a page are allowed besides,
# up to ~200 MiB of ElementTree.
MAX_OME_ITEMS = 1 << 16
OME_ITEMS_A_PAGE = 32
MAX_OME_ITEMS_IN_ALL = 1 << 21
MAX_DESCRIPTION = 1 << 20  # characters of a shaped or ImageJ description, bytes of IJMetadata
_OME_COUNTS = ("SizeZ", "SizeC", "SizeT", "PlaneCount", "IFD", "FirstZ", "FirstC", "FirstT")


def _declares_at_most(tif: tifffile.TiffFile, n_pages: int) -> bool:
    """Whether the file's own metadata declares no more planes than it has pages. tifffile
    builds its series from what the metadata declares: a 4.7 KB OME-TIFF declaring 10^8 planes
    made it allocate 1.6 GB (10^9: past 6 GB), in the daemon, as root (red team 56)."""
    page = tif.pages.first
    try:
        if tif.is_ome:
            return _ome_at_most(tif.ome_metadata or "", n_pages)
        if tif.is_imagej:
            if not _small_imagej(page):
                return False
            ij = tif.imagej_metadata or {}
            counts = [int(ij.get(k, 1)) for k in ("images", "channels", "slices", "frames")]
            return all(0 < c <= n_pages for c in counts) and math.prod(counts[1:]) <= n_pages
        description = page.shaped_description
        if description is None or len(description) > MAX_DESCRIPTION:
            return False
        shape = [int(n) for n in tifffile.shaped_description_metadata(description)["shape"]]
        pixels = math.prod(page.shape) or 1
        return all(n > 0 for n in shape) and math.prod(shape) <= n_pages * pixels
    except (ValueError, TypeError, KeyError, AttributeError):
        return False


def _small_imagej(page: tifffile.TiffPage) -> bool:
    """Whether the ImageJ metadata tifffile parses for the series (its description, and the
    IJMetadata tag's labels, ranges, LUTs and ROIs) is small enough to be parsed."""
    description = page.imagej_description or ""
    extra = page.tags.get(50839)  # IJMetadata
    return len(description) <= MAX_DESCRIPTION and (
        extra is None or extra.valuebytecount <= MAX_DESCRIPTION
    )


def _ome_at_most(xml: str, n_pages: int) -> bool:
    from xml.etree import ElementTree  # expat refuses entity expansion bombs

    if any(word in xml for word in _OME_REFUSED):
        return False
    # ElementTree (here, and tifffile's for the series) keeps every element (~200 bytes) and
    # attribute: an OME-XML of 4 million empty elements (16 MB) took the daemon to 895 MiB
    # (red team 75), one of 3 million attributes on one element to 1 GiB (red team 77).
    items = xml.count("<") + xml.count("=")
    if items > min(MAX_OME_ITEMS + OME_ITEMS_A_PAGE * n_pages, MAX_OME_ITEMS_IN_ALL):
        return False
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError:
        return False
    own = root.attrib.get("UUID")
    for element in root.iter():
        if element.tag.rpartition("}")[2] == "UUID" and (element.text or "").strip() != own:
            return False
        planes = 1
        for name in _OME_COUNTS:
            value = element.attrib.get(name)
            if value is None:
                continue
            count = int(value)
            if not 0 <= count <= n_pages:
                return False
            if name.startswith("Size"):
                planes *= count
        if planes > n_pages:
            return False
    return True


def _check_disjoint(records: list[PageRecord], size: int) -> None:
    segments = sorted(
        (o, c) for r in records for o, c in zip(r.dataoffsets, r.databytecounts, strict=True) if c
    )
    end = 0
    for off, cnt in segments:
        if off < end:
            raise NotByteExact("pixel segments overlap (shared or sparse strips)")
        end = off + cnt
    if end > size:
        raise NotByteExact("pixel segments run past the end of the file")
