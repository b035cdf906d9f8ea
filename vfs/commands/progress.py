"""A progress bar for long runs on a terminal; silent in logs and pipes."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    def __init__(self, label: str, total: int = 0) -> None:
        self.label, self.total, self.done = label, total, 0
        self.enabled = sys.stderr.isatty()
        self._last = 0.0

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._last > 0.2:
            self._last = now
            pct = (
                f"{100 * self.done / self.total:5.1f}%" if self.total else f"{self.done >> 20} MiB"
            )
            sys.stderr.write(f"\r{self.label}: {pct}")
            sys.stderr.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self._last:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
