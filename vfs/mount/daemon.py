"""Wiring one mount: backends, cache, index, the pyfuse3 session, the SRC watcher, signals."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import shutil
import signal
import sqlite3
import stat
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from vfs import threadbuffers
from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.decant.limits import SEGMENT_OVERHEAD, SEGMENTS_OVERHEAD_FREE
from vfs.errors import DecantError
from vfs.ingest.queue import PackQueue
from vfs.ingest.space import SpaceGuard
from vfs.ingest.spool import Spool
from vfs.ingest.writeside import WriteSide
from vfs.mount import hashfeed
from vfs.mount.config import SPOOL_NAME, MountConfig
from vfs.mount.index import DescriptionIndex, stamp_of
from vfs.mount.inodes import ROOT_INODE
from vfs.mount.metrics import METRICS_INTERVAL, prometheus, write_atomically
from vfs.mount.ops import DecantOperations
from vfs.mount.scrub import scrub_forever
from vfs.mount.stopping import StopWatch, mounted_device
from vfs.mount.tree import SourceTree
from vfs.mount.watch import watch_source
from vfs.owned import own_folder, swappable_by_others
from vfs.stores import local
from vfs.threads import start_block_helper
from vfs.walk import MAX_WALK_DEPTH, walk

log = logging.getLogger("decant-mount")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# A benchmark and diagnostic switch, not an option: with it set, reads of verified decant
# archives are not checked against their recorded chunk digests (the zip CRC-32 checks whole
# entries instead, and partial reads go by range, as for an archive never verified), so
# `tools/bench.py digests` can measure what the checks cost. "crc-too": not the CRC-32 either,
# for the cost of checking anything at all.
NO_CHUNK_DIGESTS = "DECANT_NO_CHUNK_DIGESTS"
# Diagnosis of memory kept (tools/stress.py --diagnose): with DECANT_DIAGNOSE=DIR, on each
# SIGUSR2 the daemon writes Python's allocator statistics (pymalloc arenas and pools in use) to
# DIR/mallocstats-N.txt; with DECANT_TRACEMALLOC=1 too, it traces allocations (slower) and
# writes a tracemalloc snapshot to DIR/snapshot-N.pickle, for stress to diff between rounds.
DIAGNOSE = "DECANT_DIAGNOSE"
TRACEMALLOC = "DECANT_TRACEMALLOC"
# An archive stays open this long after its last handle closed, for the next open of it
# (vfs.backends.idle): a reopen then costs a stat (a bucket's: one HEAD), not a parse.
LINGER_SECONDS = 5.0
# How long the start may spend aborting multipart uploads a killed run left (vfs.stores.s3uploads).
ABORT_WITHIN = 10.0
RACY_POLL = 0.5  # seconds between looks for archives described mid-write whose moment passed


def _c4gh_backend(config: MountConfig, cache: PageCache) -> Any:
    """The GDI package backend when keys were given (None otherwise, or without crypt4gh)."""
    try:
        from vfs.backends.c4gh import backend_from_args
    except ImportError:
        return None
    return backend_from_args(config.backend_args, cache)


def build_tree(config: MountConfig, cache: PageCache) -> SourceTree:
    tree = (
        build_bucket_tree(config, cache)
        if config.bucket is not None
        else _local_tree(config, cache)
    )
    tree.trees.budget = config.described_entries  # archive trees kept, across all archives
    return tree


def _local_tree(config: MountConfig, cache: PageCache) -> SourceTree:
    decant = DecantBackend(cache, linger=LINGER_SECONDS)
    backends: list[Any] = [decant]
    c4gh = _c4gh_backend(config, cache)
    if c4gh is not None:
        backends.append(c4gh)
    overlays: list[Any] = []
    try:
        from vfs.backends.acqstore import AcqStoreBackend
    except ImportError:
        pass
    else:
        overlays.append(AcqStoreBackend(cache, decant))
    index = open_index(config)
    if index is not None:
        known = index
        switch = os.environ.get(NO_CHUNK_DIGESTS, "")
        if switch:
            log.warning("%s=%s: chunk digests are recorded but not checked%s (benchmarks and "
                        "diagnosis only)", NO_CHUNK_DIGESTS, switch,
                        ", nor zip CRC-32s" if switch == "crc-too" else "")  # fmt: skip
            if switch == "crc-too":
                from vfs.decant.store import ZipArchiveStore

                ZipArchiveStore.verify_crc = False
        else:
            decant.digests = lambda path: known.digests(path, stamp_of(path))
    tree = SourceTree(config.src, backends, overlays, index, hidden=[SPOOL_NAME])
    tree.excluded = {config.mnt}
    return tree


def open_index(config: MountConfig) -> DescriptionIndex | None:
    """The persistent index, or None: with --no-index, and when SQLite cannot open it (its
    filesystem full, locked past the wait, failing). The mount then starts as with --no-index,
    saying why: a user who filled a shared filesystem held every restart off (red team 78)."""
    if not config.use_index:
        return None
    folder = config.index_dir or Path(os.path.expanduser("~/.cache/decant-mount"))
    try:
        return open_index_at(folder)
    except sqlite3.OperationalError as exc:
        why = str(exc)
        with contextlib.suppress(OSError):
            free = shutil.disk_usage(folder).free
            if free < FULL_BELOW:
                why = f"its filesystem is full ({free:,} bytes free; SQLite: {exc})"
        log.warning("index %s: %s; started without a persistent index (as --no-index): "
                    "archives are described afresh and verified again after a restart",
                    folder / "index.sqlite", why)  # fmt: skip
        return None


FULL_BELOW = 1 << 20  # free bytes under which an index that cannot be written is a full disk


def build_bucket_tree(config: MountConfig, cache: PageCache) -> SourceTree:
    """SRC in a bucket: the formats bound to its folder; one LIST first, so wrong credentials
    or an unreachable endpoint fail here, before anything is mounted (StoreError)."""
    from vfs.backends.objects import BoundBackend
    from vfs.mount.buckettree import BucketTree
    from vfs.stores.base import ObjectPath
    from vfs.stores.s3 import S3Folder, S3Options

    b = config.bucket
    assert b is not None
    options = S3Options(endpoint=b.endpoint, region=b.region, timeout=b.timeout,
                        retries=b.retries, retry_timeout=2 * b.timeout,
                        profile=b.profile, disk_cache=b.disk_cache,
                        disk_cache_size=b.disk_cache_size)  # fmt: skip
    folder = S3Folder(b.url, options, budget=cache)  # read-ahead counts against the cache
    folder.check()
    root = ObjectPath.of_url(folder.name)
    index = open_index(config)
    decant = DecantBackend(cache, linger=LINGER_SECONDS)
    if index is not None:
        known = index
        decant.digests = lambda path: known.digests(path, stamp_of(path))
    tree: BucketTree

    def key_of(path: Path) -> str:
        return tree.key_of(path)

    backends: list[Any] = [BoundBackend(decant, folder, key_of, (".zarr.zip",), (".zarr",))]
    c4gh = _c4gh_backend(config, cache)
    if c4gh is not None:
        from vfs.backends.c4gh import SUFFIX

        backends.append(BoundBackend(c4gh, folder, key_of, (SUFFIX,)))
    tree = BucketTree(folder, root, backends, index, b.relist)
    return tree


def _check_private(folder: Path) -> None:
    """A spool someone else made (a shared, world-writable SRC, before the first writable
    start) may hold their links: the daemon would create and truncate files through them as
    root. Refuse it rather than use it. So too one that other users may write (an operator's
    `mkdir -m 777`), or whose `files` or `staging` is not the daemon's own: a user could have
    made that folder and kept a working directory in it, which the chmod to 0700 at start does
    not take away; from there they listed every user's spooled files and put a folder of
    their own bytes in place of another user's, which was then uploaded under that user's
    names (red team 70, F3)."""
    for path in (folder, folder / "files", folder / "staging"):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # made 0700 by the daemon when needed
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else f"owned by uid {st.st_uid}"
        elif mode & (stat.S_IWGRP | stat.S_IWOTH):
            what = f"writable by others (mode {mode:04o})"
        else:
            continue
        raise DecantError(
            f"{path}: {what}, not a folder of this daemon's user alone: another user could "
            "plant links in it, or hold a folder inside it; move out what its files/ holds "
            "(files written through a mount, not yet published), remove it and start again "
            "(or pass another --spool)"
        )


def _check_unswappable(spool: Path) -> None:
    """The spool is reached by path for as long as the daemon runs (files are created,
    truncated, chmod-ed and chown-ed to their writers in it): a folder above it that another
    user may write without the sticky bit (a group-writable SRC holding .decant-spool) let them
    rename the spool away and put a link to a folder of theirs in its place, whose links the
    daemon then followed as root (a file written through the mount truncated and chown-ed
    /etc/shadow to its writer). So the write side refuses such a place."""
    why = swappable_by_others(spool.resolve())
    if why is not None:
        raise DecantError(
            f"{spool}: {why}, so another user could put a folder of theirs in the spool's "
            "place; make that folder sticky (chmod +t, as /tmp is) or mount read-only"
        )


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def _check_apart(config: MountConfig) -> None:
    """The spool and each inbox apart from SRC, the mountpoint and one another. Whatever sits
    in a spool or inbox is published into SRC and then removed from there: `--inbox SRC`
    "published" each file of SRC onto itself and then deleted it (every archive and plain file
    of SRC gone at the first start); `--spool SRC` made SRC 0700 for every other user. One
    below the mountpoint is reached through the mount itself. (An inbox inside SRC is fine:
    its files move up to their place.)"""
    src, mnt = config.src, config.mnt.resolve()
    places = [("--spool", config.spool_root)] + [("--inbox", p) for p in config.inbox]
    for option, place in places:
        if _overlap(place, mnt):
            raise DecantError(f"{option} {place}: overlaps the mountpoint {mnt}")
        inside_ok = option == "--inbox" or place == src / SPOOL_NAME
        if place == src or src.is_relative_to(place) or (place.is_relative_to(src) and
                                                         not inside_ok):  # fmt: skip
            raise DecantError(f"{option} {place}: overlaps SRC {src}: what is there would be "
                              "published onto itself and removed")  # fmt: skip
    for i, (option, place) in enumerate(places):
        for other, there in places[i + 1 :]:
            if _overlap(place, there):
                raise DecantError(f"{option} {place} and {other} {there} overlap")


def _check_inbox(inbox: Path) -> None:
    """Whatever is in an inbox is published into SRC as this daemon's user, at its path below
    the inbox: a user who may write the inbox could replace files and fill folders of SRC they
    may not write, or swap its folders for links to files they may not read. So only the
    daemon's user may write an inbox: a real folder of its own, no group or other write bit
    (made 0755 if missing, as Spool would make it)."""
    own_folder(inbox, "--inbox", "everything in an inbox is published as this daemon's user, "
               "so no other user may write it; let users write through the mount instead",
               mode=0o755)  # fmt: skip


def open_index_at(folder: Path) -> DescriptionIndex:
    """The persistent index in `folder` (made 0700), if that folder and its database are this
    user's own and no one else may write them: the index says which archives verified and
    holds the chunk digests reads are checked against, so a user who could write it could
    have a damaged or swapped archive served as verified."""
    real = own_folder(folder, "--index-dir", "the index says which archives verified and holds "
                      "their digests, so no other user may write it; pick a folder of this "
                      "user's own (it is made 0700)", files=("index.sqlite",))  # fmt: skip
    return DescriptionIndex(real / "index.sqlite")


def build_write_side(config: MountConfig, tree: SourceTree) -> PackQueue | None:
    """The spool, pack queue and write rules, unless the mount is read-only."""
    if config.read_only:
        return None
    if config.bucket is not None:
        return build_bucket_write_side(config, tree)
    src = config.src
    _check_apart(config)
    # Spooled files are the writers' bytes on SRC's disk: no other local user may reach (or
    # execute) them there, whatever their modes say.
    # Archives are staged in SRC/.decant-spool whichever --spool is given.
    for private in {config.spool_root, src / SPOOL_NAME}:
        private.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(private)
        _check_unswappable(private)
        os.chmod(private, 0o700)
    _hold_spool(config.spool_root, src)
    for inbox in config.inbox:
        _check_inbox(inbox)
    spool = Spool(src, config.spool_root / "files")
    spools = [spool] + [Spool(src, inbox, trusted=True) for inbox in config.inbox]
    for each in spools:
        each.max_plane = plane_bound(config.cache_size)
        each.max_segments = segment_bound(config.cache_size)
    queue = PackQueue(spools, config.settle, None, config.pack_all, config.pack_workers,
                      config.stale_temp, config.retry_after)  # fmt: skip
    queue.guard = SpaceGuard(spool.files, config.min_free)
    # Every publish changes SRC: watchfiles' own "N changes detected" INFO line per batch made
    # ~10,000 log lines of a 3,000-file rsync. Its warnings still show.
    logging.getLogger("watchfiles").setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    log.info("write side: new data is refused below %d MiB free (--min-free)",
             queue.guard.min_free >> 20)  # fmt: skip
    tree.spool = spool
    tree.publishing = queue.publishing
    return queue


def build_bucket_write_side(config: MountConfig, tree: SourceTree) -> PackQueue:
    """Over a bucket: files wait in the local --spool, packs are staged beside them, and the
    spool's placer uploads, reads back and checks each before its spooled copy goes."""
    from vfs.ingest.bucket import BucketPlacer
    from vfs.mount.buckettree import BucketTree
    from vfs.stores.s3uploads import UploadTokens

    assert isinstance(tree, BucketTree)
    root = config.spool_root
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(root)
    _check_unswappable(root)
    os.chmod(root, 0o700)  # the writers' bytes: no other local user may reach them here
    _hold_spool(root, config.src)
    spool = Spool(config.src, root / "files", staging=root / "staging")
    spool.max_plane = plane_bound(config.cache_size)
    spool.max_segments = segment_bound(config.cache_size)
    tokens = UploadTokens.kept_in(root / "upload-secret")
    spool.placer = BucketPlacer(
        tree.folder,
        tree.note_published,
        tree.note_withdrawn,  # type: ignore[arg-type]
        tokens,
    )
    tree.keep_published(root / "published.jsonl")
    # Before any upload of this run starts: one of those is never taken for a leftover.
    tree.folder.abort_left_behind(tree.pending(), time.time(), ABORT_WITHIN)  # type: ignore[attr-defined]
    tree.drop_pending_not_ours(tokens, ABORT_WITHIN)
    tree.settle_withdrawn(tree.folder.withdraw_left_behind(tree.withdrawn(), ABORT_WITHIN))  # type: ignore[attr-defined]
    queue = PackQueue([spool], config.settle, None, config.pack_all, config.pack_workers,
                      config.stale_temp, config.retry_after)  # fmt: skip
    queue.guard = SpaceGuard(spool.files, config.min_free)
    log.info("write side: files written are spooled in %s and uploaded to %s; new data is "
             "refused below %d MiB free there (--min-free)", spool.files, tree.folder.name,
             queue.guard.min_free >> 20)  # fmt: skip
    tree.spool = spool
    tree.publishing = queue.publishing
    return queue


