"""How deep the SRC watcher goes (vfs.mount.watch): a walk that neither recursed nor stopped
ended the watch for the whole mount when one user made a folder 3,000 levels deep."""

from __future__ import annotations

import os
from pathlib import Path

from tests.toolbox import make_chain, remove_chain
from vfs.mount.watch import WATCH_DEPTH, _folders_changed, real_folders, watched_at


def test_real_folders_stops_at_the_watch_depth_without_recursing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "link").symlink_to(src / "a")
    make_chain(src, "d", 1200)  # os.walk: RecursionError past ~1,000 levels
    try:
        found = real_folders(src, set())
        chain = [f for f in found if f.relative_to(src).parts[:1] == ("d",)]
        assert len(chain) == WATCH_DEPTH  # d at level 1 .. WATCH_DEPTH
        assert max(len(f.parts) - len(src.parts) for f in found) == WATCH_DEPTH
        assert {src, src / "a", src / "a" / "b"} <= set(found)
        assert src / "link" not in found
        assert set(real_folders(src, {src / "d"})) == {src, src / "a", src / "a" / "b"}
    finally:
        remove_chain(src, "d")


def test_a_new_folder_below_the_watch_depth_does_not_restart_the_watch(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    last = make_chain(src, "d", WATCH_DEPTH)
    try:
        watched = set(real_folders(src, set()))
        assert last in watched and watched_at(src, last) and not watched_at(src, last / "e")
        (last / "e").mkdir()  # reported by the watch of `last`, never watched itself
        assert not _folders_changed(src, {last / "e"}, watched, set())
        (last.parent / "f").mkdir()  # within the depth: watch it
        assert _folders_changed(src, {last.parent / "f"}, watched, set())
        assert watched_at(src, last.parent, below=1) and not watched_at(src, last, below=1)
    finally:
        os.rmdir(last / "e")
        os.rmdir(last.parent / "f")
        remove_chain(src, "d")
