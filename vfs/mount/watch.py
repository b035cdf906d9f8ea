"""SRC watched with inotify (watchfiles): changed folders are rescanned and kernel entries dropped.

Without it (`--no-watch`, inotify limits, a network filesystem) the mount still shows changes:
entries of unwatched folders carry short kernel timeouts and folders are re-checked by mtime.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vfs.mount.ops import DecantOperations

log = logging.getLogger(__name__)


async def watch_source(ops: DecantOperations, src: Path, spool_root: Path) -> None:
    """inotify on SRC: changed folders are rescanned and the kernel's entries invalidated."""
    try:
        import watchfiles
    except ImportError:
        log.warning("watchfiles is not installed: SRC changes show after a folder's mtime check")
        ops.watched = False
        return
    spool = str(spool_root)
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
        ops.watched = False
        log.warning("watching %s failed (%s); changes show after a folder's mtime check", src, exc)
