"""Folders named like a decant folder archive (`NAME.zarr`) that were made through the mount.

A file written through the mount under an archive's name (`x.tif.zarr.zip`) is wrapped in a
verbatim archive, so it reads back under the name written and a second `rsync -a` sends
nothing. A folder cannot be wrapped: a `x.tif.zarr/` folder archive copied in file by file
was shown as its original `x.tif` once its files were published, its written names gone
(ENOENT), and every later `rsync -a` of it failed (red team 61, F3). Such a folder made
through the mount (mkdir, a folder renamed to the name, one made again for spooled files)
carries the extended attribute `user.decant.written`, and the mount shows it as the folder
written. Removing the attribute in SRC (`setfattr -x user.decant.written DIR`) has it shown
as its original. Where SRC takes no user attributes the folder is shown as its original.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

WRITTEN = "user.decant.written"
SUFFIX = ".zarr"


def mark_written(dfd: int, name: str) -> None:
    """Mark the folder `name` of the folder `dfd` (no link followed) if it is named `*.zarr`."""
    if not name.endswith(SUFFIX):
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dfd)  # fmt: skip
    except OSError as exc:
        log.debug("%s: not marked as written through the mount: %s", name, exc)
        return
    try:
        os.setxattr(fd, WRITTEN, b"1")
    except OSError as exc:
        # Once: a user making folders named so by the thousand must not flood the log.
        level = logging.DEBUG if _warned else logging.WARNING
        _warned.append(name)
        log.log(level, "%s: not marked as written through the mount (%s): shown as the archive "
                "it holds, if it is one (and so is every such folder where this fails)", name,
                exc)  # fmt: skip
        del _warned[1:]
    finally:
        os.close(fd)


_warned: list[str] = []  # the first folder that could not be marked


def written(path: Path) -> bool:
    """Whether the folder at `path` was marked by `mark_written` (a link is not followed)."""
    try:
        os.getxattr(path, WRITTEN, follow_symlinks=False)
    except OSError:
        return False
    return True
