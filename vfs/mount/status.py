"""`.decant-status` as each reader gets it: bounded, rendered off the trio thread, and shared.

Any user may open the file as often as they like, and its lists name files any user can make
fail (1,500 unpublishable names made a 1 MB document, built at every lookup, getattr and open on
the trio thread and copied into every handle). So:

- each list of files (`failed`, `waiting_for_space`) names at most `LIST_MAX` entries and
  `LIST_BYTES` of their JSON; `<list>_total` counts all of the reader's;
- the pack queue's part (its counts and lists: O(files) to gather, an `lstat` per listed file
  to filter for the reader) is gathered again only when the queue changed (its `changes`
  counter) or is `TTL` old, on the trio thread (the queue's owner) into a fresh document that
  every reader shares; filtered, bounded and serialized per reader in a worker thread;
- gathers are spaced by `SPACING` times what the last one cost, whatever changed meanwhile: a
  user churning temp names and reading the status ~120 times a second made the loop gather
  50,000 queued names (~9 ms each) at nearly every read, and raised other users' open+read
  p50 from 1.2 to 4.7 ms; spaced, gathering takes at most 1/SPACING of the loop, and the status
  of a small queue (microseconds to gather) still shows a change at the next read;
- the rest (free space, the daemon's counters: a few numbers) is read at every call, so what
  the file shows is current, and serialized after the queue's part;
- a reader's rendering is reused while neither part changed: the lookup, getattr and open of
  one `cat` get the same (its size is that of what it reads); handles share the queue's part
  and hold only their own counters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import trio

LIST_MAX = 100  # entries named per list, per reader
LIST_BYTES = 64 * 1024  # and at most this much of their JSON (a name may be 4 KiB, escaped 6x)
TTL = 1.0  # seconds a reader's queue part is reused at most (a worker's progress is not counted)
SPACING = 20  # the next gather waits this many times the last one's cost (loop share <= 1/20)
LISTS = ("failed", "waiting_for_space")

Doc = dict[str, Any]


def bounded(entries: list[Any]) -> list[Any]:
    """The first entries, at most `LIST_MAX` of them and `LIST_BYTES` of their JSON."""
    out: list[Any] = []
    spent = 0
    for entry in entries[:LIST_MAX]:
        spent += len(json.dumps(entry))
        if spent > LIST_BYTES:
            break
        out.append(entry)
    return out


def for_viewer(doc: Doc, viewer: int, owned: Callable[[object, int], bool]) -> Doc:
    """`doc` as `viewer` reads it: a caller other than root sees only its own files among those
    named, never names from folders it may not list; each list bounded, with its total. A new
    document: `doc` is left as it is. Blocking (lstat): a worker thread's."""
    out: Doc = {}
    for key, value in doc.items():
        if key in LISTS and isinstance(value, list):
            if viewer != 0:
                value = [e for e in value if isinstance(e, dict) and owned(e.get("path"), viewer)]
            out[key], out[f"{key}_total"] = bounded(value), len(value)
        else:
            out[key] = value
    return out


class Joined:
    """A reader's status as its handles read it: the queue's part, shared by every handle of
    its version, then its own few hundred bytes of counters (a handle opened after each read of
    some file would otherwise hold a copy of all of it)."""

    def __init__(self, head: bytes, tail: bytes) -> None:
        self.head, self.tail = head, tail
        self.size = len(head) + len(tail)

    def read(self, offset: int, size: int) -> bytes:
        cut = len(self.head)
        if offset >= cut:
            return self.tail[offset - cut : offset - cut + size]
        return self.head[offset : offset + size] + self.tail[: max(0, offset + size - cut)]

    read_cached = read  # served on the trio thread (see Reads.read): slicing, no thread hop

    def readahead(self, offset: int) -> None:
        pass

    def close(self) -> None:
        pass

    def data(self) -> bytes:
        return self.head + self.tail


def head_part(head: str) -> bytes:
    """The queue's part of `{**head, **tail}` as `json.dumps(..., indent=1)` writes it, for a
    tail that is not empty: `head` serialized, without its closing brace."""
    return b"" if head == "{}" else (head[:-2] + ",\n").encode()


def joined(head: bytes, tail: Doc) -> Joined:
    rest = json.dumps(tail, indent=1)
    return Joined(head, ((rest[2:] if head else rest) + "\n").encode())


def render_head(doc: Doc, viewer: int, owned: Callable[[object, int], bool]) -> bytes:
    return head_part(json.dumps(for_viewer(doc, viewer, owned), indent=1))


class StatusFile:
    """What each reader (uid) reads. `head()` (the pack queue's part, every file named) and
    `tail()` (the rest, never empty) run on the trio thread and return documents no one else
    holds;
    `version()` changes whenever `head()` would; `owned(path, uid)` runs in a worker."""

    def __init__(
        self,
        head: Callable[[], Doc],
        tail: Callable[[], Doc],
        version: Callable[[], object],
        owned: Callable[[object, int], bool],
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self._head, self._tail, self._version, self._owned = head, tail, version, owned
        # The cost of a gather is the loop thread's CPU time: a gather of a few names that the
        # OS preempted is not one to space the next by.
        self._clock, self._cpu = clock, cpu
        # The queue's part as last gathered: (generation, version, when, document), shared by
        # every reader; no new gather before `_next`.
        self._gathered: tuple[int, object, float, Doc] | None = None
        self._next = 0.0
        self._heads: dict[int, tuple[int, bytes]] = {}  # uid: generation rendered, JSON
        self._read: dict[int, tuple[bytes, Doc, Joined]] = {}  # uid: head, tail, what is read
        self._lock = trio.Lock()  # one head rendered at a time: readers meanwhile reuse it

    def _current(self) -> tuple[int, Doc]:
        """The queue's part to show now (generation, document): the last one gathered while it
        stands (same version, under TTL old) or while the spacing after its gather lasts."""
        now = self._clock()
        last = self._gathered
        if last is not None:
            generation, version, taken, doc = last
            if now < self._next or (version == self._version() and now - taken < TTL):
                return generation, doc
        spent = self._cpu()
        version, doc = self._version(), self._head()
        spent = self._cpu() - spent
        self._next = self._clock() + SPACING * spent
        generation = last[0] + 1 if last is not None else 0
        self._gathered = (generation, version, now, doc)
        self._heads = {}  # renderings of an older gather are not read again
        self._read = {}
        return generation, doc

    async def _head_of(self, viewer: int) -> bytes:
        generation, doc = self._current()
        found = self._heads.get(viewer)
        if found is not None and found[0] == generation:
            return found[1]
        async with self._lock:
            generation, doc = self._current()
            found = self._heads.get(viewer)
            if found is not None and found[0] == generation:
                return found[1]
            head = await trio.to_thread.run_sync(render_head, doc, viewer, self._owned)
            if self._gathered is not None and self._gathered[0] == generation:
                self._heads[viewer] = (generation, head)
            return head

    async def read(self, viewer: int) -> Joined:
        head = await self._head_of(viewer)
        tail = self._tail()
        key = _without_uptime(tail)  # else no two opens would share: the head's TTL bounds it
        last = self._read.get(viewer)
        if last is not None and last[0] is head and last[1] == key:
            return last[2]
        data = joined(head, tail)
        self._read[viewer] = (head, key, data)
        return data


def _without_uptime(tail: Doc) -> Doc:
    daemon = tail.get("daemon")
    if not isinstance(daemon, dict):
        return tail
    return {**tail, "daemon": {k: v for k, v in daemon.items() if k != "uptime_s"}}
