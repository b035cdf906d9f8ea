"""Open files: reads through a backend, read-ahead, and the sha256 check of what is served.

Integrity, as the mount promises it: a presented original whose archive has not verified yet is
opened with `direct_io`, so every byte an application gets passed through `read` for that very
handle (no page kept from an earlier open can stand in for it). Each handle hashes what it serves
in file order; the read that completes the handle's coverage waits for the verdict, and gets EIO
if the whole file does not hash to the manifest's sha256. A handle that read the whole file out of
order is checked by a full verification before its last read returns. A handle that stopped short
queues a background verification, so random-access users get the same guarantee soon.
Verified files (persistent index) are opened with `keep_cache`: the kernel serves repeats.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import trio

from vfs.backends.base import RandomAccess
from vfs.errors import (
    ArchiveChangedError,
    ArchiveGoneError,
    CorruptArchiveError,
    DecodeTooLargeError,
    IntegrityError,
    OpenArchivesFullError,
    StoreError,
)
from vfs.integrity import Coverage, ParkBudget, SequentialHasher, held_bytes
from vfs.mount.fair import FairSlots
from vfs.mount.hashfeed import HashFeed
from vfs.mount.metrics import COUNTERS
from vfs.mount.refusals import Refusals
from vfs.nodes import Node, NodeKey

log = logging.getLogger(__name__)

MAX_VERDICTS = 20_000  # verified and failed file versions remembered (each set)
HASH_BACKLOG = 4  # served reads queued for hashing before reads wait for the hasher
VERDICT_WAIT = 30.0  # how long the completing read waits for earlier reads' bytes to be hashed
VERIFY_BLOCK = 4 << 20
IDLE_CHECK = 2.0  # an open handle whose running hash has not advanced this long: verify aside
# A small read the disk was asked for is polled for this long on the event loop before it goes
# to a thread (a local disk answers a 64 KiB read in ~0.1 ms; the two thread hops cost ~0.3 ms).
POLL_SECONDS = 0.0005
MAX_POLL_MISSES = 8


@dataclass
class OpenFile:
    node: Node
    inode: int
    reader: RandomAccess
    fd: int = -1  # a spooled file's descriptor, for writing
    feed: HashFeed | None = None  # served reads on their way into the running sha256
    served: Coverage = field(default_factory=Coverage)
    last_end: int = -1
    readahead_done: trio.Event | None = None
    uid: int = 0  # who opened it: a verification its read waits for runs in that user's turn
    poll_misses: int = 0  # polls in a row that ran out (see _polled)


class Integrity:
    """Which presented files are verified, bad, or being verified; runs the verifications."""

    def __init__(
        self,
        is_verified: Callable[[Node], bool],
        mark_verified: Callable[[Node, Mapping[str, int] | None], None],
        open_reader: Callable[[Node], RandomAccess],
        forget_verified: Callable[[Node], None] | None = None,
    ) -> None:
        self._is_verified = is_verified
        self._forget_verified = forget_verified
        self._mark_verified = mark_verified
        self._open_reader = open_reader
        self.bad = Refusals(MAX_VERDICTS)
        self.good: set[NodeKey] = set()
        self.pending: set[NodeKey] = set()
        self.limiter = trio.CapacityLimiter(1)  # background verifications at once
        self._waited: dict[int, trio.CapacityLimiter] = {}  # a uid's verifications a read awaits
        self.spawn: Callable[[Callable[..., Awaitable[None]], Node], None] | None = None
        # Told of a file whose bytes did not hash to its description (a worker thread's call):
        # the description, not the archive, may be what is wrong (SourceTree.doubt).
        self.doubt: Callable[[Node], None] | None = None
        # How long a failed file stays refused (Refusals), and what drops the bytes kept of
        # it (a worker thread's call) so that it is read afresh then: set for a bucket's.
        self.hold: Callable[[Node], float] = lambda node: math.inf
        self.refetch: Callable[[Node], None] | None = None

    @staticmethod
    def _note(verdicts: set[NodeKey], key: NodeKey) -> None:
        """Note a verdict; a set holding MAX_VERDICTS is emptied first. Each version of a file
        is a key: a user giving their own archive a new mtime and opening it, in a loop, grew
        both sets for as long as the mount ran (red team 49b, F2). A verdict forgotten is only
        asked again: of the index for a verified file, by a new verification for a bad one."""
        if len(verdicts) >= MAX_VERDICTS:
            verdicts.clear()
        verdicts.add(key)

    def state(self, node: Node) -> str:
        """`user.decant.verified`: yes, no (failed), pending, or unknown."""
        key = node.key
        if key in self.bad:
            return "no"
        if key in self.good:
            return "yes"
        return "pending" if key in self.pending else "unknown"

    def changed_inside(self, archives: set[str]) -> None:
        """A file inside these `.zarr/` folder archives changed (a chunk repaired, or damaged
        again): the version the mount keys them by (their folder's and manifest's stat) stays,
        so a refusal of them would outlast any repair until a restart. They are checked again
        as a changed archive is: hashed as served and verified in the background."""
        gone: set[NodeKey] = {key for key in self.bad if key[0] in archives}  # type: ignore[misc]
        if gone:
            for key in gone:
                self.bad.discard(key)
            for real in sorted({key[0] for key in gone}):
                log.info("%s: a file inside it changed: checked again at its next open", real)

    async def verified(self, node: Node) -> bool:
        if node.key in self.good:
            return True
        if await trio.to_thread.run_sync(self._is_verified, node):
            self._note(self.good, node.key)
            return True
        return False

    async def passed(self, node: Node, seen: Mapping[str, int] | None = None) -> None:
        """`seen`: the chunk digests the reads that hashed right noted on the way (see
        seen_digests), recorded instead of reading the whole archive again."""
        self._note(self.good, node.key)
        self.pending.discard(node.key)
        log.info("%s%s: verified sha256", node.real, _member(node))
        try:
            await trio.to_thread.run_sync(self._mark_verified, node, seen)
        except IntegrityError as exc:
            self.good.discard(node.key)
            log.error("%s%s: not recorded as verified: %s", node.real, _member(node), exc)
        except Exception as exc:
            # The bytes hashed right; only their record failed: the archive renamed or deleted
            # while it hashed (stat of its path: ENOENT), the index's disk full or damaged. A
            # scrub's verification awaits this on the daemon's own nursery, where the ENOENT of
            # a user renaming their own archive mid-scrub took the whole mount down.
            log.warning("%s%s: verified, but not recorded in the index: %s", node.real,
                        _member(node), exc)  # fmt: skip

    def _refuse(self, node: Node) -> None:
        hold = self.hold(node)
        self.bad.add(node.key, hold)
        if hold != math.inf and self.refetch is not None and self.spawn is not None:
            self.spawn(self._refetch, node)  # read afresh when the refusal lapses

    async def _refetch(self, node: Node) -> None:
        assert self.refetch is not None
        await trio.to_thread.run_sync(self.refetch, node)

    def failed(self, node: Node, digest: str) -> None:
        self._refuse(node)
        self.pending.discard(node.key)
        log.error("%s%s: reconstructed bytes hash to %s, not the recorded %s — refusing to "
                  "serve it", node.real, _member(node), digest, node.sha256)  # fmt: skip
        self._doubt_later(node)

    async def lost(self, node: Node, exc: Exception) -> None:
        """A verified file read damaged bytes (a chunk digest or decode failed): no longer
        verified, and refused from now on until the archive changes."""
        if node.key not in self.good:
            return
        self.good.discard(node.key)
        self._refuse(node)
        log.error("%s%s: damaged since it verified: %s", node.real, _member(node), exc)
        if self._forget_verified is not None:
            await trio.to_thread.run_sync(self._forget_verified, node)
        self._doubt_later(node)

    def _doubt_later(self, node: Node) -> None:
        if self.doubt is not None and self.spawn is not None:
            self.spawn(self._doubt, node)

    async def _doubt(self, node: Node) -> None:
        assert self.doubt is not None
        await trio.to_thread.run_sync(self.doubt, node)

    def queue(self, node: Node) -> None:
        """Verify `node` in the background unless it is known or already queued."""
        key = node.key
        if key in self.good or key in self.bad or key in self.pending or self.spawn is None:
            return
        # Authenticated blocks (crypt4gh segments) are not exempt: each segment authenticates
        # alone, not its place, so segments swapped in a package all decrypt and the member's
        # plaintext is wrong; only its declared sha256 tells, and small reads never hash it.
        self.pending.add(key)
        self.spawn(self.verify_now, node)

    async def verify_now(self, node: Node, uid: int | None = None) -> bool:
        """Read the whole presented file through a private reader, in order, and hash it.

        `uid`: a read of that user waits for the verdict. Such a verification runs one at a
        time per user, not in the background's turn: behind the background queue, which any
        user fills by opening files and closing them early, one user's reads of 40 files of
        1 GiB made another user's whole read of a 16 MiB file wait 114 s for its last bytes."""
        self.pending.add(node.key)
        limiter = self.limiter if uid is None else self._waited.setdefault(
            uid, trio.CapacityLimiter(1)
        )  # fmt: skip
        try:
            return await self._verify_in_turn(node, limiter)
        finally:
            idle = not limiter.borrowed_tokens and not limiter.statistics().tasks_waiting
            if uid is not None and idle and self._waited.get(uid) is limiter:
                del self._waited[uid]

    async def _verify_in_turn(self, node: Node, limiter: trio.CapacityLimiter) -> bool:
        async with limiter:
            if node.key in self.good or node.key in self.bad:
                return node.key in self.good
            try:
                digest, seen = await trio.to_thread.run_sync(self._hash_whole, node)
            except (StoreError, ArchiveGoneError, ArchiveChangedError, OpenArchivesFullError,
                    DecodeTooLargeError, OSError) as exc:  # fmt: skip
                # The object store unreachable, the archive not at its path now (its folder
                # renamed away and back kept it refused for every user), written in place
                # while it hashed (the new version is another node), not the file listed any
                # more (ESTALE: a hard link made and removed, a chmod, a rename-publish of the
                # same bytes moved its ctime; refused for every user until SRC changed, red
                # team 49b), or no room or descriptor to open it now: no verdict, try later.
                self.pending.discard(node.key)
                log.warning("%s%s: not verified now: %s", node.real, _member(node), exc)
                return False
            except Exception as exc:
                self.pending.discard(node.key)
                self._refuse(node)
                if isinstance(exc, CorruptArchiveError) and _authenticated(node):
                    # A segment that fails its MAC: the member's declared sha256 cannot be
                    # checked, and segments authenticate alone, not their place, so none of
                    # its others is known to be where it is served (swapped ones decrypt).
                    # Left unverified, a damaged segment anywhere kept swapped ones serving
                    # wrong bytes with exit 0, and each open read the member again.
                    log.error("%s%s: its declared sha256 cannot be checked (%s): refusing it",
                              node.real, _member(node), exc)  # fmt: skip
                    return False
                log.error("%s%s: verification failed: %s", node.real, _member(node), exc)
                return False
        if digest == node.sha256:
            await self.passed(node, seen)
            return True
        self.failed(node, digest)
        return False

    def _hash_whole(self, node: Node) -> tuple[str, Mapping[str, int] | None]:
        """The file's sha256, and the chunk digests its reads noted (see seen_digests)."""
        hasher = SequentialHasher(node.size, node.sha256 or "")
        reader = self._open_reader(node)
        try:
            pos = 0
            while pos < node.size:
                # Read ahead as a handle's reader does: decodes queued on the pool, and from a
                # bucket the GETs of the chunks after them in flight. Without it each chunk of
                # an archive in a bucket was a GET of its own, waited for in turn: the
                # verification a partial read queues took 165 GETs for the 160 chunks of a
                # 111 MiB archive, 26-39 with it (a sequential `dd`: 28). Not over planes
                # cached already (a file read whole out of order is verified from the cache):
                # a backwards read's verification then fetched 48 MiB ahead for nothing.
                if _needed(reader, pos):
                    reader.readahead(pos)
                data = reader.read(pos, min(VERIFY_BLOCK, node.size - pos))
                if not data:
                    raise CorruptArchiveError(f"{node.real}: short read at {pos} of {node.size}")
                hasher.feed(pos, data)
                pos += len(data)
            seen = seen_digests(reader)
        finally:
            reader.close()
        return hasher.hexdigest(), seen


