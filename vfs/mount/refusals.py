"""Which file versions failed their verification, each refused until a deadline.

A local archive's failed version is refused for good: its bytes are on this disk, and a repair
gives it a new version (a new key). An archive in a bucket keeps its version (its ETag) when
the bytes were damaged on the way, not in the store (a proxy, a NIC, plain http), so its
refusal lapses after a while and the next open reads it again, from the store, not from the
ranges kept from the damaged read (red team 58, F4: until then it was refused until a restart).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterator


class Refusals:
    """A set of keys, each until its deadline (`math.inf`: until removed). Holding `limit`
    keys, it is emptied before the next is added: a refusal forgotten is only asked again, by
    a new verification (see Integrity._note)."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._until: dict[Hashable, float] = {}
        self._limit = limit
        self._clock = clock

    def add(self, key: Hashable, hold: float = math.inf) -> None:
        if len(self._until) >= self._limit:
            self._until.clear()
        self._until[key] = self._clock() + hold

    def __contains__(self, key: object) -> bool:
        until = self._until.get(key)  # type: ignore[call-overload]
        if until is None:
            return False
        if until <= self._clock():
            del self._until[key]  # type: ignore[arg-type]
            return False
        return True

    def discard(self, key: Hashable) -> None:
        self._until.pop(key, None)

    def __iter__(self) -> Iterator[Hashable]:
        now = self._clock()
        return iter([key for key, until in self._until.items() if until > now])

    def __bool__(self) -> bool:  # without the count: may say True of lapsed ones alone
        return bool(self._until)

    def __len__(self) -> int:
        now = self._clock()
        return sum(1 for until in self._until.values() if until > now)
