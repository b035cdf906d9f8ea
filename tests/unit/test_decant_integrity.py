"""Per-chunk xxh3 digests (vfs.decant.digests): what the adapter records at index time, checked on
every later chunk read before decoding — so a swapped or rewritten chunk fails a random read."""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path

import pytest
import xxhash

from tests.toolbox import load_tool
from vfs.cache import PageCache
from vfs.decant import MANIFEST_KEY
from vfs.decant.digestmap import (
    chunk_digests,
    has_metadata_entries,
    metadata_digests,
    unpack_layout,
)
from vfs.decant.digests import archive_digests
from vfs.decant.packer import PackOptions, PackResult
from vfs.decant.reader import DecantArchive
from vfs.decant.series import pack_series
from vfs.decant.store import ZipArchiveStore, is_chunk_key, is_metadata_key
from vfs.errors import ArchiveChangedError, CorruptArchiveError

fuzz = load_tool("fuzz")
D = "imagej_hyperstack_tzc_u16.tif"
A, B = "0/0.0.0.0.0", "0/1.1.2.0.0"


def read_all(path: Path, digests: dict[str, int] | None = None) -> bytes:
    with DecantArchive.open(path, digests) as archive:
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, PageCache(1 << 20))
        return bytes(reader.read(0, reader.size))


def swap(src: Path, dest: Path) -> Path:
    """Two planes' chunks exchanged: a valid zip (CRCs recomputed), valid blosc, wrong pixels."""
    with zipfile.ZipFile(src) as zf:
        a, b = zf.read(A), zf.read(B)
    return fuzz.rewrite_zip(src, dest, lambda n, d: b if n == A else a if n == B else d)


@pytest.fixture
def good(packed_corpus: dict[str, PackResult]) -> Path:
    return packed_corpus[D].archive


def test_digests_cover_every_chunk(good: Path) -> None:
    digests = archive_digests(good)
    with zipfile.ZipFile(good) as zf:
        chunks = {n: zf.read(n) for n in zf.namelist() if is_chunk_key(n)}
    per_chunk = chunk_digests(digests)
    assert set(per_chunk) == set(chunks) and "husk/0" in digests and A in digests
    assert all(digests[k] == xxhash.xxh3_64_intdigest(v) for k, v in chunks.items())


