"""`.decant-status` as each reader gets it: bounded, rendered off the trio thread, and shared.

Any user may open the file as often as they like, and its lists name files any user can make
fail (1,500 unpublishable names made a 1 MB document, built at every lookup, getattr and open on
the trio thread and copied into every handle). So:

- each list of files (`failed`, `waiting_for_space`) names at most `LIST_MAX` entries and
  `LIST_BYTES` of their JSON; `<list>_total` counts all of the reader's;
- the pack queue's part (its counts and lists: O(files) to gather, an `lstat` per listed file
  to filter for the reader) is rendered again only when the queue changed (its `changes`
  counter) or is `TTL` old: gathered on the trio thread (the queue's owner) into a fresh
  document, filtered, bounded and serialized in a worker thread;
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
    ) -> None:
        self._head, self._tail, self._version, self._owned = head, tail, version, owned
        self._heads: dict[int, tuple[object, float, bytes]] = {}  # uid: version, when, JSON
        self._read: dict[int, tuple[bytes, Doc, Joined]] = {}  # uid: head, tail, what is read
        self._lock = trio.Lock()  # one head rendered at a time: readers meanwhile reuse it

    def _fresh_head(self, viewer: int) -> bytes | None:
        found = self._heads.get(viewer)
        if found is None or found[0] != self._version() or time.monotonic() - found[1] >= TTL:
            return None
        return found[2]

    async def _head_of(self, viewer: int) -> bytes:
        head = self._fresh_head(viewer)
        if head is not None:
            return head
        async with self._lock:
            head = self._fresh_head(viewer)
            if head is not None:
                return head
            version, taken, doc = self._version(), time.monotonic(), self._head()
            head = await trio.to_thread.run_sync(render_head, doc, viewer, self._owned)
            self._heads = {v: h for v, h in self._heads.items() if taken - h[1] < TTL}
            self._read = {v: r for v, r in self._read.items() if v in self._heads}
            self._heads[viewer] = (version, taken, head)
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