class Reads:
    """The read path of open handles: backend reads, hashing, read-ahead."""

    def __init__(self, integrity: Integrity, decode_threads: int) -> None:
        self.integrity = integrity
        # Reads that miss the cache take a decode thread: a free one goes to the waiting user
        # who holds the fewest (vfs.mount.fair), so one user's queue of slow decodes does not
        # hold up every other user's reads. `decode` bounds the threads themselves.
        self.fair = FairSlots(decode_threads)
        self.decode = trio.CapacityLimiter(decode_threads)
        self.readahead_limiter = trio.CapacityLimiter(2)
        self.parked = ParkBudget()  # what every handle's running hash may park, all told
        self.nursery: trio.Nursery | None = None

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """A background task that can fail without taking the daemon down with it."""

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__name__", fn))

        if self.nursery is not None:
            self.nursery.start_soon(guarded)

    async def prepare(self, handle: OpenFile) -> bool:
        """Set up checking for a newly opened archive file; True if the kernel may cache it."""
        node = handle.node
        if not node.sha256 or node.backend is None:
            return node.backend is not None and getattr(node.backend, "kernel_cache", True)
        if await self.integrity.verified(node):
            return True
        handle.feed = HashFeed(SequentialHasher(node.size, node.sha256, self.parked), HASH_BACKLOG)
        self.spawn(self._verify_if_stalled, handle)
        return False

    async def read(self, handle: OpenFile, off: int, size: int) -> bytes | memoryview:
        if handle.node.key in self.integrity.bad:
            raise CorruptArchiveError(f"{handle.node.real}: failed verification")
        # Bytes already decoded are served here: a thread hop per 1 MiB request costs more
        # than the slicing it would move off the loop.
        fast = getattr(handle.reader, "read_cached", None)
        data = fast(off, size) if fast is not None else None
        if data is None and fast is not None:
            data = await _after_loads(handle.reader, off, size, fast)
        if data is None and fast is not None:
            data = await _polled(handle, off, size, fast)
        if data is None:
            started = time.perf_counter()
            try:
                async with self.fair.slot(handle.uid):
                    data = await trio.to_thread.run_sync(handle.reader.read, off, size,
                                                         limiter=self.decode)  # fmt: skip
            except CorruptArchiveError as exc:
                if not isinstance(exc, ArchiveChangedError):  # a new version, not damage
                    await self.integrity.lost(handle.node, exc)
                raise
            COUNTERS.read_seconds += time.perf_counter() - started
        COUNTERS.reads += 1
        COUNTERS.bytes_served += len(data)
        expected = max(0, min(size, handle.node.size - off))
        if len(data) != expected and handle.node.backend is not None:
            raise CorruptArchiveError(
                f"{handle.node.real}: read of {size} at {off} gave {len(data)} bytes, "
                f"expected {expected}"
            )
        if handle.feed is not None and data:
            await self._check(handle, handle.feed, off, data)
        # The kernel keeps two requests in flight: a forward reader's next request may start
        # one request past where the last one served ended.
        sequential = handle.last_end <= off <= handle.last_end + size
        handle.last_end = off + len(data)
        idle = handle.readahead_done is None and self.nursery is not None
        if sequential and idle and _readahead_needed(handle):
            handle.readahead_done = trio.Event()
            self.spawn(self._read_ahead, handle)
        return data

    async def _check(self, handle: OpenFile, feed: HashFeed, off: int, data: Any) -> None:
        if not feed.done.is_set():
            # The hasher may finish or give up meanwhile: the verdict does not need these bytes.
            await feed.put(off, _unpinned(data))
        if handle.served.add(off, off + len(data)) >= handle.node.size:
            await self._verdict(handle, feed)  # every byte was served to this handle

    async def _verdict(self, handle: OpenFile, feed: HashFeed) -> None:
        """Fail the read that completes the handle's coverage when the file hashes wrong."""
        node, hasher = handle.node, feed.hasher
        with trio.move_on_after(VERDICT_WAIT):
            await feed.done.wait()
        if hasher.complete:
            if hasher.ok:
                if node.key not in self.integrity.good:
                    seen = await trio.to_thread.run_sync(seen_digests, handle.reader)
                    await self.integrity.passed(node, seen)
                return
            self.integrity.failed(node, hasher.hexdigest())
            raise CorruptArchiveError(f"{node.real}: sha256 mismatch")
        # Served whole, but not in an order the running hash could follow: check it now.
        if not await self.integrity.verify_now(node, handle.uid):
            raise CorruptArchiveError(f"{node.real}: sha256 mismatch")

    async def _verify_if_stalled(self, handle: OpenFile) -> None:
        """Random access, or a shared mmap (refused on direct_io files with ENODEV), never lets
        the running hash finish: verify such a file aside, so it soon opens cached."""
        feed = handle.feed
        assert feed is not None
        while not feed.done.is_set():
            pos = feed.hasher.pos
            with trio.move_on_after(IDLE_CHECK):
                await feed.done.wait()
            if not feed.done.is_set() and feed.hasher.pos == pos:
                self.integrity.queue(handle.node)
                return

    async def _read_ahead(self, handle: OpenFile) -> None:
        """Keep decoding ahead for as long as the reader keeps moving forward."""
        try:
            while True:
                pos = handle.last_end
                await trio.to_thread.run_sync(handle.reader.readahead, pos - 1,
                                              limiter=self.readahead_limiter)  # fmt: skip
                if handle.last_end == pos or not _readahead_needed(handle):
                    break
        except Exception as exc:  # a failed read-ahead only costs the later read its own decode
            log.debug("read-ahead in %s failed: %s", handle.node.real, exc)
        finally:
            assert handle.readahead_done is not None
            handle.readahead_done.set()
            handle.readahead_done = None

    async def close(self, handle: OpenFile) -> None:
        if handle.readahead_done is not None:
            await handle.readahead_done.wait()  # it still uses the reader's descriptor
        feed = handle.feed
        if feed is not None:
            feed.close()
            if not feed.hasher.complete:
                with trio.move_on_after(VERDICT_WAIT):  # its last batch
                    await feed.done.wait()
                if feed.done.is_set():  # nothing feeds it now
                    feed.hasher.abandon()  # what it parked goes back to the budget
                self.integrity.queue(handle.node)  # read in part: verify it in the background
        await trio.to_thread.run_sync(handle.reader.close)