def test_block_entries_are_each_blosc_blocks_own_digest(good: Path) -> None:
    """Computed here from the blosc1 layout itself (a 16-byte header; then, if compressed,
    int32 offsets and streams ending where the next starts; if stored as is (flag 0x02), the
    payload in blocks): the header and table, and each block's stream or payload slice."""
    digests = archive_digests(good)
    with zipfile.ZipFile(good) as zf:
        chunks = {n: zf.read(n) for n in zf.namelist() if is_chunk_key(n)}
        local = {n: zf.getinfo(n).header_offset for n in chunks}
    data = good.read_bytes()
    layouts, want, kinds = {}, {}, set()
    for key, raw in chunks.items():
        nbytes, blocksize, cbytes = struct.unpack_from("<iii", raw, 4)
        assert cbytes == len(raw)
        n = -(-nbytes // blocksize)
        # The layout entry: header and table, and where the entry's bytes start in the file
        # (after its local header's 30 bytes, name and extra field).
        name_len, extra_len = struct.unpack_from("<HH", data, local[key] + 26)
        offset = local[key] + 30 + name_len + extra_len
        assert data[offset : offset + len(raw)] == raw
        table = raw[:16] if raw[2] & 0x02 else raw[: 16 + 4 * n]
        layouts[f".b/{key}/l"] = (table, offset)
        if raw[2] & 0x02:  # memcpyed (the corpus's noise does not compress)
            kinds.add("memcpyed")
            want[f".b/{key}/t"] = xxhash.xxh3_64_intdigest(raw[:16])
            for j in range(n):
                piece = raw[16 + j * blocksize : 16 + min((j + 1) * blocksize, nbytes)]
                want[f".b/{key}/{j}"] = xxhash.xxh3_64_intdigest(piece)
            continue
        kinds.add("compressed")
        starts = struct.unpack_from(f"<{n}i", raw, 16)
        ends = {s: e for s, e in zip(sorted(starts), [*sorted(starts)[1:], cbytes], strict=True)}
        want[f".b/{key}/t"] = xxhash.xxh3_64_intdigest(raw[: 16 + 4 * n])
        for j, s in enumerate(starts):
            want[f".b/{key}/{j}"] = xxhash.xxh3_64_intdigest(raw[s : ends[s]])
    assert digests is not None
    got = {k: v for k, v in digests.items() if k.startswith(".b/") and not k.endswith("/l")}
    assert got == want
    got_layouts = {k: unpack_layout(v) for k, v in digests.items() if k.endswith("/l")}
    assert got_layouts == layouts
    assert kinds == {"compressed", "memcpyed"}


def test_block_entries_stop_at_their_bound(good: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_BLOCK_ENTRIES a chunk keeps only its own digest (each chunk's entries all or
    none), and reads of it are still checked, whole."""
    from vfs.decant import digestmap

    full = archive_digests(good)
    monkeypatch.setattr(digestmap, "MAX_BLOCK_ENTRIES", 5)
    bounded = archive_digests(good)
    blocks = {k for k in bounded if k.startswith(".b/")}
    assert 0 < len(blocks) <= 5 and blocks < {k for k in full if k.startswith(".b/")}
    assert chunk_digests(bounded) == chunk_digests(full)
    assert all(f"{k.rpartition('/')[0]}/t" in blocks for k in blocks)  # whole chunks only


def test_an_archive_of_more_chunks_than_a_map_holds_gets_none(
    good: Path, corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_MAP_CHUNKS chunk keys (junk a hostile zip holds by the million counts too) no
    map is made, from a whole read's notes nor by reading the archive, before any chunk is read;
    the archive reads as before, its CRC-32s checked."""
    from vfs.decant import digestmap, digests, reader

    with zipfile.ZipFile(good) as zf:
        count = sum(1 for n in zf.namelist() if is_chunk_key(n))
    for module in (digestmap, digests, reader):
        monkeypatch.setattr(module, "MAX_MAP_CHUNKS", count - 1)
    read: list[str] = []
    original = ZipArchiveStore.get
    monkeypatch.setattr(ZipArchiveStore, "get", lambda self, key, limit: read.append(key)
                        or original(self, key, limit))  # fmt: skip
    assert archive_digests(good) is None
    assert not [k for k in read if is_chunk_key(k)]
    with DecantArchive.open(good) as archive:
        (info,) = archive.originals()
        whole = archive.open_original(info.relpath, PageCache(1 << 20))
        assert bytes(whole.read(0, whole.size)) == corpus[D].read_bytes()
        assert whole.tap is not None and whole.tap.complete() is None
    for module in (digestmap, digests, reader):
        monkeypatch.setattr(module, "MAX_MAP_CHUNKS", count)  # as many as it holds: a map
    at_bound = archive_digests(good)
    assert at_bound is not None and len(chunk_digests(at_bound)) == count


def test_reads_with_digests_are_exact(good: Path, corpus: dict[str, Path]) -> None:
    assert read_all(good, archive_digests(good)) == corpus[D].read_bytes()


def test_swapped_chunks_fail_the_digest(
    good: Path, corpus: dict[str, Path], tmp_path: Path
) -> None:
    digests = archive_digests(good)
    bad = swap(good, tmp_path / "swapped.zarr.zip")
    assert read_all(bad) != corpus[D].read_bytes()  # without digests: wrong, sha256 only catches
    with pytest.raises(CorruptArchiveError, match=f"chunk '{A}' does not match its recorded xxh3"):
        read_all(bad, digests)


def test_a_chunk_missing_from_the_map(good: Path) -> None:
    digests = archive_digests(good)
    del digests["husk/0"]
    with pytest.raises(CorruptArchiveError, match="'husk/0' has no recorded digest") as info:
        read_all(good, digests)
    assert str(good) in str(info.value)


def test_digest_replaces_crc_on_reads(good: Path, tmp_path: Path) -> None:
    """A byte flipped on disk after indexing: the digest names it (the CRC is not computed)."""
    digests = archive_digests(good)
    bad = tmp_path / "flip.zarr.zip"
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo("husk/0")
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + 20] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptArchiveError, match="CRC-32"):
        read_all(bad)
    with pytest.raises(CorruptArchiveError, match="'husk/0' does not match its recorded xxh3"):
        read_all(bad, digests)


