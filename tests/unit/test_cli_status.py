"""`decant-mount --status MNT`: printed from the status file, with no mount needed here (a
folder holding a `.decant-status` of its own stands in)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def status_at(folder: Path, doc: dict[str, Any]) -> Path:
    (folder / ".decant-status").write_text(json.dumps(doc))
    return folder


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """`decant-mount --status MNT | head -1`: more lines than a pipe holds (an older daemon
    named every failed file), the reader closes after one."""
    failed = [{"path": f"f{i:05d}", "reason": "x" * 60} for i in range(5000)]
    doc = {"queued": 0, "packing": 0, "failed": failed, "done": 0, "waiting_for_space": []}
    cmd = [sys.executable, "-m", "vfs.cli", "--status", str(status_at(tmp_path, doc))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"queued 0, packing 0, failed 5000, done 0\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    proc.wait(timeout=30)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert err == ""


def test_names_print_one_line_each_with_undecodable_bytes_escaped(tmp_path: Path) -> None:
    failed = [{"path": "a\udcffb", "reason": "why"}, {"path": "c\nfailed: forged", "reason": "x"}]
    doc = {"queued": 0, "packing": 0, "failed": failed, "failed_total": 7, "done": 0}
    cmd = [sys.executable, "-m", "vfs.cli", "--status", str(status_at(tmp_path, doc))]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[:4] == [
        "queued 0, packing 0, failed 7, done 0",
        "failed: a\\xffb: why",
        "failed: c\\x0afailed: forged: x",
        "failed: 5 more not listed",
    ]


def test_temp_files_and_a_refusing_write_side_are_shown(tmp_path: Path) -> None:
    """Lines the bounded lists must not crowd out: rsync temp files waiting for their rename,
    and a write side refusing new data below --min-free."""
    space = {"free": 100 << 20, "min_free": 256 << 20, "refusing_writes": True, "refused": 3}
    doc = {"queued": 1, "packing": 0, "failed": [], "done": 2, "temp": 4, "space": space}
    cmd = [sys.executable, "-m", "vfs.cli", "--status", str(status_at(tmp_path, doc))]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == [
        "queued 1, packing 0, failed 0, done 2",
        "rsync temp files waiting for their rename: 4",
        "refusing new data: 100 MiB free, below --min-free 256 MiB",
    ]


def test_the_daemon_starts_no_openblas_threads(tmp_path: Path, monkeypatch) -> None:
    """Set before numpy is imported: its OpenBLAS would start a spinning thread per core."""
    from vfs import cli

    env: dict[str, str] = {}
    monkeypatch.setattr(cli.os, "environ", env)
    doc = {"queued": 0, "packing": 0, "failed": [], "done": 0}
    assert cli.main(["--status", str(status_at(tmp_path, doc))]) == 0
    assert env == {"OPENBLAS_NUM_THREADS": "1"}
