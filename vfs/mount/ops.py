"""The pyfuse3 handlers: resolve inodes, call the tree, backends and write side, build replies.

Every handler runs inside `errno_boundary`, the one place errors become `FUSEError`. Namespace
state lives in `InodeTable` (see its lock discipline), open files in `Reads`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import resource
import stat
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyfuse3
import trio

from vfs.acl import acl_stat
from vfs.backends.base import Entry, RandomAccess
from vfs.backends.decant import charged_to
from vfs.backends.plain import PlainFile, SpoolFile
from vfs.beneath import stat_beneath
from vfs.cache import PageCache
from vfs.decant import TEMP_PREFIX, archive_stat
from vfs.errors import DecantError, IntegrityError
from vfs.ingest.queue import PackQueue
from vfs.ingest.spool import is_temp_name
from vfs.ingest.writeside import Attrs, WriteSide
from vfs.mount.access import (
    caller_groups,
    may_change_entries,
    may_list_folder_of,
    readable_beneath,
)
from vfs.mount.config import STATUS_NAME, MountConfig
from vfs.mount.fair import FairSlots
from vfs.mount.index import stamp_of
from vfs.mount.inodes import ROOT_INODE, Folder, InodeTable, LetGoListing
from vfs.mount.letgo import LetGo
from vfs.mount.metrics import COUNTERS, daemon_section
from vfs.mount.reads import Integrity, OpenFile, Reads
from vfs.mount.status import Joined, StatusFile
from vfs.mount.tree import Deferred, NotQuick, SourceTree
from vfs.mount.watch import folder_archives, watched_at
from vfs.nodes import Node, archive_version, mirror_node
from vfs.perms import granted
from vfs.stores.base import ObjectPath, key_problem

log = logging.getLogger(__name__)

ARCHIVE_TIMEOUT = 300.0  # archive contents never change in place: let the kernel keep them
MIRROR_TIMEOUT = 2.0  # SRC itself can change; the watcher invalidates sooner when it can
UNWATCHED_TIMEOUT = 1.0  # no inotify: entries that can change expire this soon
READDIR_BATCH = 64  # entries restated in one worker-thread call, unwatched
# A missing name, watched: new names are invalidated when the watcher's rescan finds them.
# rsync's generator looks names up seconds before its receiver does, on a busy machine.
NEGATIVE_TIMEOUT = 10.0
RESCAN_INTERVAL = 1.0  # a folder's mtime is re-checked at most this often
LOG_EVERY = 60.0  # the same failure of the same entry is logged once a minute, not per call
NAME_MAX = 255
_TEMP_PREFIX = TEMP_PREFIX.encode()
_ARCHIVE_SUFFIXES = (".zarr.zip", ".zarr")  # names SRC may present as another (tree._related)
PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID
QUICK_LIMIT = 0.02  # seconds (above the GIL's 5 ms switch interval): see QuickCalls
QUICK_SLOW = 3
QUICK_WINDOW = 5.0
QUICK_COOLDOWN = 5.0
QUICK_STALL = 0.1  # one call blocked this long sends them to threads at once
QUICK_COOLDOWN_MAX = 120.0  # cooldowns double while stalls go on, up to this
# Worker threads the listings of one owner's folders (which describe the archives in them) may
# take at once. Large zip directories are parsed one at a time (vfs.decant.zipdir): without a
# bound, one user listing 48 folders of large archives at once held all of trio's 40 worker
# threads waiting for their turn, and another user's `cat` of a plain file waited 7.3 s for a
# thread; with one bound for all listings (16), another user's `ls` of a folder of one text
# file waited 60 s behind 20 such listings (red team, round 32). Each owner has its own.
LISTING_THREADS = 4
MAX_ANSWERED = 65536  # lookups of a folder answered otherwise than its listing, until it is read
# Folders' first listings read behind a lookup at once (`_unlisted`); past it such a lookup reads
# the listing itself, as every one did before: a user's `stat` of a file in each of 100,000
# folders of theirs must not queue 100,000 listings in the background.
UNLISTED_BEHIND = 256
DEFER_ROUNDS = 3  # scans of a folder that hand other users' new archives to their threads (_scan)
# Seconds one folder's listing describes other users' archives before its thread goes to the
# folder waiting that holds fewest (then it waits its turn again): a folder of one small
# archive waited for four folders' thirty slow ones each (red team 104 F1: 65-130 s).
DESCRIBE_TURN = 0.25
HANDLES_PER_USER = 4096  # open files one user but root may hold (at most an eighth of the fd limit)
QUICK_WRITE = 64 * 1024  # larger writes always go to a worker thread (the data path)
QUICK_FREE = 16 << 20  # truncating or deleting a larger file frees blocks: a worker thread

# At most this many failure lines per LOG_EVERY in all: each (call, message) pair names an
# entry, so a user with many names could otherwise write a line per call (and past 10,000
# pairs the limiter forgets them all). The rest are counted and summed up in one line.
LOG_BUDGET = 100
# The caller's own mistakes, like ENOENT: no news for the operator, logged at DEBUG only.
CALLER_ERRNOS = frozenset({
    errno.ENOENT, errno.EPERM, errno.EACCES, errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR,
    errno.EISDIR, errno.EINVAL, errno.ENAMETOOLONG, errno.EXDEV, errno.ELOOP, errno.ENODATA,
    errno.ERANGE,
})  # fmt: skip

_last_logged: dict[tuple[str, str], float] = {}
_window = {"start": -LOG_EVERY, "logged": 0, "dropped": 0}


def _log_limited(level: int, what: str, message: str, exc_info: bool = False) -> None:
    if not log.isEnabledFor(level):
        return
    key = (what, message)
    now = time.monotonic()
    if now - _last_logged.get(key, -LOG_EVERY) < LOG_EVERY:
        return
    if now - _window["start"] >= LOG_EVERY:
        if _window["dropped"]:
            log.warning("%d more failures not logged in the last minute", _window["dropped"])
        _window.update(start=now, logged=0, dropped=0)
    if _window["logged"] >= LOG_BUDGET:
        _window["dropped"] += 1
        return
    _window["logged"] += 1
    if len(_last_logged) > 10_000:
        _last_logged.clear()
    _last_logged[key] = now
    log.log(level, "%s: %s", what, message, exc_info=exc_info)


def _per_user(limiters: dict[Any, trio.CapacityLimiter], uid: Hashable) -> trio.CapacityLimiter:
    """`uid`'s own few worker threads in `limiters` (made on first use): a user fills only
    theirs, never the daemon's whole thread pool."""
    limiter = limiters.get(uid)
    if limiter is None:
        limiter = limiters[uid] = trio.CapacityLimiter(LISTING_THREADS)
    return limiter


@contextmanager
def errno_boundary(what: str) -> Iterator[None]:
    """Every handler runs inside this: pyfuse3 stops the daemon on any non-FUSEError exception."""
    try:
        yield
    except pyfuse3.FUSEError as exc:
        COUNTERS.error(exc.errno)
        raise
    except DecantError as exc:
        _log_limited(logging.ERROR, what, str(exc))
        COUNTERS.error(exc.errno)
        raise pyfuse3.FUSEError(exc.errno) from None
    except OSError as exc:
        quiet = exc.errno in CALLER_ERRNOS
        _log_limited(logging.DEBUG if quiet else logging.WARNING, what, str(exc))
        COUNTERS.error(exc.errno or errno.EIO)
        raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
    except Exception as exc:
        _log_limited(logging.ERROR, what, f"unexpected error: {exc!r}", exc_info=True)
        COUNTERS.error(errno.EIO)
        raise pyfuse3.FUSEError(errno.EIO) from None


def _may_add_to(folder: Node, ctx: pyfuse3.RequestContext) -> None:
    """EACCES unless the caller may add and remove entries of `folder` by the attributes the
    daemon holds of it now. The kernel checked them against the attributes it had cached: a
    folder of another user's renamed over the caller's own in SRC, listed again by the daemon
    a moment before the kernel dropped its copy, took a file created in it (red team 67, F1).
    A folder the write side made only in the spool, or root: nothing to check here."""
    if ctx.uid == 0 or folder.backend is not None or not folder.ino:
        return
    # The caller's groups (a read of /proc/PID/status, on the event loop) only where they can
    # decide: not for the owner, nor where group and other hold the same write and search bits
    # (a sticky 1777 drop box), which rsync creates in file after file.
    same = (folder.mode >> 3) & 0o3 == folder.mode & 0o3
    groups = {ctx.gid} if folder.uid == ctx.uid or same else caller_groups(ctx.pid, ctx.gid)
    shown = SimpleNamespace(st_uid=folder.uid, st_gid=folder.gid, st_mode=folder.mode)
    if not granted(shown, ctx.uid, groups, write=True, search=True):  # type: ignore[arg-type]
        raise _fail(errno.EACCES)


class QuickCalls:
    """Small syscalls on the spool (create, rename, chmod, a few KiB written) take microseconds,
    a thread hand-off ~70 µs and two context switches (far more on a loaded machine): rsync's
    ten requests per small file made the hand-offs most of its time. So they run on the trio
    thread while they stay fast. A call that slept in the kernel (a voluntary context switch)
    for longer than QUICK_LIMIT is slow; QUICK_SLOW of those within QUICK_WINDOW seconds (a
    stalled disk, NFS, a journal busy with fsyncs) send them all to worker threads for
    QUICK_COOLDOWN seconds. One short stall alone does not: a journal commit holds up one
    create now and then. Being preempted on a busy machine never counts.

    What this cannot bound: a call runs to its end once started, so one call on a disk that
    stops answering holds the event loop (and every read of the mount) until the disk
    answers. It bounds how often: a call blocked for QUICK_STALL sends them to threads at once,
    and each cooldown that ends in another stall doubles (up to QUICK_COOLDOWN_MAX), so a
    stalled disk costs one blocked call per cooldown, not one per request. Calls whose cost
    grows with the data (truncating or deleting large files, folder archives) never come here
    (`DecantOperations._io`), and nothing slow holds the placing lock these calls can take."""

    def __init__(self) -> None:
        self.until = 0.0
        self.slow: deque[float] = deque(maxlen=QUICK_SLOW)
        self.logged = False
        self.cooldown = QUICK_COOLDOWN

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.monotonic()
        if start < self.until:
            return await trio.to_thread.run_sync(fn, *args)
        slept = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        try:
            return fn(*args)
        finally:
            took = time.monotonic() - start
            if took > QUICK_LIMIT and resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw > slept:
                self._slow(took)

    def _slow(self, took: float) -> None:
        now = time.monotonic()
        self.slow.append(now)
        pattern = len(self.slow) >= QUICK_SLOW and now - self.slow[0] <= QUICK_WINDOW
        if not pattern and took < QUICK_STALL:
            return
        # Stalling again soon after a cooldown: the disk is still slow, wait longer.
        again = now - self.until < self.cooldown
        self.cooldown = min(QUICK_COOLDOWN_MAX, 2 * self.cooldown) if again else QUICK_COOLDOWN
        self.until = now + self.cooldown
        self.slow.clear()
        level = logging.DEBUG if self.logged else logging.INFO
        self.logged = True
        log.log(level, "spool operations blocked (the last for %.0f ms): they go to worker threads "
                "for %g s", took * 1e3, self.cooldown)  # fmt: skip


