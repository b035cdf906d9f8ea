"""What the daemon has done, for operators: counters in `.decant-status` and a Prometheus file.

No network listener: `--metrics-file PATH` is rewritten every few seconds (write, then rename)
for node_exporter's textfile collector.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfs.beneath import parent_fd

METRICS_INTERVAL = 5.0


@dataclass
class Counters:
    reads: int = 0
    bytes_served: int = 0
    read_seconds: float = 0.0  # time reads spent in backends: decoding, decrypting, disk
    errors: Counter[str] = field(default_factory=Counter)  # by errno name, as callers saw them
    started: float = field(default_factory=time.time)

    def error(self, code: int) -> None:
        self.errors[errno.errorcode.get(code, str(code))] += 1


COUNTERS = Counters()  # one daemon per process: the errno boundary records here


def daemon_section(cache: Any, integrity: Any, inodes: int) -> dict[str, Any]:
    c = COUNTERS
    doc: dict[str, Any] = {
        "uptime_s": round(time.time() - c.started, 1),
        "reads": c.reads,
        "bytes_served": c.bytes_served,
        "read_seconds": round(c.read_seconds, 3),
        "errors": dict(c.errors),
        "inodes": inodes,
        "verified": len(integrity.good),
        "failed_verification": len(integrity.bad),
        "pending_verification": len(integrity.pending),
    }
    # Loaded only when SRC is a bucket (before the mount: never half imported here).
    fetched = getattr(sys.modules.get("vfs.stores.s3"), "FETCHED", None)
    if fetched is not None:
        doc["s3"] = {"gets": fetched.gets, "bytes_fetched": fetched.bytes,
                     "bytes_refetched": fetched.refetched}  # fmt: skip
    if cache is not None:
        doc["cache"] = {
            "hits": cache.stats.hits,
            "misses": cache.stats.misses,
            "evictions": cache.stats.evictions,
            "bytes": cache.current_bytes,
            "idle_bytes": cache.idle_bytes,  # buffers kept for reuse, counted in the limit
            "limit_bytes": cache.max_bytes,
        }
    return doc


def prometheus(status: dict[str, Any]) -> str:
    """The status document as Prometheus text exposition format."""
    d = status.get("daemon", {})
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, labels: str = "") -> None:
        if not any(line.startswith(f"# TYPE {name} ") for line in lines):
            lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{labels} {value}")

    metric("decant_reads_total", "counter", d.get("reads", 0))
    metric("decant_read_bytes_total", "counter", d.get("bytes_served", 0))
    metric("decant_read_seconds_total", "counter", d.get("read_seconds", 0))
    metric("decant_inodes", "gauge", d.get("inodes", 0))
    metric("decant_files_verified", "gauge", d.get("verified", 0))
    metric("decant_files_failed_verification", "gauge", d.get("failed_verification", 0))
    metric("decant_files_pending_verification", "gauge", d.get("pending_verification", 0))
    for name, count in sorted(d.get("errors", {}).items()):
        metric("decant_errors_total", "counter", count, f'{{errno="{name}"}}')
    cache = d.get("cache", {})
    for key in ("hits", "misses", "evictions"):
        metric(f"decant_cache_{key}_total", "counter", cache.get(key, 0))
    metric("decant_cache_bytes", "gauge", cache.get("bytes", 0))
    metric("decant_cache_idle_bytes", "gauge", cache.get("idle_bytes", 0))
    metric("decant_cache_limit_bytes", "gauge", cache.get("limit_bytes", 0))
    if "s3" in d:
        metric("decant_s3_gets_total", "counter", d["s3"]["gets"])
        metric("decant_s3_fetched_bytes_total", "counter", d["s3"]["bytes_fetched"])
        metric("decant_s3_refetched_bytes_total", "counter", d["s3"].get("bytes_refetched", 0))
    if "queued" in status:
        metric("decant_pack_queued", "gauge", status["queued"])
        metric("decant_pack_packing", "gauge", status["packing"])
        metric("decant_pack_failed", "gauge", len(status["failed"]))
        metric("decant_pack_done_total", "counter", status["done"])
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """`path` replaced whole by `text` (0644: node_exporter reads it). The temp file is made
    with a name of its own (O_EXCL): a fixed `.NAME.tmp` was opened by path, so a link put at
    that name in a folder others may write had the daemon (root) truncate and write whatever
    it named. Its folder is reached from / with no link followed (resolved at start by
    cli.real_paths): a folder on the way swapped for a user's link since is ELOOP, not the
    folder of their choice."""
    dfd = parent_fd(Path("/"), path.absolute())
    try:
        fd, tmp = _temp_beside(dfd, path.name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                os.fchmod(out.fileno(), 0o644)
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)


def _temp_beside(dfd: int, name: str) -> tuple[int, str]:
    """A new file `.NAME.XXXXXXXX.tmp` in the folder `dfd` holds (O_EXCL), as mkstemp makes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o600, dir_fd=dfd), tmp
        except FileExistsError:
            continue