async def _after_loads(
    reader: RandomAccess,
    off: int,
    size: int,
    fast: Callable[[int, int], bytes | memoryview | None],
) -> bytes | memoryview | None:
    """The read served from what the read-ahead loads it needs decode, awaited here on the event
    loop; None when there were none (or what they decoded is gone again): the read then goes to
    a thread. Handed to a thread, such a read only waited there on the page's lock: a stream of
    a c4gh member did so for half its requests, a thread hop each. Only a load under way is
    awaited: the read-ahead pools are shared by every reader, and a load still queued may sit
    behind another user's slow decodes (red team 50: a victim's 64 MiB read waited 8-20 s
    behind four `dd`s of bz2 planes). Such a read goes to a thread, and the fair slots."""
    loading = getattr(reader, "loading", None)
    waited = False
    for _ in range(4):  # a request spans a few pages at most
        future = loading(off, size) if loading is not None else None
        if future is None or not (future.running() or future.done()):
            break
        await wait_future(future)
        waited = True
    return fast(off, size) if waited else None


async def _polled(
    handle: OpenFile, off: int, size: int, fast: Callable[[int, int], bytes | memoryview | None]
) -> bytes | memoryview | None:
    """A small read whose bytes the disk was just asked for (`disk_asked`), served by polling
    `fast` between the event loop's other work for up to POLL_SECONDS; None after that (the
    read goes to a thread). A handle whose polls keep running out (a slow disk) stops polling."""
    asked = getattr(handle.reader, "disk_asked", None)
    if asked is None or handle.poll_misses >= MAX_POLL_MISSES or not asked(off, size):
        return None
    deadline = time.perf_counter() + POLL_SECONDS
    while time.perf_counter() < deadline:
        await trio.sleep(0)  # a checkpoint: other requests run between polls
        data = fast(off, size)
        if data is not None:
            handle.poll_misses = 0
            return data
    handle.poll_misses += 1
    return None


