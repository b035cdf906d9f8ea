"""What open archives hold (their zip directory and manifest) is lent from the page cache and
bounded: a user holding handles on many copies of an archive of many entries gets ENOMEM for
the one past the budget instead of growing the daemon by each copy's tables."""

from __future__ import annotations

import errno
import shutil
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.backends import decant as decant_backend
from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.decant.packer import pack_file
from vfs.decant.reader import DecantArchive
from vfs.errors import OpenArchivesFullError

JUNK = 20_000  # entries a copy holds beyond its own: ~3.5 MiB of directory tables


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, bytes]:
    """(an archive holding JUNK entries beyond its own, a plain small archive, the original)."""
    base = tmp_path_factory.mktemp("budget")
    tif = base / "a.tif"
    tifffile.imwrite(tif, np.random.default_rng(1).integers(0, 60000, (2, 64, 64), np.uint16))
    small = base / "small.tif.zarr.zip"
    pack_file(tif, small)
    many = base / "many.tif.zarr.zip"
    with zipfile.ZipFile(small) as zin, zipfile.ZipFile(many, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info))
        for k in range(JUNK):
            zout.writestr(f"junk/{k:08d}{'x' * 100}", b"")
    return many, small, tif.read_bytes()


def test_held_bytes_cover_what_opening_allocates(made: tuple[Path, Path, bytes]) -> None:
    """The estimate the budget charges is at least what an open archive keeps allocated
    (measured by tracemalloc, an independent count), and not far above it."""
    many, small, _ = made
    DecantArchive.open(small).close()  # imports and one-time caches: not the archive's
    tracemalloc.start()
    try:
        archive = DecantArchive.open(many)
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    try:
        assert kept > 3 << 20
        assert kept <= archive.held_bytes() < 1.5 * kept, (kept, archive.held_bytes())
    finally:
        archive.close()


