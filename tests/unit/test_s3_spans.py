"""S3Object's read-ahead bookkeeping under every order of reads and prefetches: no byte twice.

A bucket mount's cold `dd` once fetched 278-300 MiB of a 270 MiB archive: the mount's
read-ahead thread, a few chunks behind the decoders, asked for chunks they had already taken
from their spans (keyed by their data offset by then, not by their local header), and the
object, which forgot a range once it was taken, fetched them again. Here the GETs never run on
a thread: a lazy pool runs a span's GET when a step says so, or when a read waits for it, and a
read's own GET can let the read-ahead ask for more while it is "in flight". So each order of
events is one deterministic example, and hypothesis explores them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vfs.errors import StoreError
from vfs.stores.base import ObjectInfo
from vfs.stores.ranges import Ranges
from vfs.stores.s3 import Fetched, S3Folder, S3Object, S3Options

CHUNK = 1000
HEADER = 40  # a zip local header: the first read of an entry takes it with the entry's bytes
COUNT = 24
BLOB = bytes((i * 7 + i // 251) % 256 for i in range(CHUNK * COUNT))


def first_read(i: int) -> tuple[int, int]:
    """What the decant store reads of entry `i` while its data offset is not known."""
    return i * CHUNK, CHUNK


def data_range(i: int) -> tuple[int, int]:
    """What it reads (and prefetches) of entry `i` once a read told it the data offset."""
    return i * CHUNK + HEADER, CHUNK - HEADER


class LazyFuture(Future[Any]):
    """A pool task that runs when the test says so, or inline when a reader waits for it."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        super().__init__()
        self._call = (fn, args)

    def run(self) -> None:
        if not self.set_running_or_notify_cancel():
            return  # cancelled while queued
        fn, args = self._call
        try:
            self.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever waits, as a pool thread would
            self.set_exception(exc)

    def result(self, timeout: float | None = None) -> Any:
        if not self.done() and not self.running():
            self.run()
        return super().result(timeout)


class LazyPool:
    def __init__(self) -> None:
        self.queued: list[LazyFuture] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> LazyFuture:
        future = LazyFuture(fn, args)
        self.queued.append(future)
        return future

    def run_next(self, pick: int, fail: bool = False) -> None:
        waiting = [f for f in self.queued if not f.done()]
        if not waiting:
            return
        future = waiting[pick % len(waiting)]
        if not fail:
            future.run()
        elif future.set_running_or_notify_cancel():  # the GET failed after its retries
            future.set_exception(StoreError("s3://bucket/blob: object store failed (test)"))

    def shutdown(self, wait: bool = False) -> None:
        for future in self.queued:
            future.cancel()