async def wait_future(future: Future[Any]) -> None:
    """Wait on the event loop, without a thread, for a future a pool thread completes."""
    if future.done():
        return
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_future: Future[Any]) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    await done.wait()


def _readahead_needed(handle: OpenFile) -> bool:
    """Whether a read-ahead past the handle's last read would decode anything. Asked on the
    event loop before each thread hand-off: a sequential reader used to hand one to a thread per
    request (~8 per 8 MiB plane), nearly all finding the next planes already decoded."""
    return _needed(handle.reader, handle.last_end - 1)


def _needed(reader: RandomAccess, offset: int) -> bool:
    """Whether `reader.readahead(offset)` would decode anything (always, unless it can tell)."""
    needed = getattr(reader, "readahead_needed", None)
    return needed is None or bool(needed(offset))


def seen_digests(reader: RandomAccess) -> Mapping[str, int] | None:
    """The chunk digest map a reader noted while it read every chunk (decant readers), else
    None: the archive is then read again to make it."""
    seen = getattr(reader, "seen_digests", None)
    try:
        return seen() if seen is not None else None
    except Exception as exc:  # optional: a failure here must not fail a file that verified
        log.debug("chunk digests noted by a reader not usable: %s", exc)
        return None


PIN_RATIO = 8  # a queued view may keep alive at most this many times its own bytes


def _unpinned(data: Any) -> Any:
    """A small view of a large cached page would keep the whole page alive while it waits to
    be hashed (a 4 KiB read pinning an 8 MiB plane): such views are copied. A 1 MiB request's
    view of an 8 MiB plane is not: copying every request cost a memcpy and fresh pages per MiB
    served (about a tenth of the daemon's CPU on a first read), and the HASH_BACKLOG queued
    views pin at most PIN_RATIO times what they hold."""
    if isinstance(data, memoryview) and data.nbytes * PIN_RATIO < held_bytes(data):
        return bytes(data)
    return data


def _authenticated(node: Node) -> bool:
    """Whether each block of the node's backend authenticates as it is read (crypt4gh)."""
    return bool(getattr(node.backend, "authenticated", False))


def _member(node: Node) -> str:
    return f" ({node.member})" if node.member else ""
