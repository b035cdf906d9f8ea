"""SRC watched with inotify (watchfiles): changed folders are rescanned and kernel entries dropped.

Each real folder of SRC is watched on its own (never recursively): a recursive watch follows
symlinks out of SRC and into the mountpoint, where it would wait on this very daemon. The folder
list is made by a walk in a worker thread that never follows links and skips the mountpoint and
the spool, and is made again when folders appear or go; the old watch is drained and closed
only once the new one is in place, so no change is missed in between.

Without inotify (`--no-watch`, inotify limits, a network filesystem) the mount still shows
changes: entries of unwatched folders carry short kernel timeouts and folders are re-checked by
mtime.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import threading
from collections.abc import AsyncGenerator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from vfs.decant import MANIFEST_KEY
from vfs.walk import MAX_WALK_DEPTH, walk

if TYPE_CHECKING:
    from vfs.mount.ops import DecantOperations

log = logging.getLogger(__name__)

MAX_FOLDERS = 100_000  # beyond this, watching costs more than mtime checks: fall back
VANISHED_RETRIES = 50  # walks in a row that raced folders being removed, before giving up
PATH_MAX = 4096  # a folder whose path is longer cannot be watched (nor served: ENAMETOOLONG)
UNNAMED_PAUSE = 1.0  # seconds between re-watches after an event inotify could not name
DEBOUNCE_MS = 100  # changes are handed over in batches at most this long after the first
STEP_MS = 20  # ... once no new change came for this long
TIMEOUT_MS = 200  # how long the notify thread blocks: an empty batch, and it delays shutdown
WATCH_DEPTH = MAX_WALK_DEPTH  # folder levels below SRC watched; deeper ones are served unwatched
POLL_DELAY_MS = 300  # watchfiles' default; polling only where inotify is unavailable


def real_folders(src: Path, skip: set[Path]) -> list[Path]:
    """Every real folder of SRC down to WATCH_DEPTH levels, links not followed, `skip`
    (mountpoint, spool) left out. Walked with os.walk, a folder a user made 3,000 levels deep
    raised RecursionError and turned the watch off for the whole mount (red team 68, F1); the
    folders below the bound are served as unwatched ones are (`watched_at`)."""
    found = [src]
    top = len(src.parts)
    told = False
    for base, dirs, _names in walk(src, max_depth=WATCH_DEPTH):
        if len(base.parts) - top >= WATCH_DEPTH:
            if dirs and not told:
                told = True
                log.warning("%s: folders more than %d levels below SRC are not watched; their "
                            "changes show as with --no-watch", base, WATCH_DEPTH)  # fmt: skip
            continue
        dirs[:] = [d for d in dirs if base / d not in skip
                   and len(os.fsencode(base / d)) < PATH_MAX]  # fmt: skip
        found.extend(base / d for d in dirs)
        if len(found) > MAX_FOLDERS:
            raise OSError(f"more than {MAX_FOLDERS} folders")
    return found


def watched_at(src: Path, folder: Path, below: int = 0) -> bool:
    """Whether `folder` (below `src`), and the folders `below` levels under it, are within the
    depth `real_folders` watches."""
    return len(folder.parts) - len(src.parts) + below <= WATCH_DEPTH


def manifest_of(path: Path) -> Path | None:
    """The folder archive (`NAME.zarr/`) whose manifest `path` is, else None. Its manifest
    changing is a new version of it (vfs.decant.archive_stat), which its own folder's listing
    does not tell: the name is looked at again in the folder that lists the archive."""
    folder = path.parent
    archive = folder.parent
    if (path.name, folder.name) != tuple(reversed(MANIFEST_KEY.split("/"))):
        return None
    return archive if archive.name.endswith(".zarr") else None


def folder_archives(folders: Iterable[Path], src: Path) -> set[str]:
    """The `.zarr/` folders below `src` that hold (or are) one of `folders`: the folder archives
    a file changed in, when those are the folders the watcher saw a change in."""
    found: set[str] = set()
    for folder in folders:
        try:  # one pass over its parts: a folder may be ~2,000 levels deep (PATH_MAX)
            parts = folder.relative_to(src).parts
        except ValueError:
            continue
        for i, part in enumerate(parts):
            if part.endswith(".zarr"):
                found.add(str(src.joinpath(*parts[: i + 1])))
    return found


def _folders_changed(src: Path, paths: set[Path], watched: set[Path], skip: set[Path]) -> bool:
    """A new real folder appeared within the depth watched, or a watched one went (runs in a
    worker thread)."""
    for path in paths:
        if path in skip or any(s in path.parents for s in skip):
            continue
        if path in watched and not path.is_dir():
            return True
        if (path not in watched and watched_at(src, path) and path.is_dir()
                and not path.is_symlink()):  # fmt: skip
            return True
    return False


async def watch_source(ops: DecantOperations, src: Path, spool_root: Path) -> None:
    """Rescan folders that inotify reports changed; degrade to mtime checks if it cannot."""
    try:
        from watchfiles._rust_notify import RustNotify
    except ImportError:
        log.warning("watchfiles is not installed: SRC changes show after a folder's mtime check")
        ops.watched = False
        return
    skip = {ops.config.mnt, spool_root}
    vanished = 0
    unnamed = 0
    # The watch being replaced, kept until its successor is in place: closed first, a chmod
    # made while the new set of folders was walked (a user making and removing folders in a
    # loop keeps that window open) was never heard of, and the mount showed the old bits for
    # as long as the loop ran (red team 72, F3).
    previous: AsyncGenerator[set[tuple[int, str]], None] | None = None
    try:
        while True:
            folders = await trio.to_thread.run_sync(real_folders, src, skip)
            watched = set(folders)
            caught_up = False
            batches = _batches(RustNotify, folders)
            kept = False
            try:
                async for changes in batches:
                    vanished = 0
                    if not caught_up:
                        # A watch that replaces another takes the old one's last changes (it
                        # ran until now). What a first watch's walk missed went unseen: the
                        # folders the kernel holds are checked once, now that any later change
                        # is reported.
                        caught_up = True
                        if previous is not None:
                            with contextlib.suppress(StopAsyncIteration):
                                await _take(ops, await anext(previous), skip)
                            await previous.aclose()
                            previous = None
                        await ops.on_changed(watched - skip)
                    if not changes:
                        continue
                    paths = await _take(ops, changes, skip)
                    grown = functools.partial(_folders_changed, src, paths, watched, skip)
                    if await trio.to_thread.run_sync(grown):
                        previous, kept = batches, True
                        break  # watch the new set of folders
            except OSError as exc:
                if not _vanished(exc):
                    raise
                # A folder went between the walk and the watch (an `rm -r` in progress): walk
                # again. Only SRC itself gone for good ends watching.
                vanished += 1
                if vanished > VANISHED_RETRIES or not src.is_dir():
                    raise
                await trio.sleep(0.05 * vanished)  # the next watch catches up on changes
            except Exception as exc:
                if not _unnamed_path(exc):
                    raise
                # watchfiles cannot hand over an event on a name that is not UTF-8 (its Rust
                # side wants text; any user may create such a name): which folder changed is
                # unknown, so every watched one is checked, and the watch starts again.
                unnamed += 1
                if unnamed == 1:
                    log.warning("a name in %s is not UTF-8: inotify events on it are caught by "
                                "checking every folder (%s)", src, _unnamed_path(exc))  # fmt: skip
                await ops.on_changed(watched - skip)
                await trio.sleep(UNNAMED_PAUSE)
            finally:
                if not kept:
                    await batches.aclose()
    except Exception as exc:  # e.g. the inotify watch limit: degrade, keep serving
        ops.watched = False
        log.warning("watching %s failed (%s); changes show after a folder's mtime check", src, exc)
    finally:
        if previous is not None:
            await previous.aclose()


async def _take(ops: DecantOperations, changes: set[tuple[int, str]], skip: set[Path]) -> set[Path]:
    """Hand a batch of changes to the mount, by folder and name; the paths changed."""
    paths = {Path(p) for _change, p in changes}
    names: dict[Path, set[str]] = {}
    for path in paths:
        if path.parent not in skip:
            names.setdefault(path.parent, set()).add(path.name)
        archive = manifest_of(path)
        if archive is not None and archive.parent not in skip:
            names.setdefault(archive.parent, set()).add(archive.name)
    if names:
        await ops.on_names_changed(names)
    return paths


async def _batches(
    rust_notify: Any, folders: list[Path]
) -> AsyncGenerator[set[tuple[int, str]], None]:
    """Batches of (change, path) in `folders` (not recursive, nothing filtered out: watchfiles'
    default filter hides `.git`, `*~`, `*.swp`... names), an empty batch every TIMEOUT_MS, the
    first once the watches are in place.

    watchfiles' own `awatch` does the same through anyio, whose imports held the event loop for
    ~25 ms of a new mount's first requests (start to the bytes of a package's manifest, 24
    interleaved starts: 27 ms slower than `--no-watch`; through RustNotify, 7 ms). RustNotify is
    the Rust backend watchfiles documents for direct use; its blocking `watch` runs in a worker
    thread, which sees `stop` set by a cancel within STEP_MS (it checks it every step), and
    only then is the watcher closed: waiting out TIMEOUT_MS instead made every unmount ~0.15 s
    slower than `--no-watch`."""
    stop = threading.Event()
    paths = [str(f) for f in folders]
    with rust_notify(paths, False, False, POLL_DELAY_MS, False, False) as notify:
        try:
            while True:
                raw = await _watch_once(notify, stop)
                if raw == "stop":
                    return
                if raw == "signal":
                    raise RuntimeError("the watch thread received a signal")
                yield set() if raw == "timeout" else raw
        finally:
            stop.set()


async def _watch_once(notify: Any, stop: threading.Event) -> Any:
    """One blocking `notify.watch` in a worker thread. A cancel sets `stop`, which the thread
    checks every STEP_MS; the cancel is delivered once it has returned."""
    returned = False

    async def stop_on_cancel() -> None:
        try:
            await trio.sleep_forever()
        finally:
            if not returned:
                stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_on_cancel)
        raw = await trio.to_thread.run_sync(
            notify.watch, DEBOUNCE_MS, STEP_MS, TIMEOUT_MS, stop, abandon_on_cancel=False
        )
        returned = True
        nursery.cancel_scope.cancel()
    return raw


def _vanished(exc: OSError) -> bool:
    """Whether watchfiles failed because a folder walked went, or became a file, before its
    watch was added. It raises ENOENT as FileNotFoundError but ENOTDIR as a bare OSError whose
    text alone names the code: a user making a folder and replacing it with a file in a loop
    turned the watch off for the whole mount (red team 76, F2)."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return True
    return exc.errno is None and _GONE.search(str(exc)) is not None


_GONE = re.compile(r"\(os error (2|20)\)")


def _unnamed_path(exc: BaseException) -> str:
    """The message of watchfiles' error for a path it could not decode, when that is all `exc`
    (or the exception group it comes in) holds; else ""."""
    if isinstance(exc, BaseExceptionGroup):
        found = [_unnamed_path(e) for e in exc.exceptions]
        return found[0] if found and all(found) else ""
    text = str(exc)
    kind = type(exc).__name__
    return text if kind == "WatchfilesRustInternalError" and "decode path" in text else ""