class Fetches:
    """Every GET the object makes, and what runs while a read's own GET is in flight."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.during_next_get: Callable[[], None] | None = None

    def get(self, source: S3Object, offset: int, size: int) -> bytes:
        self.calls.append((offset, size))
        hook, self.during_next_get = self.during_next_get, None
        if hook is not None:
            hook()  # the read-ahead thread, between the read's decision and its GET's answer
        return BLOB[offset : offset + size]

    def twice(self) -> list[tuple[int, int]]:
        """Ranges fetched that overlap a range fetched before."""
        seen: list[tuple[int, int]] = []
        out = []
        for offset, size in self.calls:
            if any(offset < o + n and o < offset + size for o, n in seen):
                out.append((offset, size))
            seen.append((offset, size))
        return out


def _object(monkeypatch: pytest.MonkeyPatch, fetches: Fetches) -> tuple[S3Object, LazyPool]:
    monkeypatch.setattr(S3Object, "_get", lambda self, off, n: fetches.get(self, off, n))
    folder = S3Folder("s3://bucket", S3Options(endpoint="http://127.0.0.1:9"))  # never reached
    pool = LazyPool()
    folder.conn._pool = pool  # type: ignore[assignment]
    source = S3Object(folder, "blob", ObjectInfo("blob", len(BLOB), 0.0, '"etag"'))
    return source, pool


@pytest.fixture
def lazy(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[S3Object, LazyPool, Fetches]]:
    fetches = Fetches()
    source, pool = _object(monkeypatch, fetches)
    source.readahead_bytes = len(BLOB)
    yield source, pool, fetches
    source.close()
    source._folder.close()


def test_a_late_read_ahead_does_not_fetch_again_what_reads_took(
    lazy: tuple[S3Object, LazyPool, Fetches],
) -> None:
    """The mount's case: read-ahead asked at a position the decoders have passed names the
    chunks they took, by their data offsets now (a sub-range of what the span fetched)."""
    source, pool, fetches = lazy
    source.prefetch_run([first_read(i) for i in range(6)])
    for i in range(4):
        assert source.read(*first_read(i)) == BLOB[i * CHUNK : (i + 1) * CHUNK]
    source.prefetch_run([data_range(i) for i in range(4)] + [first_read(i) for i in range(4, 8)])
    for future in pool.queued:
        future.result()
    assert fetches.twice() == []
    assert fetches.calls == [(0, 6 * CHUNK), (6 * CHUNK, 2 * CHUNK)]


def test_read_ahead_while_a_read_fetches_a_range_itself_leaves_that_range_out(
    lazy: tuple[S3Object, LazyPool, Fetches],
) -> None:
    """A decoder asks for a chunk nothing fetches ahead and GETs it; while that GET is in
    flight the read-ahead asks for the chunk and the next ones: only the next ones go out."""
    source, _pool, fetches = lazy
    fetches.during_next_get = lambda: source.prefetch_run([first_read(i) for i in range(2, 5)])
    assert source.read(*first_read(2)) == BLOB[2 * CHUNK : 3 * CHUNK]
    for i in (3, 4):
        assert source.read(*first_read(i)) == BLOB[i * CHUNK : (i + 1) * CHUNK]
    assert fetches.calls == [first_read(2), (3 * CHUNK, 2 * CHUNK)]


def test_a_read_within_a_queued_span_waits_for_it(
    lazy: tuple[S3Object, LazyPool, Fetches],
) -> None:
    """A range inside a span fetched ahead, though not one it was asked for as, is cut from
    that span's GET, not fetched again."""
    source, _pool, fetches = lazy
    source.prefetch_run([first_read(i) for i in range(3)])
    assert bytes(source.read_buffer(*data_range(1))) == BLOB[CHUNK + HEADER : 2 * CHUNK]
    assert fetches.calls == [(0, 3 * CHUNK)]


def test_a_second_pass_is_read_ahead_again(lazy: tuple[S3Object, LazyPool, Fetches]) -> None:
    """What reads took is left out of read-ahead only until a read takes some of it again:
    the reader went back for a second pass (its planes were evicted), and read-ahead serves
    that pass as it did the first."""
    source, _pool, fetches = lazy
    for i in range(6):
        source.read(*first_read(i))
    fetches.calls.clear()
    source.read(*data_range(0))  # back at the start, by the offset the first pass found
    source.prefetch_run([data_range(i) for i in range(1, 6)])
    for i in range(1, 6):
        assert source.read(*data_range(i)) == BLOB[i * CHUNK + HEADER : (i + 1) * CHUNK]
    assert fetches.calls == [data_range(0), (CHUNK + HEADER, 5 * CHUNK - HEADER)]


def _runs(held: set[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for b in sorted(held):
        if runs and runs[-1][1] == b:
            runs[-1] = (runs[-1][0], b + 1)
        else:
            runs.append((b, b + 1))
    return runs


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "forget", "near"]), st.integers(0, 120),
                          st.integers(0, 30), st.integers(0, 40)), max_size=30))  # fmt: skip
