"""The offset → region index: coverage without gaps or overlaps, and reads equal to slicing.

Each case is a random "original" with random pixel segments cut out of it: a page's serialized
bytes are its segments' bytes in its own list order (not necessarily file order, as §5 allows), the
husk is what remains (§4). Reading through the index must give back the original's bytes.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.decant import regions
from vfs.decant.manifest import PageRecord
from vfs.decant.regions import HUSK, RegionIndex
from vfs.errors import ManifestError


def page(index: int, segments: list[tuple[int, int]]) -> PageRecord:
    return PageRecord(
        index=index,
        shape=(1, max(1, sum(c for _, c in segments))),
        dtype="uint8",
        dataoffsets=tuple(o for o, _ in segments),
        databytecounts=tuple(c for _, c in segments),
        samplesperpixel=1,
        planarconfig=1,
        predictor=1,
        rowsperstrip=1,
        tilewidth=0,
        tilelength=0,
    )


@dataclass
class Case:
    original: bytes
    pages: list[PageRecord]
    page_bytes: dict[int, bytes]
    husk: bytes


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_pages = draw(st.integers(0, 4))
    pieces = draw(
        st.lists(st.tuples(st.integers(0, 12), st.integers(0, 10)), max_size=14 if n_pages else 0)
    )
    tail = draw(st.integers(0, 12))
    placed: list[tuple[int, int]] = []
    cur = 0
    for gap, length in pieces:
        placed.append((cur + gap, length))
        cur += gap + length
    size = cur + tail
    original = np.random.default_rng(draw(st.integers(0, 2**16))).bytes(size)
    owner = [draw(st.integers(0, n_pages - 1)) for _ in placed]
    # Page indices need not be 0..n-1 in order, and a page's segment list need not be in file order.
    indices = draw(st.permutations(range(10, 10 + n_pages)))
    pages, page_bytes = [], {}
    keep = np.ones(size, dtype=bool)
    for k in range(n_pages):
        segs = draw(st.permutations([s for s, o in zip(placed, owner, strict=True) if o == k]))
        pages.append(page(indices[k], segs))
        page_bytes[indices[k]] = b"".join(original[o : o + c] for o, c in segs)
        for o, c in segs:
            keep[o : o + c] = False
    husk = np.frombuffer(original, dtype=np.uint8)[keep].tobytes()
    return Case(original, list(draw(st.permutations(pages))), page_bytes, husk)


def read(index: RegionIndex, case: Case, offset: int, size: int) -> bytes:
    parts = []
    for region, inner, n in index.spans(offset, size):
        assert 0 <= inner < region.length and 0 < n <= region.length - inner
        if region.page == HUSK:
            parts.append(case.husk[region.pos + inner : region.pos + inner + n])
        else:
            start = region.pos + inner
            parts.append(case.page_bytes[region.page][start : start + n])
    return b"".join(parts)


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_regions_cover_the_file_exactly(case: Case) -> None:
    size = len(case.original)
    index = RegionIndex.build(case.pages, size, len(case.husk), "x.zarr.zip")
    cur = husk_pos = 0
    for region in index:
        assert region.start == cur and region.length > 0  # no gap, no overlap, nothing empty
        if region.page == HUSK:
            assert region.pos == husk_pos
            husk_pos += region.length
        cur += region.length
    assert cur == size and husk_pos == len(case.husk)
    pixel = [(r.start, r.length, r.page, r.pos) for r in index if r.page != HUSK]
    segments = []
    for p in case.pages:
        pos = 0
        for o, c in zip(p.dataoffsets, p.databytecounts, strict=True):
            if c:
                segments.append((o, c, p.index, pos))
            pos += c
    # A segment going on where the last ended, in the file and in its page's bytes, joins it.
    expected: list[tuple[int, int, int, int]] = []
    for o, c, owner, pos in sorted(segments):
        if expected:
            lo, lc, li, lp = expected[-1]
            if o == lo + lc and owner == li and pos == lp + lc:
                expected[-1] = (lo, lc + c, li, lp)
                continue
        expected.append((o, c, owner, pos))
    assert pixel == expected
    assert read(index, case, 0, size) == case.original


@settings(max_examples=150, deadline=None)
@given(case=cases(), data=st.data())
def test_spans_equal_slicing(case: Case, data: st.DataObject) -> None:
    size = len(case.original)
    index = RegionIndex.build(case.pages, size, len(case.husk), "x.zarr.zip")
    for _ in range(5):
        offset = data.draw(st.integers(0, size + 5))
        length = data.draw(st.integers(0, size + 5))
        assert read(index, case, offset, length) == case.original[offset : offset + length]


@settings(max_examples=100, deadline=None)
@given(case=cases())
def test_next_page_after(case: Case) -> None:
    """The read-ahead target: the first page after the region holding `offset`, not its own."""
    size = len(case.original)
    index = RegionIndex.build(case.pages, size, len(case.husk), "x.zarr.zip")
    regions = list(index)
    for i, region in enumerate(regions):
        later = [r.page for r in regions[i + 1 :] if r.page not in (HUSK, region.page)]
        want = later[0] if later else None
        for offset in {region.start, region.start + region.length - 1}:
            assert index.next_page_after(offset) == want
    assert index.next_page_after(size) is None
    assert index.next_page_after(-1) is None


def test_empty_original() -> None:
    index = RegionIndex.build([], 0, 0, "x")
    assert list(index) == [] and list(index.spans(0, 10)) == []


def test_overlapping_segments_are_refused() -> None:
    pages = [page(0, [(10, 20)]), page(1, [(25, 5)])]
    with pytest.raises(ManifestError, match=r"bad\.zarr\.zip.*overlap"):
        RegionIndex.build(pages, 100, 75, "bad.zarr.zip")


def test_segments_past_the_end_are_refused() -> None:
    with pytest.raises(ManifestError, match=r"bad\.zarr\.zip.*past original_size"):
        RegionIndex.build([page(0, [(90, 20)])], 100, 80, "bad.zarr.zip")


def test_husk_size_must_match_the_layout() -> None:
    with pytest.raises(ManifestError, match=r"bad\.zarr\.zip.*husk"):
        RegionIndex.build([page(0, [(10, 20)])], 100, 79, "bad.zarr.zip")


def test_a_negative_offset_is_einval_like_pread() -> None:
    index = RegionIndex.build([page(0, [(10, 20)])], 100, 80, "x")
    with pytest.raises(OSError) as info:
        list(index.spans(-5, 10))
    assert info.value.errno == errno.EINVAL


def test_read_cached_serves_only_what_is_decoded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """read_cached never decodes: None until a read has cached the page, then the same bytes."""
    import numpy as np
    import tifffile

    from vfs.cache import PageCache
    from vfs.decant.packer import pack_file
    from vfs.decant.reader import DecantArchive

    data = np.arange(4 * 64 * 80, dtype=np.uint16).reshape(4, 64, 80)
    tifffile.imwrite(tmp_path / "s.tif", data, photometric="minisblack")
    original = (tmp_path / "s.tif").read_bytes()
    pack_file(tmp_path / "s.tif", tmp_path / "s.zarr.zip")
    with DecantArchive.open(tmp_path / "s.zarr.zip") as archive:
        reader = archive.open_original("", PageCache(1 << 24))
        middle = len(original) // 2
        assert reader.read_cached(middle, 4096) is None
        assert reader.read(middle, 4096) == original[middle : middle + 4096]
        assert reader.read_cached(middle, 4096) == original[middle : middle + 4096]
        assert reader.read_cached(0, len(original)) is None  # other pages were never decoded


def test_segments_whose_ends_would_wrap_64_bits_are_refused() -> None:
    """numpy's int64 sums wrap past 2^63 where Python's ints did not: refused before any sum."""
    pages = [page(0, [(2**63 - 16, 8)]), page(1, [(2**62, 2**62)])]
    with pytest.raises(ManifestError, match=r"bad\.zarr\.zip.*past original_size"):
        RegionIndex.build(pages, 100, 50, "bad.zarr.zip")


@pytest.mark.parametrize("small", [8192, 0])
@pytest.mark.parametrize("base", [0, 2**31 - 64, 2**31 - 50, 2**32 + 8])
def test_offsets_on_either_side_of_32_bits(
    base: int, small: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Originals under 2 GiB keep 32-bit columns (half the memory); larger ones 64-bit, and
    every offset comes back exact on both sides of the line, from the lists of a small index
    and from the columns of a large one."""
    monkeypatch.setattr(regions, "SMALL_INDEX", small)
    size = base + 50
    index = RegionIndex.build(
        [page(0, [(base + 10, 5), (base + 30, 7)]), page(1, [(base + 20, 3)])],
        size, size - 15, "x.zarr.zip",
    )  # fmt: skip
    expected = [
        (0, base + 10, HUSK, 0),
        (base + 10, 5, 0, 0),
        (base + 15, 5, HUSK, base + 10),
        (base + 20, 3, 1, 0),
        (base + 23, 7, HUSK, base + 15),
        (base + 30, 7, 0, 5),
        (base + 37, 13, HUSK, base + 22),
    ]
    assert [(r.start, r.length, r.page, r.pos) for r in index] == expected
    assert [(r.start, r.length, r.page, r.pos) for r in index[:]] == expected
    for i, (start, length, _page, _pos) in enumerate(expected):
        assert index.locate(start) == index.locate(start + length - 1) == i
    starts, ends, pages, pos = index.columns(0, len(expected) - 1)
    assert starts.tolist() == [e[0] for e in expected]
    assert (ends - starts).tolist() == [e[1] for e in expected]
    assert pages.tolist() == [e[2] for e in expected] and pos.tolist() == [e[3] for e in expected]
    assert index._starts.itemsize == index._pos.itemsize == (4 if size < 2**31 else 8)
