"""The daemon killed between two steps of one change to SRC (red team 59): the next start
finishes the change or leaves the state before it, never a mix of both, and never loses a
file's bytes. A kill is an exception raised at that step; a restart is a fresh Spool or mount
over the same SRC."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyfuse3
import pytest

from tests.unit.inprocess import InProcessMount, fake_session
from tests.unit.test_spool import OPTIONS, archived, leftovers, put, sha256, spool
from vfs.decant.packer import PackOptions, pack_file
from vfs.ingest import publish as publish_mod
from vfs.ingest.spool import Spool
from vfs.mount import daemon

__all__ = ["spool"]  # the fixture, from test_spool


class Killed(BaseException):
    """The daemon, killed at this step."""


def kill_at(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
    """The first call of `owner.name` kills the daemon."""
    real = getattr(owner, name)
    calls = []

    def dying(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, dying)


def restarted(src: Path) -> Spool:
    fresh = Spool(src, src / ".decant-spool" / "files")
    fresh.clear_staging()
    return fresh


def own(path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(path, 1234, 5678)  # the writer's, as `put` spools


def test_a_tiff_over_a_published_plain_file_killed_between_its_renames(
    spool: Spool, src: Path, corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the archive took its name and before the plain file it replaces went: the
    restart took the archive as published ("already") and left the plain file, shown with its
    older bytes under the name (the new original under the archive's name), and a second
    `rsync -a` failed with EEXIST."""
    (src / "d").mkdir()
    own(src / "d")
    (src / "d" / "X.tif").write_bytes(b"published before: not a TIFF\n")
    own(src / "d" / "X.tif")
    tif = corpus["striped_i16.tif"]
    put(spool, "d/X.tif", tif)
    with monkeypatch.context() as m:
        kill_at(m, publish_mod, "set_aside")
        with pytest.raises(Killed):
            spool.publish("d/X.tif", False, OPTIONS)
    assert (src / "d" / "X.tif").exists() and (src / "d" / "X.tif.zarr.zip").exists()
    again = restarted(src).publish("d/X.tif", False, OPTIONS)
    assert again.mode == "already"
    assert sorted(p.name for p in (src / "d").iterdir()) == ["X.tif.zarr.zip"]
    assert archived(src / "d" / "X.tif.zarr.zip")[0] == sha256(tif)
    assert leftovers(src) == []


