"""HashFeed: served reads hashed in order on pool threads, with back-pressure, under trio."""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.integrity import SequentialHasher
from vfs.mount import hashfeed
from vfs.mount.hashfeed import HashFeed


def _pieces(data: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [(a, data[a:b]) for a, b in itertools.pairwise(edges) if b > a]


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=4096),
    cuts=st.lists(st.integers(min_value=0, max_value=4096), max_size=20),
    backlog=st.integers(min_value=1, max_value=5),
)
def test_reads_fed_in_order_hash_to_the_file_s_digest(
    data: bytes, cuts: list[int], backlog: int
) -> None:
    """Whatever the read sizes and backlog, the hash completes with the file's sha256."""
    expected = hashlib.sha256(data).hexdigest()

    async def main() -> SequentialHasher:
        hasher = SequentialHasher(len(data), expected)
        feed = HashFeed(hasher, backlog)
        for off, piece in _pieces(data, cuts):
            await feed.put(off, piece)
        with trio.fail_after(10):
            await feed.done.wait()
        return hasher

    hasher = trio.run(main)
    assert hasher.complete and hasher.ok


def test_a_wrong_byte_completes_the_hash_but_not_ok() -> None:
    data = bytes(range(256)) * 64
    expected = hashlib.sha256(data).hexdigest()

    async def main() -> SequentialHasher:
        hasher = SequentialHasher(len(data), expected)
        feed = HashFeed(hasher, 2)
        await feed.put(0, data[:100] + b"\xff" + data[101:5000])
        await feed.put(5000, data[5000:])
        with trio.fail_after(10):
            await feed.done.wait()
        return hasher

    hasher = trio.run(main)
    assert hasher.complete and not hasher.ok


class _Gated(SequentialHasher):
    """A hasher whose feeds wait for `gate`: the drain is held busy while the test looks."""

    def __init__(self, size: int) -> None:
        super().__init__(size, "")
        self.gate = threading.Event()
        self.fed = 0

    def feed(self, offset: int, data: Any) -> bool:
        assert self.gate.wait(10)
        self.fed += 1
        return super().feed(offset, data)


async def _fill_then_release(feed: HashFeed, hasher: _Gated, size: int, queued: int) -> None:
    """One read (the drain takes it at once and waits on the gate), `queued` more (the backlog is
    full then), and one more, which must wait for room until the gate opens; back once it went
    on."""
    await feed.put(0, b"a" * size)
    await trio.sleep(0.05)
    for k in range(1, queued + 1):
        await feed.put(k * size, b"a" * size)
    went_on = trio.Event()

    async def put_next() -> None:
        await feed.put((queued + 1) * size, b"a" * size)
        went_on.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(put_next)
        await trio.sleep(0.1)
        assert not went_on.is_set()  # it waits for room
        hasher.gate.set()
        with trio.fail_after(10):
            await went_on.wait()


def test_a_full_backlog_makes_the_next_read_wait_until_the_drain_takes_it() -> None:
    async def main() -> None:
        hasher = _Gated(10 * 100)
        feed = HashFeed(hasher, 2)
        await _fill_then_release(feed, hasher, 100, 2)  # the drain then takes the queued two
        for k in range(4, 10):
            await feed.put(k * 100, b"a" * 100)
        with trio.fail_after(10):
            await feed.done.wait()
        assert hasher.complete and hasher.fed == 10

    trio.run(main)


def test_close_waits_for_what_is_queued_and_an_idle_feed_is_done_at_once() -> None:
    async def main() -> None:
        hasher = _Gated(1000)
        feed = HashFeed(hasher, 4)
        await feed.put(0, b"x" * 100)
        await feed.put(100, b"x" * 100)
        feed.close()
        await trio.sleep(0.05)
        assert not feed.done.is_set()  # the drain still holds queued reads
        await feed.put(200, b"x" * 100)  # after close: dropped, not queued
        hasher.gate.set()
        with trio.fail_after(10):
            await feed.done.wait()
        assert hasher.pos == 200 and not hasher.complete

        idle = HashFeed(SequentialHasher(10, ""), 4)
        idle.close()
        assert idle.done.is_set()

    trio.run(main)


class _Broken(SequentialHasher):
    def feed(self, offset: int, data: Any) -> bool:
        raise RuntimeError("boom")


def test_a_hasher_that_fails_gives_up_and_lets_waiting_reads_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> SequentialHasher:
        hasher = _Broken(1000, "")
        feed = HashFeed(hasher, 1)
        for k in range(10):  # would wait forever for room if the failed drain left it full
            with trio.fail_after(10):
                await feed.put(k * 100, b"y" * 100)
        with trio.fail_after(10):
            await feed.done.wait()
        return hasher

    hasher = trio.run(main)
    assert hasher.abandoned
    assert "hashing served reads failed" in caplog.text


def test_many_handles_streaming_at_once_all_finish() -> None:
    """More feeds than pool threads, each streaming with a full backlog: a drain goes to the
    back of the pool's queue between batches, so no feed waits for another to end."""
    rng = random.Random(7)
    files = [rng.randbytes(256 * 1024) for _ in range(12)]

    async def main() -> list[SequentialHasher]:
        hashers = [SequentialHasher(len(f), hashlib.sha256(f).hexdigest()) for f in files]
        feeds = [HashFeed(h, 2) for h in hashers]

        async def stream(feed: HashFeed, data: bytes) -> None:
            for off in range(0, len(data), 4096):
                await feed.put(off, data[off : off + 4096])
                if off % 65536 == 0:
                    await trio.sleep(0)
            await feed.done.wait()

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for feed, data in zip(feeds, files, strict=True):
                    nursery.start_soon(stream, feed, data)
        return hashers

    assert all(h.complete and h.ok for h in trio.run(main))


class _GivesUp(_Gated):
    def feed(self, offset: int, data: Any) -> bool:
        assert self.gate.wait(10)
        self.abandon()  # as a read too far ahead of the hash position makes it
        return False


def test_a_read_waiting_for_room_goes_on_when_the_hash_gives_up() -> None:
    async def main() -> None:
        hasher = _GivesUp(1000)
        feed = HashFeed(hasher, 1)
        # The gate opens: the hash gives up, nothing more is hashed, and no read waits.
        await _fill_then_release(feed, hasher, 100, 1)
        with trio.fail_after(10):
            await feed.done.wait()
        assert hasher.abandoned

    trio.run(main)


def test_start_threads_starts_every_pool_thread_before_any_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At mount the daemon starts the hash pool's threads, so the first read that hashes does
    not start one (ThreadPoolExecutor starts them one per submit otherwise)."""
    monkeypatch.setattr(hashfeed, "_POOL", None)  # a pool of this test's own
    hashfeed.start_threads()
    pool = hashfeed._POOL
    assert pool is not None
    try:
        assert len(pool._threads) == hashfeed.WORKERS
    finally:
        pool.shutdown()
