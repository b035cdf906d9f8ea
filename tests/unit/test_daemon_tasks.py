"""The daemon's background tasks keep a failure to themselves (vfs/mount/daemon.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import trio

from vfs.mount import daemon


def test_a_relist_that_fails_unexpectedly_is_logged_and_the_daemon_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in one bucket folder's listing (round 37c's merge: a TypeError from lstat of an
    object key) escaped `_relist_forever` and stopped the daemon at its first listing."""
    asked: list[int] = []

    async def rescan(ino: int) -> None:
        asked.append(ino)
        raise TypeError("s3://b/p/x.zarr/.decant: an object key, not a local path")

    ops = SimpleNamespace(rescan=rescan)
    with caplog.at_level(logging.ERROR, logger="decant-mount"):
        trio.run(daemon._relist, ops, 1, "s3://b/p")
    assert asked == [1]
    assert "relist of s3://b/p failed unexpectedly" in caplog.text
