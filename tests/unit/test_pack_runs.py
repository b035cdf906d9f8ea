"""Small planes go to zarr in runs (vfs.decant.packer.plane_runs): every page lands at its own
coordinate, in every plane order, at every pyramid level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.cache import PageCache
from vfs.decant.layout import page_coordinate
from vfs.decant.packer import (
    RUN_BYTES,
    RUN_PAGES,
    SMALL_PLANE,
    PackOptions,
    pack_file,
    plane_runs,
    run_selection,
)
from vfs.decant.reader import DecantArchive


@settings(max_examples=300, deadline=None)
@given(
    leading=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    order=st.permutations("tzc"),
    plane=st.sampled_from([16, 1000, RUN_BYTES // 3, SMALL_PLANE - 1, SMALL_PLANE]),
)
def test_runs_cover_every_page_once_in_order_as_slices(
    leading: list[int], order: list[str], plane: int
) -> None:
    axes = order[: len(leading)]
    coords = [page_coordinate(i, leading, axes) for i in range(int(np.prod(leading)))]
    runs = plane_runs(coords, plane)
    assert [i for run in runs for i in run] == list(range(len(coords)))  # all, once, in order
    for run in runs:
        assert len(run) * plane <= max(RUN_BYTES, plane)
        assert len(run) <= RUN_PAGES
        if plane >= SMALL_PLANE:
            assert len(run) == 1
        if len(run) > 1:  # the selection names exactly the run's coordinates, in its order
            sel = run_selection([coords[i] for i in run])
            grid = np.zeros(leading, dtype=np.int64)
            grid[sel] = np.arange(1, len(run) + 1)
            assert [int(grid[coords[i]]) for i in run] == list(range(1, len(run) + 1))
            assert int((grid > 0).sum()) == len(run)


def test_a_run_of_one_pixel_pages_is_cut_by_page_count_not_bytes_alone() -> None:
    """30,000 one-byte planes are 29 KiB: by bytes alone one run, a single zarr assignment of
    30,000 chunks (~75 MiB of zarr tasks and buffers at its peak)."""
    coords = [(i,) for i in range(30_000)]
    runs = plane_runs(coords, 1)
    assert [len(r) for r in runs] == [RUN_PAGES] * (30_000 // RUN_PAGES) + [30_000 % RUN_PAGES]


@pytest.mark.parametrize("axes", ["TZCYX", "ZTCYX"])
def test_a_stack_of_small_planes_packs_byte_exact_with_its_pyramid(
    axes: str, tmp_path: Path
) -> None:
    """4 x 3 x 2 pages of 6 x 10: runs along the storage order, levels 1 and 2 the planes
    subsampled (nearest neighbour), level 0 each page at its coordinate."""
    rng = np.random.default_rng(5)
    data = rng.integers(0, 60000, (4, 3, 2, 6, 10), dtype=np.uint16)
    src = tmp_path / "small.ome.tif"
    tifffile.imwrite(src, data, metadata={"axes": axes}, ome=True)
    archive = tmp_path / "small.zarr.zip"
    pack_file(src, archive, PackOptions(pyramid=2))  # verified byte-exact before it returns
    with DecantArchive.open(archive) as arc:
        name = arc.manifest.original_name
        assert arc.open_original(name, PageCache(0)).read(0, src.stat().st_size) == src.read_bytes()
    store = zarr.storage.ZipStore(archive, mode="r")
    try:
        group = zarr.open_group(store, mode="r", zarr_format=2)
        level0 = np.asarray(group["0"][...])
        for level in (1, 2):
            step = 2**level
            assert np.array_equal(np.asarray(group[str(level)][...]),
                                  level0[..., ::step, ::step])  # fmt: skip
    finally:
        store.close()
    with tifffile.TiffFile(src) as tif:
        pages = np.stack([p.asarray() for p in tif.pages])
    assert sorted(map(bytes, level0.reshape(-1, 6, 10))) == sorted(map(bytes, pages))
