"""The pack queue: spooled files are published once closed and settled, then unspooled.

The queue lives in memory and the spool tree is its journal. It learns of work from what the FUSE
handlers report (touch, opened, closed, renamed, removed), from one walk of each spool at start
(what a crash or a stop left), and from a slow walk for files dropped into the spool or an inbox
by other means. Ready files go to worker threads in batches (`--pack-workers` at once): thousands
of small files cost a few thread hand-offs, one mount switch and one clean-up call per batch.

rsync temp names (`.NAME.XXXXXX`) are never published: they wait for their rename, and one left
unchanged for `stale_temp` seconds (its writer is gone) is deleted. A file that cannot be
published for lack of space waits; the queue asks again with exponential back-off, and at once
when something is deleted through the mount.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import stat
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from vfs.ingest.publish import (
    CHANGED_WAIT,
    Outcome,
    Published,
    describe_error,
    retract,
    signature,
    sync_placed,
)
from vfs.ingest.spool import Spool, is_temp_name, remove_orphans

if TYPE_CHECKING:
    from vfs.decant.packer import PackOptions
    from vfs.ingest.space import SpaceGuard

log = logging.getLogger(__name__)

Key = tuple[int, str]  # (index of the spool, relpath)
TICK = 0.25  # the loop looks at the clock at least this often
BATCH_FILES = 256  # at most this many files per worker call
BATCH_SECONDS = 0.5  # a worker hands back what it has not started after this long
# An idle queue takes a batch once its first file has been due this long: rsync's files come
# due one by one, a few ms apart, and without the wait every batch held one or two files, each
# costing three thread hand-offs, a folder lock and a switch of the mount (3,000 files: 1,739
# batches, 5,217 hand-offs on the trio thread, which rsync waits for).
GATHER = 0.2
RETRY_AFTER = 30.0  # a failed publish is tried again this much later, doubling up to an hour
# (--retry-after)
RETRY_MAX = 3600.0
SPACE_BACKOFF = (1.0, 60.0)  # waiting for space: first and longest pause between looks
WALK_EVERY = 5.0  # the spools are walked at most this often (more seldom when walks are slow)
STALE_TEMP = 24 * 3600.0
WAITING = ("queued", "failed", "space")  # states an item is scheduled in


class HiddenNames(set[str]):
    """Spooled relpaths the mount's listings skip (`SourceTree` asks `in`): files switching to
    their published copies, or one whose shadowed entry the mount is looking at. Counted, so
    two that hide one name never show it while the other still hides it."""

    def __init__(self) -> None:
        super().__init__()
        self._counts: Counter[str] = Counter()

    def hide(self, relpaths: Iterable[str]) -> None:
        for rel in relpaths:
            self._counts[rel] += 1
            self.add(rel)

    def unhide(self, relpaths: Iterable[str]) -> None:
        for rel in relpaths:
            left = self._counts[rel] - 1
            if left > 0:
                self._counts[rel] = left
            else:
                self._counts.pop(rel, None)
                self.discard(rel)


@dataclass(eq=False, slots=True)  # one per spooled file: 50,000 of them at once are usual
class Item:
    spool: Spool
    relpath: str
    changed_at: float = field(default_factory=time.monotonic)
    state: str = "queued"  # queued | packing | failed | space | temp
    reason: str = ""
    retry_at: float = 0.0
    failures: int = 0
    started: bool = False  # a worker has reached it (state "packing" before that: waiting)
    started_at: float = 0.0
    scheduled: bool = False  # an entry in the queue's timetable will look at it
    waited_for_space: bool = False
    found: bool = False  # by a walk: its changes are not reported, its ctime must settle too


class PackQueue:
    def __init__(
        self,
        spools: list[Spool],
        settle: float,
        options: PackOptions | None,
        pack_all: bool = False,
        workers: int = 1,
        stale_temp: float = STALE_TEMP,
        retry_after: float = RETRY_AFTER,
    ) -> None:
        self.spools = spools
        self.settle = settle
        self.options = options
        self.pack_all = pack_all
        self.workers = max(1, workers)
        self.stale_temp = stale_temp
        self.retry_after = retry_after
        # A file found by a walk (not written through the mount, whose changes the queue
        # hears of) must also have been left alone this long on disk (its ctime).
        self.disk_settle = settle
        self.items: dict[Key, Item] = {}
        self.open_counts: dict[str, int] = {}
        self.publishing = HiddenNames()  # relpaths hidden from the mount while switching
        self.done = 0
        # Bumped by every change the status shows (on the trio thread): a reader's rendered
        # status is reused while it stands. A worker's `started` is not counted: the split of
        # queued and packing may lag until its batch ends (the status is a second old at most).
        self.changes = 0
        self.limiter = trio.CapacityLimiter(self.workers)
        self.on_published: Callable[[list[str]], Awaitable[None]] | None = None
        self.guard: SpaceGuard | None = None  # the write side's reserve, shown in the status
        self.cancel = threading.Event()  # set on shutdown: publishes stop between blocks
        self._due: list[tuple[float, int, Key, Item]] = []
        self._seq = itertools.count()
        self._wake: trio.Event | None = None
        self._active = 0
        self._inflight: Counter[Key] = Counter()  # keys of the items workers hold now
        self._gone: dict[Key, float] = {}  # keys removed, and when: a walk begun before is stale
        self._space_at = 0.0
        self._space_backoff = 0.0
        self._walk_every = WALK_EVERY

    @property
    def spool(self) -> Spool:
        return self.spools[0]

    # -- what the FUSE layer reports -------------------------------------------------------

    def touch(self, relpath: str) -> None:
        self.changes += 1
        item = self.items.get((0, relpath))
        if item is None:
            item = self._new(0, relpath)
        item.changed_at = time.monotonic()
        if item.state == "failed":  # e.g. an operator's touch once the cause is fixed
            item.state, item.reason, item.failures, item.retry_at = "queued", "", 0, 0.0
            self._schedule(item, item.changed_at + self.settle)
        elif item.state == "queued" and not item.scheduled:
            self._schedule(item, item.changed_at + self.settle)

    def opened(self, relpath: str) -> None:
        self.open_counts[relpath] = self.open_counts.get(relpath, 0) + 1

    def closed(self, relpath: str) -> None:
        left = self.open_counts.get(relpath, 1) - 1
        if left:
            self.open_counts[relpath] = left
            return
        self.open_counts.pop(relpath, None)
        item = self.items.get((0, relpath))
        if item is not None and item.state in WAITING and not item.scheduled:
            self._schedule(item, item.changed_at + self.settle)  # `_ready` adds any retry wait

    def renamed(self, old: str, new: str) -> None:
        self.changes += 1
        if self.items.pop((0, old), None) is not None:
            self._gone[(0, old)] = time.monotonic()
        if old in self.open_counts:
            self.open_counts[new] = self.open_counts.pop(old) + self.open_counts.get(new, 0)
        self._new(0, new)

    def renamed_folder(self, old: str, new: str) -> None:
        """A folder holding spooled files was renamed: they move along (same state)."""
        prefix = old + "/"
        for key in [key for key in self.items if key[0] == 0 and key[1].startswith(prefix)]:
            self.renamed(key[1], new + key[1][len(old) :])

    def holds_under(self, reldir: str) -> bool:
        """Whether a file below `reldir` is open through the mount or waits to be published."""
        prefix = reldir + "/"
        return any(p.startswith(prefix) for p in self.open_counts) or any(
            key[1].startswith(prefix) for key in self.items
        )

    def removed(self, relpath: str) -> None:
        self.changes += 1
        if self.items.pop((0, relpath), None) is not None:
            self._gone[(0, relpath)] = time.monotonic()
        self.space_freed()

    def space_freed(self) -> None:
        """Something was deleted: files waiting for space are looked at again now."""
        if not self._space_backoff:
            return
        self._space_at = time.monotonic()
        for item in self.items.values():
            if item.state == "space":
                self._schedule(item, self._space_at)

    # -- scheduling ------------------------------------------------------------------------

    def _new(self, k: int, relpath: str, changed_at: float | None = None) -> Item:
        """A new item (replacing any of that key: one renamed over it, say)."""
        self.changes += 1
        item = Item(self.spools[k], relpath)
        if changed_at is not None:
            item.changed_at = changed_at
        self.items[(k, relpath)] = item
        if is_temp_name(Path(relpath).name):
            item.state = "temp"  # never published: a rename gives it a real name, or it goes
        else:
            self._schedule(item, item.changed_at + self.settle)
        return item

    def _schedule(self, item: Item, at: float) -> None:
        item.scheduled = True
        heapq.heappush(self._due, (at, next(self._seq), self._key(item), item))
        if at <= time.monotonic() and self._wake is not None:
            self._wake.set()

    def _key(self, item: Item) -> Key:
        return (0 if item.spool is self.spools[0] else self.spools.index(item.spool), item.relpath)

    def _ready(self, limit: int = BATCH_FILES) -> list[Item]:
        """Up to `limit` items due now, closed, settled and not waiting for a retry."""
        now = time.monotonic()
        ready: list[Item] = []
        while self._due and self._due[0][0] <= now and len(ready) < limit:
            _at, _n, key, item = heapq.heappop(self._due)
            if self.items.get(key) is not item or item.state not in WAITING:
                continue
            if not item.scheduled:
                continue  # a duplicate entry of an item already taken
            item.scheduled = False
            if key[0] == 0 and self.open_counts.get(key[1]):
                continue  # `closed` puts it back
            if key in self._inflight:
                # An older item of this name (one renamed over, say) is still with a worker:
                # published side by side, the later found the other's archive, took it for
                # its own ("already") and dropped the spooled copy, then the other, finding
                # its item gone, withdrew that archive: the file was lost.
                self._schedule(item, now + TICK)
                continue
            later = max(item.changed_at + self.settle, item.retry_at)
            if item.state == "space":
                later = max(later, self._space_at)
            if later > now:
                self._schedule(item, later)
                continue
            ready.append(item)
        return ready

    def _gathered(self) -> bool:
        """Time for a batch: the first file has been due for GATHER (a busy queue's next
        batch is due at once: its first file waited for the last batch)."""
        return bool(self._due) and self._due[0][0] + GATHER <= time.monotonic()

    def _next_due(self) -> float:
        return self._due[0][0] if self._due else math.inf

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loop --------------------------------------------------------------------------

    async def run(self, src: Path, skip: Path) -> None:
        self._wake = trio.Event()
        removed = await trio.to_thread.run_sync(remove_orphans, src, skip)
        for spool in self.spools:
            removed += await trio.to_thread.run_sync(spool.clear_staging)
        for path in removed:
            log.info("removed %s, a temp archive left by an interrupted pack", path)
        await self._walk(initial=True)
        sweep_every = min(60.0, max(0.2, self.stale_temp / 4))
        next_walk = next_sweep = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cancel_on_exit)
            while True:
                self._dispatch(nursery)
                now = time.monotonic()
                if now >= next_walk:
                    await self._walk()
                    next_walk = time.monotonic() + self._walk_every
                if now >= next_sweep:
                    await self._sweep_temps()
                    next_sweep = time.monotonic() + sweep_every
                pause = TICK  # every worker busy: a finished batch wakes the loop
                if self._active < self.workers:
                    pause = min(TICK, self._next_due() + GATHER - time.monotonic())
                with trio.move_on_after(max(0.0, pause)):
                    await self._wake.wait()
                self._wake = trio.Event()

    def stop(self) -> None:
        """The daemon is stopping: running publishes give up between blocks (files stay
        spooled and are published after the next start)."""
        self.cancel.set()

    async def _cancel_on_exit(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.cancel.set()  # before the nursery waits for the worker threads

    def _dispatch(self, nursery: trio.Nursery) -> None:
        while self._active < self.workers and not self.cancel.is_set():
            if not self._gathered():
                return
            batch = self._ready()
            if not batch:
                return
            for item in batch:
                item.state, item.started = "packing", False
            self._inflight.update(self._key(item) for item in batch)
            self.changes += 1
            self._active += 1
            nursery.start_soon(self._run_batch, batch)

    async def _run_batch(self, batch: list[Item]) -> None:
        """One worker call for the batch, then its bookkeeping; nothing here may stop the
        queue (or the daemon serving reads)."""
        try:
            outcomes = await trio.to_thread.run_sync(self._work, batch, limiter=self.limiter)
            await self._settle(batch, outcomes)
        except Exception as exc:
            log.exception("publishing a batch of %d files failed unexpectedly", len(batch))
            for item in batch:
                if item.state == "packing":
                    self._fail(item, describe_error(exc))
        finally:
            self._inflight.subtract(self._key(item) for item in batch)
            self._inflight = +self._inflight  # drop the zeros
            self.changes += 1
            self._active -= 1
            self._kick()

    def _work(self, batch: list[Item]) -> list[Outcome]:
        """In a worker thread: each file in turn until the batch's time is up."""
        deadline = time.monotonic() + BATCH_SECONDS
        out: list[Outcome] = []
        for item in batch:
            if self.cancel.is_set() or (out and time.monotonic() > deadline):
                out.append(Outcome(item.relpath, "skipped"))
                continue
            item.started_at, item.started = time.monotonic(), True
            settle = self.disk_settle if item.found else 0.0
            out.append(item.spool.attempt(item.relpath, self.pack_all, self.options, settle,
                                          self.cancel))  # fmt: skip
        unsynced: dict[Path, list[Path]] = {}
        for item, o in zip(batch, out, strict=False):
            if o.published and not o.published.synced:
                unsynced.setdefault(item.spool.src, []).append(o.published.target)
        gone: set[Path] = set()
        for src, targets in unsynced.items():
            gone |= sync_placed(src, targets)  # durable before their spooled copies go
        if gone:  # not durable: their spooled copies stay, and they are tried again
            out = [
                Outcome(o.relpath, "unsettled", wait=CHANGED_WAIT)
                if o.published and not o.published.synced and o.published.target in gone
                else o
                for o in out
            ]
        return out

    # -- after a batch ---------------------------------------------------------------------

    async def _settle(self, batch: list[Item], outcomes: list[Outcome]) -> None:
        now = time.monotonic()
        switch: list[tuple[Item, Published]] = []
        gone: list[tuple[Item, Published]] = []
        short: list[Item] = []
        for item, outcome in zip(batch, outcomes, strict=True):
            key = self._key(item)
            published = outcome.published
            if self.items.get(key) is not item:
                if published is not None:
                    gone.append((item, published))
                continue
            if outcome.kind == "published" and published is not None:
                if _written_meanwhile(item) or (key[0] == 0 and self.open_counts.get(item.relpath)):
                    self._requeue(item, now)  # written to meanwhile: publish the newer bytes
                else:
                    switch.append((item, published))
            elif outcome.kind == "unsettled":  # on disk: changed by other means meanwhile
                item.retry_at = now + outcome.wait
                self._requeue(item, item.retry_at)
            elif outcome.kind == "skipped":
                self._requeue(item, now)
            elif outcome.kind == "vanished":
                self._forget(item)
            elif outcome.kind == "space":
                short.append(item)
                self._wait_for_space(item, outcome.reason)
            elif _written_meanwhile(item):
                # Written to while it was packed: its check against the spooled bytes may have
                # failed for that alone ("byte-exact reconstruction failed verification"). Not a
                # failure with a 30 s back-off: the newer bytes settle and are packed.
                self._requeue(item, now)
            else:
                self._fail(item, outcome.reason)
        if short:
            if not self._space_backoff:  # one line for the whole episode
                log.warning("%s%s: waiting for space: %s; publishing resumes by itself when "
                            "there is room", short[0].relpath,
                            f" and {len(short) - 1} more" if len(short) > 1 else "",
                            short[0].reason)  # fmt: skip
            self._space_backoff = min(SPACE_BACKOFF[1], max(SPACE_BACKOFF[0],
                                                            2 * self._space_backoff))  # fmt: skip
            self._space_at = time.monotonic() + self._space_backoff
        changed = await self._withdraw(gone)
        if switch:
            await self._switch(switch, changed)
        elif changed:
            await self._announce(changed)

    def _requeue(self, item: Item, at: float) -> None:
        self.changes += 1
        item.state = "queued"
        self._schedule(item, at)

    def _forget(self, item: Item) -> None:
        key = self._key(item)
        self.changes += 1
        if self.items.get(key) is item:
            del self.items[key]
            self._gone[key] = time.monotonic()

    def _fail(self, item: Item, reason: str) -> None:
        """Tried again later (`retry_after`, doubling up to an hour); logged when the reason
        changes."""
        if not item.failures or reason != item.reason:
            log.error("%s: not published, stays spooled: %s", item.relpath, reason)
        item.failures += 1
        self.changes += 1
        item.state, item.reason = "failed", reason
        wait = min(RETRY_MAX, self.retry_after * 2 ** (item.failures - 1))
        item.retry_at = time.monotonic() + wait
        self._schedule(item, item.retry_at)

    def _wait_for_space(self, item: Item, reason: str) -> None:
        self.changes += 1
        item.state, item.reason, item.waited_for_space = "space", reason, True
        self._schedule(item, time.monotonic() + SPACE_BACKOFF[0])  # `_ready` holds it back

    async def _withdraw(self, gone: list[tuple[Item, Published]]) -> list[str]:
        """Files deleted or renamed away (through the mount) while being published: what was
        just published under the old name must go too, or a deleted file would reappear (a
        renamed one is published under its new name). Returns the names to show afresh."""
        changed = []
        for item, published in gone:
            key = self._key(item)
            if key in self.items or key[0] != 0 or published.mode == "already":
                log.info("%s: changed while publishing; its newer state is published on its "
                         "own", item.relpath)  # fmt: skip
                changed.append(item.relpath)  # the mount may have switched to what was published
                continue
            await trio.to_thread.run_sync(retract, item.spool, published.target,
                                          published.placed)  # fmt: skip
            changed.append(item.relpath)
            log.info("%s: removed while publishing; what was published is withdrawn",
                     item.relpath)  # fmt: skip
        return changed

    async def _switch(self, switch: list[tuple[Item, Published]], changed: list[str]) -> None:
        """The mount shows the published files first; only then do the spooled names go."""
        main = [item.relpath for item, _p in switch if item.spool is self.spool]
        self.publishing.hide(main)
        try:
            await self._announce([item.relpath for item, _p in switch] + changed)
            keep, reshow = [], []
            for item, published in switch:
                if item.spool is self.spool and self.open_counts.get(item.relpath):
                    self._requeue(item, time.monotonic())  # opened during the switch
                    reshow.append(item.relpath)
                else:
                    keep.append((item, published))
            removed = await trio.to_thread.run_sync(self._remove_spooled, keep)
        finally:
            self.publishing.unhide(main)
        withdrawn = []
        for (item, published), ok in zip(keep, removed, strict=True):
            key = self._key(item)
            if self.items.get(key) is not item:
                withdrawn.append((item, published))  # deleted or renamed during the switch
            elif not ok:
                self._requeue(item, time.monotonic())  # replaced at the last moment
                reshow.append(item.relpath)
            else:
                self._forget(item)
                self.done += 1
                self.changes += 1
                why = f": {published.reason}" if published.reason else ""
                log.info("%s: published as %s (%s%s)", item.relpath, published.target,
                         published.mode, why)  # fmt: skip
                if item.waited_for_space and self._space_backoff:
                    log.info("there is room again: publishing resumed")
                    self._space_backoff = 0.0
        reshow += await self._withdraw(withdrawn)
        # A folder archive copied in file by file is shown as its original once nothing
        # under it waits here: its files' names were each announced in their own folder.
        done = [item.relpath for (item, _p), ok in zip(keep, removed, strict=True) if ok]
        reshow += [f for f in folder_archives_of(done) if not self.holds_under(f)]
        if reshow:
            await self._announce(reshow)

    @staticmethod
    def _remove_spooled(keep: list[tuple[Item, Published]]) -> list[bool]:
        """In a worker thread: the batch's spooled names, then each emptied folder once."""
        done = [
            item.spool.remove(item.relpath, p.signature, prune=False, placed=(p.target, p.placed))
            for item, p in keep
        ]
        for spool, folder in {(item.spool, str(Path(item.relpath).parent)) for item, _p in keep}:
            spool.prune_dirs(folder)
        return done

    async def _announce(self, relpaths: list[str]) -> None:
        if self.on_published is not None and relpaths:
            await self.on_published(relpaths)

    # -- walks and stale temp files --------------------------------------------------------

    async def _walk(self, initial: bool = False) -> None:
        """Find files dropped in by other means (all of them after a restart) and forget
        items whose files vanished behind the queue's back."""
        started = time.monotonic()
        dropped: list[str] = []
        for k, spool in enumerate(self.spools):
            seen = await trio.to_thread.run_sync(spool.walk)
            for relpath in seen:
                key = (k, relpath)
                if key not in self.items and self._gone.get(key, -math.inf) < started:
                    # Found by a walk: only its ctime (checked before publishing) says how
                    # long it has been left alone.
                    self._new(k, relpath, changed_at=-math.inf if initial else None).found = True
                    if k == 0 and not initial:
                        dropped.append(relpath)
            vanished = [
                item for key, item in self.items.items()
                if key[0] == k and key[1] not in seen and item.state != "packing"
                and item.changed_at < started  # else it came after the walk began
            ]  # fmt: skip
            if vanished:
                # Only those really gone: a walk stops SPOOL_DEPTH folders deep (a path
                # longer than PATH_MAX cannot be listed), and a file below that is not in
                # `seen`.
                vanished = await trio.to_thread.run_sync(_gone_from_disk, vanished)
            for item in vanished:
                self._forget(item)
        self._gone = {key: t for key, t in self._gone.items() if t >= started}
        self._walk_every = max(WALK_EVERY, 50 * (time.monotonic() - started))
        await self._announce(dropped)  # not written through the mount: show them now

    async def _sweep_temps(self) -> None:
        """Delete rsync temp files left unchanged for `stale_temp` (their writer is gone)."""
        now = time.monotonic()
        stale = [
            item for key, item in self.items.items()
            if item.state == "temp" and now - item.changed_at >= self.stale_temp
            and not (key[0] == 0 and self.open_counts.get(item.relpath))
        ]  # fmt: skip
        if not stale:
            return
        limit = self.stale_temp

        def sweep() -> list[Item]:
            out = []
            for item in stale:
                try:
                    st = item.spool.path(item.relpath).lstat()
                except OSError:
                    continue
                if time.time_ns() - st.st_ctime_ns >= limit * 1e9 and item.spool.remove(
                    item.relpath, signature(st)
                ):
                    out.append(item)
            return out

        removed = await trio.to_thread.run_sync(sweep)
        for item in removed:
            self._forget(item)
            log.warning("%s: an rsync temp file unchanged for %s (its writer is gone): "
                        "deleted, never published", item.relpath, _duration(limit))  # fmt: skip
        await self._announce([i.relpath for i in removed if i.spool is self.spool])

    # -- status ----------------------------------------------------------------------------

    def publishing_now(self) -> list[str]:
        """The files a worker is publishing (a stop waits for them)."""
        return [i.relpath for i in self.items.values() if i.state == "packing" and i.started]

    def status(self) -> dict[str, Any]:
        items = list(self.items.values())
        states = Counter(i.state for i in items)
        waiting = sum(1 for i in items if i.state == "packing" and not i.started)

        def listed(state: str) -> list[dict[str, str]]:
            return [{"path": i.relpath, "reason": i.reason} for i in items if i.state == state]

        doc: dict[str, Any] = {
            "queued": states["queued"] + states["space"] + waiting,
            "packing": states["packing"] - waiting,
            "failed": listed("failed"),
            "done": self.done,
            "waiting_for_space": listed("space"),
            "temp": states["temp"],
        }
        if self.guard is not None:
            doc["space"] = self.guard.status()
        return doc


def _gone_from_disk(items: list[Item]) -> list[Item]:
    """The items whose spooled file is no longer a regular file at its path."""
    out = []
    for item in items:
        try:
            there = stat.S_ISREG(item.spool.path(item.relpath).lstat().st_mode)
        except OSError:
            there = False
        if not there:
            out.append(item)
    return out


def _written_meanwhile(item: Item) -> bool:
    """Whether the mount heard of a write to the file after its worker started on it."""
    return item.changed_at > item.started_at


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def folder_archives_of(relpaths: list[str]) -> set[str]:
    """The outermost `NAME.zarr` folders these files lie in. Such a folder copied in
    (`rsync -a x.tif.zarr …`) stayed a folder after its last file was published, until its
    parent changed or a remount: each publish looked up the file's own name in its own folder."""
    found = set()
    for relpath in relpaths:
        parts = relpath.split("/")
        for i, part in enumerate(parts[:-1]):
            if part.endswith(".zarr"):
                found.add("/".join(parts[: i + 1]))
                break
    return found
