"""What an operator sees: counters in `.decant-status` / `--status`, and the Prometheus file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} missing from\n{text}"
    return float(found.group(1))


def test_status_and_metrics_count_what_was_served(
    tmp_path: Path,
    make_mount,
    mount_corpus,  # type: ignore[no-untyped-def]
) -> None:
    originals, src = mount_corpus
    metrics = tmp_path / "decant.prom"
    m = make_mount(src, "--read-only", "--metrics-file", str(metrics))
    served = 0
    for original in sorted(originals.iterdir())[:5]:
        data = (m.mnt / original.name).read_bytes()
        assert data == original.read_bytes()
        served += len(data)
    doc = json.loads((m.mnt / ".decant-status").read_text())["daemon"]
    assert doc["bytes_served"] >= served > 0  # the status read itself is not counted
    assert doc["reads"] > 0 and doc["verified"] >= 1
    assert doc["cache"]["limit_bytes"] == 512 << 20
    # Buffers kept for reuse: at least the read buffers of the threads that decoded the reads.
    assert 0 < doc["cache"]["idle_bytes"] < 512 << 20
    assert not (m.mnt / "no-such-file").exists()  # counted as ENOENT
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not metrics.exists():
        time.sleep(0.2)
    time.sleep(5.5)  # one more interval: the ENOENT above is counted
    text = metrics.read_text()
    assert _metric(text, "decant_read_bytes_total") >= served
    assert _metric(text, "decant_cache_limit_bytes") == 512 << 20
    assert _metric(text, "decant_cache_idle_bytes") > 0
    assert _metric(text, 'decant_errors_total{errno="ENOENT"}') >= 1
    shown = subprocess.run([sys.executable, "-m", "vfs.cli", "--status", str(m.mnt)],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "bytes in" in shown and "files verified" in shown