LOCK_NAME = ".lock"  # in the spool root: what `_hold_spool` locks
_HELD: list[int] = []  # descriptors of the spools this daemon holds, for as long as it runs


def _hold_spool(root: Path, src: object) -> None:
    """Take the spool for this daemon alone (an exclusive flock on its folder, held until the
    daemon exits): two mounts given one --spool (the README's example path for each bucket)
    each published, into its own SRC or prefix, the files the other had spooled, and cleared
    the other's staging folder at start. The lock is on a 0600 file in it, not on the folder:
    any user who could open the folder (an operator's 0755 spool) took the lock before the
    start and kept the daemon from starting (red team 72, F4)."""
    import fcntl

    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DecantError(f"--spool {root}: in use by another decant-mount; give each mount "
                          f"its own (this one is of {src})") from None  # fmt: skip
    _HELD.append(fd)


def make_writer(config: MountConfig, tree: SourceTree, queue: PackQueue) -> WriteSide | None:
    """The write rules over SRC: a local folder's, or a bucket's (vfs/ingest/bucket.py)."""
    if tree.spool is None:
        return None
    if config.bucket is not None:
        from vfs.ingest.bucket import BucketWriteSide

        folder = tree.folder  # type: ignore[attr-defined]
        return BucketWriteSide(config.src, tree.spool, folder, queue.guard, config.allow_delete)
    return WriteSide(config.src, tree.spool, config.allow_delete, queue.guard)


