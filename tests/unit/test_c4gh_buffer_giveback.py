"""Decryption buffers given back when their pages leave the cache (vfs.c4gh.buffers, segments).

Before, every buffer a package's reads ever made stayed in its ring: a stream larger than the
cache left about the cache's size of idle buffers beside whatever the cache held next.
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from tests.unit.test_c4gh_segments import encrypted_body
from vfs.c4gh.buffers import ByteBudget, RecycledBuffers
from vfs.c4gh.segments import PAGE_SEGMENTS, PAGE_SIZE, SegmentBuffers, SegmentReader
from vfs.cache import PageCache

PLAIN = bytes(range(256)) * (3 * PAGE_SIZE // 256)  # three whole pages


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return encrypted_body(tmp_path_factory.mktemp("giveback"), PLAIN, "three-pages.c4gh")


def test_at_most_reserve_returned_buffers_are_kept_and_the_rest_go_back_to_the_budget() -> None:
    budget = ByteBudget(10 * 1024)
    ring = RecycledBuffers(1024, limit=10, budget=budget, reserve=2)
    taken = [ring.take() for _ in range(6)]
    assert all(b is not None for b in taken) and budget.left == 4 * 1024
    kept = {id(b) for b in taken[:2]}
    for buf in taken:
        ring.returned(buf)
    del buf
    taken.clear()
    assert len(ring) == 2 and budget.left == 8 * 1024
    again = ring.take()
    assert id(again) in kept  # an idle one, not a new one
    ring.returned(bytearray(1024))  # not one of the ring's: nothing happens
    assert len(ring) == 2 and budget.left == 8 * 1024


def test_a_returned_buffer_still_viewed_is_not_handed_out_again() -> None:
    ring = RecycledBuffers(1024, limit=4, reserve=4)
    buf = ring.take()
    assert buf is not None
    view = memoryview(buf)[10:20]  # what a reply or a queued hash still holds
    ring.returned(buf)
    del buf
    for _ in range(3):
        other = ring.take()
        assert other is not None and other is not view.obj
        ring.returned(other)
    view.release()


def _reader(package: SimpleNamespace, cache: PageCache, buffers: SegmentBuffers) -> SegmentReader:
    return SegmentReader(package.path, package.hlen, package.key, cache, buffers=buffers)


def test_pages_evicted_from_the_cache_give_their_buffers_back(package: SimpleNamespace) -> None:
    cache = PageCache(4 * PAGE_SIZE)
    buffers = SegmentBuffers(cache.max_bytes)
    buffers.pages.reserve = 1
    budget_before = buffers.pages._budget.left  # type: ignore[union-attr]
    with _reader(package, cache, buffers) as rd:
        for page in range(3):
            rd.load_span((page * PAGE_SEGMENTS, (page + 1) * PAGE_SEGMENTS))
        assert len(buffers.pages) == 3
        cache.put("another archive's plane", bytearray(4 * PAGE_SIZE))  # evicts all three
        gc.collect()
        assert len(buffers.pages) == 1  # the reserve; two were dropped
        assert buffers.pages._budget.left == budget_before - PAGE_SIZE  # type: ignore[union-attr]
        assert rd.read(PAGE_SIZE - 100, 200) == PLAIN[PAGE_SIZE - 100 : PAGE_SIZE + 100]


def test_a_stream_through_the_cache_keeps_no_more_page_buffers_than_it_holds(
    package: SimpleNamespace,
) -> None:
    """A forward reader's pages behind it are emptied (`release`): their buffers serve the
    pages ahead, and no more than the reserve sit idle."""
    cache = PageCache(4 * PAGE_SIZE)
    buffers = SegmentBuffers(cache.max_bytes)
    buffers.pages.reserve = 0
    with _reader(package, cache, buffers) as rd:
        for page in range(3):
            rd.load_span((page * PAGE_SEGMENTS, (page + 1) * PAGE_SEGMENTS))
            start = page * PAGE_SIZE
            assert rd.read(start, PAGE_SIZE) == PLAIN[start : start + PAGE_SIZE]
            rd.release(0, page)  # every page before this one
            assert len(buffers.pages) == 1


def test_a_buffer_returned_while_the_ring_is_locked_is_settled_by_the_next_call() -> None:
    """A page's finalizer runs wherever the garbage collector does (a page in a cycle through
    a stored exception's traceback), this ring's own `take` included: it never waits."""
    budget = ByteBudget(4 * 1024)
    ring = RecycledBuffers(1024, limit=4, budget=budget, reserve=0)
    buf = ring.take()
    with ring._lock:  # another thread, or this one inside `take`
        ring.returned(buf, wait=False)  # would deadlock if it waited
    assert len(ring) == 1 and budget.left == 3 * 1024  # queued, not settled yet
    del buf
    assert ring.take() is not None  # settles the queue first, then makes a new buffer
    assert len(ring) == 1 and budget.left == 3 * 1024


def test_a_page_collected_as_garbage_inside_take_gives_its_buffer_back_later(
    package: SimpleNamespace,
) -> None:
    cache = PageCache(4 * PAGE_SIZE)
    buffers = SegmentBuffers(cache.max_bytes)
    buffers.pages.reserve = 0
    with _reader(package, cache, buffers) as rd:
        rd.load_span((0, PAGE_SEGMENTS))
        page = cache.get(rd.cache_key(0))
        cycle: list[object] = [page]
        cycle.append(cycle)  # garbage only the collector frees
        del page
        cache.discard(rd.cache_key(0))
        del cycle
        with buffers.pages._lock:
            gc.collect()  # the finalizer runs with the ring's lock taken
        assert len(buffers.pages) == 1
        rd.load_span((PAGE_SEGMENTS, 2 * PAGE_SEGMENTS))  # its take settles the queue
        assert len(buffers.pages) == 1  # page 1 took a new buffer; page 0's was dropped
