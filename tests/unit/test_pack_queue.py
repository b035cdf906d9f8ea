"""The pack queue (vfs/ingest/queue.py) on trio, without a mount: settle, open handles, rsync
temp names (never published; stale ones deleted), batches, failures and back-off, waiting for
space, files changed or replaced while publishing, the switch-then-delete order, walks, status.
Time is moved by ageing an item's clock, never by waiting for it."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from vfs.decant import TEMP_PREFIX
from vfs.decant.packer import PackOptions
from vfs.ingest.publish import NoSpaceError, Published
from vfs.ingest.queue import Item, PackQueue, folder_archives_of
from vfs.ingest.spool import Spool

SETTLE = 5.0
TEMP = ".x.csv.Ab12Cd"  # rsync's temp name for x.csv


class HookedSpool(Spool):
    """A real spool whose publish can fail on demand, or run `during` before it and `after` it
    (in the worker thread, where trio.from_thread reaches the queue as a FUSE handler would)."""

    def __init__(self, src: Path, files: Path) -> None:
        super().__init__(src, files)
        self.fail: set[str] = set()
        self.full: set[str] = set()
        self.during: Callable[[str], None] | None = None
        self.after: Callable[[str], None] | None = None
        self.calls: list[str] = []

    def publish(self, relpath: str, pack_all: bool, options: Any, *args: Any,
                **kwargs: Any) -> Published:  # fmt: skip
        self.calls.append(relpath)
        if self.during is not None:
            self.during(relpath)
        if relpath in self.fail:
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), str(self.src / relpath))
        if relpath in self.full:
            raise NoSpaceError(f"needs about 9.0 MiB free to pack; 1.0 MiB free on {self.src}")
        published = super().publish(relpath, pack_all, options, *args, **kwargs)
        if self.after is not None:
            self.after(relpath)
        return published


@pytest.fixture
def spool(src: Path) -> HookedSpool:
    return HookedSpool(src, src / ".decant-spool" / "files")


@pytest.fixture
def queue(spool: HookedSpool) -> PackQueue:
    q = PackQueue([spool], SETTLE, PackOptions())
    q.disk_settle = 0.0  # files dropped by the tests are seconds old, not SETTLE
    return q


def drop(spool: Spool, relpath: str, data: bytes = b"a,b\n1,2\n") -> Path:
    path = spool.path(relpath)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def run(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return trio.run(fn, *args)


def walk(queue: PackQueue) -> None:
    run(queue._walk)


def item_of(queue: PackQueue, relpath: str, k: int = 0) -> Item:
    return queue.items[(k, relpath)]


def age(queue: PackQueue, item: Item, seconds: float) -> None:
    """As if `seconds` had passed since its last change."""
    item.changed_at -= seconds
    queue._schedule(item, item.changed_at + queue.settle)


def ready(queue: PackQueue) -> list[str]:
    """What the loop would hand to a worker now (left in the timetable for the next call)."""
    found = queue._ready()
    for item in found:
        queue._schedule(item, float("-inf"))
    return sorted(item.relpath for item in found)


def retry_now(queue: PackQueue, item: Item) -> None:
    item.retry_at = 0.0
    queue._schedule(item, 0.0)


def pack(queue: PackQueue, *relpaths: str, k: int = 0) -> None:
    """One batch of these items through a worker and the bookkeeping after it."""
    batch = [queue.items[(k, r)] for r in relpaths]
    for item in batch:
        item.state = "packing"
    queue._active += 1
    run(queue._run_batch, batch)


def counts(queue: PackQueue) -> tuple[int, int, int, int]:
    doc = queue.status()
    return doc["queued"], doc["packing"], len(doc["failed"]), doc["done"]


# -- when a file is ready --------------------------------------------------------------------


def test_a_file_is_published_once_settled_then_unspooled(
    queue: PackQueue, spool: HookedSpool, src: Path
) -> None:
    path = drop(spool, "d/x.csv")
    queue.touch("d/x.csv")  # written through the mount
    assert counts(queue) == (1, 0, 0, 0)
    assert ready(queue) == []
    age(queue, item_of(queue, "d/x.csv"), SETTLE)
    assert ready(queue) == ["d/x.csv"]

    pack(queue, "d/x.csv")
    assert (src / "d" / "x.csv").read_bytes() == b"a,b\n1,2\n"
    assert not path.exists() and spool.walk() == {}
    assert counts(queue) == (0, 0, 0, 1) and queue.items == {}


def test_a_folder_archive_is_announced_once_nothing_below_it_waits(
    queue: PackQueue, spool: HookedSpool
) -> None:
    """Its files are announced in their own folders as they go; the `NAME.zarr` folder
    itself (shown then as its original) only with the last of them, and not while a file
    below it is open or queued."""
    announced: list[list[str]] = []

    async def heard(relpaths: list[str]) -> None:
        announced.append(sorted(relpaths))

    queue.on_published = heard
    for rel in ("d/x.tif.zarr/.decant/manifest.json", "d/x.tif.zarr/0/0.0.0", "d/y.csv"):
        drop(spool, rel)
        queue.touch(rel)
    queue.opened("d/x.tif.zarr/0/1.0.0")
    pack(queue, "d/x.tif.zarr/.decant/manifest.json", "d/y.csv")
    assert not any("d/x.tif.zarr" in batch for batch in announced)
    queue.closed("d/x.tif.zarr/0/1.0.0")
    pack(queue, "d/x.tif.zarr/0/0.0.0")
    assert "d/x.tif.zarr" in announced[-1]
    assert folder_archives_of(["a.zarr/b.zarr/c", "e/f.zarr", "g/h.zarr/i/j"]) == {
        "a.zarr", "g/h.zarr"
    }  # fmt: skip


def test_a_change_restarts_the_settle_clock(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    queue.touch("x.csv")
    age(queue, item_of(queue, "x.csv"), SETTLE)
    queue.touch("x.csv")  # a write through the mount
    assert ready(queue) == []
    age(queue, item_of(queue, "x.csv"), SETTLE)
    assert ready(queue) == ["x.csv"]


def test_a_file_found_by_a_walk_must_also_have_settled_on_disk(
    spool: HookedSpool, src: Path
) -> None:
    """Dropped into the spool by other means: its writer tells the queue nothing, so the
    file's own ctime must be `settle` old before it is published."""
    queue = PackQueue([spool], SETTLE, PackOptions())
    drop(spool, "x.csv")
    walk(queue)
    item = item_of(queue, "x.csv")
    age(queue, item, SETTLE)
    pack(queue, "x.csv")  # the queue's clock says settled, the file's ctime does not
    assert item.state == "queued" and not (src / "x.csv").exists()
    assert ready(queue) == [] and item.retry_at > item.started_at + 4


