"""A walk of a folder tree that neither recurses nor goes deeper than a bound.

`os.walk` recurses once per level on Python 3.11: a folder a few thousand levels deep (anyone
who may write one folder of SRC or the inbox can make one) raises RecursionError in whatever
walks it — at start, that is the daemon exiting. This walk keeps its own stack, does not follow
links, and leaves folders below `max_depth` unwalked (the first one reported through `too_deep`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

MAX_WALK_DEPTH = 256  # folder levels below the top that a housekeeping walk goes into


def walk(
    top: Path,
    max_depth: int = MAX_WALK_DEPTH,
    too_deep: Callable[[Path], None] | None = None,
) -> Iterator[tuple[Path, list[str], list[str]]]:
    """Like `os.walk(top)` top-down: (folder, subfolders, other names); prune the subfolders
    list in place to skip them. Links (to folders too) are listed with the other names and
    never walked into; a folder that cannot be listed is skipped, as os.walk does."""
    stack: list[tuple[Path, int]] = [(top, 0)]
    told = False
    while stack:
        folder, depth = stack.pop()
        dirs: list[str] = []
        names: list[str] = []
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else names).append(entry.name)
        except OSError:
            continue
        yield folder, dirs, names
        if depth >= max_depth:
            if dirs and too_deep is not None and not told:
                too_deep(folder)
                told = True
            continue
        stack.extend((folder / d, depth + 1) for d in reversed(dirs))


__all__ = ["MAX_WALK_DEPTH", "walk"]
