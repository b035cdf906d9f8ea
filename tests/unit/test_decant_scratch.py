"""Chunks read into a thread's reused scratch buffer (ZipArchiveStore.get_scratch): the same bytes
and the same checks as `get`, and a decoded value never aliases the scratch buffer."""

from __future__ import annotations

import dataclasses
import os
import threading
import zipfile
from pathlib import Path

import pytest

from vfs.decant import store as store_module
from vfs.decant.chunks import read_chunk
from vfs.decant.digests import archive_digests
from vfs.decant.packer import PackResult
from vfs.decant.reader import DecantArchive
from vfs.decant.store import ZipArchiveStore, is_chunk_key
from vfs.errors import CorruptArchiveError

D = "imagej_hyperstack_tzc_u16.tif"  # mode D: pixel chunks 0/…, husk/0
PLANE = "0/0.0.0.0.0"


@pytest.fixture(scope="module")
def archive(packed_corpus: dict[str, PackResult]) -> Path:
    return packed_corpus[D].archive


def chunk_keys(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        return [i.filename for i in zf.infolist() if is_chunk_key(i.filename)]


def test_scratch_reads_equal_get_first_time_and_after(archive: Path) -> None:
    keys = chunk_keys(archive)
    assert len(keys) > 3
    with ZipArchiveStore(archive) as plain, ZipArchiveStore(archive) as scratch:
        for _ in range(2):  # the first read finds the data offset in the local header
            for key in keys:
                want = bytes(plain.get(key, 1 << 30) or b"")
                got = scratch.get_scratch(key, 1 << 30)
                assert got is not None and bytes(got) == want


def test_scratch_is_per_thread(archive: Path) -> None:
    """Another thread's read never lands in a buffer this thread still uses."""
    a, b = chunk_keys(archive)[:2]
    with ZipArchiveStore(archive) as store:
        mine = store.get_scratch(a, 1 << 30)
        assert mine is not None
        kept = bytes(mine)
        other = threading.Thread(target=store.get_scratch, args=(b, 1 << 30))
        other.start()
        other.join()
        assert bytes(mine) == kept


def flipped(src: Path, dest: Path, key: str) -> Path:
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        info = zf.getinfo(key)
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + 40] ^= 0x10
    dest.write_bytes(bytes(data))
    return dest


@pytest.mark.parametrize("warm", [False, True], ids=["first-read", "offset-known"])
def test_flipped_bit_fails_crc_through_scratch(archive: Path, tmp_path: Path, warm: bool) -> None:
    bad = flipped(archive, tmp_path / "flip.zarr.zip", PLANE)
    with DecantArchive.open(bad) as arc:
        spec = arc.spec("0", 1 << 30)
        if warm:  # the local header read once: the next read goes straight to the data
            arc.store.get_range(PLANE, 0, 1)
        with pytest.raises(CorruptArchiveError, match=f"'{PLANE}' fails its CRC-32"):
            read_chunk(arc.store, spec, (0, 0, 0, 0, 0))


def test_flipped_bit_fails_digest_through_scratch(archive: Path, tmp_path: Path) -> None:
    digests = archive_digests(archive)
    bad = flipped(archive, tmp_path / "flip.zarr.zip", PLANE)
    with DecantArchive.open(bad, digests) as arc:
        spec = arc.spec("0", 1 << 30)
        with pytest.raises(CorruptArchiveError, match="does not match its recorded xxh3"):
            read_chunk(arc.store, spec, (0, 0, 0, 0, 0))


def test_decoded_chunks_do_not_alias_the_scratch_buffer(archive: Path) -> None:
    """Chunks decoded one after another on one thread keep their own bytes."""
    with DecantArchive.open(archive) as arc, DecantArchive.open(archive) as again:
        spec = arc.spec("0", 1 << 30)
        indices = [(t, 0, 0, 0, 0) for t in range(spec.shape[0])]
        kept = [read_chunk(arc.store, spec, i) for i in indices]
        for index, value in zip(indices, kept, strict=True):
            assert bytes(value) == bytes(read_chunk(again.store, spec, index))


