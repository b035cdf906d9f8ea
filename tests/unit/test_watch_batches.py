"""The SRC watcher hands inotify changes to the mount without going through anyio: watchfiles'
`awatch` imported anyio's task, socket and stream modules on the event loop, ~25 ms during a
new mount's first requests. Run in a fresh interpreter, so no other test's imports count."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import trio

from tests.toolbox import json_in_child

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from types import SimpleNamespace

    import trio

    from vfs.mount.watch import watch_source

    src = Path(sys.argv[1])
    seen = []

    class Ops:
        config = SimpleNamespace(mnt=src / "mnt")
        watched = True

        async def on_changed(self, folders):
            seen.append(["caught up", sorted(str(f) for f in folders)])

        async def on_names_changed(self, names):
            seen.append(["names", {str(k): sorted(v) for k, v in names.items()}])

    async def main():
        ops = Ops()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_source, ops, src, src / "spool")
            with trio.fail_after(10):
                while not seen:  # the first batch: the watches are in place
                    await trio.sleep(0.01)
                (src / "sub" / "new.txt").write_bytes(b"x")
                while not any(kind == "names" for kind, _ in seen):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert ops.watched

    trio.run(main)
    print(json.dumps({"seen": seen, "anyio": sorted(m for m in sys.modules if "anyio." in m)}))
    """
)


def test_changes_reach_the_mount_without_anyio(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    out = json_in_child(SCRIPT, str(tmp_path))
    assert out["seen"][0] == ["caught up", sorted([str(tmp_path), str(tmp_path / "sub")])]
    assert ["names", {str(tmp_path / "sub"): ["new.txt"]}] in out["seen"]
    assert out["anyio"] == ["anyio._lazyimport"], out["anyio"]  # what `import watchfiles` loads


class FakeNotify:
    """RustNotify's `watch` contract: block until a change, the timeout, or `stop` is set
    (seen within one step); say which."""

    def __init__(self, changes: list[set[tuple[int, str]]]) -> None:
        self.changes = changes
        self.stopped = 0

    def watch(self, _debounce: int, step: int, _timeout: int, stop: threading.Event) -> object:
        if self.changes:
            return self.changes.pop(0)
        if stop.wait(60):  # a real test of "the cancel reached the thread": never times out
            self.stopped += 1
            return "stop"
        return "timeout"


def test_a_watch_that_returns_leaves_stop_unset_and_a_cancel_sets_it() -> None:
    from vfs.mount.watch import _watch_once

    notify, stop = FakeNotify([{(1, "/a")}, {(2, "/b")}]), threading.Event()

    async def main() -> list[object]:
        got = [await _watch_once(notify, stop), await _watch_once(notify, stop)]
        assert not stop.is_set()  # two batches: the watch goes on
        with trio.move_on_after(0.05) as scope:
            got.append(await _watch_once(notify, stop))  # blocks: no change comes
        assert scope.cancelled_caught
        return got

    assert trio.run(main) == [{(1, "/a")}, {(2, "/b")}]
    assert stop.is_set() and notify.stopped == 1  # the thread returned because of the cancel
