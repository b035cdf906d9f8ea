"""Hostile `.zarray` values in an image of an AcqStore collection: each is refused with a
reason (a DecantError naming what is wrong), or served; never another exception. Red team 50
F5 found tracebacks for zero or negative chunks, odd fill values and separators, and page
counts past what a TIFF's fields hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vfs.acqstore.ngff import inspect_image, open_full_resolution
from vfs.acqstore.synth_tiff import SynthesizedTiff, layout_for_image
from vfs.cache import PageCache
from vfs.errors import DecantError

BASE = {"zarr_format": 2, "fill_value": 0, "order": "C", "filters": None, "compressor": None}
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "pages_1e12": ({"shape": [10**12, 64, 64], "chunks": [1, 64, 64], "dtype": "<u2"}, "zyx"),
    "pages_2e62": ({"shape": [2**62, 4, 1, 1], "chunks": [1, 1, 1, 1], "dtype": "|u1"}, "tzyx"),
    "pages_2e64": ({"shape": [2**32, 2**32, 1, 1], "chunks": [1, 1, 1, 1], "dtype": "|u1"}, "tzyx"),
    "chunks_zero": ({"shape": [4, 64, 64], "chunks": [0, 0, 0], "dtype": "<u2"}, "zyx"),
    "chunks_negative": ({"shape": [4, 64, 64], "chunks": [-1, 64, 64], "dtype": "<u2"}, "zyx"),
    "chunks_huge": ({"shape": [4, 64, 64], "chunks": [2**40] * 3, "dtype": "<u2"}, "zyx"),
    "chunks_short": ({"shape": [2, 64, 64], "chunks": [1, 64], "dtype": "<u2"}, "zyx"),
    "chunks_tiny": ({"shape": [2, 4096, 4096], "chunks": [1, 1, 1], "dtype": "|u1"}, "zyx"),
    "chunks_float": ({"shape": [2, 64, 64], "chunks": [1.5, 64, 64], "dtype": "<u2"}, "zyx"),
    "fill_nan_int": (
        {"shape": [2, 64, 64], "chunks": [1, 64, 64], "dtype": "<u2", "fill_value": "NaN"},
        "zyx",
    ),
    "fill_huge_int": (
        {"shape": [2, 64, 64], "chunks": [1, 64, 64], "dtype": "<u2", "fill_value": 10**30},
        "zyx",
    ),
    "fill_str": (
        {"shape": [2, 64, 64], "chunks": [1, 64, 64], "dtype": "<u2", "fill_value": "abc"},
        "zyx",
    ),
    "separator_dotdot": (
        {"shape": [2, 64, 64], "chunks": [1, 64, 64], "dtype": "<u2", "dimension_separator": "../"},
        "zyx",
    ),
    "separator_slash": (
        {"shape": [2, 64, 64], "chunks": [1, 64, 64], "dtype": "<u2", "dimension_separator": "/"},
        "zyx",
    ),
    "fill_nan_float": (
        {"shape": [2, 64, 64], "chunks": [1, 64, 64], "dtype": "<f4", "fill_value": "NaN"},
        "zyx",
    ),
}
SERVED = {"separator_slash", "fill_nan_float", "pages_1e12"}  # valid zarr: zeros or NaN


def _image(root: Path, zarray: dict[str, Any], names: str) -> Path:
    img = root / "i.zarr"
    (img / "0").mkdir(parents=True)
    (img / ".zgroup").write_text('{"zarr_format": 2}')
    axes = [{"name": n, "type": {"t": "time", "c": "channel"}.get(n, "space")} for n in names]
    scale = [{"type": "scale", "scale": [1.0] * len(names)}]
    ms = {
        "version": "0.4",
        "axes": axes,
        "datasets": [{"path": "0", "coordinateTransformations": scale}],
    }
    (img / ".zattrs").write_text(json.dumps({"multiscales": [ms]}))
    (img / "0" / ".zarray").write_text(json.dumps({**BASE, **zarray}))
    return img


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_zarray_is_refused_with_a_reason_or_served(tmp_path: Path, case: str) -> None:
    img = _image(tmp_path, *CASES[case])
    try:
        image = inspect_image(img, tmp_path)
        layout = layout_for_image(image, name="i")
        array, release = open_full_resolution(image, tmp_path)
        try:
            tiff = SynthesizedTiff(layout, array, PageCache(64 << 20), ("t",))
            first = tiff.read(layout.data_offset, 64)
        finally:
            release()
    except DecantError as exc:
        assert case not in SERVED, exc
        assert str(exc)  # a reason
        return
    assert case in SERVED, f"{case} was served"
    assert len(first) == 64


def test_a_chunk_that_does_not_decode_is_named_by_its_path_in_src(tmp_path: Path) -> None:
    """Red team 50 F6: the log named `/proc/self/fd/20/0/0.0.5.0.0` (the image is held by a
    descriptor), which told the operator nothing."""
    zarray = {"shape": [2, 8, 8], "chunks": [1, 8, 8], "dtype": "<u2", "compressor": {"id": "zlib"}}
    img = _image(tmp_path, zarray, "zyx")
    (img / "0" / "1.0.0").write_bytes(b"not zlib at all")
    image = inspect_image(img, tmp_path)
    layout = layout_for_image(image, name="i")
    array, release = open_full_resolution(image, tmp_path)
    try:
        tiff = SynthesizedTiff(layout, array, PageCache(64 << 20), ("t",))
        with pytest.raises(DecantError) as caught:
            tiff.read(layout.data_offset + layout.plane_bytes, 16)
    finally:
        release()
    assert f"{img / '0' / '1.0.0'}: chunk does not decode" in str(caught.value)