def test_a_plain_file_over_a_published_archive_killed_between_its_steps(
    spool: Spool, src: Path, corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the file was linked at its name and before the archive of the name went:
    the restart left the archive, shown under its archive name with the older bytes, and a
    delete of the name brought them back under it."""
    (src / "d").mkdir()
    own(src / "d")
    archive = src / "d" / "X.tif.zarr.zip"
    pack_file(corpus["striped_i16.tif"], archive, PackOptions())
    own(archive)
    put(spool, "d/X.tif", b"a plain file now\n")
    with monkeypatch.context() as m:
        kill_at(m, publish_mod, "set_aside")
        with pytest.raises(Killed):
            spool.publish("d/X.tif", False, OPTIONS)
    assert (src / "d" / "X.tif").exists() and archive.exists()
    again = restarted(src).publish("d/X.tif", False, OPTIONS)
    assert again.mode == "already"
    assert sorted(p.name for p in (src / "d").iterdir()) == ["X.tif"]
    assert (src / "d" / "X.tif").read_bytes() == b"a plain file now\n"


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[InProcessMount]:
    src = tmp_path / "src"
    src.mkdir()
    with fake_session():
        yield InProcessMount(src, tmp_path / "work", settle=3600.0)


def test_a_published_file_renamed_over_a_spooled_one_killed_midway_keeps_its_bytes(
    mount: InProcessMount, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mv a b`, `a` published, `b` still spooled, killed after SRC's rename and before the
    spooled `b` went: the next start published the spooled `b` over SRC's `b`, which held
    `a`'s bytes: they were gone. Now the spooled file goes first: a kill midway loses only
    what the rename replaces."""
    m, src = mount, mount.config.src
    (src / "d").mkdir()
    (src / "d" / "a").write_bytes(b"AAAA published long ago\n")
    m.run(m.write_file, "d/b", b"BBBB still spooled\n")
    assert m.spooled() and not (src / "d" / "b").exists()
    kill_at(monkeypatch, type(m.tree.spool), "discard")
    with pytest.raises(BaseExceptionGroup) as killed:
        m.run(m.rename, "d/a", "d/b")
    assert killed.group_contains(Killed)
    monkeypatch.undo()
    # Killed after it: `b` holds `a`'s bytes, and no spooled `b` is left to publish over them.
    assert (src / "d" / "b").read_bytes() == b"AAAA published long ago\n"
    assert not (src / "d" / "a").exists() and not m.spooled()
    restarted(src)
    assert sorted(p.name for p in (src / "d").iterdir()) == ["b"]


def test_a_published_file_being_rewritten_stays_undeletable_across_a_restart(
    tmp_path: Path,
) -> None:
    """Without --allow-delete a published file cannot be deleted; opened for writing it moves
    into the spool until it is published again, and its deletion is refused there too. That
    mark was kept in memory only: after a restart, `rm` deleted it (red team 59, F4)."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "p").write_bytes(b"published\n")
    with fake_session():
        first = InProcessMount(src, tmp_path / "w1", allow_delete=False, settle=3600.0)
        first.run(first.write_file, "d/p", b"published, and more\n")
        assert list(first.spooled()) == ["d/p"] and not (src / "d" / "p").exists()
        with pytest.raises(pyfuse3.FUSEError) as refused:
            first.run(first.unlink, "d/p")
        assert refused.value.errno == errno.EPERM
        first.run(first.rename, "d/p", "d/q")  # the mark follows the file
        while daemon._HELD:  # the first daemon exits: its hold on the spool goes
            os.close(daemon._HELD.pop())
        again = InProcessMount(src, tmp_path / "w2", allow_delete=False, settle=3600.0)
        with pytest.raises(pyfuse3.FUSEError) as refused:
            again.run(again.unlink, "d/q")
        assert refused.value.errno == errno.EPERM
        assert again.spool_path("d/q").read_bytes() == b"published, and more\n"
        again.run(again.write_file, "d/new", b"new\n")  # a new file stays deletable
        again.run(again.unlink, "d/new")


def test_a_published_file_moved_to_be_rewritten_is_noted_before_it_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the move into the spool and before the mark was written, the restart let
    its deletion through without --allow-delete (red team 60, F4)."""
    from vfs.ingest.writeside import WriteSide

    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "p").write_bytes(b"published\n")
    with fake_session():
        first = InProcessMount(src, tmp_path / "w1", allow_delete=False, settle=3600.0)
        kill_at(monkeypatch, WriteSide, "_remember_adopted")
        with pytest.raises(BaseExceptionGroup):
            first.run(first.write_file, "d/p", b"more\n")
        monkeypatch.undo()
        assert not (src / "d" / "p").exists()  # moved into the spool
        while daemon._HELD:
            os.close(daemon._HELD.pop())
        again = InProcessMount(src, tmp_path / "w2", allow_delete=False, settle=3600.0)
        with pytest.raises(pyfuse3.FUSEError) as refused:
            again.run(again.unlink, "d/p")
        assert refused.value.errno == errno.EPERM


def test_a_folder_made_again_for_a_spooled_file_is_its_writer_s_and_private(
    spool: Spool, src: Path
) -> None:
    """Its folder gone from SRC (a `mv` of it killed between SRC's rename and the spool's, or
    removed there): made again root's and 0755, a private folder's file was readable by every
    user (red team 60, F3). Now its writer's, 0700; an inbox's (the operator's) as before."""
    put(spool, "u/d/spooled.txt", b"secret\n", mode=0o644)
    published = spool.publish("u/d/spooled.txt", False, OPTIONS)
    assert published.target == src / "u" / "d" / "spooled.txt"
    for folder in (src / "u", src / "u" / "d"):
        st = folder.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700, folder
        if os.geteuid() == 0:
            assert (st.st_uid, st.st_gid) == (1234, 5678), folder
    inbox = Spool(src, src.parent / "inbox", trusted=True)
    put(inbox, "v/x.txt", b"operator's\n")
    os.umask(umask := os.umask(0o022))
    inbox.publish("v/x.txt", False, OPTIONS)
    assert stat.S_IMODE((src / "v").stat().st_mode) == 0o777 & ~umask
