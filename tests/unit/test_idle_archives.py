"""Archives kept open after their last handle closes (vfs.backends.idle), and what the decant
backend does with them: a reopen of the same version takes the kept archive, a changed file
never does, and what is kept is bounded by count, bytes and time."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import tifffile
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.backends.base import Entry
from vfs.backends.decant import LINGER_BYTES, DecantBackend
from vfs.backends.idle import IdleArchives
from vfs.cache import PageCache
from vfs.decant.packer import pack_file
from vfs.decant.store import DATA_OFFSET_BYTES


class Fake:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def idle(seconds: float = 5.0, count: int = 3, max_bytes: int = 100) -> tuple[IdleArchives, Clock]:
    clock = Clock()
    return IdleArchives(seconds, count, max_bytes, clock=clock, sweeper=False), clock


def test_a_kept_archive_is_taken_once_and_then_is_the_callers() -> None:
    kept, _clock = idle()
    a = Fake("a")
    kept.put("k", a, 10)
    assert "k" in kept and kept.held_bytes == 10
    assert kept.take("k") is a
    assert kept.take("k") is None and kept.held_bytes == 0 and a.closed == 0


def test_what_waited_too_long_is_closed_by_a_sweep() -> None:
    kept, clock = idle(seconds=5.0)
    a, b = Fake("a"), Fake("b")
    kept.put("a", a, 1)
    clock.now += 3
    kept.put("b", b, 1)
    assert kept.sweep() == pytest.approx(2.0)
    clock.now += 2
    assert kept.sweep() == pytest.approx(3.0)  # a closed, b due 3 s later
    assert (a.closed, b.closed) == (1, 0) and kept.take("a") is None
    clock.now += 3
    assert kept.sweep() is None and b.closed == 1 and len(kept) == 0


def test_count_and_bytes_push_out_the_oldest_and_an_archive_too_large_is_closed() -> None:
    kept, _clock = idle(count=2, max_bytes=100)
    fakes = [Fake(str(i)) for i in range(4)]
    kept.put(0, fakes[0], 10)
    kept.put(1, fakes[1], 10)
    kept.put(2, fakes[2], 10)  # past the count: 0 goes
    assert [f.closed for f in fakes] == [1, 0, 0, 0]
    kept.put(3, fakes[3], 85)  # past the bytes: 1 goes (10 + 85 fit)
    assert [f.closed for f in fakes] == [1, 1, 0, 0] and kept.held_bytes == 95
    big = Fake("big")
    kept.put("big", big, 101)
    assert big.closed == 1 and "big" not in kept


def test_putting_a_key_again_closes_the_one_it_replaces() -> None:
    kept, _clock = idle()
    a, b = Fake("a"), Fake("b")
    kept.put("k", a, 10)
    kept.put("k", b, 20)
    assert a.closed == 1 and kept.take("k") is b and kept.held_bytes == 0


def test_off_keeps_nothing() -> None:
    kept, _clock = idle(seconds=0.0)
    a = Fake("a")
    kept.put("k", a, 1)
    assert a.closed == 1 and len(kept) == 0


def test_the_sweeper_thread_closes_on_time() -> None:
    kept = IdleArchives(0.2, 4, 100)
    a = Fake("a")
    kept.put("k", a, 1)
    deadline = time.monotonic() + 5
    while a.closed == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert a.closed == 1 and len(kept) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ptsw"), st.integers(0, 5), st.integers(0, 60))))
def test_bounds_hold_and_every_archive_is_closed_once_or_handed_back(ops) -> None:
    """Any sequence of puts, takes, sweeps and waits: never more than `count` kept or
    `max_bytes` held, nothing closed twice, and every archive put is exactly one of: kept,
    handed back by `take`, or closed."""
    kept, clock = idle(seconds=5.0, count=3, max_bytes=100)
    put: list[Fake] = []
    taken: set[int] = set()
    for op, key, n in ops:
        if op == "p":
            put.append(Fake(str(len(put))))
            kept.put(key, put[-1], n)
        elif op == "t":
            got = kept.take(key)
            if got is not None:
                taken.add(id(got))
        elif op == "s":
            kept.sweep()
        else:
            clock.now += n / 10
        assert len(kept) <= 3 and kept.held_bytes <= 100
    held = {id(archive) for archive, _n, _t in kept._kept.values()}
    for f in put:
        assert f.closed <= 1
        assert (f.closed == 1) + (id(f) in taken) + (id(f) in held) == 1


# -- the decant backend ------------------------------------------------------------------------


@pytest.fixture
def stack(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """An archive and its original's bytes, plus another original's bytes of the same size."""
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 4000, (6, 32, 24), dtype=np.uint16) for _ in range(2)]
    originals = []
    for i, image in enumerate(images):
        tif = tmp_path / f"src{i}" / "stack.tif"
        tif.parent.mkdir()
        tifffile.imwrite(tif, image)
        originals.append(tif)
    archive = pack_file(originals[0], tmp_path / "stack.tif.zarr.zip").archive
    other = pack_file(originals[1], tmp_path / "other.tif.zarr.zip").archive
    os.rename(other, tmp_path / "next.zarr.zip.tmp")
    settled(archive)
    settled(tmp_path / "next.zarr.zip.tmp")
    return archive, originals[0].read_bytes(), originals[1].read_bytes()


def settled(path: Path) -> None:
    """Written an hour ago: an archive written just before its parse is not kept."""
    ago = time.time() - 3600
    os.utime(path, (ago, ago))


def read_all(backend: DecantBackend, archive: Path) -> tuple[object, bytes]:
    handle = backend.open(archive, "", Entry())
    try:
        return handle.archive, bytes(handle.read(0, handle.size))
    finally:
        handle.close()


def test_a_reopen_takes_the_archive_kept_and_reads_exact(stack) -> None:
    archive, original, _other = stack
    backend = DecantBackend(PageCache(1 << 20), linger=30.0)
    first, data = read_all(backend, archive)
    assert data == original
    assert len(backend.shared) == 0 and len(backend.shared.idle) == 1
    assert backend.shared.held == 0 and backend.shared.by_uid == {}  # charged to no one
    second, data = read_all(backend, archive)
    assert second is first and data == original
    backend.shared.idle.clear()


def test_a_reopen_of_a_replaced_archive_opens_the_new_one(stack, tmp_path: Path) -> None:
    """`cp` of another archive over the name (a new inode, or the same one rewritten): the
    version key differs, so the archive kept is not taken; it is closed when its time is up."""
    archive, original, other = stack
    backend = DecantBackend(PageCache(1 << 20), linger=30.0)
    first, data = read_all(backend, archive)
    assert data == original
    os.replace(tmp_path / "next.zarr.zip.tmp", archive)
    second, data = read_all(backend, archive)
    assert second is not first and data == other
    backend.shared.idle.clear()


def test_a_reopen_while_held_joins_and_the_budget_counts_a_taken_archive_again(stack) -> None:
    archive, _original, _other = stack
    backend = DecantBackend(PageCache(1 << 20), linger=30.0)
    read_all(backend, archive)
    handle = backend.open(archive, "", Entry())
    try:
        assert backend.shared.held == handle.archive.held_bytes() > 0
        assert len(backend.shared.idle) == 0
        again = backend.open(archive, "", Entry())
        assert again.archive is handle.archive
        again.close()
    finally:
        handle.close()
    assert backend.shared.held == 0 and len(backend.shared.idle) == 1
    backend.shared.idle.clear()


def test_without_linger_the_last_close_closes_the_archive(stack) -> None:
    archive, _original, _other = stack
    fds = len(os.listdir("/proc/self/fd"))
    backend = DecantBackend(PageCache(1 << 20))
    read_all(backend, archive)
    assert len(backend.shared.idle) == 0 and len(os.listdir("/proc/self/fd")) == fds


def test_concurrent_opens_and_closes_share_one_archive_and_leave_the_books_even(stack) -> None:
    """Threads opening and closing one archive while it goes idle and is taken back: every
    read exact, and at the end nothing charged and one archive kept."""
    archive, original, _other = stack
    backend = DecantBackend(PageCache(1 << 20), linger=30.0)
    bad: list[str] = []

    def work() -> None:
        for _ in range(30):
            _archive, data = read_all(backend, archive)
            if data != original:
                bad.append("wrong bytes")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    assert backend.shared.held == 0 and backend.shared.by_uid == {}
    assert len(backend.shared) == 0 and len(backend.shared.idle) == 1
    assert backend.shared.idle.held_bytes <= LINGER_BYTES
    backend.shared.idle.clear()


def test_a_reopen_keeps_the_plan_its_last_reader_built_and_lets_it_go_after(stack) -> None:
    archive, original, _other = stack
    backend = DecantBackend(PageCache(1 << 20), linger=30.0)
    handle = backend.open(archive, "", Entry())
    plan = weakref.ref(handle.reader.plan)  # nothing here holds it: the kept archive must
    handle.close()
    del handle
    gc.collect()
    assert plan() is not None
    again = backend.open(archive, "", Entry())
    try:
        assert again.reader.plan is plan() and bytes(again.read(0, again.size)) == original
        assert again.archive._pinned == []  # held by the reader now, not by the archive
    finally:
        again.close()
    backend.shared.idle.clear()


def test_an_archive_written_just_before_its_parse_is_not_kept(stack) -> None:
    """Red team 47, F1: one write() over an archive in place stamps its mtime as it starts, so
    a parse during it has the new version's key and the old one's directory. Kept, every reopen
    within the window took that parse again; an archive written under SETTLED_NS before its
    parse is closed with its last handle."""
    archive, original, _other = stack
    os.utime(archive)  # written now
    backend = DecantBackend(PageCache(1 << 20), linger=30.0)
    first, data = read_all(backend, archive)
    assert data == original and len(backend.shared.idle) == 0
    settled(archive)
    first, _data = read_all(backend, archive)
    second, _data = read_all(backend, archive)
    assert second is first and len(backend.shared.idle) == 1
    backend.shared.idle.clear()


def test_the_bytes_kept_count_the_data_offsets_reads_found(stack) -> None:
    """What a kept archive is weighed at includes the zip entries' data offsets its reads
    found (a dict entry each), not only the directory tables it was admitted with."""
    archive, _original, _other = stack
    backend = DecantBackend(PageCache(1 << 20), linger=30.0)
    read_all(backend, archive)
    kept = backend.shared.idle.take(next(iter(backend.shared.idle._kept)))
    store = kept.store  # type: ignore[attr-defined]
    found = len(store._data_offsets)
    assert found > 0
    assert store.held_bytes() == store._entries.nbytes + found * DATA_OFFSET_BYTES
    kept.close()
