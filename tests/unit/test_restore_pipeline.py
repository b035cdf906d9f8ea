"""`decant restore`'s pipeline (vfs/decant/restore.py): byte-exact for every layout, in jobs small
enough that regions are cut, decoded out of order and written while others hash; a damaged chunk
names itself and leaves nothing behind."""

from __future__ import annotations

import errno
import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.decant import output, restore
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.verify import restore_archive
from vfs.decant.writer import CodecChoice
from vfs.errors import CorruptArchiveError, IntegrityError

RNG = np.random.default_rng(7)


def _stack(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Smooth-ish pixels (they compress) with noise (they are not constant)."""
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) % 251
    noise = RNG.integers(0, 7, size=shape)
    return (base + noise).astype(dtype)


LAYOUTS = {
    "striped-multi-strip": lambda p: tifffile.imwrite(
        p, _stack((5, 96, 80), "uint16"), rowsperstrip=7, photometric="minisblack"
    ),
    "tiled-edge-tiles": lambda p: tifffile.imwrite(
        p, _stack((3, 100, 90), "uint16"), tile=(32, 32), photometric="minisblack"
    ),
    "planar-rgb": lambda p: tifffile.imwrite(
        p, _stack((2, 3, 64, 48), "uint8"), photometric="rgb", planarconfig="separate"
    ),
    "big-endian-float": lambda p: tifffile.imwrite(
        p, _stack((4, 40, 52), "float32"), byteorder=">", photometric="minisblack"
    ),
    "imagej-description": lambda p: tifffile.imwrite(
        p, _stack((6, 64, 64), "uint16"), imagej=True, metadata={"axes": "ZYX"}
    ),
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("restore-pipeline")
    out = {}
    for name, write in LAYOUTS.items():
        tif = root / f"{name}.tif"
        write(tif)
        archive = root / f"{name}.tif.zarr.zip"
        result = pack_file(tif, archive, PackOptions(mode="byte-exact"))
        assert result.mode == "byte-exact"
        out[name] = (tif, archive)
    return out


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("job_bytes", [1000, 8 << 20])
@pytest.mark.parametrize("direct", [True, False])
def test_restore_is_byte_exact(
    name: str,
    job_bytes: int,
    direct: bool,
    packed: dict[str, tuple[Path, Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1000-byte jobs cut planes and husk runs mid-way and keep several decoders busy at once;
    # an 8 KiB staging buffer fills (and is written with O_DIRECT) many times per file, the last
    # one partly; buffered, a 3-byte write-back step calls sync_file_range after almost every write.
    monkeypatch.setattr(restore, "JOB_BYTES", job_bytes)
    monkeypatch.setattr(restore, "DIRECT", direct)
    monkeypatch.setattr(output, "STAGE", 2 * output.ALIGN)
    monkeypatch.setattr(output, "WRITEBACK", 3)
    tif, archive = packed[name]
    out = tmp_path / "back.tif"
    assert restore_archive(archive, out, tmp_path) == [out]
    assert out.read_bytes() == tif.read_bytes()
    assert _sha(out) == _sha(tif)  # independent of the manifest's recorded digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.tif"]


def test_jobs_cover_the_file_in_order(packed: dict[str, tuple[Path, Path]]) -> None:
    from vfs.cache import PageCache
    from vfs.decant.reader import DecantArchive

    for _tif, path in packed.values():
        with DecantArchive.open(path) as archive:
            reader = archive.open_original("", PageCache(64 << 20))
            spans = [span for job in restore.jobs(reader, 1000) for span in job]
            assert all(n <= 1000 for _, n in spans)
            assert sum(sum(n for _, n in job) for job in restore.jobs(reader, 1000)[:-1]) > 0
            ends = [0] + [o + n for o, n in spans]
            assert [o for o, _ in spans] == ends[:-1] and ends[-1] == reader.size


def _flip_in_chunk(archive: Path, out: Path) -> str:
    """One byte in the middle of the first pixel chunk's stored bytes flipped in place (its
    CRC-32 no longer matches); returns the chunk's key."""
    payload = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        info = next(
            i for i in zf.infolist() if i.filename.startswith("0/") and "/." not in i.filename
        )
    local = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    payload[local + info.compress_size // 2] ^= 0x01
    out.write_bytes(bytes(payload))
    return info.filename


def _damaged_memcpyed(tmp_path: Path) -> tuple[Path, Path, Path, str]:
    """A small stack packed without compression (blosc memcpy), copied with one byte flipped in
    a chunk: it still decodes, to wrong bytes. The TIFF, its archive, the damaged copy and the
    damaged chunk's key."""
    tif = tmp_path / "in" / "raw.tif"
    tif.parent.mkdir()
    tifffile.imwrite(tif, _stack((3, 64, 64), "uint16"), photometric="minisblack")
    good = tmp_path / "in" / "raw.tif.zarr.zip"
    pack_file(tif, good, PackOptions(mode="byte-exact", codec=CodecChoice("zstd", 0, "noshuffle")))
    bad = tmp_path / "in" / "bad.zarr.zip"
    return tif, good, bad, _flip_in_chunk(good, bad)


def test_damaged_chunk_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    """Stored without compression (blosc memcpy), a flipped byte still decodes: only the
    sha256 catches it, and the error names the chunk whose CRC-32 fails."""
    _tif, _good, bad, key = _damaged_memcpyed(tmp_path)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(IntegrityError) as info:
        restore_archive(bad, dest / "raw.tif", dest)
    message = str(info.value)
    assert str(bad) in message and "sha256" in message and "nothing written" in message
    assert repr(key) in message and "CRC-32" in message
    assert list(dest.iterdir()) == []


def test_undecodable_chunk_is_an_error_and_nothing_is_left(
    packed: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    _tif, good = packed["striped-multi-strip"]
    bad = tmp_path / "bad.zarr.zip"
    _flip_in_chunk(good, bad)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises((CorruptArchiveError, IntegrityError)) as info:
        restore_archive(bad, dest / "x.tif", dest)
    assert str(bad) in str(info.value)
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("direct", [True, False])
def test_damaged_archive_never_replaces_the_target(
    direct: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole wrong output is written (a memcpyed chunk with a flipped byte decodes), then
    refused: the file already at the target keeps its bytes, and no temp file is left."""
    monkeypatch.setattr(restore, "DIRECT", direct)
    tif, good, bad, _key = _damaged_memcpyed(tmp_path)
    dest = tmp_path / "out"
    dest.mkdir()
    target = dest / "raw.tif"
    target.write_bytes(b"the user's own file")
    with pytest.raises(IntegrityError, match="nothing written"):
        restore_archive(bad, target, dest)
    assert target.read_bytes() == b"the user's own file"
    assert list(dest.iterdir()) == [target]
    assert restore_archive(good, target, dest) == [target]  # the good archive does replace it
    assert target.read_bytes() == tif.read_bytes()


@pytest.mark.parametrize("direct", [True, False])
def test_a_failed_write_is_raised_and_nothing_is_left(
    direct: bool,
    packed: dict[str, tuple[Path, Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer thread's error (a disk filling up mid-file) reaches the caller; the temp file
    goes and the target is not created."""
    monkeypatch.setattr(restore, "DIRECT", direct)
    monkeypatch.setattr(restore, "JOB_BYTES", 1000)
    monkeypatch.setattr(output, "STAGE", output.ALIGN)
    calls = []
    real = output.os.pwrite

    def pwrite(fd: int, data: memoryview, at: int) -> int:
        calls.append(at)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, at)

    monkeypatch.setattr(output.os, "pwrite", pwrite)
    _tif, archive = packed["striped-multi-strip"]
    with pytest.raises(OSError, match="No space"):
        restore_archive(archive, tmp_path / "back.tif", tmp_path)
    assert list(tmp_path.iterdir()) == []
