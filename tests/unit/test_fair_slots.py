"""FairSlots: a freed slot goes to the waiting user holding the fewest (red team, round 35b)."""

from __future__ import annotations

import trio
import trio.testing

from vfs.mount.fair import FairSlots


def test_another_user_takes_the_next_free_slot_before_a_queue_of_one_user() -> None:
    order: list[str] = []

    async def main() -> None:
        slots = FairSlots(2)
        release, release_second = trio.Event(), trio.Event()

        async def use(uid: int, name: str, wait: trio.Event | None = None) -> None:
            async with slots.slot(uid):
                order.append(name)
                if wait is not None:
                    await wait.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, 1, "a1", release)
            nursery.start_soon(use, 1, "a2", release_second)
            await trio.testing.wait_all_tasks_blocked()
            for k in range(3, 6):  # queued behind the two held
                nursery.start_soon(use, 1, f"a{k}")
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(use, 2, "b1")
            await trio.testing.wait_all_tasks_blocked()
            assert slots.statistics() == {"busy": 2, "waiting": 4}
            release.set()  # one slot freed: whoever it goes to runs before the other is freed
            await trio.testing.wait_all_tasks_blocked()
            release_second.set()
        assert slots.statistics() == {"busy": 0, "waiting": 0} and slots.held == {}

    trio.run(main)
    assert sorted(order[:2]) == ["a1", "a2"]  # trio starts tasks in no set order
    assert order[2] == "b1", order  # not behind a3-a5
    assert sorted(order[3:]) == ["a3", "a4", "a5"]


def test_one_user_alone_may_hold_every_slot_and_a_cancelled_waiter_gives_nothing_away() -> None:
    async def main() -> None:
        slots = FairSlots(3)
        hold = trio.Event()
        held = 0

        async def use() -> None:
            nonlocal held
            async with slots.slot(7):
                held += 1
                await hold.wait()

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(use)
            await trio.testing.wait_all_tasks_blocked()
            assert held == 3 and slots.busy == 3
            with trio.move_on_after(0.01):
                async with slots.slot(8):
                    raise AssertionError("no slot was free")
            assert slots.statistics() == {"busy": 3, "waiting": 0}
            hold.set()
        assert slots.busy == 0 and slots.held == {}

    trio.run(main)
