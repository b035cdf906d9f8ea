"""vfs.decant.partial: the plane rows a range of a page's on-disk bytes needs, and the bytes
rebuilt from those rows alone, equal slicing serialize_page of the whole plane."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.decant.layout import serialize_page, tile_grid
from vfs.decant.manifest import PageRecord
from vfs.decant.partial import PageGeometry


@st.composite
def pages(draw: st.DrawFn) -> tuple[PageRecord, np.ndarray]:
    """A page of any layout: striped or tiled (edge tiles included), chunky or planar, 1-4
    samples, either byte order; and a plane of random pixels for it."""
    y, x = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    s = draw(st.integers(1, 4))
    dtype = np.dtype(draw(st.sampled_from(["u1", "<u2", ">u2", ">i4", "<f8"])))
    tiled = draw(st.booleans())
    tw = draw(st.sampled_from([1, 3, 16, 32])) if tiled else 0
    tl = draw(st.sampled_from([1, 3, 16, 32])) if tiled else 0
    page = PageRecord(
        index=0,
        shape=(y, x, s) if s > 1 else (y, x),
        dtype=dtype.name,
        dataoffsets=(),
        databytecounts=(),
        samplesperpixel=s,
        planarconfig=draw(st.sampled_from([1, 2])),
        predictor=1,
        rowsperstrip=draw(st.integers(1, y)),
        tilewidth=tw,
        tilelength=tl,
    )
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, y * x * s * dtype.itemsize, np.uint8)
    return page, raw.view(dtype).reshape(page.shape)


@settings(max_examples=400, deadline=None)
@given(pages(), st.data())
def test_extract_from_the_needed_rows_equals_the_serialized_slice(
    pair: tuple[PageRecord, np.ndarray], data: st.DataObject
) -> None:
    page, plane = pair
    whole = bytes(serialize_page(plane, page))
    geom = PageGeometry(page, plane.dtype.itemsize)
    assert geom.nbytes == len(whole)
    start = data.draw(st.integers(0, len(whole) - 1))
    stop = data.draw(st.integers(start + 1, len(whole)))
    r0, r1 = geom.rows_for(start, stop)
    assert 0 <= r0 < r1 <= plane.shape[0]
    rows = plane[r0:r1] if plane.ndim == 3 else plane[r0:r1, :, None]
    assert geom.extract(rows, r0, start, stop) == whole[start:stop]
    # Cut where pieces meet: the cuts follow one another over the range, each within a piece
    # (as many as the tiles and sample planes it touches), and None past `most`.
    cuts = geom.cuts(start, stop, 1 << 20)
    assert cuts is not None and cuts[0][0] == start and cuts[-1][1] == stop
    assert all(a < b for a, b in cuts)
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(cuts))
    s = page.shape[2] if len(page.shape) == 3 else 1
    planes = s if page.planarconfig == 2 and s > 1 else 1
    pieces = len(list(tile_grid(page))) if page.tilewidth else planes  # as serialize_page
    assert len(geom.cuts(0, len(whole), 1 << 20) or []) == pieces == geom.count
    if len(cuts) > 1:
        assert geom.cuts(start, stop, len(cuts) - 1) is None


def test_a_small_read_of_a_tall_striped_plane_needs_few_rows() -> None:
    page = PageRecord(0, (2048, 2048), "uint16", (), (), 1, 1, 1, 64, 0, 0)
    geom = PageGeometry(page, 2)
    assert geom.rows_for(4096 * 100 + 10, 4096 * 100 + 4106) == (100, 102)


def test_a_small_read_of_a_planar_tiled_plane_needs_the_tile_rows_it_touches() -> None:
    page = PageRecord(0, (512, 512, 3), "uint16", (), (), 3, 2, 1, 0, 256, 256)
    geom = PageGeometry(page, 2)
    tile = 256 * 256 * 2
    # Sample 1, second tile (top right), rows 10 and 11 of the tile.
    start = 4 * tile + tile + 10 * 512
    assert geom.rows_for(start, start + 1024) == (10, 12)
