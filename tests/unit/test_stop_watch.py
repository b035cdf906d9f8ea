"""The stop watch exits only when a stop outlives its grace, and detaches only its own mount."""

from __future__ import annotations

import threading
from pathlib import Path

from vfs.mount.stopping import StopWatch, mounted_device


def _watch(grace: float) -> tuple[StopWatch, list[int], list[tuple[Path, str]], threading.Event]:
    exited: list[int] = []
    detached: list[tuple[Path, str]] = []
    called = threading.Event()

    def exit_process(status: int) -> None:
        exited.append(status)
        called.set()

    watch = StopWatch(Path("/mnt/x"), grace, exit_process, lambda m, d: detached.append((m, d)))
    return watch, exited, detached, called


def test_a_stop_that_outlives_its_grace_detaches_the_mount_and_exits_with_the_status() -> None:
    watch, exited, detached, called = _watch(0.05)
    watch._device = "0:99"
    watch.arm(1, ["a.tif"])
    watch.arm(0, [])  # armed once: the first stop's status holds
    assert called.wait(5)
    assert exited == [1] and detached == [(Path("/mnt/x"), "0:99")]


def test_a_stop_that_completes_within_its_grace_exits_nothing() -> None:
    watch, exited, detached, called = _watch(0.3)
    watch.arm(0, [])
    watch.done()
    assert not called.wait(0.6)
    assert exited == [] and detached == []


def test_an_unmounted_mount_is_not_detached_and_no_device_is_guessed(tmp_path: Path) -> None:
    assert mounted_device(tmp_path / "nothing-mounted-here") is None
    watch, exited, detached, called = _watch(0.05)
    watch.mnt = tmp_path
    watch.mounted()
    assert watch._device is None
    watch.arm(0, [])
    assert called.wait(5)
    assert exited == [0] and detached == []
