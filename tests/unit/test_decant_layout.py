"""Spec §5 geometry: page serialization against real TIFF bytes, and the plane-order permutation.

The oracles: files tifffile writes (their strips and tiles, trimmed of padding by the arithmetic
of §4b written out here), numpy reshapes, and numpy.transpose for the storage → canonical map.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import tifffile
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.decant.layout import (
    deserialize_page,
    page_coordinate,
    real_segments,
    serialize_page,
    storage_shape,
)
from vfs.decant.manifest import PageRecord

DTYPES = ["uint8", "uint16", "int16", "float32"]
RANK = {"t": 0, "c": 1, "z": 2}  # spec §5: time → channel/custom → space


def record(
    shape: tuple[int, ...],
    dtype: str,
    planar: int,
    rps: int = 0,
    tile: tuple[int, int] | None = None,
    segments: list[tuple[int, int]] | None = None,
) -> PageRecord:
    segs = segments or []
    return PageRecord(
        index=0,
        shape=shape,
        dtype=dtype,
        dataoffsets=tuple(o for o, _ in segs),
        databytecounts=tuple(c for _, c in segs),
        samplesperpixel=shape[2] if len(shape) == 3 else 1,
        planarconfig=planar,
        predictor=1,
        rowsperstrip=0 if tile else rps,
        tilewidth=tile[1] if tile else 0,
        tilelength=tile[0] if tile else 0,
    )


def expected_segments(page: Any) -> list[tuple[int, int]]:
    """Real-pixel (offset, count) of a tifffile page: strips cut to rows, tiles to real rows."""
    height, width, spp = page.imagelength, page.imagewidth, page.samplesperpixel
    px = page.dtype.itemsize * (1 if page.planarconfig == 2 else spp)
    out = []
    if not page.is_tiled:
        rps = min(page.rowsperstrip, height)
        per_plane = math.ceil(height / rps)
        for k, off in enumerate(page.dataoffsets):
            rows = min(rps, height - (k % per_plane) * rps)
            out.append((off, rows * width * px))
        return out
    tl, tw = page.tilelength, page.tilewidth
    grid = [(y, x) for y in range(0, height, tl) for x in range(0, width, tw)]
    for k, off in enumerate(page.dataoffsets):
        y, x = grid[k % len(grid)]
        rows, cols = min(tl, height - y), min(tw, width - x)
        if cols == tw:
            out.append((off, rows * tw * px))
        else:
            out.extend((off + r * tw * px, cols * px) for r in range(rows))
    return out


@st.composite
def tiff_pages(draw: st.DrawFn) -> dict[str, Any]:
    height, width = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    samples = draw(st.sampled_from([1, 2, 3]))
    planar = draw(st.sampled_from([1, 2])) if samples > 1 else 1
    tiled = draw(st.booleans())
    return {
        "height": height,
        "width": width,
        "samples": samples,
        "planar": planar,
        "dtype": draw(st.sampled_from(DTYPES)),
        "byteorder": draw(st.sampled_from("<>")),
        "tile": (draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32])))
        if tiled
        else None,
        "rps": draw(st.integers(1, height + 3)),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=60, deadline=None)
@given(p=tiff_pages())
def test_serialize_matches_tifffile_bytes(p: dict[str, Any]) -> None:
    rng = np.random.default_rng(p["seed"])
    shape = (p["height"], p["width"]) + ((p["samples"],) if p["samples"] > 1 else ())
    a = (rng.random(shape) * 250).astype(p["dtype"])
    data = np.moveaxis(a, 2, 0) if p["planar"] == 2 else a
    buf = io.BytesIO()
    kwargs: dict[str, Any] = {"tile": p["tile"]} if p["tile"] else {"rowsperstrip": p["rps"]}
    if p["samples"] > 1:
        kwargs["planarconfig"] = "separate" if p["planar"] == 2 else "contig"
    tifffile.imwrite(buf, data, photometric="minisblack", byteorder=p["byteorder"], **kwargs)
    raw = buf.getvalue()
    with tifffile.TiffFile(io.BytesIO(raw)) as tif:
        page = tif.pages.first
        assert page.shape[-2:] != () and page.samplesperpixel == p["samples"]
        segments = expected_segments(page)
        found = real_segments(
            shape,
            page.dtype.itemsize,
            page.planarconfig,
            page.rowsperstrip,
            (page.tilelength, page.tilewidth) if page.is_tiled else None,
            page.dataoffsets,
            page.databytecounts,
        )
        rps = page.rowsperstrip
    assert found == segments
    pixel_bytes = b"".join(raw[o : o + c] for o, c in segments)
    assert len(pixel_bytes) == a.nbytes == sum(c for _, c in found)

    file_dtype = np.dtype(p["dtype"]).newbyteorder(p["byteorder"])
    rec = record(shape, p["dtype"], p["planar"], min(rps, p["height"]), p["tile"], segments)
    assert bytes(serialize_page(a.astype(file_dtype), rec)) == pixel_bytes
    back = deserialize_page(pixel_bytes, rec, file_dtype)
    assert back.shape == a.shape
    assert np.array_equal(back, a)


@st.composite
def any_layout(draw: st.DrawFn) -> tuple[np.ndarray, PageRecord]:
    """Geometries tifffile would not write: tiles of any size, 4 samples, rps past the height."""
    height, width = draw(st.integers(1, 30)), draw(st.integers(1, 30))
    samples = draw(st.sampled_from([1, 2, 3, 4]))
    shape = (height, width) + ((samples,) if samples > 1 else ())
    dtype = draw(st.sampled_from([*DTYPES, ">u2", ">f4"]))
    a = np.arange(math.prod(shape), dtype=np.int64).reshape(shape).astype(dtype)
    planar = draw(st.sampled_from([1, 2]))
    tile = (draw(st.integers(1, 12)), draw(st.integers(1, 12))) if draw(st.booleans()) else None
    rps = draw(st.integers(1, height + 4))
    return a, record(shape, np.dtype(dtype).name, planar, rps, tile)


@settings(max_examples=150, deadline=None)
@given(case=any_layout())
def test_serialize_deserialize_round_trip(case: tuple[np.ndarray, PageRecord]) -> None:
    a, rec = case
    out = bytes(serialize_page(a, rec))
    assert len(out) == a.nbytes
    back = deserialize_page(out, rec, a.dtype)
    assert back.dtype == a.dtype and np.array_equal(back, a)


@settings(max_examples=60, deadline=None)
@given(case=any_layout(), wide=st.integers(0, 5))
def test_one_tile_column_serializes_like_a_strip(
    case: tuple[np.ndarray, PageRecord], wide: int
) -> None:
    """Tiles at least as wide as the image hold whole rows: the bytes are the untiled ones."""
    a, rec = case
    tiled = record(rec.shape, rec.dtype, rec.planarconfig, tile=(3, a.shape[1] + wide))
    a3 = a if a.ndim == 3 else a[:, :, None]
    expect = a3.tobytes() if rec.planarconfig == 1 else np.moveaxis(a3, 2, 0).tobytes()
    assert bytes(serialize_page(a, tiled)) == expect
    striped = record(rec.shape, rec.dtype, rec.planarconfig, rps=rec.rowsperstrip)
    assert bytes(serialize_page(a, striped)) == expect


def test_right_edge_tile_rows_leave_padding_out() -> None:
    """A 3x5 uint8 image in 4x4 tiles: the right tile contributes one byte per real row."""
    a = np.arange(15, dtype=np.uint8).reshape(3, 5)
    out = bytes(serialize_page(a, record((3, 5), "uint8", 1, tile=(4, 4))))
    assert out == bytes([0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 4, 9, 14])
    segments = real_segments((3, 5), 1, 1, 0, (4, 4), [100, 200], [16, 16])
    assert segments == [(100, 12), (200, 1), (204, 1), (208, 1)]  # full-width rows are one run


def test_real_segments_refuses_short_or_missing_blocks() -> None:
    assert real_segments((10, 4), 2, 1, 4, None, [0, 100, 200], [32, 32, 15]) is None
    assert real_segments((10, 4), 2, 1, 4, None, [0, 100], [32, 32]) is None
    assert real_segments((10, 4), 2, 1, 4, None, [0, 100, 200], [32, 32, 16]) == [
        (0, 32),
        (100, 32),
        (200, 16),
    ]


@st.composite
def stacks(draw: st.DrawFn) -> tuple[list[str], list[int]]:
    """A storage order over some of t/c/z (plus a custom axis), with sizes."""
    names = draw(
        st.lists(st.sampled_from(["t", "c", "z", "q"]), min_size=1, max_size=4, unique=True)
    )
    sizes = draw(st.lists(st.integers(1, 4), min_size=len(names), max_size=len(names)))
    return names, sizes


@settings(max_examples=150, deadline=None)
@given(case=stacks())
def test_page_coordinate_inverts_the_storage_permutation(case: tuple[list[str], list[int]]) -> None:
    names, sizes = case
    # Pages numbered in storage (C) order, then moved to canonical order by numpy itself.
    storage = np.arange(math.prod(sizes)).reshape(sizes)
    to_canonical = sorted(range(len(names)), key=lambda i: RANK.get(names[i], 1))
    canonical = storage.transpose(to_canonical)
    assert storage_shape(canonical.shape, names) == sizes
    seen = set()
    for index in range(storage.size):
        coord = page_coordinate(index, canonical.shape, names)
        assert canonical[coord] == index
        seen.add(coord)
    assert seen == set(np.ndindex(*canonical.shape))  # a bijection onto every plane


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_empty_plane_order_is_plain_unravel(sizes: list[int]) -> None:
    flat = np.arange(math.prod(sizes)).reshape(sizes)
    for index in range(flat.size):
        assert flat[page_coordinate(index, sizes, [])] == index


def test_imagej_tzc_example() -> None:
    """ImageJ TZC storage, canonical TCZ: page 5 is t=0, z=2, c=1 → canonical (0, 1, 2)."""
    assert page_coordinate(5, (2, 2, 3), ["t", "z", "c"]) == (0, 1, 2)
    assert page_coordinate(6, (2, 2, 3), ["t", "z", "c"]) == (1, 0, 0)
