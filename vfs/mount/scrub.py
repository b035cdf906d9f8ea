"""`--scrub-interval`: re-verify every decant original in SRC now and then, like a ZFS scrub.

One file at a time through the same limiter as background verification, so reads keep being
served; a damaged file is refused from then on, and one summary line is logged per pass.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from vfs.backends.base import Entry
from vfs.nodes import Node, archive_node
from vfs.walk import MAX_WALK_DEPTH, walk

if TYPE_CHECKING:
    from vfs.mount.ops import DecantOperations
    from vfs.mount.tree import SourceTree

log = logging.getLogger(__name__)


def verifiable(tree: SourceTree, skip: set[Path]) -> list[Node]:
    """Every presented file of SRC that records a sha256 (decant originals, package members).
    An archive that cannot be looked at now (gone, unreadable, a name too long to reach) is
    logged and left out of this pass, not the end of it."""
    found: list[Node] = []
    for path, st, backend in _archives(tree, skip):
        try:
            desc = tree.describe(backend, path, st)
            if desc is None:
                continue
            rel = path.relative_to(tree.root).as_posix()
            for member, entry in _files(desc.root):
                if entry.sha256 and not getattr(backend, "authenticated", False):
                    found.append(archive_node(backend, path, st, member, entry, rel))
        except Exception as exc:
            log.warning("%s: not scrubbed in this pass: %s", path, _reason(exc))
    return found


def _archives(tree: SourceTree, skip: set[Path]) -> Iterator[tuple[Path, os.stat_result, object]]:
    # vfs/walk.py, not os.walk: that recursed once per level, and a folder a user made 1,200
    # levels deep ended the scrub's task with RecursionError, and with it the daemon.
    for base, dirs, names in walk(tree.root, too_deep=_too_deep):
        dirs[:] = [d for d in dirs if base / d not in skip and not d.startswith(".decant-")]
        for name in [*names, *dirs]:
            path = base / name
            try:
                st = path.lstat()
            except OSError:
                continue  # gone since the folder was listed
            if stat.S_ISLNK(st.st_mode):
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            try:
                backend = next((b for b in tree.backends if b.claims(path, is_dir)), None)
            except OSError as exc:  # a folder's manifest path past PATH_MAX, say
                log.warning("%s: not scrubbed in this pass: %s", path, _reason(exc))
                continue
            if backend is not None:
                if is_dir:
                    dirs.remove(name)  # a folder archive is verified whole, not walked into
                # Its version as a listing takes it (a folder archive's: its manifest's stat
                # folded in): else its nodes' opens are refused as of another version, and the
                # index rows it keeps replace the listing's.
                yield path, tree.version_stat(path, st), backend


def _too_deep(folder: Path) -> None:
    log.warning("%s: folders below it are more than %d levels deep; not scrubbed",
                folder, MAX_WALK_DEPTH)  # fmt: skip


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} (errno {exc.errno})"
    return str(exc) or exc.__class__.__name__


def _files(root: Entry) -> Iterator[tuple[str, Entry]]:
    stack: list[tuple[str, Entry]] = [("", root)]
    while stack:
        member, entry = stack.pop()
        if not entry.is_dir:
            yield member, entry
            continue
        for name, child in entry.children.items():
            stack.append((f"{member}/{name}".lstrip("/"), child))


async def scrub_forever(ops: DecantOperations, interval: float) -> None:
    """A pass that fails (SRC unreadable, an error no archive's check expected) is logged in
    one line and the next runs: this task is on the daemon's own nursery, so an exception
    leaving it unmounted SRC for every user."""
    while True:
        await trio.sleep(interval)
        try:
            await scrub_once(ops)
        except Exception as exc:
            log.error("scrub of %s: pass stopped: %s", ops.tree.root, _reason(exc))


async def scrub_once(ops: DecantOperations) -> tuple[int, int]:
    started = time.monotonic()
    skip = {ops.config.mnt, ops.config.spool_root}
    nodes = await trio.to_thread.run_sync(verifiable, ops.tree, skip)
    ok = failed = 0
    for node in nodes:
        ops.integrity.good.discard(node.key)  # verified before or not: read it all again
        try:
            passed = await ops.integrity.verify_now(node)
        except Exception as exc:
            log.error("%s: not scrubbed: %s", node.real, _reason(exc))
            passed = False
        if passed:
            ok += 1
        else:
            failed += 1
    log.info("scrub of %s: %d files verified, %d failed (%.0f s)", ops.tree.root, ok, failed,
             time.monotonic() - started)  # fmt: skip
    return ok, failed
