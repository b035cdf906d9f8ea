"""tools/demo.py end to end: it finishes, exits 0 and reports every file byte-exact.

The demo checks its own results (sha256 through the mount against the originals, package members
against what was packed, ingest finishing); this test holds it to its word and its exit status.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.mount.conftest import ROOT, is_mounted

DEMO = ROOT / "tools" / "demo.py"
CHECKED = 4 + 5 + 5  # stacks read through the mount, package members, files ingested
PLANES = 8  # of the README's 32: the same job on a quarter of the pixels (speeds untested)


def run_demo(work: Path) -> subprocess.CompletedProcess[str]:
    """Run the demo as a user does; whatever happens, leave no mount and no 400 MB behind."""
    try:
        return subprocess.run([sys.executable, str(DEMO), str(work), "--planes", str(PLANES)],
                              capture_output=True, text=True, timeout=150, check=False)  # fmt: skip
    finally:
        if is_mounted(work / "mnt"):  # killed by the timeout before its own unmount
            subprocess.run(["fusermount3", "-u", "-z", str(work / "mnt")], check=False)
        shutil.rmtree(work, ignore_errors=True)


def test_demo_exits_zero_and_reports_every_file_byte_exact(tmp_path: Path) -> None:
    done = run_demo(tmp_path / "demo")
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "every file byte-exact through the mount" in done.stdout, report
    verdicts = [line for line in done.stdout.splitlines() if line.endswith(" byte-exact")]
    assert len(verdicts) == CHECKED, report
    assert "DIFFERENT" not in done.stdout and "FAILED" not in done.stdout, report
    assert "queued 0, packing 0, failed 0, done 5" in done.stdout, report