def test_open_handles_hold_a_file_back(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    queue.touch("x.csv")
    age(queue, item_of(queue, "x.csv"), 10 * SETTLE)
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
    age(queue, item_of(queue, TEMP), 100 * SETTLE)
    queue.closed(TEMP)
    assert ready(queue) == []  # settled, but only a rename makes it data
    assert queue.status()["temp"] == 1 and counts(queue) == (0, 0, 0, 0)

    queue.opened(TEMP)
    spool.rename(TEMP, "x.csv")
    queue.renamed(TEMP, "x.csv")
    assert queue.open_counts == {"x.csv": 1}  # the handle moved with the name
    assert set(queue.items) == {(0, "x.csv")}
    queue.closed("x.csv")
    assert ready(queue) == []  # a rename restarts the clock
    age(queue, item_of(queue, "x.csv"), SETTLE)
    assert ready(queue) == ["x.csv"]


def test_a_temp_file_is_never_published_and_goes_once_stale(
    spool: HookedSpool, src: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What a killed rsync leaves: kept spooled (visible) until unchanged for --stale-temp,
    then deleted; never archived or moved into SRC."""
    drop(spool, TEMP, b"the first 12.8 MiB of 64")
    drop(spool, "sub/.y.tif.Qw3rTy", b"II*\x00 partial")
    queue = PackQueue([spool], SETTLE, PackOptions(), stale_temp=3600.0)
    shown: list[list[str]] = []

    async def published(relpaths: list[str]) -> None:
        shown.append(relpaths)

    queue.on_published = published
    run(queue._walk, True)  # as at start, after a crash
    assert ready(queue) == [] and queue.status()["temp"] == 2
    run(queue._sweep_temps)
    assert spool.path(TEMP).is_file()  # not stale yet: its ctime is now

    queue.stale_temp = 0.0
    caplog.set_level(logging.WARNING)
    run(queue._sweep_temps)
    assert spool.walk() == {} and queue.items == {} and spool.calls == []
    assert sorted(os.listdir(src)) == [".decant-spool"]
    assert shown == [[TEMP, "sub/.y.tif.Qw3rTy"]] or sorted(shown[0]) == sorted(
        [TEMP, "sub/.y.tif.Qw3rTy"])  # fmt: skip
    assert sum("deleted, never published" in r.getMessage() for r in caplog.records) == 2


def test_an_open_temp_file_is_not_stale(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, TEMP)
    queue.touch(TEMP)
    queue.opened(TEMP)
    queue.stale_temp = 0.0
    item_of(queue, TEMP).changed_at -= 1.0
    run(queue._sweep_temps)
    assert spool.path(TEMP).is_file()


def test_unlink_drops_the_item(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    queue.touch("x.csv")
    spool.remove("x.csv")
    queue.removed("x.csv")
    assert queue.items == {} and ready(queue) == []


def test_a_renamed_folder_takes_its_spooled_files_along(
    queue: PackQueue, spool: HookedSpool
) -> None:
    for rel in ("a/x.csv", "a/b/y.csv", "ab/z.csv"):
        drop(spool, rel)
        queue.touch(rel)
    queue.opened("a/b/y.csv")
    queue.renamed_folder("a", "c")
    assert sorted(k[1] for k in queue.items) == ["ab/z.csv", "c/b/y.csv", "c/x.csv"]
    assert queue.open_counts == {"c/b/y.csv": 1}


# -- batches ---------------------------------------------------------------------------------


def test_many_files_go_to_a_worker_as_one_batch_and_one_switch(
    queue: PackQueue, spool: HookedSpool, src: Path
) -> None:
    names = [f"d{i % 3}/f{i:03d}.csv" for i in range(120)]
    for name in names:
        drop(spool, name, name.encode())
        queue.touch(name)
        age(queue, item_of(queue, name), SETTLE)
    switches: list[int] = []

    async def published(relpaths: list[str]) -> None:
        switches.append(len(relpaths))

    queue.on_published = published
    batch = queue._ready()
    assert len(batch) == 120
    for item in batch:
        item.state = "packing"
    queue._active += 1
    run(queue._run_batch, batch)
    assert switches == [120] and queue.done == 120 and spool.walk() == {}
    assert all((src / n).read_bytes() == n.encode() for n in names)


def test_a_batch_hands_back_what_it_did_not_start_when_stopping(
    queue: PackQueue, spool: HookedSpool, src: Path
) -> None:
    for name in ("a.csv", "b.csv", "c.csv"):
        drop(spool, name)
        queue.touch(name)

    def stop_after_first(relpath: str) -> None:
        queue.stop()

    spool.after = stop_after_first
    pack(queue, "a.csv", "b.csv", "c.csv")
    assert spool.calls == ["a.csv"] and (src / "a.csv").is_file()
    assert {item_of(queue, n).state for n in ("b.csv", "c.csv")} == {"queued"}


# -- failures and space ----------------------------------------------------------------------


def test_a_failure_is_reported_kept_spooled_and_retried_with_back_off(
    queue: PackQueue, spool: HookedSpool, src: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    drop(spool, "x.csv")
    spool.fail.add("x.csv")
    queue.touch("x.csv")
    pack(queue, "x.csv")

    doc = queue.status()
    assert (doc["queued"], doc["packing"], doc["done"]) == (0, 0, 0)
    (failure,) = doc["failed"]
    assert failure["path"] == "x.csv" and "Is a directory" in failure["reason"]
    assert spool.path("x.csv").is_file() and not (src / "x.csv").exists()
    age(queue, item_of(queue, "x.csv"), SETTLE)
    assert ready(queue) == []  # not before its retry time
    first = item_of(queue, "x.csv").retry_at

    retry_now(queue, item_of(queue, "x.csv"))
    assert ready(queue) == ["x.csv"]
    pack(queue, "x.csv")  # fails again: a longer wait, no second log line
    assert item_of(queue, "x.csv").retry_at - first > 25
    assert sum("not published, stays spooled" in r.getMessage() for r in caplog.records) == 1

    retry_now(queue, item_of(queue, "x.csv"))
    spool.fail.clear()
    pack(queue, "x.csv")
    assert counts(queue) == (0, 0, 0, 1) and (src / "x.csv").is_file()


def test_the_first_retry_waits_retry_after_then_doubles(spool: HookedSpool) -> None:
    """--retry-after: how long a failed publish waits before its first retry."""
    queue = PackQueue([spool], SETTLE, PackOptions(), retry_after=4.0)
    queue.disk_settle = 0.0
    drop(spool, "x.csv")
    spool.fail.add("x.csv")
    queue.touch("x.csv")
    waits = []
    for _ in range(3):
        retry_now(queue, item_of(queue, "x.csv"))
        pack(queue, "x.csv")
        item = item_of(queue, "x.csv")
        waits.append(item.retry_at - time.monotonic())
    assert [round(w) for w in waits] == [4, 8, 16]


def test_a_failed_file_held_open_at_its_retry_is_retried_once_closed(
    queue: PackQueue, spool: HookedSpool
) -> None:
    drop(spool, "x.csv")
    spool.fail.add("x.csv")
    queue.touch("x.csv")
    pack(queue, "x.csv")
    item = item_of(queue, "x.csv")
    age(queue, item, SETTLE)
    queue.opened("x.csv")  # a reader has it open when its retry comes
    retry_now(queue, item)
    assert ready(queue) == []
    queue.closed("x.csv")
    assert ready(queue) == ["x.csv"]


def test_a_change_to_a_failed_file_queues_it_again(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    spool.fail.add("x.csv")
    queue.touch("x.csv")
    pack(queue, "x.csv")
    assert item_of(queue, "x.csv").state == "failed"
    queue.touch("x.csv")  # e.g. an operator's touch through the mount after fixing the cause
    assert item_of(queue, "x.csv").state == "queued" and queue.status()["failed"] == []
    age(queue, item_of(queue, "x.csv"), SETTLE)
    assert ready(queue) == ["x.csv"]


def test_no_space_waits_with_back_off_and_resumes_when_space_is_freed(
    queue: PackQueue, spool: HookedSpool, src: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for name in ("big.tif", "other.tif"):
        drop(spool, name)
        queue.touch(name)
        age(queue, item_of(queue, name), SETTLE)
    spool.full.update({"big.tif", "other.tif"})
    pack(queue, "big.tif", "other.tif")
    doc = queue.status()
    assert doc["failed"] == [] and doc["queued"] == 2
    assert [w["path"] for w in doc["waiting_for_space"]] == ["big.tif", "other.tif"]
    assert "needs about 9.0 MiB" in doc["waiting_for_space"][0]["reason"]
    assert ready(queue) == []  # backing off, not retrying every tick
    first = queue._space_backoff
    queue._space_at = 0.0
    for name in ("big.tif", "other.tif"):
        queue._schedule(item_of(queue, name), 0.0)
    pack(queue, *ready(queue))
    assert queue._space_backoff == 2 * first  # longer each time
    waits = [r for r in caplog.records if "waiting for space" in r.getMessage()]
    assert len(waits) == 1 and "big.tif" in waits[0].getMessage()

    spool.full.clear()
    queue.removed("something-deleted.bin")  # a delete through the mount frees space
    assert ready(queue) == ["big.tif", "other.tif"]
    pack(queue, "big.tif", "other.tif")
    assert queue.done == 2 and queue._space_backoff == 0.0
    assert any("room again" in r.getMessage() for r in caplog.records)


def test_an_unexpected_error_never_escapes_the_queue(queue: PackQueue, spool: HookedSpool) -> None:
    drop(spool, "x.csv")
    queue.touch("x.csv")

    async def broken(relpaths: list[str]) -> None:
        raise RuntimeError("the mount went away")

    queue.on_published = broken
    pack(queue, "x.csv")
    item = item_of(queue, "x.csv")
    assert item.state == "failed" and "the mount went away" in item.reason
    assert spool.path("x.csv").is_file() and queue.publishing == set()


# -- changes while publishing ----------------------------------------------------------------


def test_a_file_written_while_publishing_is_published_again(
    queue: PackQueue, spool: HookedSpool
) -> None:
    path = drop(spool, "x.csv")
    queue.touch("x.csv")

    def write_meanwhile(relpath: str) -> None:
        path.write_bytes(b"newer bytes")
        trio.from_thread.run_sync(queue.touch, relpath)

    spool.during = write_meanwhile
    pack(queue, "x.csv")
    assert path.read_bytes() == b"newer bytes"
    assert item_of(queue, "x.csv").state == "queued" and queue.done == 0


def test_a_file_written_while_its_pack_failed_is_queued_again_not_failed(
    queue: PackQueue, spool: HookedSpool, caplog: pytest.LogCaptureFixture
) -> None:
    """A pack that fails because the file changed under it (its archive no longer matches the
    spooled bytes) is not a failure of the file: no error, no back-off; the newer bytes settle
    and are packed. A 4 KiB write into a TIFF being packed once cost a 30 s wait."""
    caplog.set_level(logging.ERROR)
    path = drop(spool, "x.csv")
    queue.touch("x.csv")
    spool.fail.add("x.csv")

    def write_meanwhile(relpath: str) -> None:
        path.write_bytes(b"newer bytes")
        trio.from_thread.run_sync(queue.touch, relpath)

    spool.during = write_meanwhile
    pack(queue, "x.csv")
    item = item_of(queue, "x.csv")
    assert (item.state, item.failures, queue.status()["failed"]) == ("queued", 0, [])
    assert not any("not published" in r.getMessage() for r in caplog.records)
    spool.during = None
    spool.fail.clear()
    age(queue, item, SETTLE)
    assert ready(queue) == ["x.csv"]  # once settled, not after a back-off
    pack(queue, "x.csv")
    assert queue.done == 1 and (spool.src / "x.csv").read_bytes() == b"newer bytes"


@pytest.mark.parametrize("told", [True, False], ids=["queue-told", "queue-not-told-yet"])
def test_a_file_renamed_over_while_publishing_is_never_deleted(
    queue: PackQueue, spool: HookedSpool, src: Path, told: bool
) -> None:
    """rsync renames its next copy over a name whose older copy is being published: the newer
    spooled file must survive the older one's clean-up (whether or not the FUSE handler has
    told the queue yet)."""
    drop(spool, "x.csv", b"old")
    queue.touch("x.csv")

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

    age(queue, item_of(queue, "x.csv"), SETTLE)
    pack(queue, "x.csv")
    assert (src / "x.csv").read_bytes() == b"new" and spool.walk() == {}


def test_the_mount_switches_before_the_spooled_copy_goes(
    queue: PackQueue, spool: HookedSpool, src: Path
) -> None:
    drop(spool, "d/x.csv")
    queue.touch("d/x.csv")
    seen: list[tuple[str, bool, bool, bool]] = []

    async def published(relpaths: list[str]) -> None:
        for relpath in relpaths:
            seen.append((relpath, relpath in queue.publishing, spool.path(relpath).is_file(),
                         (src / relpath).is_file()))  # fmt: skip

    queue.on_published = published
    pack(queue, "d/x.csv")
    assert seen == [("d/x.csv", True, True, True)]
    assert queue.publishing == set() and spool.walk() == {}


def test_a_file_opened_during_the_switch_stays_spooled_and_shown(
    queue: PackQueue, spool: HookedSpool
) -> None:
    drop(spool, "x.csv")
    queue.touch("x.csv")
    calls: list[list[str]] = []

    async def published(relpaths: list[str]) -> None:
        calls.append(relpaths)
        queue.opened("x.csv")  # a reader opened the spooled file just before the switch

    queue.on_published = published
    pack(queue, "x.csv")
    assert spool.path("x.csv").is_file() and item_of(queue, "x.csv").state == "queued"
    assert calls == [["x.csv"], ["x.csv"]]  # switched, then shown spooled again


@pytest.mark.parametrize("how", ["unlinked", "renamed"])
def test_a_file_gone_while_publishing_does_not_reappear(
    queue: PackQueue, spool: HookedSpool, src: Path, how: str
) -> None:
    """Deleting (or renaming away) a file while it is published: its name must not come back
    (a renamed file is published under its new name)."""
    drop(spool, "x.csv", b"bytes")
    queue.touch("x.csv")

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
        age(queue, item_of(queue, "y.csv"), SETTLE)
        pack(queue, "y.csv")
        assert (src / "y.csv").read_bytes() == b"bytes" and spool.walk() == {}


# -- walks, the loop, status -----------------------------------------------------------------


def test_a_walk_finds_inbox_files_and_drops_vanished_ones(
    spool: HookedSpool, src: Path, tmp_path: Path
) -> None:
    inbox = HookedSpool(src, tmp_path / "inbox")
    queue = PackQueue([spool, inbox], SETTLE, PackOptions())
    queue.disk_settle = 0.0
    drop(inbox, "run1/a.csv")
    drop(spool, "b.csv")
    walk(queue)
    assert set(queue.items) == {(1, "run1/a.csv"), (0, "b.csv")}
    age(queue, item_of(queue, "run1/a.csv", 1), SETTLE)
    pack(queue, "run1/a.csv", k=1)
    assert (src / "run1" / "a.csv").is_file() and inbox.walk() == {}
    spool.path("b.csv").unlink()
    walk(queue)
    assert queue.items == {}


def test_a_walk_overtaken_by_a_publish_adds_nothing(queue: PackQueue, spool: HookedSpool) -> None:
    """A file listed by a walk that a publish then removed must not come back as new work."""
    drop(spool, "x.csv")
    real_walk = spool.walk

    def walk_then_publish() -> dict[str, os.stat_result]:
        listed = real_walk()
        queue._gone[(0, "x.csv")] = float("inf")  # as _forget does after unspooling it
        return listed

    spool.walk = walk_then_publish  # type: ignore[method-assign]
    walk(queue)
    assert queue.items == {}
    spool.walk = real_walk  # type: ignore[method-assign]
    queue._gone.clear()
    walk(queue)
    assert set(queue.items) == {(0, "x.csv")}


def test_status_counts_each_state(queue: PackQueue, spool: HookedSpool) -> None:
    states = (("a", "queued"), ("b", "queued"), ("c", "packing"), ("d", "failed"),
              ("f", "space"), (".g.csv.Ab12Cd", "temp"))  # fmt: skip
    for name, state in states:
        queue.items[(0, name)] = Item(spool, name, state=state, reason=f"why {name}")
    queue.items[(0, "c")].started = True
    queue.items[(0, "e")] = Item(spool, "e", state="packing")  # dispatched, no worker yet
    queue.done = 7
    assert queue.status() == {
        "queued": 4,
        "packing": 1,
        "failed": [{"path": "d", "reason": "why d"}],
        "done": 7,
        "waiting_for_space": [{"path": "f", "reason": "why f"}],
        "temp": 1,
    }


def test_run_clears_crash_leftovers_then_publishes_everything(
    spool: HookedSpool, src: Path, corpus: dict[str, Path]
) -> None:
    orphan = src / f"{TEMP_PREFIX}1-0123abcd-x.tif.zarr.zip"
    orphan.write_bytes(b"half an archive")
    spool.staging.mkdir(parents=True)
    staged = spool.staging / f"{TEMP_PREFIX}2-cd-y.tif.zarr.zip"
    staged.write_bytes(b"half")
    drop(spool, "a.tif", corpus["zstack_u16.tif"].read_bytes())
    drop(spool, "sub/b.csv")
    drop(spool, TEMP)  # a partial rsync temp file: stays
    queue = PackQueue([spool], 0.05, PackOptions(), workers=2)
    queue.disk_settle = 0.0

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
    assert (src / "sub" / "b.csv").is_file() and sorted(spool.walk()) == [TEMP]
    assert counts(queue) == (0, 0, 0, 2) and queue.status()["temp"] == 1
    assert queue.cancel.is_set()  # the loop's end tells running publishes to stop


def test_stop_reaches_a_publish_running_in_a_worker_thread(spool: HookedSpool, src: Path) -> None:
    """Unmount and SIGTERM cancel the loop: a worker thread in the middle of a publish sees
    the event at its next block and gives up, so the daemon is not held up."""
    drop(spool, "x.csv")
    queue = PackQueue([spool], 0.0, PackOptions())
    queue.disk_settle = 0.0
    entered, seen = threading.Event(), threading.Event()

    def block_until_cancelled(relpath: str) -> None:
        entered.set()
        if queue.cancel.wait(30):  # a publish's block loop checks the same event
            seen.set()

    spool.during = block_until_cancelled

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.run, src, src / ".decant-spool")
            await trio.to_thread.run_sync(entered.wait, 30)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen.is_set()