def _fail(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


def _rewritten(folder: Folder, names: set[str]) -> set[str]:
    """Those of `names` whose listed archive file is no longer the version listed (written in
    place: same name, same folder mtime; a folder archive whose manifest was rewritten, which
    the watcher reports in `NAME.zarr/.decant`, not in the folder listed), or whose plain
    folder's or file's owner, group or mode bits changed (chmod, chown, setfacl: no folder
    mtime tells, and a folder's getattr is answered from its listing, so `chmod 700 private`
    left it open to every user through the mount until its parent changed; a file's lookup
    is, so `chmod 600 notes.txt` left it open once the kernel's entry expired)."""
    out = set()
    for name in names:
        node = folder.children.get(name)
        if node is not None and node.backend is None and not node.spooled:
            if _attrs_changed(node) or _written(node):
                out.add(name)
            continue
        if node is None or not node.version or node.member or node.spooled:
            continue
        try:
            st = archive_stat(node.real, os.lstat(node.real))  # a folder archive: its manifest
        except OSError:
            continue
        if len(node.version) == 4 and archive_version(st) != node.version:
            out.add(name)
    return out


def _written(node: Node) -> bool:
    """Whether the plain file behind `node` has another size or mtime now: written in place
    (an archive shown raw, written over with one that parses, is then described)."""
    if node.is_dir:
        return False
    try:
        st = os.lstat(node.real)
    except OSError:
        return True
    return (st.st_size, st.st_mtime_ns) != (node.size, node.mtime_ns)


def _plain(node: Node) -> bool:
    """A file or folder of a local SRC shown as it is there (not an archive, not spooled)."""
    return node.backend is None and not node.spooled and isinstance(node.real, Path)


def _attrs_changed(node: Node) -> bool:
    """Whether the plain folder or file behind `node` shows other owner, group or bits now
    (its ACL narrowing them: vfs.acl), write bits aside (a read-only mount clears them)."""
    try:
        st = acl_stat(node.real, os.lstat(node.real))
    except OSError:
        return True  # gone or replaced: its listing says what is there
    now = (stat.S_IMODE(st.st_mode) & ~0o222, st.st_uid, st.st_gid)
    kind = stat.S_ISDIR if node.is_dir else stat.S_ISREG
    return now != (node.mode & ~0o222, node.uid, node.gid) or not kind(st.st_mode)


def _heavy(node: Node | None) -> bool:
    """Deleting it may take long whatever the disk (see QUICK_FREE)."""
    return node is not None and (node.is_dir or node.backend is not None or node.size > QUICK_FREE)


def _listed(folder: Folder, name: str) -> Node:
    """The node a folder listing holds under `name`, or ENOENT."""
    node = folder.children.get(name)
    if node is None:
        raise _fail(errno.ENOENT)
    return node


@dataclass
class _Prescan:
    """A folder's listing read before its lock was taken (`DecantOperations._prescan`), with
    what it was read against (`taken`). The folder notes the names changed under its lock
    meanwhile until `release`."""

    folder: Folder | None
    released: int  # InodeTable.released then: nobody held the lock since if unchanged
    mark: int | None  # folder.note()'s: the names changed under the lock since
    moves: int  # InodeTable.moves then: a folder at or above it moved
    real: Path
    mtime: int  # the folder's stamp, taken before it was read
    kids: dict[str, Node]
    _noting: bool = True

    def taken(self, folder: Folder | None, released: int, moves: int,
              real: Path) -> dict[str, Node] | None:  # fmt: skip
        """The listing to take now (the caller holds the folder's lock): as read, with the
        entries changed under the lock since as the listing has them (newer than the read);
        None if it cannot be told (another listing, a folder moved, too many changes)."""
        if self.folder is not folder or self.moves != moves or self.real != real:
            return None
        if released == self.released:
            return self.kids
        if folder is None or self.mark is None:
            return None
        changed = folder.changed_since(self.mark)
        if changed is None:
            return None
        for name in changed:
            node = folder.children.get(name)
            if node is None:
                self.kids.pop(name, None)
            else:
                self.kids[name] = node
        return self.kids

    def release(self) -> None:
        if self._noting and self.folder is not None:
            self.folder.unnote()
        self._noting = False


@dataclass
class _Ahead:
    """The watcher's names read before the folder's lock was taken (`_read_ahead`); the folder
    notes the names changed under its lock meanwhile until `release`."""

    folder: Folder
    released: int  # InodeTable.released then
    mark: int  # folder.note()'s
    known: Mapping[str, Node | None]
    behind: bool  # told with the archives the listing gave them to: read whole behind
    _noting: bool = True

    def usable(self, folder: Folder, released: int) -> set[str] | None:
        """The names changed under the lock since the read (their entries in the listing are
        newer than the read's); None if the read cannot be taken."""
        if folder is not self.folder:
            return None
        if released == self.released:
            return set()
        return folder.changed_since(self.mark)

    def release(self) -> None:
        if self._noting:
            self.folder.unnote()
        self._noting = False


class DecantOperations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        tree: SourceTree,
        config: MountConfig,
        writer: WriteSide | None = None,
        queue: PackQueue | None = None,
        cache: PageCache | None = None,
    ) -> None:
        super().__init__()
        self.tree = tree
        self.cache = cache
        self.config = config
        self.writer = writer
        self.queue = queue
        self.watched = config.watch  # the watcher clears it if inotify fails
        self.inodes = InodeTable(tree.root_node(), listed_entries=config.listed_entries)
        self.let_go = LetGo(self.inodes)  # its task runs in the daemon's nursery
        self.integrity = Integrity(self._is_verified, self._mark_verified, self._open_reader,
                                   self._forget_verified)  # fmt: skip
        self.integrity.doubt = tree.doubt
        self.integrity.hold = tree.refusal_hold
        self.integrity.refetch = self._refetch
        self.reads = Reads(self.integrity, config.decode_threads)
        self._handles: dict[int, OpenFile] = {}
        self._next_fh = 1
        # Each open handle holds descriptors of the daemon: one user holding them all would
        # make every other user's open (and publishing) fail with EMFILE. Up to two a handle (a
        # package's own and its O_DIRECT twin, vfs.stores.local.LocalFile): a user's handles
        # hold at most a quarter of them.
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.handles_per_user = max(16, min(HANDLES_PER_USER, fd_limit // 8))
        self._handle_uid: dict[int, int] = {}
        self._open_by_uid: dict[int, int] = {}
        self._told_cap: set[int] = set()
        self._quick = QuickCalls()
        self._listing_by_owner: dict[int, trio.CapacityLimiter] = {}
        # Another user's archives new in a folder, described for its listing (`_scan`): by
        # (folder owner, archive owner), so neither's own listings wait for them; each such
        # pool's threads shared fairly between the folders waiting (`_describe_theirs`).
        self._describing_for: dict[tuple[int, int], tuple[FairSlots, trio.CapacityLimiter]] = {}
        self._checks_by_uid: dict[int, trio.CapacityLimiter] = {}
        self._relisting: set[int] = set()  # folders a lookup left to be listed in the background
        self._relist_again: set[int] = set()  # ... and to be listed once more after that
        self._describing: Counter[int] = Counter()  # folders whose listing describes archives
        self._prescanning: dict[int, trio.Event] = {}  # folders read before their lock (_prescan)
        # Names a lookup answered otherwise than the listing did, by folder (_reconcile).
        self._answered: dict[int, dict[str, tuple[Any, int] | None]] = {}
        self._status = Node(False, 0, time.time_ns(), 0o444, os.getuid(), os.getgid(),
                            tree.root / STATUS_NAME, member=STATUS_NAME)  # fmt: skip
        self.status_file = StatusFile(self._status_head, self._status_tail, self._queue_changes,
                                      self._spooled_by)  # fmt: skip

    @property
    def nursery(self) -> trio.Nursery | None:
        return self.reads.nursery

    @nursery.setter
    def nursery(self, nursery: trio.Nursery | None) -> None:
        self.reads.nursery = nursery
        self.integrity.spawn = self.reads.spawn if nursery is not None else None

    # -- listings --------------------------------------------------------------------------

    def _node(self, inode: int) -> Node:
        node = self.inodes.get(inode)
        if node is None:
            raise _fail(errno.ENOENT)
        return node

    def _lister(self, folder: Node) -> trio.CapacityLimiter:
        """The worker threads listings of `folder` share: those of its owner's folders (an
        archive shown as a folder: its file's owner). A user fills only their own."""
        return _per_user(self._listing_by_owner, folder.uid)

    async def _scan(self, node: Node) -> dict[str, Node]:
        """`tree.scan` of a real folder in its owner's listing threads, the archives of other
        users new in it described in threads of their own (`tree.Deferred`, `_describe_
        theirs`), and handed to a scan again. Four slow archives one user dropped into four of
        root's shared folders held root's four threads while they were described, and every
        listing of every folder of root's waited behind them (red team 102 F3). An archive new
        again at every scan (rewritten meanwhile) is left out after DEFER_ROUNDS, not
        described in the owner's threads."""
        if not isinstance(node.real, Path):  # a bucket's objects are shown as one owner's
            scan = functools.partial(self.tree.scan, node.real, (node.ino, node.uid))
            return await trio.to_thread.run_sync(scan, limiter=self._lister(node))  # type: ignore[no-any-return]
        handed: dict[Path, Any] = {}
        for done in range(DEFER_ROUNDS + 1):
            scan = functools.partial(self.tree.scan, node.real, (node.ino, node.uid),
                                     defer=node.uid, handed=handed,
                                     leave_out=done == DEFER_ROUNDS)  # fmt: skip
            try:
                return await trio.to_thread.run_sync(scan, limiter=self._lister(node))  # type: ignore[no-any-return]
            except Deferred as theirs:
                handed.update(await self._describe_theirs(node, theirs.archives))
        raise AssertionError("the last round leaves out what it would defer")

    async def _describe_theirs(self, node: Node, archives: list[Any]) -> dict[Path, Any]:
        """`archives` (other users' in `node`'s folder) described (`describe_each`), each
        user's in the threads of that user's archives in that folder owner's folders: not in
        the folder owner's own (red team 102 F3), nor in the archive owner's own (a user's
        48 folders, each holding a link of root's slow archive, held root's threads and
        every listing of root's folders: tests/mount/test_redteam30.py). A thread is held
        for DESCRIBE_TURN at a time, and goes to the waiting folder holding fewest."""
        by_owner: dict[int, list[Any]] = {}
        for archive in archives:
            by_owner.setdefault(archive[1].st_uid, []).append(archive)
        out: dict[Path, Any] = {}

        async def describe(uid: int, theirs: list[Any]) -> None:
            pool = self._describing_for.get((node.uid, uid))
            if pool is None:
                pool = FairSlots(LISTING_THREADS), trio.CapacityLimiter(LISTING_THREADS)
                self._describing_for[(node.uid, uid)] = pool
            slots, limiter = pool
            while theirs:
                async with slots.slot(node.ino):
                    work = functools.partial(self.tree.describe_each, node.real, theirs,
                                             time.monotonic() + DESCRIBE_TURN)  # fmt: skip
                    described, done = await trio.to_thread.run_sync(work, limiter=limiter)
                out.update(described)
                theirs = theirs[done:]

        async with trio.open_nursery() as nursery:
            for uid, theirs in by_owner.items():
                nursery.start_soon(describe, uid, theirs)
        return out

    def _checker(self, uid: int) -> trio.CapacityLimiter:
        """The worker threads that `uid`'s access walks (`_may_read_through`) share."""
        return _per_user(self._checks_by_uid, uid)

    async def _listing(self, inode: int) -> Folder:
        """The folder's listing, re-read first if it may be stale (takes the folder's lock)."""
        folder = self.inodes.folders.get(inode)
        if folder is not None:
            self.inodes.used_listing(inode)
            if self._node(inode).backend is not None:
                return folder
            if time.monotonic() - folder.checked < RESCAN_INTERVAL:
                return folder
        # ESTALE: another folder at its name now (tree.scan), its name listed again
        node = self._node(inode)
        async with (
            self._read_before_lock(inode) as prescan,
            self._stale_relisted(node),
            self.inodes.locked(inode),
        ):
            return await self._fresh(inode, max_age=RESCAN_INTERVAL, prescan=prescan)

    async def _prescan(self, inode: int, force: bool = False) -> _Prescan | None:
        """The folder's listing read before its lock is taken, when SRC changed since it was
        read (`force`: in any case). The read describes every archive new in the folder (a
        second or two each for a big one not in the index yet); under the lock, every change
        made through the mount in the folder waited for it, while the kernel holds the folder
        for that change and every user's lookups there wait on the kernel (red team 95 F2: one
        `touch`, 32 s behind forty new archives). `_fresh` takes it under the lock if nothing
        changed meanwhile, else reads again (the descriptions are in the index by then). One at
        a time a folder: another caller waits for it, and then finds the listing fresh (or,
        `force`d, reads it again: the one it waited for may have read it before the change)."""
        node = self.inodes.get(inode)
        if node is None or not node.is_dir or node.backend is not None:
            return None
        if not isinstance(node.real, Path):  # a bucket's folder: one LIST, under the lock
            return None
        while (running := self._prescanning.get(inode)) is not None:
            await running.wait()
            if not force:  # that one's listing is as good (taken, or read under the lock)
                return None
        done = self._prescanning[inode] = trio.Event()
        folder = self.inodes.folders.get(inode)
        mark = folder.note() if folder is not None else None
        try:
            released, moves = self.inodes.released(inode), self.inodes.moves
            real = node.real
            mtime = await trio.to_thread.run_sync(self.tree.stamp_folder, real)
            if folder is None or folder.mtime_ns != mtime or force:
                with self._described_behind(inode):  # lookups need not wait for it: `_named`
                    kids = await self._scan(node)
                found = _Prescan(folder, released, mark, moves, real, mtime, kids)
                mark = None  # handed over: the caller releases it (_read_before_lock)
                return found
            return None
        except Exception:  # told under the lock, by the read there (ESTALE, ENOENT, ...)
            return None
        finally:
            if mark is not None and folder is not None:  # not handed to a _Prescan
                folder.unnote()
            del self._prescanning[inode]
            done.set()

    @contextlib.asynccontextmanager
    async def _read_before_lock(
        self, inode: int, force: bool = False
    ) -> AsyncIterator[_Prescan | None]:
        """`_prescan`, its noting of changed names ended once the caller is done with it."""
        prescan = await self._prescan(inode, force)
        try:
            yield prescan
        finally:
            if prescan is not None:
                prescan.release()

    async def _named(self, inode: int, name: str, uid: int) -> tuple[Folder | None, Node | None]:
        """The folder's listing and what it presents under `name`, for `uid`'s lookup.

        When SRC changed since the listing was read, the name is looked for by a few lstats
        (`tree.entries_of_listed`) and answered at once, and the listing is read again in the
        background: that reads every new archive in the folder (a second or two each for a big
        one not in the index yet), and a lookup of another name must not wait for it (red team
        87 F4: forty archives renamed into a shared folder held its other users' lookups 78 s).
        So too while a listing runs (a readdir's, the watcher's word of new names). Where an
        archive presents a name other than its own, the archive the last listing gave the name
        to is read with the lstats (`_presenters`), and the name goes to whichever the listing
        would give it to: a user's `scan.tif.zarr.zip` dropped beside the folder owner's
        `batch.zarr.zip` presenting `scan.tif` must not stand in for it (red team 95 F1). What
        the listing then finds otherwise the kernel is told: changed names by `_fresh`, and
        answers given here that differ from the listing read before them by `_reconcile` (the
        listing's answer may not have changed, and nothing else would tell). A spooled file
        waits for the listing (`_current` checks it against it), as does a folder the tree
        cannot tell name by name; a new entry not the folder owner's is read with the owner's
        new archives (`_with_owners_new`); a lookup while a change made through the mount
        holds the folder's lock waits for that change. In a folder not listed yet, see
        `_unlisted`."""
        folder = self.inodes.folders.get(inode)
        parent = self._node(inode)
        if (folder is None and parent.backend is None and self.nursery is not None
                and isinstance(parent.real, Path)):  # fmt: skip
            answer = await self._unlisted(inode, parent, name, uid)
            if answer is not None:
                return answer
            folder = await self._listing(inode)
            return folder, folder.children.get(name)
        if (folder is None or parent.backend is not None or self.nursery is None
                or time.monotonic() - folder.checked < RESCAN_INTERVAL):  # fmt: skip
            folder = await self._listing(inode)
            return folder, folder.children.get(name)
        if not self._describing[inode] and self.inodes.lock(inode).locked():
            # A change made through the mount: wait for it, not for a read of the listing
            # (the change reads the names it makes, `_for_change`; the rest is read behind).
            async with self.inodes.locked(inode):
                pass
            now = self.inodes.folders.get(inode)
            if now is not folder or time.monotonic() - folder.checked < RESCAN_INTERVAL:
                folder = await self._listing(inode)  # read again meanwhile, or let go
                return folder, folder.children.get(name)
        if not self._describing[inode]:
            try:
                mtime = await trio.to_thread.run_sync(self.tree.stamp_folder, parent.real)
            except OSError:
                mtime = None
            if mtime == folder.mtime_ns:  # unchanged: as `_fresh` finds it, without a 2nd stat
                self.inodes.used_listing(inode)
                folder.checked = time.monotonic()
                return folder, folder.children.get(name)
            if mtime is None:  # gone, or not reachable: the listing says how
                folder = await self._listing(inode)
                return folder, folder.children.get(name)
            self._relist_soon(inode)
        listed, seen = (parent.ino, parent.uid), (folder.checked, folder.mtime_ns)
        before = folder.children.get(name)
        look = functools.partial(self.tree.entries_of_listed, parent.real, [name], listed,
                                 also=self._presenters(parent, folder, [name]))  # fmt: skip
        try:
            fresh = await self._lstats(look, self._checker(uid))  # an archive: the caller's
        except OSError:
            fresh = None  # replaced, or gone: the listing tells (ESTALE, ENOENT)
        now = self.inodes.folders.get(inode)
        if now is not None and (now is not folder or (now.checked, now.mtime_ns) != seen):
            return now, now.children.get(name)  # listed meanwhile: as the listing found
        found = fresh[0].get(name) if fresh is not None else None
        if fresh is not None and (found is None or not found.spooled):
            if _told(found) == _told(before):
                return folder, found
            if found is not None and found.uid != parent.uid and fresh is not None:
                # A new entry not the folder owner's may lose the name to an archive of the
                # owner's new since the listing, presenting it under another name of its
                # own, which no lstat of the name finds (red team 100 R2: a user's plain
                # `vscan.tif` served for the owner's new `vb2.zarr.zip`, 30 s): those are
                # read with it. Not waited for: such lookups, one user's at will, held every
                # request task of the mount for a listing (red team 101 F1, 63 s).
                fresh = await self._with_owners_new(parent, folder, name, look, uid)
                found = fresh[0].get(name) if fresh is not None else None
            answered = self._answered.setdefault(inode, {})
            if (fresh is not None and (found is None or not found.spooled)
                    and (name in answered or len(answered) < MAX_ANSWERED)):  # fmt: skip
                answered[name] = _told(found)  # the listing may not tell: `_reconcile`
                self._relist_soon(inode)
                return folder, found
        folder = await self._listing(inode)
        return folder, folder.children.get(name)

    async def _unlisted(
        self, inode: int, parent: Node, name: str, uid: int
    ) -> tuple[Folder | None, Node | None] | None:
        """`_named` in a folder not listed yet (after a mount, or once its listing was let go):
        an entry the lstats of the name find is answered at once, and the listing is read
        behind. Its first read describes every archive in the folder the index does not hold
        (a second or two each for a big one, every time for one that fails), and every user's
        first lookup there waited for it: 30 s behind forty slow archives dropped into a
        shared folder, after each mount. Each answer is kept until the listing is read
        (`_reconcile`: dropped from the kernel where the listing answers otherwise).

        None, to wait for the listing, where lstats cannot tell: nothing found (an archive of
        another name may present the name; rsync's lookups before a create wait so), a
        spooled file (`_current` checks it against the listing), another user's entry in a
        folder whose owner has more archives than are read with it (any may present the
        name in the owner's folder, and take it from that entry: `_with_owners_new`), an
        overlay's folder, a change made through the mount holding the folder's lock, more
        answers kept than MAX_ANSWERED, more listings read behind than UNLISTED_BEHIND."""
        if self.inodes.lock(inode).locked() and not self._describing[inode]:
            return None  # a change made through the mount: as `_named` (it reads the listing)
        if inode not in self._relisting and len(self._relisting) >= UNLISTED_BEHIND:
            return None
        look = functools.partial(self.tree.entries_of_listed, parent.real, [name],
                                 (parent.ino, parent.uid))  # fmt: skip
        try:
            fresh = await self._lstats(look, self._checker(uid))  # an archive: the caller's
        except OSError:
            return None  # replaced, or gone: the listing tells (ESTALE, ENOENT)
        found = fresh[0].get(name) if fresh is not None else None
        if found is not None and found.uid != parent.uid and not found.spooled:
            fresh = await self._with_owners_new(parent, None, name, look, uid, complete=True)
            found = fresh[0].get(name) if fresh is not None else None
        now = self.inodes.folders.get(inode)
        if now is not None:  # listed meanwhile: as the listing found
            return now, now.children.get(name)
        answered = self._answered.setdefault(inode, {})
        if (found is None or found.spooled
                or (name not in answered and len(answered) >= MAX_ANSWERED)):  # fmt: skip
            return None
        answered[name] = _told(found)  # the listing tells nothing it changes: `_reconcile`
        self._relist_soon(inode)  # which reconciles it, whether under way or not
        return None, found

    async def _with_owners_new(
        self, parent: Node, folder: Folder | None, name: str, look: functools.partial[Any],
        uid: int, complete: bool = False,
    ) -> tuple[dict[str, Node | None], bool] | None:  # fmt: skip
        """`look` again with the folder owner's archives new since the listing (`tree.
        new_archives_of`; with no listing, all of them), in a worker thread of the caller's;
        None if the folder is gone (or, `complete`, where the owner has more than the tree
        reads with a lookup)."""
        try:
            async with self._checker(uid):  # a user's few at once: each copies the listing
                known = [] if folder is None else list(folder.children.values())  # unchanging
                find = functools.partial(self.tree.new_archives_of, parent.real,
                                         (parent.ino, parent.uid), known, parent.uid,
                                         complete)  # fmt: skip
                new = await trio.to_thread.run_sync(find)
                if new is None:
                    return None
                again = functools.partial(look.func, *look.args,
                                          also=[*look.keywords.get("also", ()), *new])  # fmt: skip
                return await trio.to_thread.run_sync(again)  # type: ignore[no-any-return]
        except OSError:
            return None

    def _presenters(self, parent: Node, folder: Folder, names: list[str]) -> list[str]:
        """The archives the listing gave `names`, or the names related to them, that are not
        named after them: whoever presents a name is decided among these and the names related
        to it, as the listing decides it (tree.entries_of_listed's `also`). A user's archive
        named after a name the folder owner's archive presents is shown under its own name:
        read without the owner's, it took the name (red team 95 F1), and its own looked gone."""
        near = self.tree.presented_names(self.tree.presented_names(set(names)))
        return _presenters_of(parent, {n: folder.children.get(n) for n in sorted(near)})

    def _relist_soon(self, inode: int, force: bool = False) -> None:
        """The folder's listing read again in the background (`_relist_behind`), once; once
        more after the one under way when `force`d (that one may have read it before)."""
        if self.nursery is None:
            return
        if inode in self._relisting:
            if force:
                self._relist_again.add(inode)
            return
        self._relisting.add(inode)
        self.reads.spawn(self._relist_behind, inode, force)

    async def _relist_behind(self, inode: int, force: bool = False) -> None:
        """`_named`'s listing in the background (`force`: read whole whatever the folder's
        stamp says); what it finds changed is invalidated."""
        try:
            while True:
                self._relist_again.discard(inode)
                node = self.inodes.get(inode)
                if node is None:
                    break
                with contextlib.suppress(OSError, pyfuse3.FUSEError):
                    async with (
                        self._read_before_lock(inode, force) as prescan,
                        self._stale_relisted(node),
                        self.inodes.locked(inode),
                    ):
                        with self._described_behind(inode):
                            await self._fresh(inode, force, max_age=RESCAN_INTERVAL,
                                              prescan=prescan)  # fmt: skip
                if inode not in self._relist_again:
                    break
                force = True
        finally:
            self._relisting.discard(inode)
            self._relist_again.discard(inode)
            self._reconcile(inode)

    def _reconcile(self, inode: int) -> None:
        """Names `_named` answered otherwise than the listing read before them, where the
        listing read since (or its loss) answers otherwise again: dropped from the kernel. The
        listing's own changes are invalidated by `_fresh`; these it cannot see (its answer
        the same as before, as for a spoofed name, red team 95 F1)."""
        answered = self._answered.pop(inode, None)
        if not answered:
            return
        folder = self.inodes.folders.get(inode)
        for name, told in answered.items():
            if folder is None or _told(folder.children.get(name)) != told:
                self._invalidate(inode, name)

    def _invalidate(self, inode: int, name: str) -> None:
        """The kernel's entry of `name` in the folder dropped; not once the mount is gone (a
        listing read behind, finishing after the unmount, logged a traceback a name)."""
        if self.nursery is not None:
            pyfuse3.invalidate_entry_async(inode, os.fsencode(name), ignore_enoent=True)

    @contextmanager
    def _described_behind(self, inode: int) -> Iterator[None]:
        """The folder's listing describes archives meanwhile: `_named` need not wait for it."""
        self._describing[inode] += 1
        try:
            yield
        finally:
            self._describing[inode] -= 1
            if not self._describing[inode]:
                del self._describing[inode]

    async def _fresh(
        self, inode: int, force: bool = False, max_age: float = 0.0,
        prescan: _Prescan | None = None,
    ) -> Folder:  # fmt: skip
        """The listing, re-read if SRC changed since it was checked more than `max_age` seconds
        ago (`force`: re-read in any case); the caller holds the folder's lock. `prescan`: the
        listing read before the lock was taken, taken if nothing changed since."""
        node = self._node(inode)
        if not node.is_dir:
            raise _fail(errno.ENOTDIR)
        folder = self.inodes.folders.get(inode)
        if node.backend is not None:
            if folder is None:
                kids = await trio.to_thread.run_sync(self.tree.children_of_archive_node, node,
                                                     limiter=self._lister(node))  # fmt: skip
                folder = Folder()
                folder.merge(kids)
                self.inodes.keep_archive_listing(inode, folder)
            return folder
        if folder is not None and not force and time.monotonic() - folder.checked < max_age:
            return folder
        while True:
            moves, real = self.inodes.moves, node.real
            try:
                mtime = await trio.to_thread.run_sync(self.tree.stamp_folder, real)
                if folder is not None and folder.mtime_ns == mtime and not force:
                    folder.checked = time.monotonic()
                    return folder
                read = None
                if prescan is not None:
                    read = prescan.taken(folder, self.inodes.released(inode), moves, real)
                if prescan is not None and read is not None:
                    # Its stamp, taken before it was read: a change since shows at next use.
                    kids, mtime = read, prescan.mtime
                    break
                with self._described_behind(inode):  # lookups need not wait for it: `_named`
                    kids = await self._scan(node)
            except FileNotFoundError:
                if moves == self.inodes.moves:
                    raise
                continue
            if moves == self.inodes.moves:
                break  # else a folder at or above it moved while it was read: read it again
        if folder is None:
            folder = Folder()
            folder.merge(kids)
            # A first listing: the kernel has no names of it cached. One let go: what changed
            # since and the watcher has not told yet (it may tell after this read, when the
            # stamp matches and nothing looks changed) is dropped from the kernel now.
            gone = self.inodes.taken_back(inode)
            changed = [] if gone is None else self._changed_since(node, inode, gone, kids)
        else:  # new names too: the kernel may remember that they were not there
            before = folder.children.copy()
            changed = [name for name in kids if name not in folder.children]
            changed += folder.merge(kids)
            # A rescan that runs between a publish and the queue's word of it (the watcher saw
            # SRC change) keeps the published file's inode, as `_show` does.
            changed = [n for n in changed if not self._carry_published(before.get(n), kids.get(n))]
        for node in kids.values():  # the kernel's inodes see new sizes and modes at getattr
            ino = self.inodes.known(node)
            if ino is not None:
                self.inodes.replace(ino, node)
        folder.mtime_ns, folder.checked, folder.absorbed = mtime, time.monotonic(), False
        self.inodes.keep_listing(inode, folder)
        for name in changed:
            self._invalidate(inode, name)
        return folder

    def _changed_since(
        self, node: Node, inode: int, gone: LetGoListing, kids: dict[str, Node]
    ) -> list[str]:
        """Names of a listing read again after it was let go that the kernel may hold wrong:
        new ones (it may remember them missing), and files it holds that went or are another
        entry now (a spooled file published keeps its inode, as in a rescan)."""
        changed = gone.new_names(kids)
        for ino, parent, name in self.inodes.held_files_in(node.real):
            if parent != inode:
                continue
            held, now = self.inodes.get(ino), kids.get(name)
            if now is None or (held is not None and self.inodes.known(now) != ino
                               and not self._carry_published(held, now)):  # fmt: skip
                changed.append(name)
        return changed

    async def rescan(self, inode: int, force: bool = False) -> Folder:
        async with self._read_before_lock(inode, force) as prescan, self.inodes.locked(inode):
            return await self._fresh(inode, force, prescan=prescan)

    def watches(self, folder: object, below: int = 0) -> bool:
        """Whether the watcher reports changes in `folder` (a local SRC's), and `below` levels
        under it: not with --no-watch, once inotify failed, nor below the depth it watches."""
        if not self.watched:
            return False
        return not isinstance(folder, Path) or watched_at(self.tree.root, folder, below)

    def _watched(self, node: Node) -> bool:
        """Whether a change of `node`'s own attributes is reported (by its folder's watch)."""
        folder = node.folder  # a bucket's are ObjectPaths (pure): the watcher never sees them
        return self.watches(folder) if isinstance(folder, Path) else self.watched

    def _attrs(self, inode: int, node: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.generation = 0
        if node.backend is not None and node.member:
            timeout = ARCHIVE_TIMEOUT  # inside an archive: changes give new inodes
        elif not self._watched(node):
            timeout = UNWATCHED_TIMEOUT
        else:
            timeout = ARCHIVE_TIMEOUT if node.backend is not None else MIRROR_TIMEOUT
        a.entry_timeout = a.attr_timeout = timeout
        a.st_mode = (stat.S_IFDIR if node.is_dir else stat.S_IFREG) | node.mode
        a.st_nlink = 2 if node.is_dir else 1
        a.st_uid, a.st_gid = node.uid, node.gid
        a.st_size = node.size
        a.st_blksize = 128 * 1024
        a.st_blocks = (node.size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = node.mtime_ns
        return a

    @staticmethod
    def _status_name(parent_inode: int, name: bytes) -> bool:
        return parent_inode == ROOT_INODE and name == STATUS_NAME.encode()

    def _is_status(self, node: Node) -> bool:
        return node is self._status

    def status(self) -> dict[str, Any]:
        """The pack queue (writable mounts) and the daemon's counters, every file named: root's
        view, for the metrics file. Readers of `.decant-status` get theirs from `status_file`."""
        return {**self._status_head(), **self._status_tail()}

    def _status_head(self) -> dict[str, Any]:
        """The pack queue's counts and lists (O(files) to gather: see `status_file`)."""
        doc: dict[str, Any] = self.queue.status() if self.queue is not None else {}
        doc.pop("space", None)  # in the tail: it moves with every write
        return doc

    def _queue_changes(self) -> int:
        return self.queue.changes if self.queue is not None else 0

    def _status_tail(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.queue is not None and self.queue.guard is not None:
            doc["space"] = self.queue.guard.status()
        doc["daemon"] = daemon_section(self.cache, self.integrity, len(self.inodes))
        return doc

    def _status_attrs(self, inode: int, data: Joined) -> pyfuse3.EntryAttributes:
        """Sized as the caller reads it (`data`: `status_file.read(ctx.uid)`), never from another
        caller's status (which would tell the length of names it may not see); attributes not
        cached, since the kernel keeps one size per inode for every caller."""
        self._status.size = data.size
        a = self._attrs(inode, self._status)
        a.attr_timeout = 0
        return a

    def _spooled_by(self, relpath: object, uid: int) -> bool:
        if self.writer is None or not isinstance(relpath, str):
            return False
        try:
            if os.lstat(self.writer.spool.path(relpath)).st_uid != uid:
                return False
        except OSError:
            return False
        root = self.tree.root
        if isinstance(root, ObjectPath):  # a bucket's folders have no modes of their own
            return True
        # The user's own file, but maybe moved since into a folder they may not list (another
        # user's rename of a folder holding it): its path would tell them that folder's name.
        return may_list_folder_of(root, root / relpath, uid)

    # -- namespace handlers ----------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        with errno_boundary(f"lookup {name!r}"):
            if self._status_name(parent_inode, name):
                # Found by name only: listings and rsync skip it. The daemon's own, whatever
                # SRC or a bucket holds under that name (anyone who may write there could
                # otherwise show every user a status of their making).
                data = await self.status_file.read(ctx.uid)
                return self._status_attrs(self.inodes.hand_out(self._status), data)
            if name == STATUS_NAME.encode():  # nor below the top: `--status MNT/sub` printed
                return self._negative(parent_inode)  # one a user made there (red team 50)
            text = os.fsdecode(name)
            folder, node = await self._named(parent_inode, text, ctx.uid)
            if node is not None and folder is not None:  # else not spooled: `_unlisted`
                node = await self._current(folder, text, node)
            if node is None:
                return self._negative(parent_inode)
            if _plain(node) and not self._watched(node):
                if node.is_dir:
                    await self._restat_folder(node)  # no watcher tells a chmod of it: see there
                else:
                    node = await self._restat_file(node)  # nor of a file: as getattr takes it
            ino = self.inodes.hand_out(node, (parent_inode, text))
            self.let_go.poke()
            return self._attrs(ino, node)

    def _negative(self, parent_inode: int) -> pyfuse3.EntryAttributes:
        """No such name, and the kernel may remember that as long as it keeps the folder's
        names: rsync asks for each name three times before it creates it. Names that appear
        without the kernel's knowing (SRC changed, a file dropped into the spool) are
        invalidated when the listing takes them (`_fresh`, `_show`)."""
        COUNTERS.error(errno.ENOENT)  # what the caller sees, as if raised
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0
        parent = self.inodes.get(parent_inode)
        if parent is not None and self._fixed_listing(parent):
            a.entry_timeout = ARCHIVE_TIMEOUT
        elif parent is not None and self.watches(parent.real):
            a.entry_timeout = NEGATIVE_TIMEOUT
        else:
            a.entry_timeout = UNWATCHED_TIMEOUT
        return a

    def _fixed_listing(self, folder: Node) -> bool:
        """An archive's folder: its listing never changes under one inode (a changed archive
        gets new ones). Not a collection's view, which is rebuilt in place when it changes."""
        if folder.backend is None:
            return False
        real = folder.real
        return not any(r == real or r in real.parents for r in self.tree.overlay_roots)

    async def _current(self, folder: Folder, name: str, node: Node) -> Node | None:
        """A spooled file's size and times move with its writes, not with its folder listing.
        While they are read the name may switch to its published file (or go): then what the
        listing holds now, or the spooled node would get an inode of its own that is gone."""
        if not node.spooled or self.writer is None:
            return node
        with contextlib.suppress(FileNotFoundError):  # published meanwhile: as listed
            fresh: Node = await self._quick(self.writer.refresh, node)
            now = folder.children.get(name)
            return fresh if now is not None and now.key == node.key else now
        return folder.children.get(name)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        with errno_boundary(f"getattr {inode}"):
            node = self._node(inode)
            if node.spooled and self.writer is not None:
                seen = node
                node, fresh = await self._on_spooled(inode, node, self.writer.refresh)
                if self.inodes.get(inode) is seen:
                    self.inodes.replace(inode, fresh)  # writes move its size
                node = self._node(inode)
            elif self._is_status(node):
                return self._status_attrs(inode, await self.status_file.read(ctx.uid))
            elif node.backend is None and not node.is_dir:
                node = await self._restat_file(node)
                self.inodes.replace(inode, node)
            elif node.backend is None and node.is_dir and node.real != self.tree.root:
                await self._restat_folder(node)
            return self._attrs(inode, node)

    async def _restat_file(self, node: Node) -> Node:
        """A mirrored file as SRC has it now (ACL-narrowed): it may be rewritten, chmod'ed or
        setfacl'ed in SRC without its folder changing."""
        fresh = self._taken(node, await trio.to_thread.run_sync(self._restated, node))
        if fresh is None:
            raise _fail(errno.ENOENT)
        return fresh

    async def _restat_folder(self, node: Node) -> None:
        """A plain folder's owner, group and bits as SRC has them now (ACL-narrowed): a chmod
        or setfacl of it changes no listing, and with no watcher to say so (`--no-watch`)
        `chmod 700 private` left it open through the mount for good. The kernel asks again
        when its attributes expire, and before it lets a caller in once they have."""
        self._taken(node, await trio.to_thread.run_sync(self._restated, node))

    def _taken(self, node: Node, fresh: Node | None) -> Node | None:
        """(trio thread) What `_restated` found, taken: a folder's node keeps its identity (its
        inode hangs on it) and takes the fresh owner, group and bits; a file's is the fresh
        node, or None if it is gone. A folder whose owner, group or bits changed is listed
        afresh: the name may hold another folder now (its owner swapped one of theirs in,
        with the same mtime), and the listing kept was read from the one before, so its names
        were shown to whoever the new folder's bits let in."""
        if fresh is None or not node.is_dir:
            return fresh
        if (fresh.mode, fresh.uid, fresh.gid) != (node.mode, node.uid, node.gid):
            node.mode, node.uid, node.gid = fresh.mode, fresh.uid, fresh.gid
            ino = self.inodes.known(node)
            if ino is not None:
                self.inodes.drop_listing(ino)
        return node

    def _restated(self, node: Node) -> Node | None:
        """(worker thread; reads `node`, changes nothing) A plain entry of SRC as SRC has it
        now: a fresh node; `node` itself if a folder could not be stat'ed (its parent's listing
        says what is there); None if a file is gone or no longer a file. Reached without
        links: one swapped in must not lend the mount its target's attributes."""
        if not _plain(node):
            return node
        try:
            st = stat_beneath(self.tree.root, node.real)
        except OSError:
            return node if node.is_dir else None
        want = stat.S_ISDIR if node.is_dir else stat.S_ISREG
        if not want(st.st_mode):
            return node if node.is_dir else None
        return mirror_node(node.real, st, self.tree.writable)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        with errno_boundary(f"opendir {inode}"):
            await self._listing(inode)
            self.inodes.opened_dir(inode)  # its listing is kept while a readdir may go on
            return inode

    async def releasedir(self, fh: int) -> None:
        with errno_boundary(f"releasedir {fh}"):
            self.inodes.released_dir(fh)

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        with errno_boundary(f"readdir {fh}"):
            try:
                await self._fill(fh, start_id, token)
            finally:
                self.let_go.poke()

    async def _fill(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        folder = self.inodes.folders.get(fh)
        if folder is None or self._node(fh).backend is not None:
            folder = await self._listing(fh)
        elif time.monotonic() - folder.checked >= RESCAN_INTERVAL:
            # Read by its opendir (which holds no lock of the kernel's): a readdir runs while
            # the kernel holds the folder (shared with lookups, not with a change to it), so a
            # read of the listing here held a `touch` there, and every lookup queued behind it
            # (a handle opened, left a while, then read). The listing as it is; read again in
            # the background, and at the next opendir.
            self.inodes.used_listing(fh)
            self._relist_soon(fh)
        entries = folder.after(start_id)
        while batch := list(itertools.islice(entries, READDIR_BATCH)):
            if any(_plain(node) and not self._watched(node) for _c, _n, node in batch):
                # What lookup and getattr give, not the listed bits.
                fresh = await trio.to_thread.run_sync(self._restated_batch, batch)
                batch = [(c, n, node) for (c, n, old), new in zip(batch, fresh, strict=True)
                         if (node := self._taken(old, new)) is not None]  # fmt: skip
            for cookie, name, listed in batch:
                if name == STATUS_NAME:
                    continue  # SRC's own entries of that name are never shown (see lookup)
                node = await self._current(folder, name, listed)
                if node is None:
                    continue
                ino = self.inodes.assign(node)
                if not pyfuse3.readdir_reply(
                    token, os.fsencode(name), self._attrs(ino, node), cookie
                ):
                    self.inodes.release_unused(ino)
                    return
                self.inodes.count(ino, (fh, name))  # readdirplus: the kernel holds one more

    def _restated_batch(self, batch: list[tuple[int, str, Node]]) -> list[Node | None]:
        """(worker thread) `_restated` of each listed entry, unwatched: a chmod or setfacl of
        a file changes no folder, and `ls -l` (readdirplus) handed the kernel the listed, wider
        bits again after lookup and getattr had narrowed them."""
        return [self._restated(node) for _cookie, _name, node in batch]

    async def forget(self, inode_list: Any) -> None:
        for inode, count in inode_list:
            self.inodes.forget(inode, count)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        with errno_boundary("statfs"):
            st = await trio.to_thread.run_sync(self.tree.statvfs)
            out = pyfuse3.StatvfsData()
            for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                         "f_ffree", "f_favail", "f_namemax"):  # fmt: skip
                setattr(out, name, getattr(st, name))
            return out

    def _xattrs(self, node: Node) -> dict[str, str]:
        found = dict(node.xattrs)
        if node.sha256 and node.backend is not None:
            found["user.decant.verified"] = self.integrity.state(node)
        return found

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        with errno_boundary(f"getxattr {inode}"):
            # Every name the mount shows is user.*. `ls -l` asks for security.selinux and
            # system.posix_acl_access of every entry, two thirds of its requests (the kernel
            # caches no "absent"): answered without the node lookup and the dict of names.
            # `ls -l` of 1,000 archives, 5 A/B rounds, fresh daemon: 0.21-0.33 -> 0.20-0.26 s;
            # warm, median of 10: 0.11-0.22 -> 0.10-0.16 s.
            if not name.startswith(b"user."):
                raise _fail(pyfuse3.ENOATTR)
            node = self._node(inode)
            if name == b"user.decant.verified" and node.sha256 and node.backend is not None:
                await self.integrity.verified(node)  # the index may know it
            value = self._xattrs(node).get(os.fsdecode(name))
            if value is None:
                raise _fail(pyfuse3.ENOATTR)
            return value.encode()

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        with errno_boundary(f"listxattr {inode}"):
            return [os.fsencode(k) for k in self._xattrs(self._node(inode))]

    # -- file handlers ---------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        self._reserve_handle(ctx.uid)
        try:
            info = await self._open(inode, flags, ctx)
        except BaseException:
            self._drop_handle(ctx.uid)
            raise
        self._handle_uid[info.fh] = ctx.uid
        return info

    def _reserve_handle(self, uid: int) -> None:
        """Count one more open handle of `uid`; EMFILE past its share (root has no cap)."""
        held = self._open_by_uid.get(uid, 0)
        if uid != 0 and held >= self.handles_per_user:
            if uid not in self._told_cap:
                self._told_cap.add(uid)
                log.warning("uid %d holds %d open files: refusing more (EMFILE) until some close",
                            uid, held)  # fmt: skip
            raise _fail(errno.EMFILE)
        self._open_by_uid[uid] = held + 1

    def _drop_handle(self, uid: int) -> None:
        held = self._open_by_uid.get(uid, 0) - 1
        if held > 0:
            self._open_by_uid[uid] = held
        else:
            self._open_by_uid.pop(uid, None)
            self._told_cap.discard(uid)

    async def _open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        with errno_boundary(f"open {inode}"):
            node = self._node(inode)
            if node.is_dir:
                raise _fail(errno.EISDIR)
            writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND)
            if self._is_status(node):
                if writing:
                    raise _fail(errno.EACCES)
                data = await self.status_file.read(ctx.uid)  # its bulk shared: see status.py
                handle = OpenFile(node, inode, data)
                return self._new_handle(handle, direct_io=True)
            if writing:
                return await self._open_for_write(inode, node, flags, ctx)
            if node.backend is not None and self.tree.racy_due(node):
                await self._describe_again(node)
            if node.key in self.integrity.bad:
                raise _fail(errno.EIO)
            if node.spooled:  # a plain file of the spool: see QuickCalls
                node, reader = await self._on_spooled(inode, node, self._open_reader)
            else:
                checked = await self._may_read_through(node, ctx)
                if self.config.verify_first:
                    await self._verified_first(node, ctx.uid)
                try:
                    with charged_to(ctx.uid):  # its share of what open archives may hold
                        reader = await trio.to_thread.run_sync(self._open_reader, node)
                except OSError as exc:
                    if exc.errno == errno.ESTALE:
                        await self._relist(node)
                    raise
                if checked is not None and not self._same_sources(reader, checked):
                    await trio.to_thread.run_sync(reader.close)
                    raise _fail(errno.EACCES)
            handle = OpenFile(node, inode, reader, uid=ctx.uid)
            try:
                cache = await self.reads.prepare(handle)
            except BaseException:
                # No handle holds the reader yet: closed here, or an open that failed now (its
                # archive renamed away before prepare's stat: ENOENT) kept its descriptor and
                # its open archive's share of the budget (_SharedArchives) for ever.
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(reader.close)
                raise
            if node.spooled and self.queue is not None:
                self.queue.opened(node.spooled)
            # Unverified archive content bypasses the page cache (see reads.py); verified archive
            # content is immutable per inode, so the kernel keeps it. Real files may change.
            return self._new_handle(handle, keep_cache=cache,
                                    direct_io=handle.feed is not None)  # fmt: skip

    async def _verified_first(self, node: Node, uid: int) -> None:
        """--verify-first: an original not verified yet is read whole and hashed (in this
        user's turn) before its open returns, EIO if it does not hash right or cannot be read
        now; opened after that, its reader checks every chunk or block against the digests the
        verification recorded. Without it a small read of an unverified original is served
        before any check (the hash of what is served, or the verification its handle queues,
        then refuses the file): wrong bytes from a damaged archive reach that read unflagged."""
        if not node.sha256 or node.backend is None or await self.integrity.verified(node):
            return
        if await self.integrity.verify_now(node, uid):
            return
        if node.key not in self.integrity.bad and await trio.to_thread.run_sync(
            self._not_as_listed, node
        ):
            # No verdict: the archive is not the file listed (a rename over it, or its ctime
            # moved by a link or a chmod): listed again, the kernel's retry opens what is there.
            await self._relist(node)
            raise _fail(errno.ESTALE)
        raise _fail(errno.EIO)

    def _not_as_listed(self, node: Node) -> bool:
        """Whether opening `node` now finds another file than the one listed (ESTALE)."""
        try:
            self._open_reader(node).close()
        except OSError as exc:
            return exc.errno == errno.ESTALE
        except Exception:  # damaged, store down: not a question of which file it is
            return False
        return False

    async def _describe_again(self, node: Node) -> None:
        """`node` was described while its archive file may have been mid-write (racy.RACY_NS):
        its archive is described again, and if that presents another entry under its name the
        open gets ESTALE, which the kernel retries with a fresh lookup (see `_relist`); a
        verdict on the old description goes with it. Else the description stands, and so does
        a failed verification of it."""
        await self._relist(node)
        if node.member:  # a package's member: its folders are listed from the tree read now
            now = await trio.to_thread.run_sync(self._member_now, node)
        else:
            now = self._listed_now(node)
        if now == node.entry:
            return
        self.integrity.bad.discard(node.key)
        if node.member:
            self.inodes.drop_archive_listings(node.real)
        raise _fail(errno.ESTALE)

    def _member_now(self, node: Node) -> Entry | None:
        try:
            return self.tree.tree_of(node).walk(node.member)
        except OSError:  # changed again since: the retry's lookup finds what is there
            return None

    def _listed_now(self, node: Node) -> Entry | None:
        """The entry the listing of `node`'s folder shows for its archive now."""
        found = self.inodes.folder_of(node.real.parent)
        if found is None:
            return node.entry  # not listed: nothing read again to compare with
        real = node.real_text
        for name in self.tree.presented_names({node.real.name}):
            kid = found[1].children.get(name)
            if kid is not None and kid.real_text == real and kid.backend is node.backend:
                return kid.entry
        # An archive presenting a name of another stem (rare; a racy one rarer): looked for
        # among all, not taken for gone (which would give its open a needless ESTALE). Only in
        # a folder where such names are shown: elsewhere a walk of a folder of a million names
        # held the event loop ~0.5 s for an archive that now simply fails to parse.
        if not self.tree.presents_other_names(node.real.parent):
            return None
        for kid in found[1].children.values():
            if kid.backend is node.backend and kid.real_text == real:
                return kid.entry
        return None

    async def _relist(self, node: Node) -> None:
        """The archive behind `node` is not the version listed (written in place, which no
        folder mtime tells; or swapped): its names are listed again, so the kernel's retry of
        an open that got ESTALE (a lookup with revalidation) finds what is there now. A view's
        file (an overlay's: a collection's table written anew since its view was built, which
        no folder mtime tells either) has its collection folder scanned again, which builds
        the view anew."""
        overlay = bool(getattr(node.backend, "overlay", False))
        folder = node.real if overlay else node.real.parent
        found = self.inodes.folder_of(folder)
        if found is None:
            return
        forget = getattr(self.tree, "forget_listing", None)  # a bucket's listings are kept
        if forget is not None:
            forget(folder)
        with contextlib.suppress(OSError, pyfuse3.FUSEError):
            async with self.inodes.locked(found[0]):
                if overlay:
                    await self._fresh(found[0], force=True)
                else:
                    names = self.tree.presented_names({node.real.name})
                    await self._show(found[0], sorted(names))

    def _new_handle(self, handle: OpenFile, **info: bool) -> pyfuse3.FileInfo:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        self.inodes.pin(handle.inode)
        return pyfuse3.FileInfo(fh=fh, **info)

    async def _may_read_through(
        self, node: Node, ctx: pyfuse3.RequestContext
    ) -> list[tuple[int, int]] | None:
        """A member read from files of its own elsewhere in SRC (an AcqStore view's tables and
        images; a folder archive's files, which keep modes of their own): EACCES unless the
        caller could read each there, by its real path. Returns their identities (st_dev,
        st_ino), for `_same_sources` to hold the opened reader to; None when there is nothing
        to check."""
        reads_for = getattr(node.backend, "reads_for", None)
        if ctx.uid == 0 or reads_for is None or node.entry is None:
            return None
        targets = reads_for(node.real, node.member, node.entry)
        if not targets:
            return None  # nothing beyond what the kernel checked (a zip), or open refuses it
        uid, gid, pid, real = ctx.uid, ctx.gid, ctx.pid, node.real

        def checked() -> list[tuple[int, int] | None]:
            # A target that is the archive itself (a folder archive read whole) is walked to
            # from its folder, whose search permission the kernel checked on the way in.
            return [
                readable_beneath(node.real.parent if t == real else real, t, uid, gid, pid)
                for t in targets
            ]

        # A walk of a folder of 100,000 files takes ~0.3 s of a thread: one user opening such
        # a folder archive from many threads held all of the daemon's, and every other user's
        # requests waited (a `cat` elsewhere: 23 s). Each caller's walks share a few threads.
        found = await trio.to_thread.run_sync(checked, limiter=self._checker(uid))
        idents = [ident for ident in found if ident is not None]
        if len(idents) != len(found):
            raise _fail(errno.EACCES)
        return idents

    @staticmethod
    def _same_sources(reader: RandomAccess, idents: list[tuple[int, int]]) -> bool:
        """Whether the reader opened what was checked (a folder on the way, or the file, may
        have been swapped between the check and the open by someone who may rename there).
        A reader that cannot say (a synthesized TIFF reads many files of an image folder)
        passes: see README, "Security model"."""
        source = getattr(reader, "source_ident", None)
        if source is None:
            opened = getattr(reader, "opened", None)  # a decant archive: (ino, size, mtime, ctime)
            if opened is None:
                return True
            return any(opened[0] == ino for _dev, ino in idents)
        return source in idents

    def _open_reader(self, node: Node) -> RandomAccess:
        if node.backend is None:
            # A spooled file lives in the daemon's private spool (0700, checked at start): no
            # link can be swapped in on the way, so it is opened from its own folder, not
            # walked to from SRC (rsync opens each file it copies once more, to chmod it).
            if node.spooled:
                return PlainFile(node.real)
            return PlainFile(node.real, self.tree.root, node.ino, node.uid)
        assert node.entry is not None
        reader = node.backend.open(node.real, node.member, node.entry)
        opened = getattr(reader, "opened", None)
        _path, _member, want = self._verified_as(node)
        if opened is not None and want is not None and opened != want:
            # Not the archive listed: replaced since, or swapped for a link by the folder's
            # owner (which must not make root decode someone else's archive for them).
            reader.close()
            raise OSError(errno.ESTALE, "the archive changed since it was listed", str(node.real))
        return reader

    @staticmethod
    def _verified_as(node: Node) -> tuple[Path, str, tuple[int, ...] | None]:
        """Whose verified state a node's is: (file, member, the version of it the node was
        listed for, None if it cannot say). An AcqStore view's member that is a decant
        archive's original is that archive's original (vfs.backends.acqstore.verifies_as)."""
        verifies_as = getattr(node.backend, "verifies_as", None)
        if verifies_as is not None and node.entry is not None:
            found = verifies_as(node.real, node.entry)
            if found is not None:
                return found[0], "", found[1]
        # An object's stamp is the identity its listing gave, carried by its path (stamp_of):
        # the node's own version by construction (a replaced object is listed as a new node),
        # and what its handles' GETs were pinned to. Its node's version is a stat made up from
        # it (an inode of key and ETag, no ctime) that no stamp equals: compared, every verdict
        # on a bucket archive was dropped as "replaced while it verified".
        local = len(node.version) == 4 and not isinstance(node.real, ObjectPath)
        return node.real, node.member, node.version if local else None

    def _is_verified(self, node: Node) -> bool:
        index = self.tree.index
        if index is None or not node.sha256:
            return False
        path, member, want = self._verified_as(node)
        stamp = stamp_of(path)
        if want is not None and (stamp[2], stamp[0], stamp[1], stamp[3]) != want:
            return False  # another file than the one listed: its own first read verifies it
        return index.is_verified(path, member, stamp, node.sha256)

    def _mark_verified(self, node: Node, seen: Mapping[str, int] | None = None) -> None:
        """`seen`: the chunk digests the verifying reads noted (else the archive is read again)."""
        index = self.tree.index
        if index is None or not node.sha256:
            return
        path, member, want = self._verified_as(node)
        stamp = stamp_of(path)
        if want is not None and (stamp[2], stamp[0], stamp[1], stamp[3]) != want:
            # The bytes that hashed right were the listed archive's, read through its open
            # descriptor; the path names another file now (renamed over it, rewritten): that
            # one is not verified by them, nor are digests read from it.
            log.info("%s: replaced while it verified; the new file is not marked verified", path)
            return
        index.mark_verified(path, member, stamp, node.sha256)
        backend = getattr(node.backend, "decant_backend", None) if path != node.real else None
        record = getattr(backend or node.backend, "chunk_digests", None)
        if record is None:
            return
        held = index.digests(path, stamp)
        if held is None:
            # From now on every chunk read from disk is checked against these before decoding
            # (an archive of more chunks than a map may hold has none: its CRC-32s stay).
            try:
                digests = seen if seen is not None else record(path, node.sha256)
            except IntegrityError:
                # A folder archive whose files, read again for the map, no longer reconstruct
                # what verified (one swapped since its plane was served from the cache): not
                # verified, so its next open hashes what it serves again.
                index.forget_verified(path, member)
                raise
            except (OSError, DecantError) as exc:  # replaced meanwhile (ESTALE), store down
                log.info("%s: chunk digests not recorded (%s)", path, exc)
                return
            if digests is not None:
                index.put_digests(path, stamp, digests)
        elif seen is not None and len(seen) > len(held):
            # A finer map of the same bytes (the reads of a scrub noted block entries that a
            # map recorded before them lacks): small reads then check just what they decode.
            index.put_digests(path, stamp, seen)

    def _refetch(self, node: Node) -> None:
        """A refused file's bytes kept from its store go (the tree's, the decoded pages), so
        that its next try reads it afresh. A worker thread's."""
        if self.tree.refetch(node) and self.cache is not None:
            self.cache.discard_source(str(node.real))

    def _forget_verified(self, node: Node) -> None:
        if self.tree.index is not None:
            path, member, _want = self._verified_as(node)
            self.tree.index.forget_verified(path, member)

    def _handle(self, fh: int) -> OpenFile:
        handle = self._handles.get(fh)
        if handle is None:
            raise _fail(errno.EBADF)
        return handle

    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]
        handle = self._handle(fh)
        with errno_boundary(f"read {handle.node.real_text} {handle.node.member}".rstrip()):
            return await self.reads.read(handle, off, size)

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        uid = self._handle_uid.pop(fh, None)
        if uid is not None:
            self._drop_handle(uid)
        if handle is None:
            return
        if self._is_status(handle.node):  # nothing to close: no thread hop, or a loop of
            self.inodes.unpin(handle.inode)  # opens outruns the releases (EMFILE at the cap)
            return
        with errno_boundary(f"release {handle.node.real_text}"):
            try:
                # The queue first, before any await: the handle is out of `_handles`, so a
                # rename run meanwhile (rsync renames as it closes) would move the file's open
                # count to the new name while this closed the old one: never published. The
                # write mark goes next; a publish waits for the settle time after this.
                if handle.node.spooled and self.queue is not None:
                    self.queue.closed(handle.node.spooled)
                if handle.fd >= 0 and self.writer is not None:
                    await self._quick(self.writer.writers.closed, handle.fd)
                spooled = handle.node.spooled and handle.feed is None
                if spooled and handle.readahead_done is None:
                    await self._quick(handle.reader.close)  # a plain file of the spool
                else:
                    await self.reads.close(handle)
            finally:
                self.inodes.unpin(handle.inode)

    # -- change notification ---------------------------------------------------------------

    async def on_changed(self, folders: set[Path]) -> None:
        for folder in folders:
            await self._rescan_path(folder)
        # A document deep inside a collection changed: rebuild the collection's view.
        roots = {r for r in self.tree.overlay_roots for f in folders if f == r or r in f.parents}
        for root in roots:
            self._overlay_changed(root)
            await self._rescan_path(root, force=True)

    async def on_names_changed(self, changed: dict[Path, set[str]]) -> None:
        """The watcher saw these names change in these folders: each listed folder takes them
        one by one (`_show`: a few lstats each), not by a rescan of the whole folder, so a
        deletion of n files costs O(n), not O(n) per watcher batch. Changes it never heard of
        by name still show: the folder's stamp is left as it was, and checked at its next use."""
        if self.integrity.bad:  # on the event loop: nothing to look for, nothing walked
            self.integrity.changed_inside(folder_archives(changed, self.tree.root))
        for path, names in changed.items():
            found = self.inodes.folder_of(path)
            if found is None:
                self._unlisted_changed(path, names)
                continue
            ino = found[0]
            with contextlib.suppress(OSError, pyfuse3.FUSEError):  # gone: the parent drops it
                ahead = await self._read_ahead(ino, self.tree.presented_names(names))
                async with self._released_after(ahead), self.inodes.locked(ino):
                    folder = self.inodes.folders.get(ino)
                    if folder is None:
                        continue
                    # Unchanged entries (a publish restores the folder's mtime; its queue
                    # shows the names itself): nothing to do, as a rescan would find.
                    stamp = await self._quick(self.tree.stamp_folder, path)
                    names = self.tree.presented_names(names)  # archives show other names
                    if stamp == folder.mtime_ns and not folder.absorbed:
                        # Only an archive written in place changed (its folder did not):
                        # listed as it was, it would give ESTALE until the folder changes.
                        names = await self._quick(_rewritten, folder, names)
                        if not names:
                            continue
                        # An archive shown raw may present another name now: both are shown.
                        names = self.tree.presented_names(names)
                    with self._described_behind(ino):  # new archives: lookups need not wait
                        await self._show(ino, sorted(names), ahead)
                    for name in names:  # the kernel's inodes see new sizes at getattr
                        node = folder.children.get(name)
                        known = self.inodes.known(node) if node is not None else None
                        if node is not None and known is not None:
                            self.inodes.replace(known, node)
        roots = {r for r in self.tree.overlay_roots for f in changed if f == r or r in f.parents}
        for root in roots:
            self._overlay_changed(root)
            await self._rescan_path(root, force=True)

    def _overlay_changed(self, root: Path) -> None:
        """A file inside an overlay's folder changed: what the overlay decoded from it goes."""
        for overlay in self.tree.overlays:
            forget = getattr(overlay, "forget", None)
            if forget is not None:
                forget(root)

    async def describe_racy_again(self) -> None:
        """The names of archives described while they may have been mid-write (racy.RACY_NS),
        once that moment has passed, are listed again in the folders the kernel holds: a
        description of a half-written file, or its raw file shown for a parse that failed, is
        replaced by what the file holds now (the kernel's entries of changed names dropped)."""
        for path, names in self.tree.take_racy_due().items():
            found = self.inodes.folder_of(path)
            if found is None:  # not listed: described afresh when it is
                self._unlisted_changed(path, names)
                continue
            shown = sorted(self.tree.presented_names(names))
            try:  # described again before the lock is taken, as the watcher's names are
                ahead = await self._read_ahead(found[0], set(shown))
                async with self._released_after(ahead), self.inodes.locked(found[0]):
                    await self._show(found[0], shown, ahead)
            except (OSError, pyfuse3.FUSEError, DecantError) as exc:  # gone, store down: as is
                log.debug("%s: not listed again: %s", path, exc)
            except Exception:  # one folder's bug must not end the task, and the daemon with it
                log.exception("%s: listing it again failed unexpectedly", path)

    async def _rescan_path(self, path: Path, force: bool = False) -> None:
        found = self.inodes.folder_of(path)
        if found is not None:
            with contextlib.suppress(OSError, pyfuse3.FUSEError):  # gone: the parent drops it
                await self.rescan(found[0], force)
            return
        # Held, its listing let go: which names changed is unknown, so the kernel's entries of
        # its files are dropped (looked up afresh; a name it remembers missing goes within
        # NEGATIVE_TIMEOUT). Not its own: a process working in it would lose its path.
        ino = self.inodes.held_unlisted(path)
        if ino is None:
            return
        with contextlib.suppress(OSError):  # gone: the parent drops it
            stamp = await self._quick(self.tree.stamp_folder, path)
            if force or self.inodes.stamp_let_go(ino, stamp):
                for parent, name in self.inodes.file_entries_in(path):
                    self._invalidate(parent, name)

    def _unlisted_changed(self, path: Path, names: set[str]) -> None:
        """Names changed in a folder the kernel holds whose listing was let go
        (`InodeTable.keep_listing`): the kernel may still hold entries of them (a name it was
        told is missing, too), which no listing's rescan will drop; so they are dropped now,
        and looked up afresh (the listing read again) when next asked for."""
        ino = self.inodes.held_unlisted(path)
        if ino is None:
            return  # not held: the kernel holds no entry of it
        for name in self.tree.presented_names(names):
            self._invalidate(ino, name)

    async def published(self, relpaths: list[str]) -> None:
        """The pack queue published (or withdrew, or found) these files: each name is looked up
        afresh in its folder's listing, one entry each, not by rescanning the folder."""
        by_folder: dict[Path, set[str]] = {}
        held: dict[Path, int | None] = {}
        for relpath in relpaths:
            path = self.tree.root / relpath
            # A folder the kernel does not hold is read afresh when asked for; but it may be
            # new in SRC (an inbox drop publishes `run1/img.tif` into a `run1/` made for it):
            # then its name is shown in the nearest folder the kernel does hold.
            while path != self.tree.root:
                if path.parent not in held:
                    held[path.parent] = self.inodes.known(Node(True, 0, 0, 0, 0, 0, path.parent))
                if held[path.parent] is not None:
                    names = by_folder.setdefault(path.parent, set())
                    names.add(path.name)
                    if path.name.endswith(_ARCHIVE_SUFFIXES):
                        # A file written in as `x.tif.zarr.zip` (an archive copied back) is
                        # presented as `x.tif` once in SRC: looked up under its own name
                        # only, it left the listing and `x.tif` never came, until a remount.
                        names |= self.tree.presented_names({path.name})
                    break
                path = path.parent
        for folder, names in by_folder.items():
            # By the folder's inode, listed or not: a first listing being read holds the lock
            # and must be waited for, or it could miss a file that left the spool meanwhile.
            ino = held[folder]
            if ino is None:
                continue
            with contextlib.suppress(OSError, pyfuse3.FUSEError):  # gone: the parent drops it
                ahead = await self._read_ahead(ino, names)  # before the lock, as the watcher's
                async with self._released_after(ahead), self.inodes.locked(ino):
                    if ino in self.inodes.folders:
                        await self._show(ino, sorted(names), ahead)
                    else:
                        self._unlisted_changed(folder, names)

    async def _folder_changed(self, inode: int) -> None:
        """An entry of this real folder was made or removed in SRC: its mtime moved, and the
        kernel (which drops the folder's attributes after such a call) must see the new one,
        or `rsync -a` would not set the folder's time again once it is done inside."""
        node = self._node(inode)
        if self.writer is not None and node.backend is None and node.is_dir:
            self.inodes.replace(inode, await self._quick(self.writer.refresh, node))

    async def _read_ahead(self, inode: int, names: set[str]) -> _Ahead | None:
        """The watcher's names read before the folder's lock is taken: `_show` takes them if
        nobody held the lock since. Their reading describes the archives new among them
        (seconds each for a big one), and under the lock every change made through the mount
        there waited for it, while the kernel holds the folder for that change and every
        user's lookups wait behind it (red team 95 F2). A change in SRC after this read is
        told by the watcher again."""
        released = self.inodes.released(inode)
        node = self.inodes.get(inode)
        folder = self.inodes.folders.get(inode)
        if node is None or folder is None or node.backend is not None:
            return None
        mark, behind = folder.note(), False
        try:
            with self._described_behind(inode):
                known = await self._entries(node, sorted(names))
                if known is None:
                    known = await self._entries_with_presenters(node, folder, sorted(names))
                    behind = True
        except OSError:
            known = None  # told under the lock, by the read there
        if known is None:
            folder.unnote()
            return None
        return _Ahead(folder, released, mark, known, behind)

    @contextlib.asynccontextmanager
    async def _released_after(self, ahead: _Ahead | None) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if ahead is not None:
                ahead.release()

    async def _show(self, inode: int, names: list[str], ahead: _Ahead | None = None) -> None:
        """Update these names of a listed folder from SRC and the spool (the caller holds the
        folder's lock). Where an archive presents a name other than its own, the names are
        read with the archives the listing gave them to, and the whole listing is read again
        behind (`_relist_soon`), before the lock is taken: not under it, where every change
        through the mount waited for it while the kernel holds the folder for that change,
        and every user's lookups wait behind it (red team 95 F2). `ahead`: what `_read_ahead`
        read before the lock was taken."""
        folder = self.inodes.folders.get(inode)
        node = self._node(inode)
        if folder is None or node.backend is not None:
            return
        fresh: Mapping[str, Node | None] | None = None
        behind = False
        changed = ahead.usable(folder, self.inodes.released(inode)) if ahead else None
        if ahead is not None and changed is not None and all(n in ahead.known for n in names):
            # Names changed under the lock since: the listing's entries are newer.
            fresh = {name: ahead.known[name] for name in names if name not in changed}
            behind = ahead.behind
        if fresh is None:
            fresh = await self._entries(node, names)
        if fresh is None:
            with contextlib.suppress(OSError):  # the full read tells how (ESTALE, ENOENT)
                fresh = await self._entries_with_presenters(node, folder, names)
            behind = True
        if fresh is None:  # an overlay's folder (or gone): told only by a full read
            await self._fresh(inode, force=True)
            return
        self._take(inode, folder, fresh)
        if behind:
            self._relist_soon(inode, force=True)

    async def _entries_with_presenters(
        self, node: Node, folder: Folder, names: list[str]
    ) -> dict[str, Node | None] | None:
        """`names` of the listed folder read by a few lstats, with the archives the listing
        gave them (or names related to them) to (`_presenters`), through the folder's
        descriptor checked to be the one listed; None for an overlay's folder."""
        look = functools.partial(self.tree.entries_of_listed, node.real, names,
                                 (node.ino, node.uid),
                                 also=self._presenters(node, folder, names))  # fmt: skip
        fresh = await self._lstats(look, self._lister(node))
        return None if fresh is None else fresh[0]

    async def _for_change(self, inode: int, names: list[str]) -> Folder:
        """The listing a change made through the mount works on (the caller holds the folder's
        lock): `_fresh`'s, but where SRC changed since it was read, only `names` are read
        again (a few lstats, through the folder's descriptor checked to be the folder listed,
        with the archives the listing gave them to: `_entries_with_presenters`) and the rest
        in the background. The kernel holds the folder for the change, and every user's
        lookups there wait for it: a `touch` that read the whole listing, which describes
        every archive new in the folder, held them 32 s (red team 95 F2)."""
        folder = self.inodes.folders.get(inode)
        node = self._node(inode)
        if (folder is None or node.backend is not None or self.nursery is None
                or time.monotonic() - folder.checked < RESCAN_INTERVAL):  # fmt: skip
            return await self._fresh(inode, max_age=RESCAN_INTERVAL)
        mtime = await trio.to_thread.run_sync(self.tree.stamp_folder, node.real)
        if mtime == folder.mtime_ns:  # unchanged, as `_fresh` finds it
            folder.checked = time.monotonic()
            return folder
        fresh = await self._entries_with_presenters(node, folder, names)
        if fresh is None:  # an overlay's folder: told only by a full read
            return await self._fresh(inode, max_age=RESCAN_INTERVAL)
        self._take(inode, folder, fresh)
        self._relist_soon(inode)
        return folder

    def _take(self, inode: int, folder: Folder, fresh: Mapping[str, Node | None]) -> None:
        """These entries into the listing; the kernel's entries of changed names dropped."""
        for name, new in fresh.items():
            old = folder.children.get(name)
            if new is None:
                folder.drop(name)
            else:
                folder.put(name, new)
            if old is None or new is None:
                if old is None and new is None:
                    continue
            elif (new.key == old.key and new.ino == old.ino) or self._carry_published(old, new):
                continue  # another entry at the name (ino) is dropped from the kernel's cache
            self._invalidate(inode, name)

    def _carry_published(self, old: Node | None, new: Node | None) -> bool:
        """A spooled file that became a published one keeps its inode: the same bytes, so a
        reader that looked the name up before the switch opens the published file, not a
        spooled one just unlinked (and 20,000 publishes queue no kernel invalidations)."""
        if old is None or new is None or not old.spooled or new.spooled or new.is_dir:
            return False
        ino = self.inodes.known(old)
        if ino is None:
            return False
        self.inodes.replace(ino, new)
        return True

    # -- the write side (a writable mount) -------------------------------------------------

    def _writer(self) -> WriteSide:
        if self.writer is None:
            raise _fail(errno.EROFS)
        return self.writer

    def _touch(self, node: Node) -> None:
        if node.spooled and self.queue is not None:
            self.queue.touch(node.spooled)

    async def _on_spooled(
        self, inode: int, node: Node, fn: Callable[..., Any], *args: Any
    ) -> tuple[Node, Any]:
        """fn(node, *args) for a spooled node. Its file may be published and its spooled name
        unlinked while the call waits in a worker thread: then it runs once more on what the
        inode stands for now (the published file). Returns the node used and fn's result; the
        caller puts a result back into the inode table only if the inode still stands for the
        node it started with."""
        try:
            return node, await self._quick(fn, node, *args)
        except FileNotFoundError:
            current = self._node(inode)
            if current is node:
                raise
            return current, await self._quick(fn, current, *args)

    def _check_name(self, name: bytes, new: bool = False) -> str:
        """The name as text, or a refusal; `new`: a name being made (create, mkdir, the target
        of a rename), held to what a bucket's keys can be too."""
        if len(name) > NAME_MAX:
            raise _fail(errno.ENAMETOOLONG)
        if name == STATUS_NAME.encode():
            raise _fail(errno.EACCES)
        if name.startswith(_TEMP_PREFIX):  # hidden, and deleted at start as a crashed pack's
            raise _fail(errno.EINVAL)
        if b"\\" in name and isinstance(self.tree.root, ObjectPath):
            # Object stores (SeaweedFS among them) take a backslash in a key for a "/": the
            # file would be published into another folder, under another name.
            raise _fail(errno.EINVAL)
        text = os.fsdecode(name)
        if new and isinstance(self.tree.root, ObjectPath) and _not_a_key(text):
            # obstore takes no key with a control character, nor one that is not UTF-8: such a
            # file was spooled, then failed at every retry for good while cp and rsync had
            # reported success.
            raise _fail(errno.EINVAL)
        return text

    @staticmethod
    def _safe_mode(mode: int, ctx: pyfuse3.RequestContext) -> int:
        """setuid/setgid bits are never taken from a caller other than root."""
        return mode & ~PRIVILEGE_BITS if ctx.uid != 0 else mode

    async def _open_for_write(
        self, inode: int, node: Node, flags: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        writer = self._writer()
        seen = node
        if node.spooled:
            node, (new, fd) = await self._on_spooled(inode, node, writer.open_for_write, flags)
        else:
            await self._may_republish(node, ctx)
            heavy = bool(flags & os.O_TRUNC) and node.size > QUICK_FREE
            async with self._stale_relisted(node):
                new, fd = await self._adopting(node, heavy, writer.open_for_write, node, flags)
        current = self.inodes.get(inode)
        if current is seen or current is node:
            self.inodes.replace(inode, new)
        self._touch(new)
        if self.queue is not None:
            self.queue.opened(new.spooled)
        return self._new_handle(OpenFile(new, inode, SpoolFile(fd), fd=fd, uid=ctx.uid))

    @contextlib.asynccontextmanager
    async def _stale_relisted(self, node: Node) -> AsyncIterator[None]:
        """ESTALE from the write side (the file at `node`'s name is not the one listed, whose
        attributes the kernel checked the caller against: Node.ino): `node`'s name is listed
        again, so the kernel's retry (a lookup with revalidation) checks the file there now."""
        try:
            yield
        except OSError as exc:
            if exc.errno == errno.ESTALE:
                await self._relist(node)
            raise

    async def _may_republish(self, node: Node, ctx: pyfuse3.RequestContext) -> None:
        """EACCES unless the caller may change the entries of the published file's folder: a
        write moves the file into the spool and publishes it anew (see vfs.mount.access)."""
        if ctx.uid == 0 or isinstance(node.real, ObjectPath):  # a bucket's "folders": no modes
            return
        folder = Path(node.real).parent
        if not await trio.to_thread.run_sync(may_change_entries, folder, ctx.uid, ctx.gid, ctx.pid):
            raise _fail(errno.EACCES)

    async def _adopting(self, node: Node, heavy: bool, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) moves the real file behind `node` into the spool (a write or truncation of
        a published file): under its folder's lock, and the listing then holds the spooled
        node (same inode), so lookup and readdir never hand out the real file that is gone."""
        found = self.inodes.folder_of(node.real.parent)
        if found is None:
            return await self._io(heavy, fn, *args)
        ino, _folder = found
        async with self.inodes.locked(ino):
            result = await self._io(heavy, fn, *args)
            folder = self.inodes.folders.get(ino)
            new = result[0] if isinstance(result, tuple) else result
            name = node.real.name
            listed = folder.children.get(name) if folder is not None else None
            if folder is not None and listed is not None and listed.key == node.key:
                folder.put(name, new)
            return result

    async def _behind(self, parent: Node, name: str, node: Node) -> Node | None:
        """What SRC itself presents under `name` in `parent` that the spooled `node` hides (the
        published file, or archive, that it replaces), or None. The caller holds the folder's
        lock."""
        if not node.spooled or self.queue is None or is_temp_name(name):
            return None  # an rsync temp name is never published: nothing of it is in SRC
        hidden = self.queue.publishing
        hidden.hide([node.spooled])  # the tree skips spooled names being hidden
        try:
            fresh = await self._entries(parent, [name])
            listed = self.inodes.folder_of(parent.real) if fresh is None else None
            if listed is not None:  # an archive presents another name: with the listing's
                # presenters, not a read of the whole folder under its lock (each unlink of
                # a spooled file in such a folder read it, describing every archive new in
                # it: the victim's creates and lookups waited 37 s, red team 101 F3)
                with contextlib.suppress(OSError):
                    fresh = await self._entries_with_presenters(parent, listed[1], [name])
            if fresh is None:  # a folder the tree cannot tell name by name (an overlay's)
                scanned = await trio.to_thread.run_sync(self.tree.scan, parent.real,
                                                        limiter=self._lister(parent))  # fmt: skip
                found = scanned.get(name)
            else:
                found = fresh[name]
        finally:
            hidden.unhide([node.spooled])
        return found if found is not None and not found.spooled else None

    async def _entries(self, folder: Node, names: list[str]) -> dict[str, Node | None] | None:
        """`tree.entries`, by `_lstats`."""
        look = functools.partial(self.tree.entries, folder.real, names)
        return await self._lstats(look, self._lister(folder))  # type: ignore[no-any-return]

    async def _lstats(self, look: Callable[..., Any], limiter: trio.CapacityLimiter) -> Any:
        """`look(True)`, a few lstats, on the event loop (QuickCalls); where an archive is among
        them (NotQuick), `look()` in a worker thread of `limiter`: describing one takes
        seconds for a big one not in the index yet."""
        try:
            return await self._quick(look, True)
        except NotQuick:
            return await trio.to_thread.run_sync(look, limiter=limiter)

    async def _io(self, heavy: bool, fn: Callable[..., Any], *args: Any) -> Any:
        """A spool call that may take long whatever the disk (freeing a large file's blocks,
        deleting a folder archive) goes to a worker thread; others are QuickCalls."""
        if heavy:
            return await trio.to_thread.run_sync(fn, *args)
        return await self._quick(fn, *args)

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._reserve_handle(ctx.uid)
        try:
            info, attrs = await self._create(parent_inode, name, mode, flags, ctx)
        except BaseException:
            self._drop_handle(ctx.uid)
            raise
        self._handle_uid[info.fh] = ctx.uid
        return info, attrs

    async def _create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        with errno_boundary(f"create {name!r}"):
            writer = self._writer()
            text = self._check_name(name, new=True)
            async with self.inodes.locked(parent_inode):
                folder = await self._for_change(parent_inode, [text])
                parent = self._node(parent_inode)
                _may_add_to(parent, ctx)
                node, fd = await self._quick(
                    writer.create, parent, text, self._safe_mode(mode, ctx), ctx.uid, ctx.gid
                )
                folder.put(text, node)
                ino = self.inodes.hand_out(node, (parent_inode, text))
            self._touch(node)
            if self.queue is not None:
                self.queue.opened(node.spooled)
            info = self._new_handle(OpenFile(node, ino, SpoolFile(fd), fd=fd, uid=ctx.uid))
            return info, self._attrs(ino, node)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._handle(fh)
        if handle.fd < 0:
            raise _fail(errno.EBADF)
        with errno_boundary(f"write {handle.node.spooled}"):
            writer = self._writer()
            args = (writer.write, handle.fd, buf, off, handle.node.spooled)
            if len(buf) <= QUICK_WRITE:
                written = await self._quick(*args)
            else:
                written = await trio.to_thread.run_sync(*args)
            self._touch(handle.node)
            return written

    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handles.get(fh)
        if handle is not None and handle.fd >= 0:
            with errno_boundary(f"fsync {handle.node.spooled}"):
                await trio.to_thread.run_sync(os.fsync, handle.fd)

    async def flush(self, fh: int) -> None:
        return None  # writes go straight to the spooled file

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        with errno_boundary(f"setattr {inode}"):
            writer = self._writer()
            node = self._node(inode)
            if self._is_status(node):
                raise _fail(errno.EPERM)
            attrs = Attrs(
                size=attr.st_size if fields.update_size else None,
                mode=self._safe_mode(attr.st_mode, ctx) if fields.update_mode else None,
                uid=attr.st_uid if fields.update_uid else None,
                gid=attr.st_gid if fields.update_gid else None,
                atime_ns=attr.st_atime_ns if fields.update_atime else None,
                mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            )
            self._check_owner_change(node, attrs, ctx)
            seen = node
            if node.spooled:
                node, new = await self._on_spooled(inode, node, writer.setattr, attrs)
            else:
                async with self._stale_relisted(node):
                    if attrs.size is not None and not node.is_dir:  # moves it into the spool
                        await self._may_republish(node, ctx)
                        heavy = node.size > QUICK_FREE
                        new = await self._adopting(node, heavy, writer.setattr, node, attrs)
                    else:
                        new = await self._quick(writer.setattr, node, attrs)
            if self.inodes.get(inode) is seen:
                self.inodes.replace(inode, new)
            self._touch(new)
            return self._attrs(inode, new)

    @staticmethod
    def _check_owner_change(node: Node, attrs: Attrs, ctx: pyfuse3.RequestContext) -> None:
        """What chmod/chown allow a caller on a local filesystem, checked again here: the kernel
        does it too (default_permissions), and the daemon acting as root must never do more."""
        if ctx.uid == 0:
            return
        changes_owner = attrs.uid is not None and attrs.uid != node.uid
        if changes_owner:
            raise _fail(errno.EPERM)
        if (attrs.mode is not None or attrs.gid is not None) and ctx.uid != node.uid:
            raise _fail(errno.EPERM)
        if attrs.gid is not None and attrs.gid != node.gid:
            groups = set(pyfuse3.get_sup_groups(ctx.pid)) | {ctx.gid}
            if attrs.gid not in groups:
                raise _fail(errno.EPERM)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        with errno_boundary(f"rename {name_old!r} -> {name_new!r}"):
            writer = self._writer()
            if flags & pyfuse3.RENAME_EXCHANGE:
                raise _fail(errno.EINVAL)
            old, new = self._check_name(name_old), self._check_name(name_new, new=True)
            async with self.inodes.locked(parent_inode_old, parent_inode_new):
                src_folder = await self._for_change(parent_inode_old, [old])
                dst_folder = await self._for_change(parent_inode_new, [new])
                _may_add_to(self._node(parent_inode_old), ctx)
                _may_add_to(self._node(parent_inode_new), ctx)
                node = src_folder.children.get(old)
                if node is None:
                    raise _fail(errno.ENOENT)
                if flags & pyfuse3.RENAME_NOREPLACE and new in dst_folder.children:
                    raise _fail(errno.EEXIST)
                old_real = node.real
                # Asked before the write side moves a real node in place (its key changes).
                ino = self.inodes.known(node)
                src_parent, dst_parent = self._node(parent_inode_old), self._node(parent_inode_new)
                behind = await self._behind(src_parent, old, node)
                # What the kernel checked the caller against under the new name (and what
                # that hides): nothing else of SRC may be replaced (WriteSide._check_free).
                shown = dst_folder.children.get(new)
                over = () if shown is None else (shown, await self._behind(dst_parent, new, shown))
                heavy = _heavy(behind) or node.backend is not None  # a bucket's: copy, delete
                if not node.spooled and not node.is_dir:  # an archive it replaces is deleted
                    heavy = heavy or any(n is not None and n.backend is not None for n in over)
                moved = await self._io(
                    heavy, writer.rename, src_parent, old, node, dst_parent, new, behind, over
                )
                self._moved(src_folder, old, dst_folder, new, ino, node, moved, old_real)
                if ino is not None:
                    self.inodes.renamed(ino, (parent_inode_new, new))
                if self.queue is not None and node.spooled:
                    self.queue.renamed(node.spooled, moved.spooled)
                elif self.queue is not None and node.is_dir:  # spooled files inside move along
                    self.queue.renamed_folder(self.tree.relpath(old_real),
                                              self.tree.relpath(moved.real))  # fmt: skip
                elif self.queue is not None:  # a spooled file of either name went
                    self.queue.removed(self.tree.relpath(moved.real))
                    self.queue.removed(self.tree.relpath(old_real))
                if node.spooled:
                    if behind is not None:  # gone: whatever else presents the name shows
                        await self._show(parent_inode_old, [old])
                        await self._folder_changed(parent_inode_old)
                else:  # what else presents either name shows (the whole folder where it
                    # cannot be told name by name: `_show`); not a read of the whole listing,
                    # which the kernel waits for holding both folders (red team 95 F2)
                    await self._show(parent_inode_old,
                                     sorted(self.tree.presented_names({old})))  # fmt: skip
                    await self._show(parent_inode_new,
                                     sorted(self.tree.presented_names({new})))  # fmt: skip
                    for changed in {parent_inode_old, parent_inode_new}:
                        await self._folder_changed(changed)

    def _moved(self, src: Folder, old: str, dst: Folder, new: str, ino: int | None, node: Node,
               moved: Node, old_real: Path) -> None:  # fmt: skip
        src.drop(old)
        dst.put(new, moved)
        if node.is_dir and moved.real != old_real:
            self.inodes.rekey_below(old_real, moved.real)
            self._rekey_handles(old_real, moved.real)
        if ino is not None:
            self.inodes.replace(ino, moved)
            self.inodes.drop_listing(ino)  # a moved folder is listed afresh
            for handle in self._handles.values():
                if handle.inode == ino:  # its writes and release (often after the rename)
                    handle.node = moved  # must reach the pack queue under the new name

    def _rekey_handles(self, old: Path, new: Path) -> None:
        """Handles of files spooled below a moved folder take their moved nodes: the pack
        queue moved their open counts to the new relpaths (`renamed_folder`), and their
        writes and release must reach it under those, or the file stays open to the queue
        (never published) and its count under the old name closes a file made there since."""
        old_rel, new_rel = self.tree.relpath(old) + "/", self.tree.relpath(new) + "/"
        for handle in self._handles.values():
            spooled = handle.node.spooled
            if not spooled.startswith(old_rel):
                continue
            current = self.inodes.get(handle.inode)
            if current is not None and current.spooled == new_rel + spooled[len(old_rel) :]:
                handle.node = current

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        with errno_boundary(f"unlink {name!r}"):
            writer = self._writer()
            text = self._check_name(name)
            async with self.inodes.locked(parent_inode):
                folder = await self._for_change(parent_inode, [text])
                node = _listed(folder, text)
                parent = self._node(parent_inode)
                behind = await self._behind(parent, text, node)
                heavy = _heavy(node) or _heavy(behind)
                if node.spooled and not heavy:  # its listed size may be from its create
                    with contextlib.suppress(OSError):
                        heavy = (await self._quick(os.stat, node.real)).st_size > QUICK_FREE
                # A real file's unlink changes its folder's stamp; when nothing else changed
                # it since the listing was read, the listing takes the new stamp, or the next
                # use would rescan the whole folder (once a second, per folder being emptied).
                # Watched only: a change by others between the two stamps is then reported by
                # name (`on_names_changed`, which `absorbed` tells not to trust the stamp).
                absorb = (
                    self.watches(parent.real)
                    and not node.spooled
                    and folder.mtime_ns == (await self._quick(self.tree.stamp_folder, parent.real))
                )
                await self._io(heavy, writer.unlink, parent, text, node, behind)
                if self.queue is not None:
                    # A spooled file of a real file's name (being switched to it) went too.
                    self.queue.removed(node.spooled or self.tree.relpath(node.real))
                folder.drop(text)
                if node.spooled and behind is None:
                    return
                # Whatever else presents the name shows: that name's related entries are
                # looked at, not the whole folder (a rescan per unlink made deleting a folder
                # of n files cost n^2 lstats).
                await self._show(parent_inode, [text])
                if absorb and self.inodes.folders.get(parent_inode) is folder:
                    with contextlib.suppress(OSError):
                        folder.mtime_ns = await self._quick(self.tree.stamp_folder, parent.real)
                        folder.absorbed = True
                await self._folder_changed(parent_inode)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        with errno_boundary(f"mkdir {name!r}"):
            writer = self._writer()
            text = self._check_name(name, new=True)
            async with self.inodes.locked(parent_inode):
                folder = await self._for_change(parent_inode, [text])
                if text in folder.children:
                    raise _fail(errno.EEXIST)
                _may_add_to(self._node(parent_inode), ctx)
                node = await self._quick(
                    writer.mkdir, self._node(parent_inode), text, self._safe_mode(mode, ctx),
                    ctx.uid, ctx.gid,
                )  # fmt: skip
                folder.put(text, node)
                ino = self.inodes.hand_out(node, (parent_inode, text))
                await self._folder_changed(parent_inode)
            return self._attrs(ino, node)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        with errno_boundary(f"rmdir {name!r}"):
            writer = self._writer()
            text = self._check_name(name)
            async with self.inodes.locked(parent_inode):
                folder = await self._for_change(parent_inode, [text])
                node = _listed(folder, text)
                await self._quick(writer.rmdir, self._node(parent_inode), text, node)
                folder.drop(text)
                ino = self.inodes.known(node)
                if ino is not None:
                    self.inodes.drop_listing(ino)
                await self._folder_changed(parent_inode)


def _told(node: Node | None) -> tuple[Any, int] | None:
    """What the kernel was told of a name: nothing, or an entry (its key and SRC inode)."""
    return None if node is None else (node.key, node.ino)


def _presenters_of(folder: Node, listed: Mapping[str, Node | None]) -> list[str]:
    """The real names of the archives the listing gave these names to that are not named
    after them (`batch.zarr.zip` presenting `scan.tif`)."""
    out = []
    for name, node in listed.items():
        if node is None or node.backend is None or node.spooled:
            continue
        real = node.real
        if not isinstance(real, Path) or real.parent != folder.real:
            continue
        if name not in (real.name, *(real.name[: -len(s)] for s in _ARCHIVE_SUFFIXES
                                     if real.name.endswith(s))):  # fmt: skip
            out.append(real.name)
    return out


def _not_a_key(name: str) -> bool:
    """Whether `name` can be no part of an object key: a control character, or not UTF-8."""
    if key_problem(name) is not None:
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # the surrogates os.fsdecode made of bytes that are not UTF-8
        return True
    return False
