"""The event loop's polling of a small read the disk was asked for (vfs.mount.reads._polled)."""

from __future__ import annotations

from types import SimpleNamespace

import trio

from vfs.mount import reads


class Disk:
    """A reader whose bytes arrive after `ready` polls; counts what the adapter asked."""

    def __init__(self, ready: int | None, small: bool = True) -> None:
        self.ready, self.small = ready, small
        self.polls = self.asked = 0

    def disk_asked(self, off: int, size: int) -> bool:
        self.asked += 1
        return self.small

    def read_cached(self, off: int, size: int) -> bytes | None:
        self.polls += 1
        if self.ready is not None and self.polls >= self.ready:
            return bytes([off % 256]) * size
        return None


def polled(handle: SimpleNamespace) -> bytes | None:
    async def main() -> bytes | None:
        return await reads._polled(handle, 4096, 16, handle.reader.read_cached)

    return trio.run(main)


def test_a_read_whose_bytes_arrive_while_polled_is_served_from_the_loop() -> None:
    handle = SimpleNamespace(reader=Disk(ready=3), poll_misses=5)
    assert polled(handle) == bytes([0]) * 16
    assert handle.reader.polls == 3 and handle.poll_misses == 0


def test_a_slow_disk_hands_reads_to_threads_and_stops_being_polled() -> None:
    handle = SimpleNamespace(reader=Disk(ready=None), poll_misses=0)
    for n in range(1, reads.MAX_POLL_MISSES + 1):
        assert polled(handle) is None
        assert handle.poll_misses == n
    polls, asked = handle.reader.polls, handle.reader.asked
    assert polls >= reads.MAX_POLL_MISSES
    assert polled(handle) is None  # no more polling, nor asking the disk, for this handle
    assert (handle.reader.polls, handle.reader.asked) == (polls, asked)


def test_a_read_polling_cannot_serve_is_not_polled() -> None:
    handle = SimpleNamespace(reader=Disk(ready=1, small=False), poll_misses=0)
    assert polled(handle) is None
    assert handle.reader.polls == 0 and handle.poll_misses == 0
    bare = SimpleNamespace(reader=SimpleNamespace(read_cached=lambda o, s: b"x"), poll_misses=0)
    assert polled(bare) is None  # a backend without disk_asked (decant, AcqStore)
