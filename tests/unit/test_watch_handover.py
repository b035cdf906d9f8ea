"""The SRC watcher replaced by a new one when folders come or go (vfs.mount.watch): the old one
was closed before the folders were walked again, and a chmod made during that walk was never
heard of; a user making and removing folders in a loop kept that window open, and the mount
showed another user's file with its old bits for as long as the loop ran (red team 72, F3).
Now the old watch is drained once the new one is in place, then closed."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from vfs.mount import watch


class Ops:
    """What the watcher asks of the mount: the folders and names it hands over, recorded."""

    def __init__(self, src: Path) -> None:
        self.config = SimpleNamespace(mnt=src / "mnt")
        self.watched = True
        self.caught: list[set[Path]] = []
        self.heard: list[dict[Path, set[str]]] = []

    async def on_changed(self, folders: set[Path]) -> None:
        self.caught.append(set(folders))

    async def on_names_changed(self, names: dict[Path, set[str]]) -> None:
        self.heard.append({k: set(v) for k, v in names.items()})


def test_a_change_made_while_the_folders_are_walked_again_is_heard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_bytes(b"x")
    ops = Ops(src)
    caught, heard = ops.caught, ops.heard
    walks: list[int] = []
    walking, go_on = threading.Event(), threading.Event()
    real = watch.real_folders

    def slow_second_walk(top: Path, skip: set[Path]) -> list[Path]:
        walks.append(1)
        if len(walks) == 2:
            walking.set()
            go_on.wait(20)
        return real(top, skip)

    monkeypatch.setattr(watch, "real_folders", slow_second_walk)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.watch_source, ops, src, tmp_path / "spool")
            with trio.fail_after(20):
                while not caught:  # the first watch is in place
                    await trio.sleep(0.01)
                (src / "new").mkdir()  # a new folder: the folders are walked again
                while not walking.is_set():
                    await trio.sleep(0.01)
                os.chmod(src / "f.txt", 0o600)  # while they are
                go_on.set()
                while not any("f.txt" in names.get(src, set()) for names in heard):
                    await trio.sleep(0.01)
                while len(caught) < 2:  # and the new watch caught up
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert ops.watched and len(walks) == 2
    assert src / "new" in caught[1]


def test_a_folder_that_became_a_file_before_its_watch_is_walked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 76, F2: a user making `D/E` and replacing `D` with a file in a loop in their
    part of SRC: a folder walked became a file's path before its watch was added, watchfiles
    raised ENOTDIR as a bare OSError (only ENOENT as FileNotFoundError), and the watch of the
    whole mount was turned off for good."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "D").write_bytes(b"a file now")
    ops = Ops(src)
    caught = ops.caught
    walks: list[int] = []
    real = watch.real_folders

    def first_walk_stale(top: Path, skip: set[Path]) -> list[Path]:
        walks.append(1)
        found = real(top, skip)
        return [*found, src / "D" / "E"] if len(walks) == 1 else found  # D/E, as walked

    monkeypatch.setattr(watch, "real_folders", first_walk_stale)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.watch_source, ops, src, tmp_path / "spool")
            with trio.fail_after(20):
                while not caught and ops.watched:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert ops.watched and len(walks) == 2
