"""Hostile archives beside good ones in a real mount: the daemon stays up and small, good files
read byte-exact, a hostile archive is shown raw (with one log line) or its reads fail with EIO."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.toolbox import load_tool, proc_status

GOOD_D = "imagej_hyperstack_tzc_u16.tif"
GOOD_V = "zlib_u16.tif"
RSS_LIMIT_KIB = 600 * 1024
READ_FAILS = {"husk-bomb-in-small-chunk"}  # describe cannot tell; the read that decodes does


@pytest.fixture
def hostile_src(
    mount_corpus: tuple[Path, Path], tmp_path: Path
) -> tuple[Path, Path, dict[str, Path]]:
    originals, corpus_src = mount_corpus
    src = tmp_path / "src"
    shutil.copytree(corpus_src, src)
    made = load_tool("fuzz").headline_cases(
        src / f"{GOOD_D}.zarr.zip", src / f"{GOOD_V}.zarr.zip", src / "hostile"
    )
    return originals, src, made


def read_fully(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def test_hostile_archives_beside_good_ones(make_mount, hostile_src) -> None:  # type: ignore[no-untyped-def]
    originals, src, made = hostile_src
    m = make_mount(src, "--read-only", "--cache-size", "64M")
    assert m.proc is not None
    shown = {p.name for p in (m.mnt / "hostile").iterdir()}

    errors: list[str] = []

    def hammer(case: str, archive: Path) -> None:
        raw_view = m.mnt / "hostile" / archive.name
        try:
            if case in READ_FAILS:
                assert GOOD_D in shown  # presented under its original name, unreadable
                with pytest.raises(OSError) as info:
                    read_fully(m.mnt / "hostile" / GOOD_D)
                assert info.value.errno == errno.EIO
            else:
                assert archive.name in shown, (case, shown)  # refused at describe: shown raw
                assert read_fully(raw_view) == archive.read_bytes()
        except BaseException as exc:  # collected for the main thread's assert
            errors.append(f"{case}: {exc!r}")

    threads = [threading.Thread(target=hammer, args=item) for item in made.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

    for path in sorted(originals.iterdir()):  # good files, after the hostile ones were tried
        got = hashlib.sha256(read_fully(m.mnt / path.name)).hexdigest()
        assert got == hashlib.sha256(path.read_bytes()).hexdigest(), path.name

    log = m.log_text()
    for case, archive in made.items():
        if case not in READ_FAILS:
            lines = [line for line in log.splitlines() if archive.name in line]
            assert any("shown as the raw file" in line for line in lines), (case, log[-2000:])
    assert m.proc.poll() is None, "the daemon exited"
    hwm = proc_status(m.proc.pid, "VmHWM") >> 10  # KiB
    print(f"daemon VmHWM {hwm >> 10} MiB")
    assert hwm < RSS_LIMIT_KIB, f"daemon peak RSS {hwm >> 10} MiB"
    assert os.listdir(m.mnt)  # still serving
