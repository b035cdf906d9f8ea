"""Hash-as-you-serve bookkeeping: SequentialHasher and Coverage against hashlib and set logic."""

from __future__ import annotations

import hashlib
import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.integrity import MAX_GAP, Coverage, ParkBudget, SequentialHasher, held_bytes


def _chunks(data: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [(a, data[a:b]) for a, b in itertools.pairwise(edges) if b > a]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=1, max_size=5000), cuts=st.lists(st.integers(0, 5000)),
       seed=st.integers(0, 2**32))  # fmt: skip
def test_reordered_reads_hash_like_hashlib(data: bytes, cuts: list[int], seed: int) -> None:
    chunks = _chunks(data, cuts)
    random.Random(seed).shuffle(chunks)
    hasher = SequentialHasher(len(data), hashlib.sha256(data).hexdigest())
    completions = [hasher.feed(off, chunk) for off, chunk in chunks]
    assert hasher.complete and hasher.ok
    assert completions.count(True) == 1


def test_wrong_bytes_complete_but_fail() -> None:
    data = b"x" * 1000
    hasher = SequentialHasher(len(data), hashlib.sha256(b"y" * 1000).hexdigest())
    assert hasher.feed(0, data)
    assert hasher.complete and not hasher.ok


def test_overlapping_reads_abandon_rather_than_guess() -> None:
    data = bytes(range(256)) * 8
    hasher = SequentialHasher(len(data), hashlib.sha256(data).hexdigest())
    hasher.feed(100, data[100:300])
    hasher.feed(0, data[0:200])  # overlaps the parked read
    assert hasher.abandoned and not hasher.complete


def test_a_read_far_ahead_is_not_parked_but_ends_the_running_hash() -> None:
    """Random reads of a fresh handle each parked a copy (up to 8 MiB a handle) for a hash
    that could not continue; one starting past the kernel's reordering gives up at once."""
    size = 3 * MAX_GAP
    hasher = SequentialHasher(size, "0" * 64)
    hasher.feed(MAX_GAP, b"r" * 4096)  # as far ahead as reordering goes: parked
    assert not hasher.abandoned and hasher._pending_bytes == 4096
    hasher = SequentialHasher(size, "0" * 64)
    hasher.feed(MAX_GAP + 1, b"r" * 4096)
    assert hasher.abandoned and hasher._pending_bytes == 0


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 3000), cuts=st.lists(st.integers(0, 3000)), seed=st.integers(0, 99))
def test_coverage_reaches_size_only_when_every_byte_was_seen(size: int, cuts: list[int],
                                                              seed: int) -> None:  # fmt: skip
    ranges = [(a, a + len(c)) for a, c in _chunks(bytes(size), cuts)]
    random.Random(seed).shuffle(ranges)
    cov, seen = Coverage(), set()
    for a, b in ranges:
        seen.update(range(a, b))
        full = cov.add(a, b) >= size
        assert full == (len(seen) == size)


def test_hashers_sharing_a_budget_park_within_it_and_give_back_what_they_held() -> None:
    size = 8 << 20
    budget = ParkBudget(size)
    first, second = (SequentialHasher(size, "0" * 64, budget) for _ in range(2))
    plane = bytearray(size)
    first.feed(1 << 20, memoryview(plane)[1 << 20 : 2 << 20])  # a view pins its whole buffer
    assert not first.abandoned and budget.held == size
    budget.max_bytes = size + (2 << 20)
    second.feed(1 << 20, b"x" * (1 << 20))
    second.feed(2 << 20, b"x" * (1 << 20))
    assert not second.abandoned and budget.held == size + (2 << 20)
    second.feed(3 << 20, b"x" * 4096)  # past the budget: it gives up, and lets go
    assert second.abandoned and budget.held == size
    first.feed(0, b"\0" * (1 << 20))  # the gap filled: the parked read is hashed, let go
    assert first.pos == 2 << 20 and budget.held == 0
    first.feed(3 << 20, b"y" * 10)
    assert budget.held == 10
    first.abandon()
    assert budget.held == 0


def test_a_view_held_for_hashing_counts_the_buffer_it_keeps_alive() -> None:
    buf = bytearray(1000)
    assert held_bytes(memoryview(buf)[10:20]) == 1000
    assert held_bytes(b"abc") == 3
    assert held_bytes(memoryview(b"abcdef")[1:2]) == 6
