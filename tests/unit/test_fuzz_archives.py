"""Deterministic fuzzing of packed archives through vfs.backends.decant (tools/fuzz.py, fixed seed).

Runs in its own process under an address-space limit, so a runaway allocation is a MemoryError
there (counted) and a crash in a C codec fails this test instead of killing pytest. Bit flips
inside compressed data may decode to other bytes: those are tallied, not asserted (the sha256 a
whole-file read checks catches them); everything else must be exact bytes or a DecantError.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEED = 20240601
CASES = 4000  # all 22 mutation kinds; `tools/fuzz.py --cases N` runs more by hand


def test_fuzzed_archives_fail_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fuzz.py"), "--seed", str(SEED), "--cases",
         str(CASES), "--timeout", "10", "--max-memory", "4096", "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode in (0, 1), (
        f"fuzz process died ({proc.returncode}): {proc.stderr[-3000:]}"
    )
    tally = json.loads(proc.stdout)
    assert tally["cases"] == CASES
    assert tally["failures"] == [], "\n".join(tally["failures"][:20])
    for result in ("short-read", "missing-served", "unexpected", "memory", "timeout"):
        assert tally["results"].get(result, 0) == 0, result
    # Every mutation kind was exercised, and most cases were refused rather than served.
    assert len(tally["by_kind"]) >= 12, tally["by_kind"]
    assert tally["results"]["error"] > CASES // 2
    assert tally["max_rss_mib"] < 400, tally["max_rss_mib"]
