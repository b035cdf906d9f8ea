"""RacyArchives (vfs/mount/racy.py) with a fake clock: which descriptions are racy, when they
are due, and that one owner's files never push another owner's out (red team 48b: a user who
kept 10,050 files racy emptied the shared book, and root's archive stayed shown raw)."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.mount import racy
from vfs.mount.racy import RacyArchives

S = 1_000_000_000
NOW = 1_800_000_000 * S


@pytest.fixture(autouse=True)
def _window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(racy, "RACY_NS", 2 * S)  # the unit conftest turns it off


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


def stat_of(mtime_ns: int, uid: int = 0, mode: int = stat.S_IFREG | 0o644) -> Any:
    return SimpleNamespace(st_mode=mode, st_mtime_ns=mtime_ns, st_uid=uid)


def test_a_file_written_within_the_window_is_racy_and_due_after_it() -> None:
    clock = Clock()
    book = RacyArchives(clock=clock)
    path = Path("/src/d/x.tif.zarr.zip")
    assert book.note(path, stat_of(NOW - S // 2), (1,))
    assert not book.due(path, (1,), 0)
    assert book.take_due() == {}
    clock.now += 2 * S
    assert book.due(path, (1,), 0)
    assert not book.due(path, (2,), 0)  # another version: not the one described racy
    assert not book.due(path, (1,), 1000)  # another owner's file at that path
    assert book.take_due() == {Path("/src/d"): {"x.tif.zarr.zip"}}
    assert book.take_due() == {}  # handed out once


def test_old_mtimes_folders_and_mtimes_set_in_the_future_are_not_racy() -> None:
    book = RacyArchives(clock=Clock())
    path = Path("/src/x.zarr.zip")
    assert not book.note(path, stat_of(NOW - 3 * S), (1,))
    assert not book.note(path, stat_of(NOW, mode=stat.S_IFDIR | 0o755), (1,))
    assert not book.note(path, stat_of(NOW + 3 * S), (1,))  # `touch -d 2033`: set, not written
    assert book.note(path, stat_of(NOW + S), (1,))  # a clock a little behind the file's


def test_a_description_trusted_later_forgets_the_racy_one() -> None:
    clock = Clock()
    book = RacyArchives(clock=clock)
    path = Path("/src/x.zarr.zip")
    assert book.note(path, stat_of(NOW), (1,))
    clock.now += 3 * S
    assert not book.note(path, stat_of(NOW), (1,))
    assert not book.due(path, (1,), 0)


def test_one_owner_filling_the_book_leaves_another_owner_s_archives() -> None:
    clock = Clock()
    book = RacyArchives(per_owner=100, clock=clock)
    mine = Path("/src/v/x.tif.zarr.zip")
    assert book.note(mine, stat_of(NOW, uid=0), (7,))
    for i in range(1000):
        book.note(Path(f"/src/u/j{i}.tif.zarr.zip"), stat_of(NOW, uid=1000), (i,))
    clock.now += 2 * S
    assert book.due(mine, (7,), 0)
    due = book.take_due()
    assert due[Path("/src/v")] == {"x.tif.zarr.zip"}
    assert len(due[Path("/src/u")]) <= 100


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(-8, 3)),
        max_size=200,
    )
)
def test_an_owner_within_its_bound_loses_nothing(notes: list[tuple[int, int, int]]) -> None:
    """Whatever other owners note, every racy note of an owner who noted fewer paths than the
    bound is handed out exactly once, when due, under its folder."""
    clock = Clock()
    book = RacyArchives(per_owner=8, clock=clock)
    noted: dict[int, set[Path]] = {}
    for uid, name, seconds in notes:
        path = Path(f"/src/{uid}/a{name}.zarr.zip")
        if book.note(path, stat_of(NOW + seconds * S // 2, uid=uid), (name,)):
            noted.setdefault(uid, set()).add(path)
    clock.now += 4 * S
    handed = [folder / name for folder, names in book.take_due().items() for name in names]
    assert len(handed) == len(set(handed))
    for paths in noted.values():
        if len(paths) < 8:
            assert paths <= set(handed)
    assert book.take_due() == {}
