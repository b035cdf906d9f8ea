"""Persistent index of archive descriptions and verified digests: a remount lists without reopening.

Keyed by archive path, size and mtime: a changed archive misses and is described afresh. SQLite
gives atomic, crash-safe writes; a damaged index file is set aside and rebuilt, never fatal.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from pathlib import Path

from vfs.backends.base import Description

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS descriptions (
    path TEXT NOT NULL, backend TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    doc TEXT NOT NULL, PRIMARY KEY (path, backend));
CREATE TABLE IF NOT EXISTS verified (
    path TEXT NOT NULL, member TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL, PRIMARY KEY (path, member));
"""


class DescriptionIndex:
    def __init__(self, db_path: Path) -> None:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        self.path = db_path
        self._lock = threading.Lock()
        try:
            self._db = self._connect(db_path)
        except sqlite3.DatabaseError as exc:
            log.warning("index %s is unreadable (%s); starting a new one", db_path, exc)
            db_path.replace(db_path.with_suffix(".corrupt"))
            self._db = self._connect(db_path)

    @staticmethod
    def _connect(db_path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        return db

    def get(self, path: Path, backend: str, size: int, mtime_ns: int) -> Description | None:
        with self._lock:
            row = self._db.execute(
                "SELECT doc FROM descriptions WHERE path=? AND backend=? AND size=? AND mtime_ns=?",
                (str(path), backend, size, mtime_ns),
            ).fetchone()
        if row is None:
            return None
        try:
            return Description.from_json(json.loads(row[0]))
        except (ValueError, KeyError, TypeError, RecursionError):
            return None

    def put(self, path: Path, backend: str, size: int, mtime_ns: int, desc: Description) -> None:
        doc = json.dumps(desc.to_json(), separators=(",", ":"))
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO descriptions VALUES (?, ?, ?, ?, ?)",
                (str(path), backend, size, mtime_ns, doc),
            )

    def is_verified(self, path: Path, member: str, size: int, mtime_ns: int, sha256: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM verified WHERE path=? AND member=? AND size=? AND mtime_ns=? "
                "AND sha256=?",
                (str(path), member, size, mtime_ns, sha256),
            ).fetchone()
        return row is not None

    def mark_verified(self, path: Path, member: str, size: int, mtime_ns: int, sha256: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO verified VALUES (?, ?, ?, ?, ?)",
                (str(path), member, size, mtime_ns, sha256),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
