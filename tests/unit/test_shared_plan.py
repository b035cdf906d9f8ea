"""Handles of one archive version share their original's plan (vfs.decant.plan), built once.

Each handle used to build its own page table, region index and page order and run every check
again: 65,536 pages of 4×4 planes cost ~55 MiB and 4-12 s of daemon CPU per open (red team 24).
What a handle's reads change (position, read-ahead queue, drop-behind, noted digests) stays its own.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

from vfs.backends.base import Entry
from vfs.backends.decant import DecantBackend, DecantFile
from vfs.cache import PageCache
from vfs.decant.packer import pack_file
from vfs.decant.reader import DecantArchive, PixelReader
from vfs.decant.regions import RegionIndex

THREADS = 6


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, bytes]]:
    """{kind: (archive, the original's bytes)}: a byte-exact stack and a verbatim blob."""
    base = tmp_path_factory.mktemp("shared")
    rng = np.random.default_rng(24)
    stack = base / "stack.tif"
    tifffile.imwrite(stack, rng.integers(0, 4000, (40, 24, 20), dtype=np.uint16), rowsperstrip=7)
    blob = base / "blob.bin"
    blob.write_bytes(rng.bytes(300_000))
    out = {}
    for kind, original in (("tiff", stack), ("blob", blob)):
        archive = pack_file(original, base / f"{original.name}.zarr.zip").archive
        out[kind] = (archive, original.read_bytes())
    return out


def opened(backend: DecantBackend, archive: Path) -> DecantFile:
    return backend.open(archive, "", Entry())


@pytest.mark.parametrize("kind", ["tiff", "blob"])
def test_two_handles_share_the_plan_and_read_exact(
    archives: dict[str, tuple[Path, bytes]], kind: str
) -> None:
    archive, original = archives[kind]
    backend = DecantBackend(PageCache(64 << 10))  # small: reads decode again, not just slice
    a, b = opened(backend, archive), opened(backend, archive)
    try:
        assert a.archive is b.archive
        assert a.reader is not b.reader
        assert a.reader.regions is b.reader.regions
        assert a.reader.plan is b.reader.plan
        if kind == "tiff":
            assert isinstance(a.reader, PixelReader) and isinstance(b.reader, PixelReader)
            assert a.reader.pages is b.reader.pages
            assert a.reader._by_rank is b.reader._by_rank
            assert a.reader._rank is b.reader._rank
            assert a.reader._queued is not b.reader._queued  # per handle
        if a.reader.tap is not None:
            assert a.reader.tap is not b.reader.tap  # each handle notes its own reads
        size = len(original)
        # Interleaved: one handle forward in large reads, the other backward in odd small ones.
        for k, offset in enumerate(range(0, size, 4096)):
            back = max(0, size - (k + 1) * 3001)
            assert a.read(offset, 4096) == original[offset : offset + 4096]
            assert b.read(back, 3001) == original[back : back + 3001]
        a.close()
        assert b.read(0, size) == original  # the other's close leaves the plan whole
    finally:
        a.close()
        b.close()
    assert len(backend.shared) == 0


def test_concurrent_first_opens_build_the_plan_once(
    archives: dict[str, tuple[Path, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads opening the same original at once: one builds, the others wait and share it.
    The first build holds until every thread has asked (and a moment more), so without the
    lock each would find no plan and build its own."""
    archive, original = archives["tiff"]
    builds: list[int] = []
    asked = threading.Semaphore(0)
    real_build = RegionIndex.build

    def counted(*args: Any, **kwargs: Any) -> RegionIndex:
        builds.append(threading.get_ident())
        if len(builds) == 1:
            for _ in range(THREADS):
                assert asked.acquire(timeout=30)
            threading.Event().wait(0.2)  # room for the others to reach the plan
        return real_build(*args, **kwargs)

    monkeypatch.setattr(RegionIndex, "build", counted)
    backend = DecantBackend(PageCache(1 << 20))
    handles: list[DecantFile] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        asked.release()
        try:
            handles.append(opened(backend, archive))
        except Exception as exc:  # reported below, with the thread's traceback
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors, errors
        assert len(handles) == THREADS
        assert len(builds) == 1, f"{len(builds)} builds for {THREADS} concurrent opens"
        assert len({id(h.reader.regions) for h in handles}) == 1
        for h in handles:
            assert h.read(0, len(original)) == original
    finally:
        for h in handles:
            h.close()


def test_a_plan_lives_while_a_reader_holds_it(archives: dict[str, tuple[Path, bytes]]) -> None:
    """The archive does not keep a plan no reader holds: describe's check of a series of many
    members builds each in turn, not all at once."""
    archive, original = archives["tiff"]
    with DecantArchive.open(archive) as opened_archive:
        first = opened_archive.open_original("", PageCache(1 << 20))
        second = opened_archive.open_original("", PageCache(1 << 20))
        assert first.plan is second.plan
        first.close()
        second.close()
        del first, second
        assert len(opened_archive._plans) == 0
        again = opened_archive.open_original("", PageCache(1 << 20))
        assert len(opened_archive._plans) == 1
        assert again.read(0, len(original)) == original