def test_ranges_hold_what_a_set_of_bytes_would(ops: list[tuple[str, int, int, int]]) -> None:
    ranges, held = Ranges(limit=3), set()
    for op, start, size, distance in ops:
        end = start + size
        if op == "add":
            ranges.add(start, end)
            held |= set(range(start, end))
        elif op == "forget":
            ranges.forget_from(start)
            held = {b for b in held if b < start}
        else:
            ranges.keep_near(start, end, distance)
            runs = [(a, b) for a, b in _runs(held) if start - distance <= b and a <= end + distance]
            while len(runs) > 3:
                runs.pop(0 if start - runs[0][1] > runs[-1][0] - end else -1)
            held = {b for a, z in runs for b in range(a, z)}
        assert list(zip(ranges._starts, ranges._ends, strict=True)) == _runs(held)
        for a in range(0, 160, 7):
            for n in (1, 5, 30):
                assert ranges.overlaps(a, a + n) == any(b in held for b in range(a, a + n))
                assert ranges.covered(a, a + n) == sum(b in held for b in range(a, a + n))


class SpanBookkeeping(RuleBasedStateMachine):
    """Reads (each chunk once, as a cold pass does, in any order) and read-ahead runs (any
    window, before or after the reads, or while a read's own GET is in flight), with the GETs
    of spans run in any order. With a budget that holds the whole object, no byte is ever
    fetched twice, and every read gets its bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.monkeypatch = pytest.MonkeyPatch()
        self.fetches = Fetches()
        self.source, self.pool = _object(self.monkeypatch, self.fetches)
        self.source.readahead_bytes = len(BLOB)
        self.read_once: set[int] = set()

    def _run(self, start: int, count: int) -> list[tuple[int, int]]:
        """The store's ranges: by data offset for an entry read before, else header and data."""
        chunks = range(start, min(COUNT, start + count))
        return [data_range(i) if i in self.read_once else first_read(i) for i in chunks]

    @rule(start=st.integers(0, COUNT - 1), count=st.integers(1, 8))
    def read_ahead(self, start: int, count: int) -> None:
        self.source.prefetch_run(self._run(start, count))

    @rule(pick=st.integers(0, 1 << 16))
    def a_span_is_fetched(self, pick: int) -> None:
        self.pool.run_next(pick)

    @precondition(lambda self: len(self.read_once) < COUNT)
    @rule(
        pick=st.integers(0, COUNT - 1),
        late=st.none() | st.tuples(st.integers(0, COUNT - 1), st.integers(1, 8)),
        view=st.booleans(),
    )
    def read(self, pick: int, late: tuple[int, int] | None, view: bool) -> None:
        unread = [i for i in range(COUNT) if i not in self.read_once]
        i = unread[pick % len(unread)]
        if late is not None:  # runs only if this read GETs the chunk itself
            self.fetches.during_next_get = lambda: self.source.prefetch_run(self._run(*late))
        reader = self.source.read_buffer if view else self.source.read
        got = bytes(reader(*first_read(i)))
        self.fetches.during_next_get = None
        self.read_once.add(i)
        assert got == BLOB[i * CHUNK : (i + 1) * CHUNK]

    @invariant()
    def no_byte_is_fetched_twice(self) -> None:
        assert self.fetches.twice() == [], self.fetches.calls

    @invariant()
    def held_is_what_the_spans_hold(self) -> None:
        held = sum(n for _off, n in self.source._ahead)
        assert held <= self.source.readahead_bytes
        assert self.source._folder.conn._held == held
        spans = self.source._spans
        assert spans == sorted(self.source._ahead)
        assert all(a + n <= b for (a, n), (b, _m) in itertools.pairwise(spans))

    def teardown(self) -> None:
        self.source.close()
        assert self.source._folder.conn._held == 0
        self.source._folder.close()
        self.monkeypatch.undo()