def test_open_archives_past_the_budget_are_refused_until_some_close(
    made: tuple[Path, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many, small, original = made
    copies = [tmp_path / f"c{i}.tif.zarr.zip" for i in range(3)]
    for copy in copies:
        shutil.copyfile(many, copy)
    monkeypatch.setattr(decant_backend, "HELD_FLOOR", 6 << 20)
    cache = PageCache(4 << 20)
    backend = DecantBackend(cache)
    assert backend.shared.budget == 6 << 20
    desc = backend.describe(copies[0])

    first = backend.open(copies[0], "", desc.root)
    again = backend.open(copies[0], "", desc.root)  # shares the first's tables: no more held
    held = backend.shared.held
    assert held == first.archive.held_bytes() > 3 << 20
    assert cache._reserved == 2 << 20  # lent up to half the cache: it evicted to make room
    cache.put(("plane",), bytearray(1 << 20))  # the other half still caches every user's reads
    assert ("plane",) in cache
    with pytest.raises(OpenArchivesFullError) as refused:
        backend.open(copies[1], "", desc.root)
    assert refused.value.errno == errno.ENOMEM and str(copies[1]) in str(refused.value)
    assert backend.shared.held == held and cache._reserved == 2 << 20  # nothing kept of it

    tiny = backend.open(small, "", backend.describe(small).root)  # small ones still fit
    assert bytes(tiny.read(0, len(original))) == original
    assert bytes(again.read(0, len(original))) == original
    first.close()
    with pytest.raises(OpenArchivesFullError):  # `again` still holds the tables
        backend.open(copies[2], "", desc.root)
    again.close()
    second = backend.open(copies[1], "", desc.root)
    assert bytes(second.read(0, len(original))) == original
    for handle in (second, tiny):
        handle.close()
    assert backend.shared.held == 0 and cache._reserved == 0 and len(backend.shared) == 0


def test_one_archive_opens_whatever_it_holds(
    made: tuple[Path, Path, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing else open, an archive holding more than the whole budget still opens (the
    format's own limits bound it): a small cache never makes a valid archive unreadable."""
    many, _, original = made
    monkeypatch.setattr(decant_backend, "HELD_FLOOR", 1 << 20)
    backend = DecantBackend(PageCache(1 << 20))
    handle = backend.open(many, "", backend.describe(many).root)
    try:
        assert backend.shared.held > backend.shared.budget
        assert bytes(handle.read(0, len(original))) == original
    finally:
        handle.close()
    assert backend.shared.held == 0


def test_a_zip_that_cannot_fit_is_refused_before_its_directory_is_parsed(
    made: tuple[Path, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused after parsing, each open past the budget still cost its tables for a moment
    (and the heap kept them): the end record's counts refuse it first."""
    from vfs.decant.zipdir import ZipDirectory

    many, _small, _ = made
    copies = [tmp_path / f"c{i}.tif.zarr.zip" for i in range(2)]
    for copy in copies:
        shutil.copyfile(many, copy)
    monkeypatch.setattr(decant_backend, "HELD_FLOOR", 6 << 20)
    backend = DecantBackend(PageCache(2 << 20))
    desc = backend.describe(copies[0])
    parsed: list[object] = []
    build = ZipDirectory._build
    monkeypatch.setattr(ZipDirectory, "_build", lambda self, *a: parsed.append(str(self.path))
                        or build(self, *a))  # fmt: skip
    first = backend.open(copies[0], "", desc.root)
    assert parsed == [str(copies[0])]
    with pytest.raises(OpenArchivesFullError, match="not opened"):
        backend.open(copies[1], "", desc.root)
    assert parsed == [str(copies[0])]  # the second was never parsed
    first.close()
    backend.open(copies[1], "", desc.root).close()
    assert parsed == [str(copies[0]), str(copies[1])]


def test_the_plan_an_open_builds_is_charged_too(
    made: tuple[Path, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An original's plan holds ~700 bytes a page (a stack of 65,536 pages: ~46 MiB) for as
    long as the archive is open: charged once the open built it, and an open whose plan does
    not fit is refused (its reader closed, nothing kept), while a small archive is open."""
    from vfs.decant.reader import PLAN_PAGE_BYTES
    from vfs.decant.regions import RegionIndex
    from vfs.decant.store import DATA_OFFSET_BYTES

    _many, small, original = made
    pages = 4096
    tif = tmp_path / "pages.tif"
    planes = (np.arange(pages * 16, dtype=np.uint32) % 251).astype(np.uint8)
    tifffile.imwrite(tif, planes.reshape(pages, 4, 4), photometric="minisblack")
    stack = tmp_path / "pages.tif.zarr.zip"
    pack_file(tif, stack)
    with DecantArchive.open(stack) as archive:
        admitted = archive.held_bytes()  # before any plan: tables and manifest
        m = archive.manifest
        regions = RegionIndex.build(m.pages, m.original_size, m.husk_raw_size, "x").nbytes
    assert regions >= pages * 20  # each page's pixels a region, husk runs between them
    planned = admitted + pages * PLAN_PAGE_BYTES + regions

    monkeypatch.setattr(decant_backend, "HELD_FLOOR", planned + (64 << 10))
    backend = DecantBackend(PageCache(1 << 20))
    handle = backend.open(stack, "", backend.describe(stack).root)
    # The plan charged once the open built it, with the data offsets its checks had found.
    found = len(handle.archive.store._data_offsets) * DATA_OFFSET_BYTES
    assert planned <= backend.shared.held <= planned + found
    assert bytes(handle.read(0, 4096)) == tif.read_bytes()[:4096]
    handle.close()
    assert backend.shared.held == 0

    tiny = backend.open(small, "", backend.describe(small).root)  # holds ~20 KiB
    monkeypatch.setattr(backend.shared, "budget", admitted + tiny.archive.held_bytes() + 4096)
    with pytest.raises(OpenArchivesFullError):  # admitted, then its plan does not fit
        backend.open(stack, "", backend.describe(stack).root)
    assert backend.shared.held == tiny.archive.held_bytes() and len(backend.shared) == 1
    assert bytes(tiny.read(0, len(original))) == original
    tiny.close()
    assert backend.shared.held == 0


def test_one_user_s_archives_leave_other_users_their_share(
    made: tuple[Path, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's opens may hold half the budget, and count for no more than that when another
    user's open is weighed (red team, round 35b): one user's archive admitted alone, past the
    whole budget, used to leave every other user's open refused."""
    many, small, original = made
    copies = [tmp_path / f"c{i}.tif.zarr.zip" for i in range(2)]
    for copy in copies:
        shutil.copyfile(many, copy)
    monkeypatch.setattr(decant_backend, "HELD_FLOOR", 2 << 20)  # below one copy's tables
    backend = DecantBackend(PageCache(1 << 20))
    shared = backend.shared
    root = backend.describe(many).root
    with decant_backend.charged_to(1000):
        hog = backend.open(copies[0], "", root)  # alone: past the whole budget
        with pytest.raises(OpenArchivesFullError, match="uid 1000"):
            backend.open(copies[1], "", root)
    assert shared.held > shared.budget
    with decant_backend.charged_to(1001):
        other = backend.open(small, "", backend.describe(small).root)
    assert bytes(other.read(0, len(original))) == original
    assert shared.by_uid[1000] == hog.archive.held_bytes() and 1001 in shared.by_uid
    with decant_backend.charged_to(1001), pytest.raises(OpenArchivesFullError):
        backend.open(copies[1], "", root)  # past user 1001's share
    other.close()
    hog.close()
    assert shared.held == 0 and shared.by_uid == {} and len(shared) == 0


@pytest.mark.parametrize("where", ["bucket first", "local first"])
def test_a_first_open_being_built_holds_its_tables_against_the_budget(
    made: tuple[Path, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Two first opens at once, nothing open yet (red team 50s, F5): while the first builds its
    directory, its end record's estimate is held, so the second is refused before it builds
    anything; the first then opens and serves, and once it closes the second opens. Both byte
    sources (a local file and an object, tests/unit/memory_store.py) take the same path."""
    import threading

    from tests.unit.memory_store import MemoryFolder
    from vfs.decant.zipdir import ZipDirectory

    many, _small, original = made
    local = tmp_path / "c.tif.zarr.zip"
    shutil.copyfile(many, local)
    bucket = MemoryFolder({"b.tif.zarr.zip": many.read_bytes()})
    monkeypatch.setattr(decant_backend, "HELD_FLOOR", 6 << 20)
    backend = DecantBackend(PageCache(2 << 20))
    desc = backend.describe(local)

    def open_local() -> object:
        return backend.open(local, "", desc.root)

    def open_bucket() -> object:
        return backend.open_at(bucket, "b.tif.zarr.zip", "", desc.root)

    first, second = (
        (open_bucket, open_local) if where == "bucket first" else (open_local, open_bucket)
    )
    parsed: list[str] = []
    building, go = threading.Event(), threading.Event()
    build = ZipDirectory._build

    def slow_build(self: ZipDirectory, *args: object) -> None:
        parsed.append(str(self.path))
        if threading.current_thread() is not threading.main_thread():
            building.set()
            assert go.wait(10)
        build(self, *args)

    monkeypatch.setattr(ZipDirectory, "_build", slow_build)
    got: list[object] = []
    opener = threading.Thread(target=lambda: got.append(first()))
    opener.start()
    try:
        assert building.wait(10)
        assert sum(backend.shared.pending.values()) > 3 << 20  # the estimate, held
        with pytest.raises(OpenArchivesFullError, match="not opened"):
            second()
        assert len(parsed) == 1  # the second was never parsed
    finally:
        go.set()
        opener.join(10)
    (handle,) = got
    assert backend.shared.pending == {}  # admitted: held now, pending no more
    assert bytes(handle.read(0, len(original))) == original  # type: ignore[attr-defined]
    handle.close()  # type: ignore[attr-defined]
    assert backend.shared.held == 0
    again = second()
    assert bytes(again.read(0, len(original))) == original  # type: ignore[attr-defined]
    again.close()  # type: ignore[attr-defined]
    assert len(parsed) == 2 and backend.shared.held == 0


def test_opens_and_closes_racing_from_many_users_leave_nothing_held_or_pending(
    made: tuple[Path, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight threads of four users open and close handles on copies of a large and a small
    archive at once, local and from a bucket, the budget too small for all of them: each open
    either serves the original's bytes or is refused with ENOMEM, none raises anything else,
    and once all are closed nothing is held, pending, charged or lent (a reservation leaked on
    any path would refuse every later open)."""
    import random
    import threading

    from tests.unit.memory_store import MemoryFolder

    many, small, original = made
    locals_ = []
    for i in range(3):
        locals_.append(tmp_path / f"m{i}.tif.zarr.zip")
        shutil.copyfile(many, locals_[-1])
    locals_.append(small)
    bucket = MemoryFolder({f"b{i}.tif.zarr.zip": many.read_bytes() for i in range(2)})
    monkeypatch.setattr(decant_backend, "HELD_FLOOR", 8 << 20)  # two large archives' tables
    cache = PageCache(4 << 20)
    backend = DecantBackend(cache)
    root = backend.describe(small).root
    refused, errors, served = [], [], []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        held: list[object] = []
        with decant_backend.charged_to(1000 + seed % 4):
            for _ in range(25):
                try:
                    if rng.random() < 0.3:
                        key = f"b{rng.randrange(2)}.tif.zarr.zip"
                        handle = backend.open_at(bucket, key, "", root)
                    else:
                        handle = backend.open(rng.choice(locals_), "", root)
                except OpenArchivesFullError:
                    refused.append(1)
                except Exception as exc:  # anything else fails the test
                    errors.append(exc)
                else:
                    held.append(handle)
                    if bytes(handle.read(0, len(original))) == original:  # type: ignore[attr-defined]
                        served.append(1)
                    else:
                        errors.append(AssertionError("wrong bytes"))
                while held and (len(held) > 2 or rng.random() < 0.5):
                    held.pop(rng.randrange(len(held))).close()  # type: ignore[attr-defined]
        for handle in held:
            handle.close()  # type: ignore[attr-defined]

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert served and refused  # both outcomes happened: the budget was in play
    shared = backend.shared
    assert shared.held == 0 and shared.pending == {} and shared.by_uid == {}
    assert shared.lent == 0 and len(shared) == 0
    assert cache._reserved == 0
