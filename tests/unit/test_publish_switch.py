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
