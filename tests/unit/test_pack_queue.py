"""The pack queue (vfs/watcher.py) on trio, without a mount: settle, open handles, rsync temp
names, failures and retries, files changed or replaced while packing, the switch-then-delete
order, status counts. Time is moved by ageing an item's clock, never by waiting for it."""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from vfs.decant import TEMP_PREFIX
from vfs.decant.packer import PackOptions
from vfs.ingest.queue import Item, PackQueue
from vfs.ingest.spool import Published, Spool

SETTLE = 5.0
TEMP = ".x.csv.Ab12Cd"  # rsync's temp name for x.csv


class HookedSpool(Spool):
    """A real spool whose publish can fail on demand, or run `during` before it and `after` it
    (in the worker thread, where trio.from_thread reaches the queue as a FUSE handler would)."""

    def __init__(self, src: Path, files: Path) -> None:
        super().__init__(src, files)
        self.fail: set[str] = set()
        self.during: Callable[[str], None] | None = None
        self.after: Callable[[str], None] | None = None
        self.calls: list[str] = []

    def publish(self, relpath: str, pack_all: bool, options: PackOptions) -> Published:
        self.calls.append(relpath)
        if self.during is not None:
            self.during(relpath)
        if relpath in self.fail:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path(relpath)))
        published = super().publish(relpath, pack_all, options)
        if self.after is not None:
            self.after(relpath)
        return published


@pytest.fixture
def spool(src: Path) -> HookedSpool:
    return HookedSpool(src, src / ".decant-spool" / "files")


@pytest.fixture
def queue(spool: HookedSpool) -> PackQueue:
    return PackQueue([spool], SETTLE, PackOptions())