def _rot_a_page_offset(src: Path, dest: Path) -> Path:
    """A copy of `src` whose stored manifest has one digit of a page's data offset changed:
    still JSON, still a manifest, and the original rebuilt from it is shifted."""
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        info = zf.getinfo(MANIFEST_KEY)
        manifest = zf.read(MANIFEST_KEY)
    assert info.compress_type == zipfile.ZIP_STORED
    at = manifest.index(b'"dataoffsets"')
    at += re.search(rb"[1-9]", manifest[at:]).start()  # type: ignore[union-attr]
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + at] = ord("1") if data[start + at] != ord("1") else ord("2")
    dest.write_bytes(bytes(data))
    return dest


def test_metadata_entries_are_checked_by_the_map_or_by_their_crc(
    good: Path, tmp_path: Path
) -> None:
    """A verified archive's map replaces the zip's CRC-32: it must cover the manifest (a rotten
    digit of a page's offset, read unchecked, served the original shifted). A map recorded
    before metadata digests has none for it: the entry keeps its CRC-32, and a reader with such
    a map notes digests, so the next whole read records the map anew."""
    full = archive_digests(good)
    assert full is not None and has_metadata_entries(full)
    assert {k for k in full if is_metadata_key(k)} >= {MANIFEST_KEY, "0/.zarray"}
    old = {k: v for k, v in full.items() if not is_metadata_key(k)}
    assert not has_metadata_entries(old)
    bad = _rot_a_page_offset(good, tmp_path / "rot.zarr.zip")
    with pytest.raises(
        CorruptArchiveError, match=re.escape(f"'{MANIFEST_KEY}' does not match its")
    ):
        read_all(bad, full)
    with pytest.raises(CorruptArchiveError, match=re.escape(f"'{MANIFEST_KEY}' fails its CRC-32")):
        read_all(bad, old)
    # The map records the manifest the archive was read with, never what the file holds later:
    # written in place since it was opened, it records nothing (the entries not parsed yet
    # would be read from the new version).
    copy = tmp_path / "copy.zarr.zip"
    copy.write_bytes(good.read_bytes())
    with DecantArchive.open(copy) as archive:
        assert metadata_digests(archive.store) == {k: full[k] for k in full if is_metadata_key(k)}
    with DecantArchive.open(copy) as archive:
        _rot_a_page_offset(copy, copy)
        with pytest.raises(ArchiveChangedError):
            metadata_digests(archive.store)
    for digests, noting in ((full, False), (old, True)):
        with DecantArchive.open(good, digests) as archive:
            (info,) = archive.originals()
            reader = archive.open_original(info.relpath, PageCache(1 << 20))
            assert (reader.tap is not None) is noting


