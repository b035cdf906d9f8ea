"""The on-disk range cache: hits by (URL, ETag, offset, length), stays within its bound (least
recently used leave first), drops a damaged entry and a crash's temp files, survives a restart."""

from __future__ import annotations

import os
import time
from pathlib import Path

from vfs.stores.diskcache import DiskCache


def test_hits_only_the_same_object_version_and_range(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 1 << 20)
    key = cache.key("s3://b/k", "etag1", 0, 4)
    cache.put(key, b"abcd")
    assert cache.get(key, 4) == b"abcd"
    assert cache.get(cache.key("s3://b/k", "etag2", 0, 4), 4) is None  # replaced object
    assert cache.get(cache.key("s3://b/k", "etag1", 1, 4), 4) is None
    assert DiskCache(tmp_path, 1 << 20).get(key, 4) == b"abcd"  # after a restart


def test_stays_within_its_bound_least_recently_used_first(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 3000)
    keys = [cache.key("u", "e", i, 1000) for i in range(3)]
    for n, key in enumerate(keys):
        cache.put(key, bytes([n]) * 1000)
        old = time.time() - 100 + n
        os.utime(tmp_path / key, (old, old))
    assert cache.get(keys[0], 1000) is not None  # used: now the most recent
    cache.put(cache.key("u", "e", 9, 1000), b"z" * 1000)
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert on_disk <= 3000 and cache.total == on_disk
    assert cache.get(keys[1], 1000) is None  # the least recently used went first
    assert cache.get(keys[0], 1000) == bytes([0]) * 1000


def test_a_damaged_entry_and_temp_files_are_dropped(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 1 << 20)
    key = cache.key("u", "e", 0, 8)
    cache.put(key, b"12345678")
    (tmp_path / key).write_bytes(b"1234")  # cut short
    (tmp_path / ".tmp-x-1").write_bytes(b"half")
    again = DiskCache(tmp_path, 1 << 20)
    assert again.get(key, 8) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []
