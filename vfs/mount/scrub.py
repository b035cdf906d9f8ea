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

if TYPE_CHECKING:
    from vfs.mount.ops import DecantOperations
    from vfs.mount.tree import SourceTree

log = logging.getLogger(__name__)


def verifiable(tree: SourceTree, skip: set[Path]) -> list[Node]:
    """Every presented file of SRC that records a sha256 (decant originals, package members)."""
    found: list[Node] = []
    for path, st, backend in _archives(tree, skip):
        desc = tree.describe(backend, path, st)
        if desc is None:
            continue
        rel = path.relative_to(tree.root).as_posix()
        for member, entry in _files(desc.root):
            if entry.sha256 and not getattr(backend, "authenticated", False):
                found.append(archive_node(backend, path, st, member, entry, rel))
    return found


def _archives(tree: SourceTree, skip: set[Path]) -> Iterator[tuple[Path, os.stat_result, object]]:
    for folder, dirs, files in os.walk(tree.root):
        base = Path(folder)
        dirs[:] = [d for d in dirs if base / d not in skip and not d.startswith(".decant-")]
        for name in [*files, *dirs]:
            path = base / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            backend = next((b for b in tree.backends if b.claims(path, is_dir)), None)
            if backend is not None:
                if is_dir:
                    dirs.remove(name)  # a folder archive is verified whole, not walked into
                yield path, st, backend


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
    while True:
        await trio.sleep(interval)
        await scrub_once(ops)


async def scrub_once(ops: DecantOperations) -> tuple[int, int]:
    started = time.monotonic()
    skip = {ops.config.mnt, ops.config.spool_root}
    nodes = await trio.to_thread.run_sync(verifiable, ops.tree, skip)
    ok = failed = 0
    for node in nodes:
        ops.integrity.good.discard(node.key)  # verified before or not: read it all again
        if await ops.integrity.verify_now(node):
            ok += 1
        else:
            failed += 1
    log.info("scrub of %s: %d files verified, %d failed (%.0f s)", ops.tree.root, ok, failed,
             time.monotonic() - started)  # fmt: skip
    return ok, failed
