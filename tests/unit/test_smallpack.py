"""The direct small-TIFF archive writer against the zarr-python path it stands in for."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.reader import DecantArchive
from vfs.decant.smallpack import fits, pack_small
from vfs.decant.tiffscan import scan_tiff
from vfs.decant.verify import private_cache, require_verified, verify_archive
from vfs.decant.writer import CodecChoice
from vfs.errors import IntegrityError

RNG = np.random.default_rng(12)
CASES: dict[str, tuple[np.ndarray[Any, Any], dict[str, Any]]] = {
    "u16": (RNG.integers(0, 4096, (128, 80), dtype=np.uint16), {}),
    "u16-big-endian": (RNG.integers(0, 4096, (64, 50), dtype=np.uint16), {"byteorder": ">"}),
    "rgb": (RNG.integers(0, 255, (30, 40, 3), dtype=np.uint8), {"photometric": "rgb"}),
    "planar-rgb": (
        RNG.integers(0, 255, (3, 20, 20), dtype=np.uint8),
        {"photometric": "rgb", "planarconfig": "separate"},
    ),
    "f32": (RNG.random((20, 30), dtype=np.float32), {}),
    "f64": (RNG.random((10, 10)), {}),
    "i16-stack": (RNG.integers(-100, 100, (5, 16, 16), dtype=np.int16), {}),
    "tiled": (RNG.integers(0, 4096, (100, 70), dtype=np.uint16), {"tile": (32, 32)}),
    "zeros": (np.zeros((8, 8), dtype=np.uint32), {}),
}


def both(tmp_path: Path, case: str) -> tuple[Path, Path, Path]:
    """The TIFF, its archive by the zarr path and by the direct writer."""
    data, kwargs = CASES[case]
    source = tmp_path / f"{case}.tif"
    tifffile.imwrite(source, data, **kwargs)
    by_zarr, direct = tmp_path / "zarr.zarr.zip", tmp_path / f"{case}.tif.zarr.zip"
    pack_file(source, by_zarr, PackOptions())
    raw = source.read_bytes()
    layout = scan_tiff(source, len(raw))
    assert fits(len(raw), layout, 0)
    pack_small(source.name, raw, layout, direct, CodecChoice())
    return source, by_zarr, direct


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_member_is_what_the_zarr_path_writes(tmp_path: Path, case: str) -> None:
    _source, by_zarr, direct = both(tmp_path, case)
    with zipfile.ZipFile(by_zarr) as za, zipfile.ZipFile(direct) as zb:
        # Same names (zarr writes a stack's planes from a thread pool: in any order).
        assert sorted(za.namelist()) == sorted(zb.namelist())
        for b in zb.infolist():
            a = za.getinfo(b.filename)
            assert za.read(a) == zb.read(b), a.filename
            assert (b.compress_type, b.external_attr) == (zipfile.ZIP_STORED, a.external_attr)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_ordinary_reader_and_zarr_read_it_back(tmp_path: Path, case: str) -> None:
    source, _by_zarr, direct = both(tmp_path, case)
    original = source.read_bytes()
    require_verified(direct)
    assert all(v.ok for v in verify_archive(direct))
    with DecantArchive.open(direct) as archive:
        (info,) = archive.originals()
        assert info.size == len(original) and info.relpath == source.name
        reader = archive.open_original(info.relpath, private_cache(archive))
        assert bytes(reader.read(0, len(original))) == original
    import zarr
    import zarr.storage

    pixels = tifffile.imread(source)
    group = zarr.open_group(zarr.storage.ZipStore(direct, mode="r"), mode="r", zarr_format=2)
    stored = np.asarray(group["0"][...])
    if CASES[case][1].get("planarconfig") == "separate":
        pixels = np.moveaxis(pixels, 0, -1)  # samples stay last in the archive
    assert np.array_equal(stored.reshape(pixels.shape), pixels)
    assert group.attrs["decant"]["husk"] == "husk"


def test_an_archive_that_does_not_reconstruct_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate runs: a wrong husk chunk fails verification, nothing is returned as good."""
    from vfs.decant import smallpack

    data, _kw = CASES["u16"]
    source = tmp_path / "a.tif"
    tifffile.imwrite(source, data)
    raw = source.read_bytes()
    real = smallpack._husk

    def wrong(data: bytes, layout: Any, husk_size: int) -> list[tuple[str, bytes]]:
        flipped = bytes([data[0] ^ 1]) + data[1:]
        return real(flipped, layout, husk_size)

    monkeypatch.setattr(smallpack, "_husk", wrong)
    with pytest.raises(IntegrityError):
        pack_small(source.name, raw, scan_tiff(source, len(raw)), tmp_path / "a.zarr.zip",
                   CodecChoice())  # fmt: skip


def test_large_files_and_pyramids_take_the_zarr_path(tmp_path: Path) -> None:
    source = tmp_path / "a.tif"
    tifffile.imwrite(source, CASES["u16"][0])
    layout = scan_tiff(source, source.stat().st_size)
    assert fits(source.stat().st_size, layout, 0)
    assert not fits(5 << 20, layout, 0)
    assert not fits(source.stat().st_size, layout, 1)
