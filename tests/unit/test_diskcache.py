"""The on-disk range cache: hits by (URL, ETag, offset, length), stays within its bound (least
recently used leave first), drops a damaged entry and a crash's temp files, survives a restart;
serves nothing that changed on disk, follows no planted link, and refuses a folder another user
may write."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from vfs.errors import StoreError
from vfs.stores.diskcache import TRAILER, DiskCache


def test_hits_only_the_same_object_version_and_range(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 1 << 20)
    key = cache.key("s3://b/k", "etag1", 0, 4)
    cache.put(key, b"abcd")
    assert cache.get(key, 4) == b"abcd"
    assert cache.get(cache.key("s3://b/k", "etag2", 0, 4), 4) is None  # replaced object
    assert cache.get(cache.key("s3://b/k", "etag1", 1, 4), 4) is None
    assert DiskCache(tmp_path, 1 << 20).get(key, 4) == b"abcd"  # after a restart


def test_stays_within_its_bound_least_recently_used_first(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 3 * (1000 + TRAILER))
    keys = [cache.key("u", "e", i, 1000) for i in range(3)]
    for n, key in enumerate(keys):
        cache.put(key, bytes([n]) * 1000)
        old = time.time() - 100 + n
        os.utime(tmp_path / key, (old, old))
    assert cache.get(keys[0], 1000) is not None  # used: now the most recent
    cache.put(cache.key("u", "e", 9, 1000), b"z" * 1000)
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert on_disk <= 3 * (1000 + TRAILER) and cache.total == on_disk
    assert cache.get(keys[1], 1000) is None  # the least recently used went first
    assert cache.get(keys[0], 1000) == bytes([0]) * 1000


def test_a_damaged_entry_and_temp_files_are_dropped(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 1 << 20)
    key = cache.key("u", "e", 0, 8)
    cache.put(key, b"12345678")
    (tmp_path / key).write_bytes(b"1234")  # cut short
    (tmp_path / f".tmp-{key}-1").write_bytes(b"half")  # a put cut short by a crash
    again = DiskCache(tmp_path, 1 << 20)
    assert again.get(key, 8) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_entry_changed_on_disk_is_dropped_not_served(tmp_path: Path) -> None:
    """A range whose bytes changed on disk (bit rot, or anyone who could write there) keeps
    its length: it must fail its xxh3 and be fetched again, never served as the object's."""
    cache = DiskCache(tmp_path / "c", 1 << 20)
    key = cache.key("s3://b/notes.txt", "e", 0, 8)
    cache.put(key, b"12345678")
    entry = tmp_path / "c" / key
    raw = bytearray(entry.read_bytes())
    raw[3] ^= 0x01
    entry.write_bytes(bytes(raw))
    assert cache.get(key, 8) is None
    assert not entry.exists()


def test_a_link_planted_as_an_entry_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"private!")
    cache = DiskCache(tmp_path / "c", 1 << 20)
    key = cache.key("s3://b/k", "e", 0, 8)
    (tmp_path / "c" / key).symlink_to(secret)
    assert cache.get(key, 8) is None


def test_entries_are_private_to_the_daemon_s_user(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c", 1 << 20)
    key = cache.key("s3://b/k", "e", 0, 4)
    cache.put(key, memoryview(b"abcd"))
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "c" / key).stat().st_mode) == 0o600
    assert cache.get(key, 4) == b"abcd"


@pytest.mark.parametrize("how", ["writable", "symlink", "not-ours"])
def test_a_folder_another_user_may_write_is_refused(tmp_path: Path, how: str) -> None:
    """What the cache holds is served as the bucket's bytes to every user: a folder another
    user may write (or a link to one) would let them plant ranges."""
    folder = tmp_path / "c"
    if how == "writable":
        folder.mkdir()
        folder.chmod(0o777)
    elif how == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "real")
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the folder to another user")
        folder.mkdir(mode=0o700)
        os.chown(folder, 65534, 65534)
    with pytest.raises(StoreError) as err:
        DiskCache(folder, 1 << 20)
    assert str(err.value).startswith(f"--disk-cache {folder}: ")
    assert {"writable": "writable by others", "symlink": "a symlink",
            "not-ours": "owned by uid 65534"}[how] in str(err.value)  # fmt: skip


def test_the_cache_keeps_to_the_real_folder_it_checked(tmp_path: Path) -> None:
    """A --disk-cache path through a link (someone else's, say) was checked as resolved, then
    used as given: the link repointed later, entries were read from wherever it pointed (red
    team, stop 26). The cache uses the real path it checked, whatever the link says later."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    cache = DiskCache(link / "cache", 1 << 20)
    assert cache.folder == real / "cache"
    key = cache.key("s3://b/k", "e", 0, 4)
    cache.put(key, b"ours")
    link.unlink()
    link.symlink_to(tmp_path / "elsewhere")  # repointed after the check
    assert cache.get(key, 4) == b"ours"
    assert not (tmp_path / "elsewhere" / "cache").exists()


def test_forget_drops_what_this_run_kept_of_an_object_and_of_objects_below_it(
    tmp_path: Path,
) -> None:
    """A range damaged on the way was kept with the checksum of its damaged bytes: the mount
    forgets an archive that failed (red team 58, F4). A zip is one object; a folder archive's
    chunks are objects below its name. Others stay, a name that only starts alike too."""
    cache = DiskCache(tmp_path / "c", 1 << 20)
    keys = {}
    for owner in ("s3://b/x.zip", "s3://b/d.zarr/0/0", "s3://b/d.zarr/1/0", "s3://b/x.zip2"):
        keys[owner] = DiskCache.key(owner, "e", 0, 4)
        cache.put(keys[owner], b"data", owner)
    got = DiskCache.key("s3://b/y.zip", "e", 0, 4)
    DiskCache(tmp_path / "c", 1 << 20).put(got, b"kept", "")  # before a restart: not owned yet
    assert cache.forget("s3://b/y.zip") == 0
    assert cache.get(got, 4, "s3://b/y.zip") == b"kept"  # owned once got
    assert cache.forget("s3://b/x.zip") == 1
    assert cache.forget("s3://b/d.zarr") == 2
    assert cache.forget("s3://b/y.zip") == 1
    assert cache.get(keys["s3://b/x.zip"], 4) is None
    assert cache.get(keys["s3://b/d.zarr/1/0"], 4) is None
    assert cache.get(got, 4) is None
    assert cache.get(keys["s3://b/x.zip2"], 4) == b"data"
    assert cache.total == 4 + TRAILER


def test_what_it_remembers_for_forget_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("vfs.stores.diskcache.MAX_OWNED", 10)
    cache = DiskCache(tmp_path / "c", 1 << 20)
    for i in range(30):
        cache.put(DiskCache.key(f"s3://b/{i}", "e", 0, 1), b"x", f"s3://b/{i}")
    assert sum(len(keys) for keys in cache._owned.values()) <= 10
    assert cache.forget("s3://b/29") == 1  # the most recent are remembered
    assert cache.forget("s3://b/0") == 0
