"""The mount's switch from a spooled file to its published file, in-process (no kernel): a
handler that was waiting in a worker thread when the switch happened must not undo it, and the
inode the kernel holds keeps serving the same bytes."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio

from vfs.cache import PageCache
from vfs.ingest.writeside import WriteSide
from vfs.mount.config import MountConfig
from vfs.mount.daemon import build_tree, build_write_side
from vfs.mount.ops import DecantOperations


class Ctx:
    uid = gid = 0
    pid = os.getpid()
    umask = 0o022


@pytest.fixture
def ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DecantOperations:
    monkeypatch.setattr(pyfuse3, "invalidate_entry_async", lambda *a, **k: None)
    src = tmp_path / "src"
    src.mkdir()
    config = MountConfig(src=src, mnt=tmp_path / "mnt", index_dir=tmp_path / "index",
                         settle=600.0, watch=False)  # fmt: skip
    tree = build_tree(config, PageCache(1 << 20))
    queue = build_write_side(config, tree)
    assert queue is not None and tree.spool is not None
    writer = WriteSide(src, tree.spool, False, queue.guard)
    made = DecantOperations(tree, config, writer, queue)
    queue.on_published = made.published
    return made


async def new_file(ops: DecantOperations, name: bytes, data: bytes) -> int:
    await ops.opendir(1, Ctx())  # type: ignore[arg-type]  # the root is listed
    info, attr = await ops.create(1, name, stat.S_IFREG | 0o644, os.O_RDWR, Ctx())  # type: ignore[arg-type]
    await ops.write(info.fh, 0, data)
    await ops.release(info.fh)
    return int(attr.st_ino)


def publish(ops: DecantOperations, relpath: str) -> Any:
    """What the pack queue does for one plain file, step by step."""
    queue = ops.queue
    assert queue is not None
    published = queue.spool.publish(relpath, False, None)
    queue.publishing.add(relpath)
    return published


def test_a_getattr_waiting_in_a_thread_does_not_undo_the_switch(ops: DecantOperations) -> None:
    gate, entered = threading.Event(), threading.Event()
    assert ops.writer is not None
    real_refresh = ops.writer.refresh

    def slow_refresh(node: Any) -> Any:
        entered.set()
        gate.wait(10)
        return real_refresh(node)

    async def main() -> None:
        ino = await new_file(ops, b"x.csv", b"a,b\n")
        ops._quick.until = float("inf")  # as if the disk had stalled: calls go to threads
        ops.writer.refresh = slow_refresh  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.getattr, ino, Ctx())
            await trio.to_thread.run_sync(entered.wait, 10)
            published = publish(ops, "x.csv")  # meanwhile: the queue publishes it
            await ops.published(["x.csv"])
            assert ops.queue is not None
            ops.queue.spool.remove("x.csv", published.signature)
            ops.queue.publishing.discard("x.csv")
            gate.set()
        node = ops.inodes.get(ino)
        assert node is not None and not node.spooled  # still the published file
        info = await ops.open(ino, os.O_RDONLY, Ctx())  # type: ignore[arg-type]
        assert await ops.read(info.fh, 0, 100) == b"a,b\n"
        await ops.release(info.fh)

    trio.run(main)


def test_a_first_listing_read_during_a_publish_does_not_miss_the_file(
    ops: DecantOperations,
) -> None:
    """The folder's listing is being read for the first time (the kernel had forgotten it)
    while a file in it is published: the listing, having seen SRC before the publish and the
    spool after it, must not be taken (it would miss the file for good). It is read before
    the folder's lock is taken (`_prescan`), and the publish's word, under the lock, voids
    it: read again under the lock, it shows the file."""
    spooled_seen, release = threading.Event(), threading.Event()
    real_spooled = ops.tree._spooled

    def gated(folder: Path) -> Any:
        spooled_seen.set()  # SRC has been listed, the spool not yet
        release.wait(10)
        return real_spooled(folder)

    async def main() -> None:
        await ops.opendir(1, Ctx())  # type: ignore[arg-type]
        attr = await ops.mkdir(1, b"d", stat.S_IFDIR | 0o755, Ctx())  # type: ignore[arg-type]
        info, _ = await ops.create(attr.st_ino, b"x.csv", stat.S_IFREG | 0o644, os.O_RDWR,
                                   Ctx())  # type: ignore[arg-type]  # fmt: skip
        await ops.write(info.fh, 0, b"1,2\n")
        await ops.release(info.fh)
        ops.inodes.folders.pop(attr.st_ino)  # forgotten: the next look reads it afresh
        ops.tree._spooled = gated  # type: ignore[method-assign]
        ops._quick.until = float("inf")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.opendir, attr.st_ino, Ctx())
            await trio.to_thread.run_sync(spooled_seen.wait, 10)
            real = ops.tree.root / "d"
            before = os.stat(real)
            published = publish(ops, "d/x.csv")
            # As the queue leaves it (and within one tick of the clock, as it may): the
            # folder's stamp tells nothing, only the publish's word under the lock does.
            os.utime(real, ns=(before.st_atime_ns, before.st_mtime_ns))
            nursery.start_soon(ops.published, ["d/x.csv"])
            await trio.sleep(0.2)  # as the queue would go on to unspool it
            assert ops.queue is not None
            release.set()
        ops.queue.spool.remove("d/x.csv", published.signature)
        ops.queue.publishing.discard("d/x.csv")
        listing = ops.inodes.folders[attr.st_ino]
        assert "x.csv" in listing.children and not listing.children["x.csv"].spooled

    trio.run(main)


def test_a_rescan_between_a_publish_and_its_word_keeps_the_inode(ops: DecantOperations) -> None:
    """The watcher sees SRC change and the folder is rescanned after the file left the spool
    but before the queue reports the publish: the published file must keep the inode the
    kernel holds (it looked the name up before), not come back under a new one."""

    async def main() -> None:
        ino = await new_file(ops, b"x.csv", b"a,b\n")
        published = publish(ops, "x.csv")
        assert ops.queue is not None
        ops.queue.spool.remove("x.csv", published.signature)
        ops.queue.publishing.discard("x.csv")
        await ops.rescan(1, force=True)  # the watcher's rescan comes first
        await ops.published(["x.csv"])  # then the queue's word
        entry = await ops.lookup(1, b"x.csv", Ctx())  # type: ignore[arg-type]
        assert entry.st_ino == ino
        node = ops.inodes.get(ino)
        assert node is not None and not node.spooled
        info = await ops.open(ino, os.O_RDONLY, Ctx())  # type: ignore[arg-type]
        assert await ops.read(info.fh, 0, 100) == b"a,b\n"
        await ops.release(info.fh)

    trio.run(main)