KERNEL_READ_AHEAD_KB = 128  # what the kernel sets a FUSE mount's read-ahead to at INIT


def raise_read_ahead(mnt: Path, kib: int = 1024) -> None:
    """1 MiB kernel read-ahead: 8× fewer round trips than the 128 KiB default (needs root).
    Only from the kernel's value: one an operator set meanwhile stays (red team 62, F4)."""
    # Not os.stat(mnt): that would wait on this very daemon, which is not serving yet.
    try:
        bdi = Path(f"/sys/class/bdi/{mount_device(mnt)}/read_ahead_kb")
        if int(bdi.read_text()) == KERNEL_READ_AHEAD_KB:
            bdi.write_text(str(kib))
    except (OSError, ValueError) as exc:
        log.debug("cannot raise read_ahead_kb (%s); reads stay 128 KiB", exc)


# When the read-ahead is raised after the mount appears. The kernel sets it (128 KiB) when it
# handles the reply to FUSE INIT, so a raise before that is undone: it is raised soon, for
# files opened early (a file keeps the read-ahead it was opened with: one opened in the first
# 0.3 s, the old single raise's delay, read in 128 KiB requests for good), and set again after.
READ_AHEAD_AT = (0.02, 0.1, 0.3, 1.0)


async def _raise_read_ahead_after_init(mnt: Path) -> None:
    waited = 0.0
    for at in READ_AHEAD_AT:
        await trio.sleep(at - waited)
        waited = at
        await trio.to_thread.run_sync(raise_read_ahead, mnt)


