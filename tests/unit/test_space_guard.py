"""vfs/ingest/space.py: the free-space reserve the write side keeps (--min-free)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from vfs.ingest import space
from vfs.ingest.space import SpaceGuard, default_min_free


def test_the_default_reserve_is_256_mib_or_5_percent(tmp_path: Path) -> None:
    found = default_min_free(tmp_path)
    assert 0 < found <= 256 << 20


def test_writes_are_admitted_down_to_the_reserve_then_refused_once_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    free = {"now": 10 << 20}
    monkeypatch.setattr(space, "free_bytes", lambda path: free["now"])
    guard = SpaceGuard(tmp_path, min_free=4 << 20)
    caplog.set_level(logging.INFO)
    assert guard.admit(5 << 20)  # 10 → 5 MiB estimated
    assert guard.admit(1 << 20)  # 4 MiB: at the reserve
    assert guard.admit(1)  # near it the filesystem is asked again: 10 MiB really free
    free["now"] = 3 << 20  # the disk filled up meanwhile (another writer)...
    monkeypatch.setattr(space, "REFRESH", 0.0)  # ... and the estimate is REFRESH s old
    assert not guard.admit(0) and not guard.admit(0) and guard.refusing
    assert guard.status() == {"free": 3 << 20, "min_free": 4 << 20, "refusing_writes": True,
                              "refused": 2}  # fmt: skip
    free["now"] = 8 << 20  # something was deleted
    assert guard.admit(4096) and not guard.refusing
    messages = [r.getMessage() for r in caplog.records]
    assert sum("refused" in m for m in messages) == 1 and sum("again" in m for m in messages) == 1


def test_a_write_that_would_cross_the_reserve_is_refused_smaller_ones_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(space, "free_bytes", lambda path: 5 << 20)
    monkeypatch.setattr(space, "REFRESH", 0.0)
    guard = SpaceGuard(tmp_path, min_free=4 << 20)
    assert not guard.admit(2 << 20) and guard.refusing
    assert guard.admit(4096)  # still above the reserve
    assert guard.refusing  # until there is room for what was refused


def test_the_status_says_writes_are_refused_before_one_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the reserve the status said "refusing_writes": false until a write was refused
    (red team 44 F4)."""
    monkeypatch.setattr(space, "free_bytes", lambda path: 3 << 20)
    guard = SpaceGuard(tmp_path, min_free=4 << 20)
    assert guard.status()["refusing_writes"] and guard.refused == 0