def test_nested_series_digests(corpus: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "plates"
    folder.mkdir()
    for name in ("zstack_u16.tif", "zlib_u16.tif"):
        (folder / name).write_bytes(corpus[name].read_bytes())
    archive = pack_series(folder, tmp_path / "plates.zarr", PackOptions()).archive
    digests = archive_digests(archive)
    bundles = {
        m["subarchive"]
        for m in json.loads((archive / ".decant/manifest.json").read_text())["members"]
    }
    # The bundles' entries, and the series' own manifest (checked like a chunk once recorded).
    assert {k.split("/", 1)[0] for k in digests} == bundles | {".decant"}
    assert ".decant/manifest.json" in digests
    with DecantArchive.open(archive, digests) as opened:
        for info in opened.originals():
            reader = opened.open_original(info.relpath, PageCache(1 << 20))
            assert bytes(reader.read(0, reader.size)) == (folder / info.relpath).read_bytes()
    tampered = dict(digests)
    key = next(k for k in tampered if k.endswith("/original/0"))
    tampered[key] ^= 1
    with DecantArchive.open(archive, tampered) as opened:
        infos = {i.relpath: i for i in opened.originals()}
        reader = opened.open_original("zlib_u16.tif", PageCache(1 << 20))
        with pytest.raises(CorruptArchiveError, match="'original/0' does not match"):
            reader.read(0, infos["zlib_u16.tif"].size)


def test_directory_archive_digests(good: Path, corpus: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "d.zarr"
    with zipfile.ZipFile(good) as zf:
        zf.extractall(folder)
    in_folder, in_zip = archive_digests(folder), archive_digests(good)
    assert in_folder is not None and in_zip is not None
    # The same digests; the layout entries keep the same tables, and an offset only in a zip.
    layouts = {k: unpack_layout(v) for k, v in in_folder.items() if k.endswith("/l")}
    assert layouts and all(offset is None for _table, offset in layouts.values())
    assert {k: t for k, (t, _offset) in layouts.items()} == {
        k: unpack_layout(v)[0] for k, v in in_zip.items() if k.endswith("/l")
    }
    assert {k: v for k, v in in_folder.items() if k not in layouts} == {
        k: v for k, v in in_zip.items() if k not in layouts
    }
    assert read_all(folder, in_folder) == corpus[D].read_bytes()
    assert read_all(folder, in_zip) == corpus[D].read_bytes()
    (folder / A).write_bytes((folder / B).read_bytes())
    with pytest.raises(CorruptArchiveError, match=f"'{A}' does not match"):
        read_all(folder, archive_digests(good))


def test_backend_checks_the_adapters_digests(good: Path, tmp_path: Path) -> None:
    from vfs.backends.decant import DecantBackend

    recorded = DecantBackend(PageCache(0)).chunk_digests(good)
    bad = swap(good, tmp_path / "swapped.zarr.zip")
    backend = DecantBackend(PageCache(1 << 20), digests=lambda path: recorded)
    handle = backend.open(bad, "", backend.describe(bad).root)
    try:
        with pytest.raises(CorruptArchiveError, match="does not match its recorded xxh3"):
            handle.read(0, handle.size)
    finally:
        handle.close()


def test_a_whole_read_notes_the_digest_map_it_would_record(good: Path, tmp_path: Path) -> None:
    """A first read that hashes the whole file records the chunk digests its own reads noted,
    instead of reading the archive again: the map must be exactly what a second pass makes,
    and is given only when every chunk of this very file was read through this handle."""
    from vfs.backends.decant import DecantBackend

    want = archive_digests(good)
    backend = DecantBackend(PageCache(64 << 20))
    entry = backend.describe(good).root
    handle = backend.open(good, "", entry)
    try:
        handle.read(0, 4096)
        assert handle.seen_digests() is None  # only some chunks read so far
        handle.read(0, handle.size)
        assert handle.seen_digests() == want
        # Another handle now finds every plane in the shared cache: its reads saw no chunk.
        other = backend.open(good, "", entry)
        try:
            other.read(0, other.size)
            assert other.seen_digests() is None
        finally:
            other.close()
        # The file at the path replaced (a new inode): the noted map is not that file's.
        moved = tmp_path / "moved.zarr.zip"
        good.rename(moved)
        try:
            (tmp_path / "copy").write_bytes(moved.read_bytes())
            (tmp_path / "copy").rename(good)
            assert handle.seen_digests() is None
        finally:
            moved.replace(good)
    finally:
        handle.close()
    with_map = DecantBackend(PageCache(64 << 20), digests=lambda path: want)
    handle = with_map.open(good, "", entry)
    try:
        handle.read(0, handle.size)
        assert handle.seen_digests() is None  # already recorded: nothing noted on reads
    finally:
        handle.close()


def test_background_verification_records_the_noted_map(good: Path) -> None:
    """Integrity.verify_now hands mark_verified the map its own whole read noted."""
    import trio

    from vfs.backends.decant import DecantBackend
    from vfs.mount.reads import Integrity
    from vfs.nodes import Node

    backend = DecantBackend(PageCache(64 << 20))
    entry = backend.describe(good).root
    marked: list[object] = []
    integrity = Integrity(
        lambda node: False,
        lambda node, seen: marked.append(seen),
        lambda node: backend.open(good, "", entry),
    )
    node = Node(False, entry.size, 0, 0o444, 0, 0, good, backend=backend, entry=entry)
    assert trio.run(integrity.verify_now, node)
    assert marked == [archive_digests(good)]


def test_a_failure_to_give_the_noted_map_does_not_fail_verification(
    good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The noted map is an optimisation: if it cannot be had, the file still verifies and the
    archive is read again for its digests."""
    import trio

    from vfs.backends.decant import DecantBackend, DecantFile
    from vfs.mount.reads import Integrity
    from vfs.nodes import Node

    backend = DecantBackend(PageCache(64 << 20))
    entry = backend.describe(good).root
    marked: list[object] = []

    def broken(self: DecantFile) -> None:
        raise OSError("no stat today")

    integrity = Integrity(
        lambda node: False,
        lambda node, seen: marked.append(seen),
        lambda node: backend.open(good, "", entry),
    )
    node = Node(False, entry.size, 0, 0o444, 0, 0, good, backend=backend, entry=entry)
    monkeypatch.setattr(DecantFile, "seen_digests", broken)
    assert trio.run(integrity.verify_now, node)
    assert marked == [None] and integrity.state(node) == "yes"
