"""What the read buffers each thread keeps for its next read hold, all told, and their bound.

Readers keep one buffer per thread for the bytes they read (a chunk or a span of cipher text,
up to ~4 MiB; vfs.stores.direct, vfs.c4gh.buffers, vfs.decant.store), so a read costs no fresh
allocation and its page faults. With many readers the threads that keep one grow in number:
16 readers of a package and an original held ~35 MiB of them beside a full cache, 24 readers
of an original 38 MiB in 34 threads. The daemon counts them against its cache's budget
(`PageCache.counts_idle(HELD)`) and bounds them (`HELD.limit`): past it, a thread reads into a
buffer of its own for that read only.
"""

from __future__ import annotations

import threading
from typing import Any


class _Held:
    """The bytes of every kept buffer of every live thread (an IdlePool of vfs.cache)."""

    def __init__(self) -> None:
        self.idle_bytes = 0
        self.limit: float = float("inf")  # the daemon sets one from its cache size
        # Reentrant: a charge's finalizer may run inside `admit` (an allocation there collects).
        self._lock = threading.RLock()

    def admit(self, nbytes: int, replaced: int) -> bool:
        """Count `nbytes` more (`replaced` fewer: the buffer it replaces) if that stays within
        the limit."""
        with self._lock:
            if self.idle_bytes - replaced + nbytes > self.limit:
                return False
            self.idle_bytes += nbytes
            return True

    def _add(self, nbytes: int) -> None:
        with self._lock:
            self.idle_bytes += nbytes


HELD = _Held()


class _Charge:
    """`nbytes` counted in HELD while this lives: as long as the thread keeps its buffer."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes  # counted by HELD.admit

    def __del__(self, held: _Held = HELD) -> None:  # bound now: at exit, globals may be gone
        held._add(-self.nbytes)


def keep(local: threading.local, name: str, buf: Any, nbytes: int) -> bool:
    """Keep `buf` (`nbytes`) as this thread's `name` in `local`, counted in HELD until the
    thread replaces it or ends (a thread's locals go with it). Past HELD's limit the thread
    keeps none (the one it had goes too): False, and the caller uses `buf` for this read only."""
    old = getattr(local, name + "_charge", None)
    if not HELD.admit(nbytes, old.nbytes if old is not None else 0):
        setattr(local, name, None)
        setattr(local, name + "_charge", None)
        return False
    setattr(local, name, buf)
    setattr(local, name + "_charge", _Charge(nbytes))
    return True
