"""Wiring one mount: backends, cache, index, the pyfuse3 session, the SRC watcher, signals."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.fuse_ops import DecantOperations
from vfs.index import DescriptionIndex
from vfs.spool import Spool
from vfs.tree import SourceTree
from vfs.watcher import PackQueue
from vfs.writeside import WriteSide

log = logging.getLogger("decant-mount")
SPOOL_NAME = ".decant-spool"


def build_tree(args: argparse.Namespace, src: Path, cache: PageCache) -> SourceTree:
    decant = DecantBackend(cache)
    backends: list[Any] = [decant]
    try:
        from vfs.backends.c4gh import backend_from_args
    except ImportError:
        pass
    else:
        c4gh = backend_from_args(args, cache)
        if c4gh is not None:
            backends.append(c4gh)
    overlays: list[Any] = []
    try:
        from vfs.backends.acqstore import AcqStoreBackend
    except ImportError:
        pass
    else:
        overlays.append(AcqStoreBackend(cache, decant))
    index = None
    if not args.no_index:
        folder = args.index_dir or Path(os.path.expanduser("~/.cache/decant-mount"))
        index = DescriptionIndex(folder / "index.sqlite")
    return SourceTree(src, backends, overlays, index, hidden=[SPOOL_NAME])


def build_write_side(args: argparse.Namespace, src: Path, tree: SourceTree) -> PackQueue | None:
    """The spool, pack queue and write rules, unless the mount is read-only."""
    from vfs.cli import read_only

    if read_only(args):
        return None
    spool_root = args.spool or src / SPOOL_NAME
    spool = Spool(src, spool_root / "files")
    spools = [spool] + [Spool(src, inbox) for inbox in args.inbox]
    queue = PackQueue(spools, args.settle, None, args.pack_all, args.pack_workers)
    tree.spool = spool
    tree.publishing = queue.publishing
    return queue


def raise_read_ahead(mnt: Path, kib: int = 1024) -> None:
    """1 MiB kernel read-ahead: 8× fewer round trips than the 128 KiB default (needs root)."""
    # Not os.stat(mnt): that would wait on this very daemon, which is not serving yet.
    try:
        bdi = Path(f"/sys/class/bdi/{mount_device(mnt)}/read_ahead_kb")
        bdi.write_text(str(kib))
    except OSError as exc:
        log.debug("cannot raise read_ahead_kb (%s); reads stay 128 KiB", exc)


async def _raise_read_ahead_after_init(mnt: Path) -> None:
    # The kernel sets the mount's read-ahead when it handles FUSE INIT (capped at 128 KiB), so
    # the raise must come after INIT: give the session loop a moment to answer it.
    await trio.sleep(0.3)
    await trio.to_thread.run_sync(raise_read_ahead, mnt)


def mount_device(mnt: Path) -> str:
    """major:minor of the mount at `mnt`, from /proc/self/mountinfo."""
    target = str(mnt).replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
    found = ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == target:
            found = fields[2]  # the last match is the topmost mount
    if not found:
        raise OSError(f"{mnt} is not in /proc/self/mountinfo")
    return found


def tune_malloc() -> None:
    """Two glibc arenas instead of one per thread: streaming 1 GiB with a 512 MiB cache peaked
    ~200 MiB above the cache with per-thread arenas (tools/bench.py c4gh). A low mmap threshold
    bounded RSS further but made every buffer an mmap: ingest 1.7× and cold reads 4× slower."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_arena_max = -8
    libc.mallopt(m_arena_max, 2)


def serve(args: argparse.Namespace, src: Path, mnt: Path, ready: Callable[[], None]) -> int:
    from vfs.cli import fuse_options

    tune_malloc()
    cache = PageCache(args.cache_size)
    tree = build_tree(args, src, cache)
    queue = build_write_side(args, src, tree)
    writer = WriteSide(tree, tree.spool, args.allow_delete) if queue and tree.spool else None
    ops = DecantOperations(tree, args.decode_threads, writer, queue)
    if queue is not None:
        queue.on_published = ops.published
    pyfuse3.init(ops, str(mnt), fuse_options(args.options, src))
    try:
        log.info("mounted %s on %s (cache %d MiB)", src, mnt, args.cache_size >> 20)
        ready()
        trio.run(_run, ops, src, mnt, queue, args.spool or src / SPOOL_NAME)
    finally:
        pyfuse3.close(unmount=True)
        if tree.index is not None:
            tree.index.close()
    log.info("unmounted %s", mnt)
    return 0


async def _run(
    ops: DecantOperations, src: Path, mnt: Path, queue: PackQueue | None, spool_root: Path
) -> None:
    async with trio.open_nursery() as nursery:
        ops.nursery = nursery
        if queue is not None:
            nursery.start_soon(queue.run, src, spool_root)
        nursery.start_soon(_raise_read_ahead_after_init, mnt)
        nursery.start_soon(_signals, nursery.cancel_scope)
        nursery.start_soon(_watch, ops, src)
        nursery.start_soon(_census, ops, src)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()  # unmounted from outside (fusermount3 -u)


async def _signals(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("%s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


async def _watch(ops: DecantOperations, src: Path) -> None:
    """inotify on SRC: changed folders are rescanned and the kernel's entries invalidated."""
    try:
        import watchfiles
    except ImportError:
        log.warning("watchfiles is not installed: SRC changes show after a folder's mtime check")
        return
    spool = str(src / SPOOL_NAME)
    try:
        watching = watchfiles.awatch(
            src,
            debounce=100,
            step=20,
            watch_filter=lambda _c, p: not p.startswith(spool),
            rust_timeout=200,  # how long the notify thread blocks: it delays shutdown by this much
        )
        async for changes in watching:
            folders = {Path(p).parent for _change, p in changes}
            await ops.on_changed(folders)
    except Exception as exc:  # e.g. the inotify watch limit: degrade, keep serving
        log.warning("watching %s failed (%s); changes show after a folder's mtime check", src, exc)


async def _census(ops: DecantOperations, src: Path) -> None:
    """Log how many archives SRC holds (names only: nothing is opened)."""

    def count() -> int:
        n = 0
        for root, dirs, files in os.walk(src):
            dirs[:] = [d for d in dirs if d != SPOOL_NAME]
            base = Path(root)
            for name in files + dirs:
                if any(b.claims(base / name, name in dirs) for b in ops.tree.backends):
                    n += 1
        return n

    log.info("%s holds %d archives", src, await trio.to_thread.run_sync(count))
