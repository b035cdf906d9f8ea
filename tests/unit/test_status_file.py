"""`vfs/mount/status.py`: what a reader of `.decant-status` gets, bounded, current and shared."""

from __future__ import annotations

import json
from typing import Any

import trio

from vfs.mount.status import (
    LIST_BYTES,
    LIST_MAX,
    SPACING,
    StatusFile,
    bounded,
    for_viewer,
    head_part,
    joined,
)


def failures(n: int, name_len: int = 10) -> list[dict[str, str]]:
    return [{"path": f"f{i:05d}" + "q" * name_len, "reason": "why"} for i in range(n)]


def test_a_list_names_at_most_list_max_entries() -> None:
    assert bounded(failures(LIST_MAX + 50)) == failures(LIST_MAX)
    assert bounded(failures(3)) == failures(3)


def test_a_list_names_at_most_list_bytes_of_json() -> None:
    long = [{"path": "\udcff" * 4000, "reason": "why"} for _ in range(LIST_MAX)]  # ~24 KB each
    named = bounded(long)
    assert 0 < len(named) < LIST_MAX
    assert sum(len(json.dumps(e)) for e in named) <= LIST_BYTES


def test_a_reader_gets_its_own_files_counted_and_the_first_named() -> None:
    doc: dict[str, Any] = {"queued": 0, "failed": failures(300), "waiting_for_space": [], "done": 1}
    mine = {e["path"] for e in doc["failed"][::2]}  # every other file is the reader's

    out = for_viewer(doc, 1000, lambda path, uid: uid == 1000 and path in mine)
    assert out["failed_total"] == 150 and len(out["failed"]) == LIST_MAX
    assert {e["path"] for e in out["failed"]} <= mine
    assert out["waiting_for_space"] == [] and out["waiting_for_space_total"] == 0
    assert len(doc["failed"]) == 300  # the snapshot is left as it was

    root = for_viewer(doc, 0, lambda path, uid: False)  # root: every file
    assert root["failed_total"] == 300 and root["failed"] == failures(LIST_MAX)


def test_the_queue_s_part_and_the_counters_read_as_json_would_write_the_whole() -> None:
    head = {"queued": 1, "failed": failures(2), "temp": 0}
    tail = {"space": {"free": 5}, "daemon": {"reads": 3, "errors": {"ENOENT": 1}}}
    whole = (json.dumps({**head, **tail}, indent=1) + "\n").encode()
    got = joined(head_part(json.dumps(head, indent=1)), tail)
    assert got.data() == whole and got.size == len(whole)
    for offset, size in [(0, 7), (len(got.head) - 3, 10), (len(got.head), 4), (5, 10**6)]:
        assert got.read(offset, size) == whole[offset : offset + size]
    assert got.read(got.size, 10) == b""
    empty = joined(head_part("{}"), tail)  # a read-only mount: no queue
    assert empty.data() == (json.dumps(tail, indent=1) + "\n").encode()


class State:
    """A pack queue and counters standing in for the daemon's, and the clocks they run on: a
    gather costs `cost` seconds of the loop's CPU."""

    def __init__(self, cost: float = 0.0) -> None:
        self.changes, self.reads, self.gathered = 0, 0, 0
        self.cost, self.now, self.cpu = cost, 0.0, 0.0

    def head(self) -> dict[str, Any]:
        self.gathered += 1
        self.now += self.cost
        self.cpu += self.cost
        return {"queued": self.changes, "failed": failures(5)}

    def tail(self) -> dict[str, Any]:
        return {"daemon": {"uptime_s": 0.1 * self.gathered, "reads": self.reads}}

    def status(self) -> StatusFile:
        return StatusFile(self.head, self.tail, lambda: self.changes, lambda path, uid: True,
                          clock=lambda: self.now, cpu=lambda: self.cpu)  # fmt: skip


def test_opens_share_one_rendering_while_nothing_changed() -> None:
    """The lookup, getattr and open of one `cat`, and handles opened together: the queue
    gathered once, one bytes object (not a copy per handle)."""
    state = State()

    async def main() -> None:
        status = state.status()
        first = await status.read(1000)
        again = await status.read(1000)
        assert again is first and state.gathered == 1
        other = await status.read(1001)  # another reader: its own rendering of the same gather
        assert other is not first and state.gathered == 1
        state.reads += 1  # a counter moved: the queue's part is still shared
        counted = await status.read(1000)
        assert counted is not first and counted.head is first.head

    trio.run(main)


def test_what_a_reader_reads_is_current() -> None:
    """A change of the queue or of the counters shows at the next read; the queue is gathered
    again only when it changed."""
    state = State()

    async def main() -> None:
        status = state.status()
        first = json.loads((await status.read(1000)).data())
        state.reads += 1
        counted = json.loads((await status.read(1000)).data())
        assert counted["daemon"]["reads"] == first["daemon"]["reads"] + 1
        assert state.gathered == 1  # the queue's part was reused
        state.changes += 1
        changed = json.loads((await status.read(1000)).data())
        assert changed["queued"] == first["queued"] + 1 and state.gathered == 2

    trio.run(main)


def test_a_queue_costly_to_gather_takes_a_bounded_share_of_the_loop() -> None:
    """A user churning temp names (the queue changes before every read) and reading the status
    120 times a second: gathering 50,000 names cost ~9 ms of the loop at each read, so other
    users' requests waited. Gathers are spaced by SPACING times their cost; the change still
    shows once the spacing has passed."""
    state = State(cost=0.009)

    async def main() -> None:
        status = state.status()
        for _ in range(240):  # two seconds of reads
            state.changes += 1
            state.now += 1 / 120
            await status.read(1000)
        spent = state.gathered * state.cost
        assert spent <= state.now / 20 + state.cost, (state.gathered, state.now)  # 5% of the loop
        assert state.gathered >= 2  # not frozen: gathered again after each spacing
        state.now += SPACING * state.cost
        shown = json.loads((await status.read(1001)).data())
        assert shown["queued"] == state.changes

    trio.run(main)
