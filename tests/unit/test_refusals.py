"""Refusals: a failed file version refused until its deadline (a bucket's), or for good."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from vfs.mount.refusals import Refusals


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_lapses_at_its_deadline_and_one_for_good_does_not() -> None:
    clock = Clock()
    bad = Refusals(10, clock)
    bad.add("bucket", 30.0)
    bad.add("local", math.inf)
    clock.now += 29.9
    assert "bucket" in bad and "local" in bad and len(bad) == 2
    clock.now += 0.1
    assert "bucket" not in bad and "local" in bad
    assert list(bad) == ["local"] and len(bad) == 1
    clock.now += 1e9
    assert "local" in bad
    bad.discard("local")
    assert "local" not in bad and not bad


def test_a_refusal_noted_again_takes_the_new_deadline() -> None:
    clock = Clock()
    bad = Refusals(10, clock)
    bad.add("k", 5.0)
    clock.now += 4
    bad.add("k", 5.0)
    clock.now += 4
    assert "k" in bad


@given(st.lists(st.tuples(st.integers(0, 50), st.floats(0.5, 100)), max_size=200))
def test_it_never_holds_more_than_its_limit_and_agrees_with_a_model(
    adds: list[tuple[int, float]],
) -> None:
    clock = Clock()
    bad = Refusals(16, clock)
    model: dict[int, float] = {}
    for key, hold in adds:
        if len(model) >= 16:
            model.clear()
        model[key] = clock.now + hold
        bad.add(key, hold)
        clock.now += 1.0
        assert len(bad._until) <= 16
        assert sorted(bad) == sorted(k for k, until in model.items() if until > clock.now)
