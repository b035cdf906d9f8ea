"""QuickCalls (vfs/mount/ops.py): small spool syscalls run inline while fast, and go to worker
threads for a while once several calls in a row slept in the kernel. What the event loop runs
itself is a few lstats, never an archive's description (see the last test)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tifffile
import trio

from tests.unit.inprocess import InProcessMount, fake_session
from vfs.decant.packer import pack_file
from vfs.mount import ops
from vfs.mount.ops import QuickCalls


def test_fast_calls_run_on_the_trio_thread() -> None:
    quick = QuickCalls()

    async def main() -> int | None:
        return await quick(threading.get_ident)  # type: ignore[no-any-return]

    assert trio.run(main) == threading.get_ident()


def test_calls_that_block_go_to_threads_after_a_few(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "QUICK_LIMIT", 0.001)
    quick = QuickCalls()

    def blocking() -> int:
        time.sleep(0.005)  # sleeps in the kernel: a voluntary context switch
        return threading.get_ident()

    def busy() -> int:
        end = time.monotonic() + 0.005
        while time.monotonic() < end:  # slow, but never sleeps: not the disk's fault
            pass
        return threading.get_ident()

    async def main() -> list[bool]:
        here = threading.get_ident()
        inline = [await quick(busy) == here for _ in range(5)]
        inline += [await quick(blocking) == here for _ in range(ops.QUICK_SLOW + 1)]
        return inline

    seen = trio.run(main)
    assert seen[:5] == [True] * 5  # busy calls stay inline
    assert seen[5 : 5 + ops.QUICK_SLOW] == [True] * ops.QUICK_SLOW  # one stall is no pattern
    assert seen[-1] is False  # after QUICK_SLOW stalls: a worker thread
    assert quick.until > time.monotonic()


def test_one_long_stall_is_enough_and_stalls_that_go_on_wait_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ops, "QUICK_STALL", 0.01)
    monkeypatch.setattr(ops, "QUICK_COOLDOWN", 5.0)
    quick = QuickCalls()

    def stalled() -> int:
        time.sleep(0.02)  # one call blocked past QUICK_STALL
        return threading.get_ident()

    async def main() -> tuple[bool, float, bool]:
        here = threading.get_ident()
        inline = await quick(stalled) == here
        first = quick.cooldown
        quick.until = time.monotonic()  # the cooldown is over
        again = await quick(stalled) == here  # and the disk blocks again at once
        return inline, first, again

    inline, first, again = trio.run(main)
    assert inline and again
    assert first == 5.0
    assert quick.cooldown == 10.0  # a longer one
    assert quick.until > time.monotonic() + 5.0


def threads_describing(m: InProcessMount) -> list[str]:
    """The names of the threads that describe an archive from now on, in call order."""
    names: list[str] = []
    for backend in m.tree.backends:
        for method in ("describe", "describe_listed"):  # the latter: a listed version's
            original = getattr(backend, method, None)
            if original is None:
                continue

            def spy(*args: object, original=original) -> object:  # type: ignore[no-untyped-def]
                names.append(threading.current_thread().name)
                return original(*args)

            setattr(backend, method, spy)
    return names


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[InProcessMount]:
    with fake_session():
        src = tmp_path / "src"
        (src / "drop").mkdir(parents=True)
        yield InProcessMount(src, tmp_path, read_only=True)


def test_a_new_archive_s_description_runs_off_the_event_loop(
    mount: InProcessMount, tmp_path: Path
) -> None:
    """The watcher's word of a new name in a listed folder is taken on the trio thread (`_show`:
    a few lstats). An archive among the entries is described, for a big archive not yet in the
    index for seconds, during which every request of every user waited (red team, stop 25)."""
    tif = tmp_path / "scan.tif"
    data = np.random.default_rng(1).integers(0, 60000, (2, 16, 12), dtype=np.uint16)
    tifffile.imwrite(tif, data, photometric="minisblack")
    archive = pack_file(tif, tmp_path / "scan.tif.zarr.zip").archive
    described_on = threads_describing(mount)
    folder = mount.config.src / "drop"

    async def scenario() -> bytes:
        assert await mount.listdir("drop") == []  # listed: the watcher's names reach it
        archive.rename(folder / archive.name)
        await mount.ops.on_names_changed({folder: {archive.name}})
        assert await mount.listdir("drop") == ["scan.tif"]
        return await mount.read_file("drop/scan.tif")

    assert mount.run(scenario) == tif.read_bytes()
    assert described_on, "the archive was never described"
    loop = threading.main_thread().name  # trio.run's own thread
    assert loop not in described_on, described_on


def test_a_rename_of_a_spooled_file_describes_its_archive_off_the_event_loop(
    tmp_path: Path,
) -> None:
    """Renaming a spooled file asks what SRC presents under its name (`_behind`): an archive
    of that name, put in SRC directly, was described on the trio thread too."""
    tif = tmp_path / "f1.tif"
    data = np.random.default_rng(2).integers(0, 60000, (2, 16, 12), dtype=np.uint16)
    tifffile.imwrite(tif, data, photometric="minisblack")
    with fake_session():
        src = tmp_path / "src"
        (src / "drop").mkdir(parents=True)
        m = InProcessMount(src, tmp_path, settle=3600)  # spooled files stay spooled
        described_on = threads_describing(m)

        async def scenario() -> list[str]:
            await m.write_file("drop/f1", b"spooled, not a TIFF\n")
            pack_file(tif, src / "drop" / "f1.zarr.zip")  # in SRC directly, beside it
            await m.rename("drop/f1", "drop/g1")
            return await m.listdir("drop")

        assert "g1" in m.run(scenario)
    assert described_on, "the archive was never described"
    assert threading.main_thread().name not in described_on, described_on