def test_uncompressed_chunks_are_not_read_into_scratch(archive: Path) -> None:
    """Without a codec the stored bytes are the value, kept in the cache: never a scratch view."""
    with DecantArchive.open(archive) as arc:
        spec = arc.spec("0", 1 << 30)
        plain = dataclasses.replace(spec, compressor=None)

        def refuse(key: str, limit: int) -> None:
            raise AssertionError("read into scratch")

        arc.store.get_scratch = refuse  # type: ignore[method-assign,assignment]
        with pytest.raises(CorruptArchiveError, match="decodes to"):
            read_chunk(arc.store, plain, (0, 0, 0, 0, 0))  # stored bytes are compressed


def test_a_local_archive_is_not_read_ahead_with_fadvise(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WILLNEED ahead of the decoders' own preads halved cold streaming here (store.prefetch)."""
    advised: list[tuple[int, int]] = []
    with ZipArchiveStore(archive) as store:
        monkeypatch.setattr(store.source, "prefetch", lambda o, n: advised.append((o, n)))
        store.prefetch(PLANE)
        assert advised == []
        monkeypatch.delattr(type(store.source), "fileno")  # as a bucket's source: no descriptor
        store.prefetch(PLANE)
        assert len(advised) == 1


@pytest.mark.parametrize("direct_ok", [True, False], ids=["o-direct", "refused"])
def test_large_chunks_read_past_the_page_cache_give_the_same_bytes(
    archive: Path, monkeypatch: pytest.MonkeyPatch, direct_ok: bool
) -> None:
    """Entries of DIRECT_MIN bytes and more go through the source's read_past_cache (O_DIRECT);
    where it is refused (None) they come through the page cache: the same bytes either way."""
    monkeypatch.setattr(store_module, "DIRECT_MIN", 1)  # the corpus's chunks are small
    keys = chunk_keys(archive)
    asked: list[int] = []
    with ZipArchiveStore(archive) as plain, ZipArchiveStore(archive) as store:
        real = store.source.read_past_cache  # type: ignore[attr-defined]

        def past(offset: int, size: int, keep: int) -> memoryview | None:
            asked.append(size)
            return real(offset, size, keep) if direct_ok else None

        monkeypatch.setattr(store.source, "read_past_cache", past)
        for _ in range(2):  # with the local header, then the data alone
            for key in keys:
                got = store.get_scratch(key, 1 << 30)
                assert got is not None and bytes(got) == bytes(plain.get(key, 1 << 30) or b"")
    assert len(asked) == 2 * len(keys)


def test_flipped_bit_fails_crc_past_the_page_cache(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "DIRECT_MIN", 1)
    bad = flipped(archive, tmp_path / "flip.zarr.zip", PLANE)
    with DecantArchive.open(bad) as arc:
        spec = arc.spec("0", 1 << 30)
        with pytest.raises(CorruptArchiveError, match=f"'{PLANE}' fails its CRC-32"):
            read_chunk(arc.store, spec, (0, 0, 0, 0, 0))


@pytest.mark.parametrize("direct_min", [1, 1 << 40], ids=["o-direct", "page-cache"])
def test_an_archive_cut_short_while_open_is_an_error_naming_the_entry(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_min: int
) -> None:
    """Truncated in place after opening (its size was taken at open): an error, never the
    bytes of a shorter buffer or stale bytes of an earlier read."""
    monkeypatch.setattr(store_module, "DIRECT_MIN", direct_min)
    cut = tmp_path / "cut.zarr.zip"
    cut.write_bytes(archive.read_bytes())
    keys = chunk_keys(cut)
    with ZipArchiveStore(cut) as store:
        assert store.get_scratch(keys[0], 1 << 30) is not None  # a first read fills the buffer
        os.truncate(cut, 40)
        with pytest.raises(CorruptArchiveError, match=f"{keys[-1]}.*written since"):
            store.get_scratch(keys[-1], 1 << 30)
