"""The pack queue: spooled files are packed once closed and settled, then published and unspooled.

Runs on trio; packing itself runs in worker threads behind a limiter (`--pack-workers`), so reads
of other files keep being served while a file packs.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from vfs.ingest.spool import Published, Spool, is_temp_name, remove_orphans

if TYPE_CHECKING:
    from vfs.decant.packer import PackOptions

log = logging.getLogger(__name__)

RETRY_AFTER = 30.0  # a failed pack (disk full, unreadable file) is tried again this much later
POLL_INTERVAL = 0.25


@dataclass
class Item:
    spool: Spool
    relpath: str
    signature: tuple[int, int, int] = (0, 0, 0)
    changed_at: float = field(default_factory=time.monotonic)
    state: str = "queued"  # queued | packing | failed
    reason: str = ""
    retry_at: float = 0.0
    started: bool = False  # a pack worker has it (state "packing" before that means waiting)


class PackQueue:
    def __init__(
        self,
        spools: list[Spool],
        settle: float,
        options: PackOptions | None,
        pack_all: bool = False,
        workers: int = 1,
    ) -> None:
        self.spools = spools
        self.settle = settle
        self.options = options
        self.pack_all = pack_all
        self.items: dict[tuple[int, str], Item] = {}
        self.open_counts: dict[str, int] = {}
        self.publishing: set[str] = set()  # relpaths hidden from the mount while switching
        self.done = 0
        self.removals = 0  # spooled copies deleted so far: a walk begun before one is stale
        self.limiter = trio.CapacityLimiter(workers)
        self.on_published: Callable[[str], Awaitable[None]] | None = None

    @property
    def spool(self) -> Spool:
        return self.spools[0]

    # -- what the FUSE layer reports -------------------------------------------------------

    def touch(self, relpath: str) -> None:
        item = self.items.setdefault((0, relpath), Item(self.spool, relpath))
        item.changed_at = time.monotonic()
        if item.state == "failed":
            item.state, item.reason = "queued", ""

    def opened(self, relpath: str) -> None:
        self.open_counts[relpath] = self.open_counts.get(relpath, 0) + 1

    def closed(self, relpath: str) -> None:
        left = self.open_counts.get(relpath, 1) - 1
        if left:
            self.open_counts[relpath] = left
        else:
            self.open_counts.pop(relpath, None)

    def renamed(self, old: str, new: str) -> None:
        item = self.items.pop((0, old), None)
        if old in self.open_counts:
            self.open_counts[new] = self.open_counts.pop(old) + self.open_counts.get(new, 0)
        self.items[(0, new)] = Item(self.spool, new, state="queued")
        if item is not None:
            self.items[(0, new)].signature = item.signature

    def removed(self, relpath: str) -> None:
        self.items.pop((0, relpath), None)

    # -- the loop --------------------------------------------------------------------------

    async def run(self, src: Path, skip: Path) -> None:
        removed = await trio.to_thread.run_sync(remove_orphans, src, skip)
        for spool in self.spools:
            removed += await trio.to_thread.run_sync(spool.clear_staging)
        for path in removed:
            log.info("removed %s, a temp archive left by an interrupted pack", path)
        async with trio.open_nursery() as nursery:
            while True:
                await self._poll()
                for item in self._ready():
                    item.state, item.started = "packing", False
                    nursery.start_soon(self._pack_guarded, item)
                await trio.sleep(POLL_INTERVAL)

    async def _poll(self) -> None:
        """Pick up files changed or dropped in by other means (and after a restart)."""
        dropped_in: dict[str, str] = {}  # one file per folder: a rescan shows them all
        for k, spool in enumerate(self.spools):
            removals = self.removals
            seen = await trio.to_thread.run_sync(spool.walk)
            now = time.monotonic()
            for relpath, st in seen.items():
                sig = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                item = self.items.get((k, relpath))
                if item is None:
                    if removals == self.removals:  # else it may list a file published meanwhile
                        self.items[(k, relpath)] = Item(spool, relpath, sig, now)
                        if k == 0:
                            dropped_in.setdefault(str(Path(relpath).parent), relpath)
                elif item.signature != sig and item.state != "packing":
                    item.signature, item.changed_at = sig, now
                    if item.state == "failed":
                        item.state, item.reason = "queued", ""
            for key in [key for key in self.items if key[0] == k and key[1] not in seen]:
                if self.items[key].state != "packing":
                    del self.items[key]
        if self.on_published is not None:
            for relpath in dropped_in.values():  # not written through the mount: show them now
                await self.on_published(relpath)

    def _ready(self) -> list[Item]:
        now = time.monotonic()
        ready = []
        for (k, relpath), item in self.items.items():
            if item.state == "packing" or (k == 0 and self.open_counts.get(relpath)):
                continue
            if item.state == "failed" and now < item.retry_at:
                continue
            wait = self.settle
            if is_temp_name(Path(relpath).name):
                wait = max(60.0, 10 * self.settle)  # an rsync temp file: its rename may come
            if now - item.changed_at >= wait:
                ready.append(item)
        return ready

    async def _pack_guarded(self, item: Item) -> None:
        """One file's failure must never stop the queue (or the daemon serving reads)."""
        try:
            await self._pack(item)
        except Exception as exc:
            log.exception("%s: packing failed unexpectedly", item.relpath)
            item.state, item.reason = "failed", _reason(exc)
            item.retry_at = time.monotonic() + RETRY_AFTER

    async def _pack(self, item: Item) -> None:
        relpath, spool = item.relpath, item.spool
        key, main = (self.spools.index(spool), relpath), spool is self.spool
        started = time.monotonic()

        def publish() -> Published:
            item.started = True  # a worker took it: until now it was waiting for one
            return spool.publish(relpath, self.pack_all, self.options)

        try:
            published = await trio.to_thread.run_sync(publish, limiter=self.limiter)
        except Exception as exc:
            item.state, item.reason = "failed", _reason(exc)
            item.retry_at = time.monotonic() + RETRY_AFTER
            log.error("%s: not archived, stays spooled: %s", relpath, item.reason)
            return
        if self.items.get(key) is not item:
            # Renamed, replaced (rsync's rename over it) or unlinked while packing: the spooled
            # copy, if any, is a newer file with its own item. It must not be deleted.
            if key not in self.items and main and published.mode != "already":
                # Unlinked or renamed away: what was just published under this name must go
                # too, or a deleted file would reappear (a renamed one packs under its new name).
                await trio.to_thread.run_sync(retract, published.target)
                if self.on_published is not None:
                    await self.on_published(relpath)
                log.info("%s: removed while packing; its archive was withdrawn", relpath)
                return
            log.info("%s: changed while packing; its newer state is packed on its own", relpath)
            return
        if item.changed_at > started or (main and self.open_counts.get(relpath)):
            item.state = "queued"  # written to while packing: pack the newer bytes again
            return
        if main:
            self.publishing.add(relpath)
        try:
            if self.on_published is not None:
                await self.on_published(relpath)  # the mount now shows the published file
            if main and self.open_counts.get(relpath):
                item.state = "queued"
                return
            removed = await trio.to_thread.run_sync(spool.remove, relpath, published.signature)
        finally:
            self.publishing.discard(relpath)
        if not removed:
            item.state = "queued"  # replaced in the spool at the last moment: pack that too
            return
        self.removals += 1
        if self.items.get(key) is item:
            del self.items[key]
        self.done += 1
        log.info("%s: archived as %s (%s)", relpath, published.target, published.mode)

    def status(self) -> dict[str, Any]:
        states = [i.state for i in self.items.values()]
        waiting = sum(1 for i in self.items.values() if i.state == "packing" and not i.started)
        return {
            "queued": states.count("queued") + waiting,
            "packing": states.count("packing") - waiting,
            "failed": [
                {"path": i.relpath, "reason": i.reason}
                for i in self.items.values()
                if i.state == "failed"
            ],
            "done": self.done,
        }


def retract(target: Path) -> None:
    """Withdraw a just-published archive (or plain file) whose source was deleted meanwhile."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target, ignore_errors=True)
    else:
        target.unlink(missing_ok=True)


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror} (errno {exc.errno})"
    return str(exc) or exc.__class__.__name__