class TightBudget(SpanBookkeeping):
    """The same with room for a few chunks only, chunks read again, and GETs of spans that
    fail: spans are dropped to make room and failed ones are asked again (so a chunk may be
    fetched twice), but what is held stays within the budget and every read gets its bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.source.readahead_bytes = 5 * CHUNK + CHUNK // 2

    @rule(pick=st.integers(0, 1 << 16))
    def a_span_fails(self, pick: int) -> None:
        self.pool.run_next(pick, fail=True)

    @precondition(lambda self: self.read_once)
    @rule(pick=st.integers(0, COUNT - 1), first=st.booleans())
    def read_again(self, pick: int, first: bool) -> None:
        i = sorted(self.read_once)[pick % len(self.read_once)]
        offset, size = first_read(i) if first else data_range(i)
        assert self.source.read(offset, size) == BLOB[offset : offset + size]

    @invariant()
    def no_byte_is_fetched_twice(self) -> None:
        pass  # not here, by design


for machine in (SpanBookkeeping, TightBudget):
    machine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_span_bookkeeping = SpanBookkeeping.TestCase
test_span_bookkeeping_in_a_tight_budget = TightBudget.TestCase


def test_a_read_that_waited_for_a_failing_prefetch_gives_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store hangs: the span the read waits for fails after its GET's retries. That error is
    the read's, not a second GET with retries of its own (the wait to EIO doubled). A span that
    had failed before the read came is asked again: the store may be back."""
    fetches = Fetches()
    source, pool = _object(monkeypatch, fetches)
    down = True

    def get(self: S3Object, offset: int, size: int) -> bytes:
        fetches.calls.append((offset, size))
        if down:
            raise StoreError("s3://bucket/blob: object store failed after retries (test)")
        return BLOB[offset : offset + size]

    monkeypatch.setattr(S3Object, "_get", get)
    try:
        source.prefetch(*data_range(3))
        with pytest.raises(StoreError):
            source.read(*data_range(3))  # waits for the queued span: it runs, and fails
        assert fetches.calls == [data_range(3)]
        source.prefetch(*data_range(5))
        pool.run_next(0)  # fails before anyone reads it
        down = False
        assert source.read(*data_range(5)) == BLOB[slice(*_bounds(data_range(5)))]
        assert fetches.calls == [data_range(3), data_range(5), data_range(5)]
    finally:
        source.close()
        source._folder.close()


def _bounds(r: tuple[int, int]) -> tuple[int, int]:
    return r[0], r[0] + r[1]


def test_fetched_counts_the_bytes_a_get_fetches_again() -> None:
    """`.decant-status` shows what GETs fetched again: a benchmark's over-fetch is then told
    apart from an archive's framing read once (per object version, whichever reader asked)."""
    fetched = Fetched()
    assert fetched.add(100, "s3://b/a", '"1"', 0) == 0
    assert fetched.add(100, "s3://b/a", '"1"', 150) == 0
    assert fetched.add(150, "s3://b/a", '"1"', 50) == 100  # 50-100 and 150-200 were fetched
    assert fetched.add(100, "s3://b/a", '"2"', 0) == 0  # another version: its own bytes
    assert fetched.add(100, "s3://b/b", '"1"', 0) == 0
    assert (fetched.gets, fetched.bytes, fetched.refetched) == (5, 550, 100)


def test_read_ahead_for_a_chunk_stored_before_its_spans_keeps_them(
    lazy: tuple[S3Object, LazyPool, Fetches],
) -> None:
    """`decant pack`'s threads may store a plane's chunk after the next one's (here plane 1's
    chunk is entry 2, plane 2's entry 1). Read-ahead for plane 3 fetched entries 2-5 (the
    budget's four chunks); asked then for plane 2's (entry 1, stored before them), it dropped
    the farthest span to make room although it still asked for it, and fetched its chunks again
    later: a cold `dd` of a 512 MiB original fetched 8.4 MiB twice. The spans stay; entry 1
    is left to the read that needs it, and no byte is fetched twice."""
    source, pool, fetches = lazy
    source.readahead_bytes = 4 * CHUNK
    source.read(*first_read(0))
    source.prefetch_run([first_read(i) for i in range(2, 8)])
    pool.run_next(0)
    source.prefetch_run([first_read(i) for i in range(1, 5)])  # as many as the budget holds
    for i in range(1, 8):
        assert source.read(*first_read(i)) == BLOB[i * CHUNK : (i + 1) * CHUNK]
        source.prefetch_run([first_read(k) for k in range(i + 1, COUNT)])
    assert fetches.twice() == []
    assert fetches.calls[:3] == [first_read(0), (2 * CHUNK, 4 * CHUNK), first_read(1)]
