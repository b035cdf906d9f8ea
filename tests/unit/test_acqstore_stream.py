"""A synthesized TIFF read front to back the way the mount reads it (1 MiB requests, read-ahead
between them, planes dropped behind the reader): the pixel bytes are those tifffile writes for
the same pixels, and the planes behind are released for reuse."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.toolbox import load_tool
from vfs.acqstore import synth_tiff
from vfs.acqstore.ngff import inspect_image, open_full_resolution
from vfs.acqstore.synth_tiff import SynthesizedTiff, layout_for_image
from vfs.cache import PageCache

REQUEST = 1 << 20


def _image(tmp_path: Path, planes: int, size: int) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(planes)
    data = (rng.integers(0, 40, (planes, size, size)) + np.arange(size)).astype(np.uint16)
    path = tmp_path / "img.zarr"
    load_tool("make_acqstore_corpus").write_ome_zarr(
        path, data, "zyx", [2.0, 0.5, 0.5], chunks=(1, size, size)
    )
    return path, data


def _stream(tiff: SynthesizedTiff) -> bytes:
    """Forward 1 MiB requests, each served from the cache when it can be, then a read-ahead in
    a worker when the tiff says one is needed (as vfs/mount/reads.py does; waited for here, so
    what is dropped does not depend on timing)."""
    out = bytearray()
    with ThreadPoolExecutor(1) as worker:
        while len(out) < tiff.size:
            off = len(out)
            got = tiff.read_cached(off, REQUEST)
            out += got if got is not None else tiff.read(off, REQUEST)
            if tiff.readahead_needed(len(out) - 1):
                worker.submit(tiff.readahead, len(out) - 1).result()
    return bytes(out)


def _plain_pixels(data: np.ndarray, tmp_path: Path) -> bytes:
    """The pixel bytes of every page of an ordinary TIFF tifffile writes for `data`."""
    plain = tmp_path / "plain.tif"
    tifffile.imwrite(plain, data, photometric="minisblack")
    raw = plain.read_bytes()
    with tifffile.TiffFile(plain) as tf:
        return b"".join(
            raw[o : o + n]
            for page in tf.pages
            for o, n in zip(page.dataoffsets, page.databytecounts, strict=True)
        )


@pytest.mark.parametrize("size", [256, 768])  # one strip per plane; two, the last short
def test_streamed_pixels_are_tifffiles_and_planes_behind_are_reused(
    size: int, tmp_path: Path
) -> None:
    path, data = _image(tmp_path, 12, size)
    image = inspect_image(path)
    array, release = open_full_resolution(image)
    plane = size * size * 2
    cache = PageCache(8 * plane)  # the image is larger than a quarter of it: drops behind
    with ThreadPoolExecutor(1) as decoders:
        tiff = SynthesizedTiff(
            layout_for_image(image), array, cache, ("img",), release, decoders.submit
        )
        raw = _stream(tiff)
        tiff.close()
    lay = tiff.layout
    assert raw[lay.data_offset :] == _plain_pixels(data, tmp_path)
    assert np.array_equal(tifffile.imread(io.BytesIO(raw)), data)
    kept = [p for p in range(lay.n_pages) if ("img", p) in cache]
    behind = lay.n_pages - 1 - synth_tiff.DROP_BEHIND - synth_tiff.READAHEAD_PLANES
    assert kept and min(kept) >= behind
    if plane >= cache.buffers.MIN_BYTES:  # smaller buffers are malloc's to recycle
        assert cache.buffers.reused > 0  # dropped planes' buffers decoded the planes ahead


def test_an_image_small_next_to_the_cache_is_kept_whole(tmp_path: Path) -> None:
    path, data = _image(tmp_path, 6, 128)
    image = inspect_image(path)
    array, release = open_full_resolution(image)
    cache = PageCache(64 << 20)
    tiff = SynthesizedTiff(layout_for_image(image), array, cache, ("img",), release)
    raw = _stream(tiff)
    tiff.close()
    assert np.array_equal(tifffile.imread(io.BytesIO(raw)), data)
    assert all(("img", p) in cache for p in range(6))
