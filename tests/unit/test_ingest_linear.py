"""Ingest into one folder costs the same per file whatever the folder holds (issue 12): rsync's
requests for each file (lookups, create, write, release, setattr, rename over its temp name),
listings going stale, and publishes between them, counted in filesystem calls (lstat, stat,
open, entries read by scandir) for a small and a ten times larger folder. Work that grows with
the folder (a rescan per create or publish, a listing rebuilt per name) makes the larger
folder's calls per file grow with it; counts, not times, so a loaded machine cannot fail it."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyfuse3
import pytest

from tests.unit.inprocess import FakeSetattrFields, InProcessMount, fake_session

PUBLISH_EVERY = 20  # files written between two passes of the pack queue
CLOCK_EVERY = 10  # files between two steps of the clock past the listing's rescan interval


class _CountingScandir:
    def __init__(self, it: Any, counts: Counter[str]) -> None:
        self._it, self._counts = it, counts

    def __enter__(self) -> _CountingScandir:
        self._it.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._it.__exit__(*exc)

    def __iter__(self) -> Iterator[os.DirEntry[str]]:
        for entry in self._it:
            self._counts["scandir entries"] += 1
            yield entry


def _counting(monkeypatch: pytest.MonkeyPatch, counts: Counter[str]) -> None:
    for name in ("lstat", "stat", "open"):
        real = getattr(os, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            counts[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(os, name, counted)
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda *a: _CountingScandir(real_scandir(*a), counts))


def _ingest(tmp_path: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls made while rsync's requests put `n` files into one folder (published meanwhile)."""
    src = tmp_path / f"src-{n}"
    src.mkdir()
    counts: Counter[str] = Counter()
    with fake_session() as session, monkeypatch.context() as patch:
        m = InProcessMount(src, tmp_path / f"work-{n}")
        ctx = m.ctx

        async def rsync() -> None:
            folder = await m.mkdir("run")
            _counting(patch, counts)
            for i in range(n):
                name, temp = f"rec{i:06d}.csv", f".rec{i:06d}.csv.Ab12Cd"
                for looked_up in (name, temp):  # both missing: negative entries
                    await m.ops.lookup(folder, looked_up.encode(), ctx)
                fh, ino = await m.create(folder, temp)
                await m.ops.write(fh, 0, b"x" * 1024)
                await m.ops.release(fh)
                attr = pyfuse3.EntryAttributes()
                attr.st_mode, attr.st_mtime_ns, attr.st_atime_ns = 0o100644, 10**18, 10**18
                fields = FakeSetattrFields(update_mode=True, update_mtime=True, update_atime=True)
                await m.ops.setattr(ino, attr, fields, None, ctx)  # type: ignore[arg-type]
                await m.ops.getattr(ino, ctx)
                await m.ops.lookup(folder, name.encode(), ctx)  # the rename's target
                await m.ops.rename(folder, temp.encode(), folder, name.encode(), 0, ctx)
                if i % CLOCK_EVERY == CLOCK_EVERY - 1:
                    session.clock.advance(1.5)  # listings go stale: stamps are checked again
                if i % PUBLISH_EVERY == PUBLISH_EVERY - 1:
                    await m.publish_all()
            patch.undo()
            assert sorted(await m.listdir("run")) == [f"rec{i:06d}.csv" for i in range(n)]

        m.run(rsync)
    return counts


def test_ingest_into_one_folder_costs_the_same_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, large = 40, 400
    few, many = _ingest(tmp_path, small, monkeypatch), _ingest(tmp_path, large, monkeypatch)
    for what in ("lstat", "stat", "open", "scandir entries"):
        per_file_small, per_file_large = few[what] / small, many[what] / large
        # Linear work: the same calls per file (a little slack for the publish passes'
        # fixed costs). Work that grows with the folder is ~10x more per file here.
        assert per_file_large <= 1.5 * per_file_small + 1, (what, dict(few), dict(many))
