"""Fuzzed archives through a real mount (fixed seed): no full read and no read of a verified file
returns wrong bytes without an error, no read hangs, the mount survives. `tools/fuzz_mount.py`
runs the same with more cases and a random seed."""

from __future__ import annotations

from pathlib import Path

from tests.toolbox import load_tool


def test_fuzzed_archives_through_the_mount(tmp_path: Path) -> None:
    doc = load_tool("fuzz_mount").fuzz_mount(seed=20261130, cases=150, timeout=30.0, work=tmp_path)
    tally = doc["tally"]
    assert doc["fails"] == [], doc
    # Not vacuous: some cases served whole, some refused at a read, some shown raw.
    assert tally.get("ok", 0) > 0 and tally.get("error", 0) > 0 and tally.get("raw", 0) > 0, tally
    assert doc["log_lines"] < 20 * doc["cases"]  # each failure logged, not once per read
