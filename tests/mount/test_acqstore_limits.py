"""A synthesized TIFF whose planes do not fit a quarter of the page cache is refused with the
reason, through a real mount; the same collection under a larger cache serves it byte-exact.

Red team 50 F1: such a plane was decoded whole for every read and never kept (a 29 KB `.zarray`
of 1 GiB planes: 59 s and 1.1 GiB of memory for ten small reads)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

from tests.mount.test_acqstore_mount import Corpus, _full_resolution, corpus  # noqa: F401

STACK = "coll/members/Stack 2/Stack 2.tif"  # czyx 2x3x300x1800 uint16: 1.08 MB planes


def test_planes_over_a_quarter_of_the_cache_are_refused_with_the_reason(
    corpus: Corpus,  # noqa: F811
    tmp_path: Path,
    make_mount: Any,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(corpus.template, src / "coll")
    small = make_mount(src, "--cache-size", "4M", name="small")  # a quarter: 1 MiB
    with pytest.raises(OSError) as caught:
        (small.mnt / STACK).read_bytes()
    assert caught.value.errno == errno.EOPNOTSUPP  # as for every image it cannot present
    text = small.log_text()
    assert "planes of 1.02997 MiB are larger than a quarter of the 4 MiB page cache" in text
    assert "--cache-size" in text and "stack.zarr" in text
    small.stop()
    large = make_mount(src, "--cache-size", "8M", name="large")
    data, axes, _scale = _full_resolution(src / "coll" / "images" / "stack.zarr")
    with tifffile.TiffFile(large.mnt / STACK) as tif:  # in the series' own axis order
        series = tif.series[0]
        order = [axes.index(letter.lower()) for letter in series.axes]
        np.testing.assert_array_equal(series.asarray(), data.transpose(order))