def mount_device(mnt: Path) -> str:
    """major:minor of the mount at `mnt`, from /proc/self/mountinfo."""
    found = mounted_device(mnt)
    if found is None:
        raise OSError(f"{mnt} is not in /proc/self/mountinfo")
    return found


THREAD_BUFFERS_MIN = 16 << 20
PLANE_BOUND_MIN = 8 << 20  # a 2048 x 2048 uint16 plane packs byte-exact whatever the cache
M_ARENA_MAX = -8  # glibc mallopt parameter
TRIM_ABOVE = 100 << 20  # RSS over the cache size that starts a malloc_trim
TRIM_STEP = 32 << 20  # after a trim that could not get under it, trim again this much higher
TRIM_POLL = 0.25


def plane_bound(cache_size: int) -> int:
    """The largest page the write side archives in mode D: half the cache (the decode gate's
    size up to the default cache; the gate stops at 256 MiB). A plane is decoded whole to pack
    it and to read it: a 1 GiB plane took a daemon with a 128 MiB cache to 3.4 GiB while it
    packed and to 800 MiB as it was read (red team 56). Larger pages are archived verbatim,
    read in blocks."""
    return max(cache_size // 2, PLANE_BOUND_MIN)


def segment_bound(cache_size: int) -> int:
    """The most strips/tiles of a file the write side archives in mode D: half the cache's
    worth at ~1 KiB each to pack (65,536 at least). A 2.1 GB TIFF of 2 million 1 KiB strips
    (zeros: a 28 MB archive) took a daemon with a 64 MiB cache to 1.2 GB (red team 85)."""
    return max(cache_size // 2, SEGMENTS_OVERHEAD_FREE) // SEGMENT_OVERHEAD


def raise_fd_limit() -> None:
    """Every open file of the mount holds a descriptor here: take all the hard limit allows
    (systemd starts services with a soft limit of 1,024; see LimitNOFILE in the unit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20  # infinity: not for NOFILE
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open-files limit from %d: %s", soft, exc)


def tune_malloc(cache_size: int | None = None) -> None:
    """One glibc arena, and malloc_trim whenever RSS passes cache_size + 100 MiB.

    Decoded planes (8 MiB) and the compressed chunks they come from (~4 MiB) churn through the
    heap at hundreds a second; freed planes leave holes that compressed chunks split, so the
    heap keeps 50-250 MiB of free memory resident beside the cache. 8 threads of random 4 KiB
    preads over two 256 MiB stacks, --cache-size 256M (tools/bench.py rss, scenario A, with the
    cache's in-flight reservations): two arenas peaked at 537-609 MiB, one at 408-420, one plus
    these trims at 385-401 (budget: cache + 150 = 406), and 307-355 MiB once idle instead of
    380-400. Daemon CPU per pread with and without the trims was within run-to-run noise
    (2355-2386 vs 2327-2395 µs), as was sha256sum of the same files. A fixed mmap threshold also
    bounded RSS, but faulting in each plane's fresh pages doubled the CPU per decoded plane
    (4 → 9 ms); two arenas (instead of one per thread) came from streaming c4gh with a 512 MiB
    cache, which peaked ~200 MiB above the cache with per-thread arenas (tools/bench.py c4gh)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_ARENA_MAX, 1)
    if cache_size is not None and hasattr(libc, "malloc_trim"):
        limit = cache_size + TRIM_ABOVE
        threading.Thread(target=_trim_forever, args=(libc, limit), daemon=True).start()


def _trim_forever(libc: Any, limit: int) -> None:
    """Give free heap pages back once RSS passes `limit` (a thread: it never touches trio)."""
    floor = limit
    while True:
        time.sleep(TRIM_POLL)
        rss = _rss()
        if rss > floor:
            libc.malloc_trim(0)  # ctypes drops the GIL; ~20-60 ms with 300 MiB of heap
            after = _rss()
            # Live data above the limit (a file being packed) cannot be trimmed away: do not
            # trim again until TRIM_STEP more is resident.
            floor = max(limit, after + TRIM_STEP)
            log.debug("malloc_trim: RSS %d → %d MiB", rss >> 20, after >> 20)
        elif rss < limit:
            floor = limit


def _rss() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * PAGE_SIZE


def serve(config: MountConfig, ready: Callable[[], None]) -> int:
    local.EXACT_OPENS = True  # SRC (resolved) is opened through no link: see open_exact
    local.OWNER_FILES_ONLY = True  # see vfs.stores.local
    # tifffile logs each flaw of a malformed TIFF at ERROR (6 lines for one 216-byte file, at
    # each of its scans), past the log's bound on failure lines: files written in by any user
    # flooded the log. Why a TIFF is archived verbatim (or not served) is logged by the caller.
    logging.getLogger("tifffile").setLevel(logging.CRITICAL)
    tune_malloc(config.cache_size)
    raise_fd_limit()
    diagnose = None
    if os.environ.get(DIAGNOSE):
        # Its files are made by name: links another user put at those names in a folder they
        # could write were written through as root. So the folder must be this user's own.
        diagnose = own_folder(Path(os.environ[DIAGNOSE]).absolute(), DIAGNOSE,
                              "its files are written as this daemon's user")  # fmt: skip
        if os.environ.get(TRACEMALLOC):
            tracemalloc.start(8)
    src, mnt = config.src, config.mnt
    cache = PageCache(config.cache_size)
    # The read buffers threads keep count in its budget, and at most a quarter of it is kept
    # (16 MiB at least: a few threads' worth, as one stream uses).
    cache.counts_idle(threadbuffers.HELD)
    threadbuffers.HELD.limit = max(config.cache_size // 4, THREAD_BUFFERS_MIN)
    tree = build_tree(config, cache)
    queue = build_write_side(config, tree)
    writer = make_writer(config, tree, queue) if queue is not None else None
    ops = DecantOperations(tree, config, writer, queue, cache)
    for overlay in tree.overlays:
        if hasattr(overlay, "watching"):
            overlay.watching = ops.watches  # whether its images' changes are reported
    if queue is not None:
        queue.on_published = ops.published
    pyfuse3.init(ops, str(mnt), config.fuse_options())
    stopping = StopWatch(mnt)
    stopping.mounted()
    try:
        log.info("mounted %s on %s (cache %d MiB)", src, mnt, config.cache_size >> 20)
        ready()
        moved = trio.run(_run, ops, config, queue, diagnose, stopping)
    finally:
        pyfuse3.close(unmount=True)
        if tree.index is not None:
            tree.index.close()
        stopping.done()
    log.info("unmounted %s", mnt)
    return 1 if moved else 0  # a service manager restarts it on the SRC now there


async def _run(
    ops: DecantOperations,
    config: MountConfig,
    queue: PackQueue | None,
    diagnose: Path | None,
    stopping: StopWatch,
) -> bool:
    """Serve until unmounted; True if the daemon stopped because SRC moved (`_keep_src`)."""
    src = config.src
    moved: list[str] = []
    async with trio.open_nursery() as nursery:
        ops.nursery = nursery
        if queue is not None and config.bucket is not None:  # no temp archives in a bucket
            nursery.start_soon(queue.run, config.spool_root / "staging", queue.spool.files)
        elif queue is not None:
            nursery.start_soon(queue.run, src, config.spool_root)
        nursery.start_soon(_raise_read_ahead_after_init, config.mnt)
        nursery.start_soon(_signals, partial(_arm, stopping, queue, 0))
        nursery.start_soon(_describe_racy_forever, ops)
        nursery.start_soon(ops.let_go.run)
        nursery.start_soon(_start_threads)
        if config.watch:
            nursery.start_soon(watch_source, ops, src, config.spool_root)
        else:
            log.info("not watching %s (--no-watch): changes show after short kernel timeouts", src)
        if config.bucket is not None:
            nursery.start_soon(_relist_forever, ops, config.bucket.relist)
        else:
            nursery.start_soon(_census, ops, src)
            if queue is not None:  # reads go by path: a read-only mount serves what is there
                nursery.start_soon(_keep_src, src, config.spool_root, moved,
                                   partial(_arm, stopping, queue, 1))  # fmt: skip
        if diagnose is not None:
            nursery.start_soon(_diagnose, diagnose)
        if config.scrub_interval is not None and config.bucket is not None:
            log.warning("--scrub-interval is not supported on a bucket yet: no scrubbing")
        elif config.scrub_interval is not None:
            nursery.start_soon(scrub_forever, ops, config.scrub_interval)
        if config.metrics_file is not None:
            nursery.start_soon(_write_metrics, ops, config.metrics_file)
        await pyfuse3.main()
        ops.nursery = None  # unmounted: nothing more is told to the kernel (ops._invalidate)
        ops.tree.stopping = True
        _arm(stopping, queue, 1 if moved else 0)
        if queue is not None:
            queue.stop()  # a publish in a worker thread gives up at its next block
        nursery.cancel_scope.cancel()  # unmounted from outside (fusermount3 -u), or a signal
    return bool(moved)


SRC_CHECK = 1.0  # seconds between checks that SRC is still the folder mounted
PRUNE_INTERVAL = 3600.0  # index rows of archives gone from SRC are forgotten this often


def _arm(stopping: StopWatch, queue: PackQueue | None, status: int) -> None:
    """Asked to stop: exit with `status` within the grace, whatever still runs."""
    stopping.arm(status, queue.publishing_now() if queue is not None else [])


async def _keep_src(src: Path, spool_root: Path, moved: list[str], arm: Callable[[], None]) -> None:
    """Stop (exit 1) once SRC's path names another folder than the one mounted: a filesystem
    mounted over it (fstab's NFS SRC mounted after the daemon started on the empty folder
    below), or SRC moved away and made anew. The daemon reaches SRC and the spool by path, so
    files spooled until then vanished from the mount without a word, every later write gave
    ENOENT, and nothing was published from that folder again; stopping says so and lets the
    service manager start it on what SRC now is. Why it stopped goes into `moved`."""
    first = await trio.to_thread.run_sync(os.stat, src)
    while True:
        await trio.sleep(SRC_CHECK)
        try:
            now = await trio.to_thread.run_sync(os.stat, src)
        except OSError as exc:
            now, why = None, exc.strerror
        else:
            why = "another filesystem is mounted over it, or it was replaced"
        if now is not None and (now.st_dev, now.st_ino) == (first.st_dev, first.st_ino):
            continue
        moved.append(why)
        log.error("%s: %s while mounted: stopping; files spooled until now stay in %s of the "
                  "folder that was there (publish them by moving them into the mount)", src,
                  why, spool_root)  # fmt: skip
        arm()
        pyfuse3.terminate()
        return


async def _signals(arm: Callable[[], None]) -> None:
    """SIGTERM and SIGINT unmount; so does SIGHUP, unless the log is a file: then it is
    opened again (logrotate's `postrotate kill -HUP` unmounted the mount at each rotation)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            handlers = logging.getLogger().handlers
            reopen = [fn for h in handlers if (fn := getattr(h, "reopen", None)) is not None]
            if signum == signal.SIGHUP and reopen:
                for fn in reopen:
                    await trio.to_thread.run_sync(fn)
                continue
            log.info("%s: unmounting", signal.Signals(signum).name)
            arm()
            pyfuse3.terminate()
            return


async def _diagnose(folder: Path) -> None:
    """Allocator statistics (and a tracemalloc snapshot) to `folder` on each SIGUSR2 (checked
    at start: see `serve`)."""
    with trio.open_signal_receiver(signal.SIGUSR2) as signals:
        n = 0
        async for _ in signals:
            n += 1
            # On the trio thread, so the tables hold still. sys._debugmallocstats writes to the
            # C stderr: point fd 2 at the file meanwhile (the log goes to --log-file).
            stats = folder / f"mallocstats-{n}.txt"
            fd, saved = os.open(stats, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), os.dup(2)
            try:
                os.dup2(fd, 2)
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                os.close(fd)
            if tracemalloc.is_tracing():
                snapshot = tracemalloc.take_snapshot()
                path = folder / f"snapshot-{n}.pickle"
                await trio.to_thread.run_sync(snapshot.dump, str(path) + ".part")
                os.replace(str(path) + ".part", path)
            log.info("diagnosis %d written to %s", n, folder)
            (folder / f"done-{n}").touch()


async def _write_metrics(ops: DecantOperations, path: Path) -> None:
    """The counters for node_exporter's textfile collector, every few seconds."""
    while True:
        try:
            await trio.to_thread.run_sync(write_atomically, path, prometheus(ops.status()))
        except OSError as exc:
            log.warning("cannot write metrics to %s: %s", path, exc)
        await trio.sleep(METRICS_INTERVAL)


async def _start_threads() -> None:
    """The threads reads use, started at mount rather than by the first reads (each start cost
    a first read a few tenths of a millisecond)."""
    await trio.to_thread.run_sync(hashfeed.start_threads)
    await trio.to_thread.run_sync(start_block_helper)


async def _describe_racy_forever(ops: DecantOperations) -> None:
    """Archives described while they may have been mid-write are described again once that
    moment has passed (DecantOperations.describe_racy_again); a poll of an empty map when none
    were."""
    while True:
        await trio.sleep(RACY_POLL)
        await ops.describe_racy_again()


async def _relist_forever(ops: DecantOperations, interval: float) -> None:
    """Every `interval` seconds, re-list the bucket folders the kernel holds listings of: what
    other hosts added or removed appears or disappears (and the kernel forgets changed names).
    Folders nobody holds are re-listed when next looked at (their listings have expired).
    The top level is presented at once (the start-up check's LIST, index rows): the first `ls`
    of the mount then finds it ready (a listing of 1,000 archives: ~25 ms of CPU)."""
    tree: Any = ops.tree
    await _relist(ops, ROOT_INODE, tree.root)
    while True:
        await trio.sleep(interval)
        tree.expire()
        for ino in list(ops.inodes.folders):
            node = ops.inodes.get(ino)
            if node is None or node.backend is not None:
                continue  # archive contents never change in place
            await _relist(ops, ino, node.real)


async def _relist(ops: DecantOperations, ino: int, real: object) -> None:
    """One folder re-listed. Any failure stays this folder's: a bug in a listing (a TypeError
    from one odd entry) escaped this task and stopped the daemon for every user."""
    try:
        await ops.rescan(ino)
    except (OSError, pyfuse3.FUSEError, DecantError) as exc:
        log.debug("relist of %s failed: %s", real, exc)
    except Exception:
        log.exception("relist of %s failed unexpectedly", real)


async def _census(ops: DecantOperations, src: Path, every: float = PRUNE_INTERVAL) -> None:
    """Log how many archives SRC holds (names only: nothing is opened); then forget the index
    rows of archives of SRC that are gone (DescriptionIndex.prune), and again every `every`
    seconds: a user cycling archive names in SRC grew the index for as long as a run lasted."""
    await _count(ops, src)
    index = ops.tree.index
    while index is not None:
        try:
            gone = await trio.to_thread.run_sync(index.prune, src)
        except sqlite3.Error as exc:
            log.warning("index: rows of archives gone not pruned (%s)", exc)
        else:
            if gone:
                log.info("index: forgot %d archives no longer in %s", gone, src)
        await trio.sleep(every)


async def _count(ops: DecantOperations, src: Path) -> None:

    def deep(folder: Path) -> None:
        log.info("%s: folders below it are more than %d levels deep; not counted",
                 folder, MAX_WALK_DEPTH)  # fmt: skip

    def count() -> int:
        n = 0
        for base, dirs, files in walk(src, too_deep=deep):
            dirs[:] = [d for d in dirs if d != SPOOL_NAME and base / d != ops.config.mnt]
            for name in files + dirs:
                if any(b.claims(base / name, name in dirs) for b in ops.tree.backends):
                    n += 1
        return n

    log.info("%s holds %d archives", src, await trio.to_thread.run_sync(count))
