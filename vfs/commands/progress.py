"""Byte progress for long runs: a tqdm bar on a terminal, nothing at all in pipes and logs.

The cores only take a `Callable[[int], None]`; tqdm stays out of them (and out of the daemon).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from vfs.logsafe import escape_controls

Progress = Callable[[int], None]


def _ignore(n: int) -> None:
    del n


@contextmanager
def byte_progress(label: str, total: int | None, quiet: bool = False) -> Iterator[Progress]:
    """Yield a callback taking byte counts; a bar (rate, time left) only when stderr is a tty.

    Not a tty means not one control character: piped stderr is often a log file.
    """
    if quiet or not sys.stderr.isatty():
        yield _ignore
        return
    from tqdm import tqdm  # only here: `decant info` and the tests of cores never load it

    with tqdm(
        **_width(),
        total=total or None,  # unknown: count and rate, no time left
        desc=escape_controls(label),  # an input's name: its escapes must not reach the tty
        unit="B",
        unit_scale=True,  # SI prefixes, so "MB/s" means 10**6 bytes a second
        leave=False,  # the result line replaces the bar
        file=sys.stderr,
        mininterval=0.2,
    ) as bar:
        yield bar.update


def _width() -> dict[str, object]:
    """Follow resizes, except on a tty that reports no size (`script` without a terminal, some
    consoles): tqdm then draws nothing at all, so use $COLUMNS/$LINES or 80x24."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except OSError:
        size = os.terminal_size((0, 0))
    if size.columns and size.lines:
        return {"dynamic_ncols": True}
    fallback = shutil.get_terminal_size()
    return {"ncols": fallback.columns, "nrows": fallback.lines}
