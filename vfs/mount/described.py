"""Archive description trees the mount keeps: one LRU for all archives, bounded in entries.

An archive's member tree costs ~650 bytes an entry (a package may hold 100,000 members, and
nothing bounds how many packages SRC holds). Folder nodes of archives do not hold their tree:
their children are made from the tree kept here, and a tree evicted is read again (the
persistent index first) when they are next needed. Pure and thread-safe: scans and listings
run in worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from vfs.backends.base import Entry

DESCRIBED_ENTRIES = 150_000  # entries (members and folders) kept across all archives


class DescribedTrees:
    """Trees by key, the most recently used kept while their entries fit `budget`. The most
    recent tree is kept whatever its size: an archive larger than the budget still lists."""

    def __init__(self, budget: int = DESCRIBED_ENTRIES) -> None:
        self.budget = budget
        self._trees: OrderedDict[Hashable, tuple[Entry, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self._loading: dict[Hashable, _Loading] = {}
        self.loads = 0  # trees read again after eviction (or never put)

    @property
    def held(self) -> int:
        """Entries of all trees kept."""
        return self._held

    def __len__(self) -> int:
        return len(self._trees)

    def get(self, key: Hashable) -> Entry | None:
        with self._lock:
            found = self._trees.get(key)
            if found is None:
                return None
            self._trees.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, root: Entry) -> None:
        """Keep `root` (compacted: no more entries may be added to it) under `key`."""
        weight = root.compact()
        with self._lock:
            old = self._trees.pop(key, None)
            if old is not None:
                self._held -= old[1]
            self._trees[key] = (root, weight)
            self._held += weight
            while self._held > self.budget and len(self._trees) > 1:
                _key, (_root, dropped) = self._trees.popitem(last=False)
                self._held -= dropped

    def discard(self, key: Hashable) -> None:
        with self._lock:
            old = self._trees.pop(key, None)
            if old is not None:
                self._held -= old[1]

    def get_or_load(self, key: Hashable, load: Callable[[], Entry]) -> Entry:
        """The tree under `key`, loaded (and kept) on a miss. One thread loads a key at a time:
        others asking for it wait and take its result, rather than read it a second time."""
        found = self.get(key)
        if found is not None:
            return found
        with self._lock:
            slot = self._loading.setdefault(key, _Loading())
            slot.waiters += 1
        try:
            with slot.lock:
                found = self.get(key)
                if found is None:
                    found = load()
                    self.loads += 1
                    self.put(key, found)
                return found
        finally:
            with self._lock:
                slot.waiters -= 1
                if not slot.waiters:
                    del self._loading[key]


class _Loading:
    """A key being loaded: its threads take turns, the first one loads."""

    __slots__ = ("lock", "waiters")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiters = 0
