"""vfs/ingest/publish.py: what a publish checks under the placing lock, so a file renamed or
deleted through the mount while it is published never loses another file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vfs.ingest.publish import SourceChangedError, attempt, place, retract
from vfs.ingest.spool import Spool


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    src = tmp_path / "src"
    src.mkdir()
    return Spool(src, src / ".decant-spool" / "files")


def _spooled(spool: Spool, rel: str, data: bytes) -> os.stat_result:
    path = spool.path(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path.stat()


def _staged(spool: Spool, data: bytes) -> Path:
    spool.staging.mkdir(parents=True, exist_ok=True)
    staged = spool.staging / "built"
    staged.write_bytes(data)
    return staged


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_place_changes_nothing_when_its_source_went_meanwhile(spool: Spool, how: str) -> None:
    """x was spooled over a published x, and packing began; then a real file was renamed
    over x through the mount (the spooled x deleted) or x was written again."""
    st = _spooled(spool, "x", b"spooled")
    real = spool.src / "x"
    real.write_bytes(b"renamed over it")
    if how == "deleted":
        spool.path("x").unlink()
    else:
        spool.path("x").unlink()
        _spooled(spool, "x", b"written again")
    staged = _staged(spool, b"archive")
    error = FileNotFoundError if how == "deleted" else SourceChangedError
    with pytest.raises(error):
        place(spool, staged, spool.src / "x.zarr.zip", real, source=("x", st))
    assert real.read_bytes() == b"renamed over it"
    assert not (spool.src / "x.zarr.zip").exists()


def test_a_changed_source_is_tried_again_not_failed(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _spooled(spool, "x", b"data")

    def changed(*_args: object, **_kw: object) -> None:
        raise SourceChangedError(spool.path("x"))

    monkeypatch.setattr(spool, "publish", changed)
    outcome = attempt(spool, "x", False, None, 0.0)
    assert outcome.kind == "unsettled" and outcome.wait > 0


def test_retract_leaves_a_file_renamed_over_what_was_placed(spool: Spool) -> None:
    st = _spooled(spool, "x", b"spooled")
    target = spool.src / "x"
    placed = place(spool, _staged(spool, b"published"), target, spool.src / "x.zarr.zip",
                   source=("x", st))  # fmt: skip
    (spool.src / "y").write_bytes(b"renamed over it")
    os.replace(spool.src / "y", target)
    retract(spool, target, placed)
    assert target.read_bytes() == b"renamed over it"
    os.replace(_staged(spool, b"published"), target)
    retract(spool, target, (target.stat().st_dev, target.stat().st_ino))
    assert not target.exists()
    assert list(spool.staging.iterdir()) == []


def test_an_older_file_replaced_by_a_publish_is_freed_outside_the_lock(spool: Spool) -> None:
    """Its blocks are freed after the placing lock is released (handlers wait for the lock),
    and nothing is left in staging."""
    st = _spooled(spool, "x.csv", b"new")
    (spool.src / "x.csv").write_bytes(b"old" * 1000)
    published = spool.publish("x.csv", False, None)
    assert published.mode == "plain"
    assert (spool.src / "x.csv").read_bytes() == b"new"
    assert os.path.samestat((spool.src / "x.csv").stat(), spool.path("x.csv").stat())
    assert st.st_ino == published.placed[1]
    assert list(spool.staging.iterdir()) == []


def _ident(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_dev, st.st_ino


def test_place_replaces_only_what_the_writer_was_shown(spool: Spool) -> None:
    """x was created through the mount with nothing at x or x.zarr.zip; another user's file
    there since is neither replaced nor set aside. A file shown when it was renamed over is."""
    st = _spooled(spool, "x", b"spooled")
    spool.allow_replacing("x", frozenset())
    theirs = spool.src / "x.zarr.zip"
    theirs.write_bytes(b"another user's archive")
    with pytest.raises(FileExistsError, match="written through the mount; not replaced"):
        place(spool, _staged(spool, b"built"), spool.src / "x", theirs, source=("x", st))
    assert theirs.read_bytes() == b"another user's archive"
    assert not (spool.src / "x").exists()
    spool.allow_replacing("x", frozenset({_ident(theirs)}))  # shown under x at a rename
    place(spool, _staged(spool, b"built"), spool.src / "x", theirs, source=("x", st))
    assert (spool.src / "x").read_bytes() == b"built" and not theirs.exists()
    # Its own copy, published again after a change, is no one else's.
    st = _spooled(spool, "x", b"spooled again")
    place(spool, _staged(spool, b"rebuilt"), spool.src / "x", theirs, source=("x", st))
    assert (spool.src / "x").read_bytes() == b"rebuilt"


def test_what_may_be_replaced_moves_with_a_renamed_folder(spool: Spool) -> None:
    _spooled(spool, "d/a", b"a")
    spool.allow_replacing("d/a", frozenset({(1, 2)}))
    spool.allow_replacing("dx", frozenset({(3, 4)}))
    spool.rename("d", "e")
    assert spool.may_replace("e/a") == {(1, 2)}
    assert spool.may_replace("d/a") is None and spool.may_replace("dx") == {(3, 4)}
    spool.rename("e/a", "e/b", frozenset())
    assert spool.may_replace("e/b") == frozenset() and spool.may_replace("e/a") is None
    spool.discard("e/b")
    assert spool.may_replace("e/b") is None