def drop(spool: Spool, relpath: str, data: bytes = b"a,b\n1,2\n") -> Path:
    path = spool.path(relpath)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def run(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return trio.run(fn, *args)


def item_of(queue: PackQueue, relpath: str, k: int = 0) -> Item:
    return queue.items[(k, relpath)]


def age(item: Item, seconds: float) -> None:
    item.changed_at -= seconds


def ready(queue: PackQueue) -> list[str]:
    return sorted(item.relpath for item in queue._ready())


def pack(queue: PackQueue, relpath: str, k: int = 0) -> None:
    item = queue.items[(k, relpath)]
    item.state = "packing"
    run(queue._pack, item)


# -- when a file is ready --------------------------------------------------------------------


def test_a_file_is_packed_once_settled_then_unspooled(
    queue: PackQueue, spool: HookedSpool, src: Path
) -> None:
    drop(spool, "d/x.csv")
    run(queue._poll)
    assert queue.status() == {"queued": 1, "packing": 0, "failed": [], "done": 0}
    assert ready(queue) == []
    age(item_of(queue, "d/x.csv"), SETTLE)
    assert ready(queue) == ["d/x.csv"]

    pack(queue, "d/x.csv")
    assert (src / "d" / "x.csv").read_bytes() == b"a,b\n1,2\n"
    assert spool.walk() == {}
    assert queue.status() == {"queued": 0, "packing": 0, "failed": [], "done": 1}


def test_a_change_restarts_the_settle_clock(queue: PackQueue, spool: HookedSpool) -> None:
    path = drop(spool, "x.csv")
    run(queue._poll)
    age(item_of(queue, "x.csv"), SETTLE)
    path.write_bytes(b"longer content now")  # noticed by the next look at the spool
    run(queue._poll)
    assert ready(queue) == []
    age(item_of(queue, "x.csv"), SETTLE)
    queue.touch("x.csv")  # a write through the mount
    assert ready(queue) == []


def test_open_handles_hold_a_file_back(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    run(queue._poll)
    age(item_of(queue, "x.csv"), 10 * SETTLE)
    queue.opened("x.csv")
    queue.opened("x.csv")
    queue.closed("x.csv")
    assert ready(queue) == []
    queue.closed("x.csv")
    assert ready(queue) == ["x.csv"]
    assert queue.open_counts == {}


def test_temp_names_wait_for_their_rename(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, TEMP)
    queue.touch(TEMP)
    queue.opened(TEMP)
    age(item_of(queue, TEMP), 10 * SETTLE - 1)
    queue.closed(TEMP)
    assert ready(queue) == []  # settled, but a rename may still come

    queue.opened(TEMP)
    spool.rename(TEMP, "x.csv")
    queue.renamed(TEMP, "x.csv")
    assert queue.open_counts == {"x.csv": 1}  # the handle moved with the name
    assert set(queue.items) == {(0, "x.csv")}
    queue.closed("x.csv")
    assert ready(queue) == []  # a rename restarts the clock
    age(item_of(queue, "x.csv"), SETTLE)
    assert ready(queue) == ["x.csv"]


def test_a_temp_name_never_renamed_is_packed_eventually(
    queue: PackQueue, spool: HookedSpool
) -> None:
    drop(spool, TEMP)
    run(queue._poll)
    age(item_of(queue, TEMP), 60.0 + 10 * SETTLE)
    assert ready(queue) == [TEMP]


def test_unlink_drops_the_item(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    queue.touch("x.csv")
    spool.remove("x.csv")
    queue.removed("x.csv")
    assert queue.items == {}


# -- failures --------------------------------------------------------------------------------


def test_a_failure_is_reported_kept_spooled_and_retried(
    queue: PackQueue, spool: HookedSpool, src: Path
) -> None:
    drop(spool, "x.csv")
    spool.fail.add("x.csv")
    run(queue._poll)
    age(item_of(queue, "x.csv"), SETTLE)
    pack(queue, "x.csv")

    doc = queue.status()
    assert (doc["queued"], doc["packing"], doc["done"]) == (0, 0, 0)
    (failure,) = doc["failed"]
    assert failure["path"] == "x.csv"
    assert "No space left on device" in failure["reason"] and "x.csv" in failure["reason"]
    assert spool.path("x.csv").is_file() and not (src / "x.csv").exists()
    assert ready(queue) == []  # not before its retry time

    item_of(queue, "x.csv").retry_at = 0.0
    spool.fail.clear()
    assert ready(queue) == ["x.csv"]
    pack(queue, "x.csv")
    assert queue.status() == {"queued": 0, "packing": 0, "failed": [], "done": 1}
    assert (src / "x.csv").is_file()


def test_a_change_to_a_failed_file_queues_it_again(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    spool.fail.add("x.csv")
    run(queue._poll)
    age(item_of(queue, "x.csv"), SETTLE)
    pack(queue, "x.csv")
    assert item_of(queue, "x.csv").state == "failed"
    queue.touch("x.csv")  # e.g. an operator's touch through the mount after fixing the cause
    assert item_of(queue, "x.csv").state == "queued" and queue.status()["failed"] == []


def test_an_unexpected_error_never_escapes_the_queue(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    run(queue._poll)
    item = item_of(queue, "x.csv")

    async def broken(relpath: str) -> None:
        raise RuntimeError("the mount went away")

    queue.on_published = broken
    item.state = "packing"
    run(queue._pack_guarded, item)
    assert item.state == "failed" and "the mount went away" in item.reason
    assert spool.path("x.csv").is_file()


# -- changes while packing -------------------------------------------------------------------


def test_a_file_written_while_packing_is_packed_again(queue: PackQueue, spool: HookedSpool) -> None:
    path = drop(spool, "x.csv")
    run(queue._poll)

    def write_meanwhile(relpath: str) -> None:
        path.write_bytes(b"newer bytes")
        trio.from_thread.run_sync(queue.touch, relpath)

    spool.during = write_meanwhile
    pack(queue, "x.csv")
    assert path.read_bytes() == b"newer bytes"
    assert item_of(queue, "x.csv").state == "queued" and queue.done == 0


@pytest.mark.parametrize("told", [True, False], ids=["queue-told", "queue-not-told-yet"])
def test_a_file_renamed_over_while_packing_is_never_deleted(
    queue: PackQueue, spool: HookedSpool, src: Path, told: bool
) -> None:
    """rsync renames its next copy over a name whose older copy is being packed: the newer
    spooled file must survive the older one's clean-up (whether or not the FUSE handler has
    told the queue yet)."""
    drop(spool, "x.csv", b"old")
    run(queue._poll)

    def rsync_meanwhile(relpath: str) -> None:  # after the old bytes were published
        if spool.calls.count(relpath) > 1:
            return
        drop(spool, TEMP, b"new")
        os.replace(spool.path(TEMP), spool.path("x.csv"))
        if told:
            trio.from_thread.run_sync(queue.renamed, TEMP, "x.csv")

    spool.after = rsync_meanwhile
    pack(queue, "x.csv")
    assert (src / "x.csv").read_bytes() == b"old"
    assert spool.path("x.csv").read_bytes() == b"new"
    assert item_of(queue, "x.csv").state == "queued" and queue.done == 0

    age(item_of(queue, "x.csv"), SETTLE)
    pack(queue, "x.csv")
    assert (src / "x.csv").read_bytes() == b"new" and spool.walk() == {}


def test_the_mount_switches_before_the_spooled_copy_goes(
    queue: PackQueue, spool: HookedSpool, src: Path
) -> None:
    drop(spool, "d/x.csv")
    run(queue._poll)
    seen: list[tuple[str, bool, bool, bool]] = []

    async def published(relpath: str) -> None:
        seen.append((relpath, relpath in queue.publishing, spool.path(relpath).is_file(),
                     (src / relpath).is_file()))  # fmt: skip

    queue.on_published = published
    pack(queue, "d/x.csv")
    assert seen == [("d/x.csv", True, True, True)]
    assert queue.publishing == set() and spool.walk() == {}


def test_a_file_opened_during_the_switch_stays_spooled(
    queue: PackQueue, spool: HookedSpool
) -> None:
    drop(spool, "x.csv")
    run(queue._poll)

    async def published(relpath: str) -> None:
        queue.opened(relpath)  # a reader opened the spooled file just before the switch

    queue.on_published = published
    pack(queue, "x.csv")
    assert spool.path("x.csv").is_file() and item_of(queue, "x.csv").state == "queued"


# -- the spool tree, inboxes and the loop ----------------------------------------------------


def test_poll_finds_inbox_files_and_drops_vanished_ones(
    spool: HookedSpool, src: Path, tmp_path: Path
) -> None:
    inbox = HookedSpool(src, tmp_path / "inbox")
    queue = PackQueue([spool, inbox], SETTLE, PackOptions())
    drop(inbox, "run1/a.csv")
    drop(spool, "b.csv")
    run(queue._poll)
    assert set(queue.items) == {(1, "run1/a.csv"), (0, "b.csv")}
    age(item_of(queue, "run1/a.csv", 1), SETTLE)
    pack(queue, "run1/a.csv", 1)
    assert (src / "run1" / "a.csv").is_file() and inbox.walk() == {}
    spool.path("b.csv").unlink()
    run(queue._poll)
    assert queue.items == {}


def test_a_walk_overtaken_by_a_publish_adds_nothing(queue: PackQueue, spool: HookedSpool) -> None:
    """A file listed by a walk that a publish then removed must not come back as new work."""
    drop(spool, "x.csv")
    walk = spool.walk

    def walk_then_publish() -> dict[str, os.stat_result]:
        listed = walk()
        queue.removals += 1  # as _pack does after deleting a spooled copy
        return listed

    spool.walk = walk_then_publish  # type: ignore[method-assign]
    run(queue._poll)
    assert queue.items == {}
    spool.walk = walk  # type: ignore[method-assign]
    run(queue._poll)
    assert set(queue.items) == {(0, "x.csv")}


def test_status_counts_each_state(queue: PackQueue, spool: HookedSpool) -> None:
    for name, state in (("a", "queued"), ("b", "queued"), ("c", "packing"), ("d", "failed")):
        queue.items[(0, name)] = Item(spool, name, state=state, reason=f"why {name}")
    queue.items[(0, "c")].started = True
    queue.items[(0, "e")] = Item(spool, "e", state="packing")  # dispatched, no worker free yet
    queue.done = 7
    assert queue.status() == {
        "queued": 3,
        "packing": 1,
        "failed": [{"path": "d", "reason": "why d"}],
        "done": 7,
    }


def test_run_clears_crash_leftovers_then_packs_everything(
    spool: HookedSpool, src: Path, corpus: dict[str, Path]
) -> None:
    orphan = src / f"{TEMP_PREFIX}1-ab-x.tif.zarr.zip"
    orphan.write_bytes(b"half an archive")
    spool.staging.mkdir(parents=True)
    staged = spool.staging / f"{TEMP_PREFIX}2-cd-y.tif.zarr.zip"
    staged.write_bytes(b"half")
    drop(spool, "a.tif", corpus["zstack_u16.tif"].read_bytes())
    drop(spool, "sub/b.csv")
    queue = PackQueue([spool], 0.05, PackOptions(), workers=2)

    async def main() -> None:
        with trio.fail_after(60):  # a guard against hanging, not a timing check
            async with trio.open_nursery() as nursery:
                nursery.start_soon(queue.run, src, src / ".decant-spool")
                while queue.done < 2:
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert not orphan.exists() and not staged.exists()
    assert sorted(os.listdir(src)) == [".decant-spool", "a.tif.zarr.zip", "sub"]
    assert (src / "sub" / "b.csv").is_file() and spool.walk() == {}
    assert queue.status() == {"queued": 0, "packing": 0, "failed": [], "done": 2}


@pytest.mark.parametrize("how", ["unlinked", "renamed"])
def test_a_file_gone_while_packing_does_not_reappear(
    queue: PackQueue, spool: HookedSpool, src: Path, how: str
) -> None:
    """Deleting (or renaming away) a file while it packs: its name must not come back as an
    archive once the pack finishes; a renamed file is packed under its new name."""
    drop(spool, "x.csv", b"bytes")
    run(queue._poll)

    def user_meanwhile(relpath: str) -> None:
        if how == "unlinked":
            spool.remove(relpath)
            trio.from_thread.run_sync(queue.removed, relpath)
        else:
            spool.rename(relpath, "y.csv")
            trio.from_thread.run_sync(queue.renamed, relpath, "y.csv")

    spool.after = user_meanwhile
    pack(queue, "x.csv")
    assert not (src / "x.csv").exists()
    assert spool.calls == ["x.csv"]
    if how == "renamed":
        spool.after = None
        age(item_of(queue, "y.csv"), SETTLE)
        pack(queue, "y.csv")
        assert (src / "y.csv").read_bytes() == b"bytes" and spool.walk() == {}
