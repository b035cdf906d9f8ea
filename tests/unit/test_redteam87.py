"""Red team 87: archives that make one decode hold far more than the cache.

F1: a chunk stating one blosc block the size of its plane: every small read of a plane larger
than a quarter of the cache decoded that whole block outside the decode gate (eight readers of
512 MiB blocks: 3.1 GiB under a 64 MiB cache). F2: husk blocks of the format's 64 MiB decoded
outside the gate too. Now every decode passes the gate, and one past the bound is refused.
"""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
from numcodecs import Blosc

from vfs.cache import DECODE_FLOOR, PageCache
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.reader import DecantArchive
from vfs.errors import DecodeTooLargeError

SIDE = 8800  # a uint8 plane of ~74 MiB: past the 64 MiB one decode may hold under a small cache


def _plane_archive(tmp_path: Path, one_block: bool) -> tuple[Path, bytes]:
    tif = tmp_path / "big.tif"
    plane = np.zeros((SIDE, SIDE), np.uint8)
    plane[::97, ::13] = 7
    tifffile.imwrite(tif, plane, rowsperstrip=SIDE, photometric="minisblack")
    out = tmp_path / "big.tif.zarr.zip"
    pack_file(tif, out)
    if one_block:  # the plane's chunk encoded again as one block of the whole plane
        new = tmp_path / "new.zarr.zip"
        with zipfile.ZipFile(out) as zin, zipfile.ZipFile(new, "w") as zout:
            for info in zin.infolist():
                data = zin.read(info)
                name = info.filename
                if name.startswith("0/") and not name.rsplit("/", 1)[-1].startswith("."):
                    decoded = Blosc().decode(data)
                    data = Blosc("zstd", 1, 0, blocksize=len(decoded)).encode(decoded)
                zout.writestr(info, data)
        new.replace(out)
    return out, tif.read_bytes()


def _read(archive_path: Path, cache: PageCache, at: int) -> bytes:
    with DecantArchive.open(archive_path) as archive:
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, cache)
        try:
            return bytes(reader.read(at, 4096))
        finally:
            reader.close()


def test_a_block_past_the_bound_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    path, original = _plane_archive(tmp_path, one_block=True)
    at = len(original) // 2
    tracemalloc.start()
    try:
        with pytest.raises(DecodeTooLargeError) as info:
            _read(path, PageCache(8 << 20), at)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "big.tif.zarr.zip" in str(info.value) and "chunk" in str(info.value)
    assert info.value.errno == 12  # ENOMEM, as an open past the budget
    assert peak < 32 << 20  # refused before the 74 MiB block was allocated
    # A cache large enough to hold the block reads it, byte-exact.
    big = PageCache(192 << 20)
    assert big.decode_bound() > SIDE * SIDE > DECODE_FLOOR
    assert _read(path, big, at) == original[at : at + 4096]


def test_the_same_plane_in_small_blocks_reads_under_the_small_cache(tmp_path: Path) -> None:
    path, original = _plane_archive(tmp_path, one_block=False)
    at = len(original) // 2
    assert _read(path, PageCache(8 << 20), at) == original[at : at + 4096]


def test_husk_blocks_decode_through_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verbatim original's blocks are held against the decode gate while they decode."""
    blob = tmp_path / "blob.bin"
    blob.write_bytes(np.random.default_rng(87).bytes(3 << 20))
    out = tmp_path / "blob.bin.zarr.zip"
    pack_file(blob, out)
    cache = PageCache(8 << 20)
    held: list[int] = []
    real = cache.decodes.held

    def noted(nbytes: int) -> Any:
        held.append(nbytes)
        return real(nbytes)

    monkeypatch.setattr(cache.decodes, "held", noted)
    assert _read(out, cache, 1 << 20) == blob.read_bytes()[1 << 20 : (1 << 20) + 4096]
    assert held and all(0 < n <= DECODE_FLOOR for n in held)


def test_a_series_of_more_members_than_the_readers_take_is_not_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F3: the readers refuse a manifest of more than MAX_MEMBERS members (400,000 took 1.3
    GiB to parse); the packer makes none."""
    from vfs.decant import series
    from vfs.decant.series import pack_series
    from vfs.errors import PackError

    monkeypatch.setattr(series, "MAX_MEMBERS", 3)
    folder = tmp_path / "run"
    folder.mkdir()
    for i in range(4):
        (folder / f"f{i}.txt").write_text(f"file {i}\n")
    with pytest.raises(PackError, match="at most 3 members"):
        pack_series(folder, tmp_path / "run.zarr", PackOptions())
    (folder / "f3.txt").unlink()
    pack_series(folder, tmp_path / "run.zarr", PackOptions())


def test_members_pages_share_one_table_and_a_view_is_read_only() -> None:
    """F3: each member's pages are a view of one shared table, not a table of their own."""
    from vfs.decant.manifest import parse_manifest
    from vfs.decant.pagetable import PageTable

    page = (b'{"index": %d, "shape": [1, 8], "dtype": "uint8", "dataoffsets": [%d], '
            b'"databytecounts": [8], "samplesperpixel": 1, "planarconfig": 1, "predictor": 1, '
            b'"rowsperstrip": 1, "tilewidth": 0, "tilelength": 0}')  # fmt: skip
    members = b",".join(
        b'{"relpath": "m%d.tif", "original_size": 16, "original_sha256": "%s", "husk_array": '
        b'"husk_%d", "husk_raw_size": 8, "pages": [%s]}' % (i, b"0" * 64, i, page % (i, 8))
        for i in range(3)
    )
    raw = (b'{"format": 1, "mode": "series", "original_name": "s", "original_size": 0, '
           b'"original_sha256": "", "series_consolidated": true, "plane_order": ["T"], '
           b'"members": [%s], "notes": "%s"}' % (members, b"n" * (5 << 20)))  # fmt: skip
    m = parse_manifest(raw, "s.zarr.zip")  # notes make it costly: walked, not json.loads
    tables = [mem.pages for mem in m.members]
    assert all(isinstance(t, PageTable) and len(t) == 1 for t in tables)
    assert [t[0].index for t in tables] == [0, 1, 2]
    assert len({id(t._cols) for t in tables}) == 1
    with pytest.raises(TypeError):
        tables[0].append(tables[1][0])


def test_a_tiled_plane_of_more_than_32_mib_still_packs_byte_exact_and_verifies(
    tmp_path: Path,
) -> None:
    """Red team 88, F1: with every decode bounded by half the cache, a tiled (or planar)
    page over 32 MiB, which decodes to twice its plane, was refused under the packer's and
    `decant verify`'s own caches: such TIFFs were packed verbatim, and archives of them made
    before failed to verify and restore. Only blosc blocks are held to the bound now."""
    from vfs.decant.verify import verify_archive

    tif = tmp_path / "tiled.tif"
    plane = np.zeros((6144, 6144), np.uint8)
    plane[::7, ::3] = 200
    tifffile.imwrite(tif, plane, tile=(512, 512), photometric="minisblack")
    out = tmp_path / "tiled.tif.zarr.zip"
    assert pack_file(tif, out).mode == "byte-exact"
    assert all(v.ok for v in verify_archive(out))
    at = 20 << 20
    assert _read(out, PageCache(64 << 20), at) == tif.read_bytes()[at : at + 4096]
