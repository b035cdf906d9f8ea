"""BucketTree without a server or a mount: listings presented with the local rules, the listing
generation that stands in for a folder's mtime, a failed LIST keeping the last listing, the
index keyed by object identity, and keys that cannot be names left out."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import tarfile
import time
from pathlib import Path

import pytest

from vfs.backends.base import Description, Entry
from vfs.backends.decant import DecantBackend
from vfs.backends.objects import BoundBackend, ObjectBackend
from vfs.cache import PageCache
from vfs.decant.packer import PackResult
from vfs.errors import StoreError
from vfs.mount.buckettree import BucketTree
from vfs.mount.index import DescriptionIndex, stamp_of
from vfs.stores.base import ObjectInfo, ObjectPath
from vfs.stores.local import LocalFile


class Blob:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.data, self.size = name, data, len(data)

    @property
    def identity(self) -> tuple[object, ...]:
        return (self.name, hashlib.md5(self.data).hexdigest())

    def read(self, offset: int, size: int) -> bytes:
        assert offset + size <= self.size
        return self.data[offset : offset + size]

    def read_many(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        return [self.read(o, n) for o, n in ranges]

    def close(self) -> None:
        pass


class FakeBucket:
    """A Folder with S3's listing shape (prefixes and objects one level down), counting LISTs."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.name = "s3://bkt/pre"
        self.lists = 0
        self.down = False
        self.times: dict[str, float] = {}  # upload times other than the default

    def _info(self, key: str) -> ObjectInfo:
        data = self.files[key]
        when = self.times.get(key, 1_700_000_000.0)
        return ObjectInfo(key, len(data), when, hashlib.md5(data).hexdigest())

    def stat(self, key: str) -> ObjectInfo | None:
        return self._info(key) if key in self.files else None

    def get(self, key: str) -> bytes | None:
        return self.files.get(key)

    def url_of(self, key: str) -> str:
        return f"{self.name}/{key}"

    def open(self, key: str) -> Blob:
        return Blob(f"{self.name}/{key}", self.files[key])

    def list_dir(self, prefix: str = "") -> tuple[list[str], list[ObjectInfo]]:
        self.lists += 1
        if self.down:
            raise StoreError(f"{self.name}: listing: object store failed after retries")
        cut = f"{prefix}/" if prefix else ""
        dirs, files = set(), []
        for key in sorted(self.files):
            if key.startswith(cut):
                rest = key[len(cut) :]
                if "/" in rest:
                    dirs.add(rest.split("/", 1)[0])
                else:
                    files.append(self._info(key))
        return sorted(dirs), files

    def sub(self, prefix: str) -> FakeBucket:
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Below `prefix` as a folder (obstore's: `a` lists `a/…`, not `a` nor `ab`)."""
        cut = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        return [self._info(k) for k in sorted(self.files) if k.startswith(cut)]

    def close(self) -> None:
        pass


def spooled_stat(size: int, mode: int = 0o600, uid: int = 1001) -> os.stat_result:
    """What a spooled file's stat gives the tree when its upload is noted (mtime 5 s)."""
    ns = {"st_atime_ns": 5 * 10**9, "st_mtime_ns": 5 * 10**9, "st_ctime_ns": 5 * 10**9}
    return os.stat_result((stat.S_IFREG | mode, 1, 0, 1, uid, uid, size, 5, 5, 5), ns)


def make_tree(bucket: FakeBucket, index: DescriptionIndex | None = None) -> BucketTree:
    decant = DecantBackend(PageCache(8 << 20))
    tree: BucketTree

    def key_of(path: Path) -> str:
        return tree.key_of(path)

    bound = BoundBackend(decant, bucket, key_of, (".zarr.zip",), (".zarr",))
    tree = BucketTree(bucket, ObjectPath.of_url(bucket.name), [bound], index, relist=3600)  # type: ignore[arg-type]
    return tree


@pytest.fixture
def archive(packed_corpus: dict[str, PackResult]) -> tuple[str, bytes]:
    name = "striped_i16.tif"
    return name, packed_corpus[name].archive.read_bytes()


def test_a_listing_is_presented_with_the_local_rules(archive: tuple[str, bytes]) -> None:
    name, data = archive
    bucket = FakeBucket({f"{name}.zarr.zip": data, "notes.txt": b"hello", "sub/x.bin": b"x",
                         "..": b"dots", "a" * 300: b"long"})  # fmt: skip
    tree = make_tree(bucket)
    kids = tree.scan(tree.root)
    assert sorted(kids) == sorted([name, "notes.txt", "sub"])
    original = kids[name]
    assert original.backend is not None and original.backend.name == "decant"
    assert str(original.real) == f"s3://bkt/pre/{name}.zarr.zip"
    assert original.xattrs["user.decant.archive"] == f"{name}.zarr.zip"
    plain = kids["notes.txt"]
    assert isinstance(plain.backend, ObjectBackend) and plain.size == 5
    assert plain.backend.open(plain.real, "", plain.entry).read(0, 100) == b"hello"  # type: ignore[arg-type]
    assert kids["sub"].is_dir and kids["sub"].backend is None
    assert sorted(tree.scan(kids["sub"].real)) == ["x.bin"]
    # An archive's name carries its listing identity: its stamp needs no request.
    assert stamp_of(original.real)[:2] == (len(data), 1_700_000_000 * 10**9)
    with pytest.raises(TypeError):
        LocalFile(original.real)  # no os call reaches a local file of the same name


def test_the_generation_moves_only_when_a_fresh_listing_differs() -> None:
    bucket = FakeBucket({"a.bin": b"1"})
    tree = make_tree(bucket)
    first = tree.stamp_folder(tree.root)
    assert tree.stamp_folder(tree.root) == first and bucket.lists == 1  # trusted for --relist
    tree.expire()
    assert tree.stamp_folder(tree.root) == first and bucket.lists == 2  # same objects
    bucket.files["b.bin"] = b"2"
    tree.expire()
    assert tree.stamp_folder(tree.root) == first + 1
    bucket.files["a.bin"] = b"replaced"  # same key, new ETag and size
    tree.expire()
    assert tree.stamp_folder(tree.root) == first + 2


def test_a_failed_listing_keeps_the_last_one_and_the_first_one_raises() -> None:
    bucket = FakeBucket({"a.bin": b"1"})
    tree = make_tree(bucket)
    assert sorted(tree.scan(tree.root)) == ["a.bin"]
    bucket.down = True
    tree.expire()
    assert sorted(tree.scan(tree.root)) == ["a.bin"]
    fresh = make_tree(bucket)
    with pytest.raises(StoreError):
        fresh.scan(fresh.root)


def test_a_second_tree_describes_from_the_index(
    archive: tuple[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, data = archive
    bucket = FakeBucket({f"{name}.zarr.zip": data})
    index = DescriptionIndex(tmp_path / "index.sqlite")
    first = make_tree(bucket, index).scan(ObjectPath.of_url(bucket.name))
    described: list[str] = []
    real = DecantBackend.describe_at
    monkeypatch.setattr(DecantBackend, "describe_at",
                        lambda self, f, k: described.append(k) or real(self, f, k))  # fmt: skip
    again = make_tree(bucket, index).scan(ObjectPath.of_url(bucket.name))
    assert described == [] and again[name].entry == first[name].entry
    bucket.files[f"{name}.zarr.zip"] = data + b"\0"  # replaced: a new ETag and size miss
    make_tree(bucket, index).scan(ObjectPath.of_url(bucket.name))
    assert described == [f"{name}.zarr.zip"]
    index.close()


class TarAt:
    """A plain TAR object of a bucket as a folder of its members (what a package is, unsealed)."""

    name = "tar"

    def __init__(self) -> None:
        self.described = 0

    def describe_at(self, folder: FakeBucket, key: str) -> Description:
        self.described += 1
        root = Entry(is_dir=True)
        with tarfile.open(fileobj=io.BytesIO(folder.files[key])) as tar:
            for info in tar.getmembers():
                root.children[info.name] = Entry(size=info.size)
        return Description(key, root)


def tar_of(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in names:
            tar.addfile(tarfile.TarInfo(name))
    return buf.getvalue()


def tar_tree(bucket: FakeBucket, index: DescriptionIndex | None) -> tuple[BucketTree, TarAt]:
    """A tree of `bucket`'s TAR objects as folders, keeping one tree of three entries."""
    inner = TarAt()
    tree: BucketTree

    def key_of(path: Path) -> str:
        return tree.key_of(path)

    bound = BoundBackend(inner, bucket, key_of, (".tar",))
    tree = BucketTree(bucket, ObjectPath.of_url(bucket.name), [bound], index, relist=3600)  # type: ignore[arg-type]
    tree.trees.budget = 3  # one tree of three entries
    return tree, inner


def test_a_package_tree_let_go_comes_back_for_its_own_object_only(tmp_path: Path) -> None:
    """Trees of a bucket's folder archives share the bounded LRU: one let go is read back from
    the index for the object identity its node was listed with; once the object is replaced
    (and the index holds the new one), the old node gets ESTALE, not the new object's members."""
    bucket = FakeBucket({"a.tar": tar_of(["a1", "a2"]), "b.tar": tar_of(["b1", "b2"])})
    index = DescriptionIndex(tmp_path / "index.sqlite")
    tree, inner = tar_tree(bucket, index)
    kids = tree.scan(tree.root)
    old = kids["a.tar"]
    assert old.entry is None and len(tree.trees) == 1 and inner.described == 2
    assert sorted(tree.children_of_archive_node(old)) == ["a1", "a2"]  # from the index
    assert inner.described == 2
    tree.children_of_archive_node(kids["b.tar"])  # a's tree let go again
    bucket.files["a.tar"] = tar_of(["new1", "new2"])
    tree.expire()
    assert sorted(tree.children_of_archive_node(tree.scan(tree.root)["a.tar"])) == ["new1", "new2"]
    tree.children_of_archive_node(kids["b.tar"])
    with pytest.raises(OSError) as raised:
        tree.children_of_archive_node(old)
    assert raised.value.errno == errno.ESTALE
    index.close()


class CoarseHeads(FakeBucket):
    """A store that lists modification times in milliseconds and gives them in whole seconds
    in a HEAD's Last-Modified (MinIO does; SeaweedFS gives seconds in both)."""

    def _info(self, key: str) -> ObjectInfo:
        info = super()._info(key)
        return ObjectInfo(info.key, info.size, info.mtime + 0.123, info.etag)

    def stat(self, key: str) -> ObjectInfo | None:
        info = super().stat(key)
        return None if info is None else ObjectInfo(key, info.size, int(info.mtime), info.etag)


def test_a_tree_let_go_without_an_index_comes_back_whatever_the_heads_precision() -> None:
    """Without an index, a package tree let go is described again from the object, checked by
    a HEAD to be the version listed: by size and ETag, as an open is. Compared by the whole
    identity, the listing's milliseconds against the HEAD's seconds made every such package
    ESTALE for good (until relisted, and then again)."""
    bucket = CoarseHeads({"a.tar": tar_of(["a1", "a2"]), "b.tar": tar_of(["b1", "b2"])})
    tree, inner = tar_tree(bucket, None)
    kids = tree.scan(tree.root)
    tree.children_of_archive_node(kids["b.tar"])  # a's tree let go
    assert sorted(tree.children_of_archive_node(kids["a.tar"])) == ["a1", "a2"]
    assert inner.described == 3
    tree.children_of_archive_node(kids["b.tar"])
    bucket.files["a.tar"] = tar_of(["new1", "new2"])  # replaced: another size and ETag
    with pytest.raises(OSError) as raised:
        tree.children_of_archive_node(kids["a.tar"])
    assert raised.value.errno == errno.ESTALE


def test_a_fresh_listing_forgets_the_index_rows_of_objects_gone(
    archive: tuple[str, bytes], tmp_path: Path
) -> None:
    """The index's object rows were never pruned: a bucket's index grew with every archive name
    ever listed. A fresh listing now drops the rows of its folder's objects it no longer holds
    (once per listing), and keeps every other folder's."""
    name, data = archive
    bucket = FakeBucket({f"{name}.zarr.zip": data, f"b{name}.zarr.zip": data,
                         f"sub/{name}.zarr.zip": data})  # fmt: skip
    index = DescriptionIndex(tmp_path / "index.sqlite")
    top, sub = ObjectPath.of_url(bucket.name), ObjectPath.of_url(f"{bucket.name}/sub")
    tree = make_tree(bucket, index)
    tree.scan(top)
    tree.scan(sub)
    key = "decant@3"
    assert sorted(index.objects_in(bucket.name, key)) == [
        f"{bucket.name}/b{name}.zarr.zip", f"{bucket.name}/{name}.zarr.zip"]  # fmt: skip
    del bucket.files[f"b{name}.zarr.zip"]
    tree.scan(top)  # the listing it keeps (relist: an hour) still holds it
    assert len(index.objects_in(bucket.name, key)) == 2
    make_tree(bucket, index).scan(top)  # a fresh listing: gone
    assert list(index.objects_in(bucket.name, key)) == [f"{bucket.name}/{name}.zarr.zip"]
    deeper = f"{bucket.name}/sub"
    assert list(index.objects_in(deeper, key)) == [f"{deeper}/{name}.zarr.zip"]
    index.close()


class DatedBucket(FakeBucket):
    """A FakeBucket whose objects have upload times of their own, counting recursive LISTs."""

    def __init__(self, files: dict[str, bytes], times: dict[str, float]) -> None:
        super().__init__(files)
        self.times = times
        self.deep_lists = 0

    def _info(self, key: str) -> ObjectInfo:
        info = super()._info(key)
        return ObjectInfo(key, info.size, self.times.get(key, 1_700_000_000.0), info.etag)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self.deep_lists += 1
        return super().list(prefix)


@pytest.mark.parametrize("folder_first", [True, False])
def test_a_folder_and_archives_presenting_its_name_go_by_upload_time_in_few_lists(
    archive: tuple[str, bytes], folder_first: bool
) -> None:
    """Red team 46: a folder's time was the daemon's start, so which of a folder and an archive
    presenting its name a host showed depended on when it started. The folder's oldest object
    now decides; twenty clashing archives cost the folder's LIST at most twice."""
    name, data = archive
    t0 = 1_700_000_000.0
    folder_at = t0 if folder_first else t0 + 100
    files = {f"{name}/x.bin": b"x", f"{name}/y.bin": b"y"}
    times = {f"{name}/x.bin": folder_at + 5, f"{name}/y.bin": folder_at}
    for i in range(20):
        files[f"c{i:02d}.zarr.zip"] = data
        times[f"c{i:02d}.zarr.zip"] = t0 + 50 + i
    bucket = DatedBucket(files, times)
    kids = make_tree(bucket).scan(ObjectPath.of_url(bucket.name))
    if folder_first:
        assert kids[name].is_dir  # the folder keeps it; every archive under its own name
        assert all(kids[f"c{i:02d}.zarr.zip"].backend is not None for i in range(20))
    else:  # the oldest archive keeps it, the folder is not shown, the others are set aside
        assert not kids[name].is_dir and str(kids[name].real).endswith("/c00.zarr.zip")
        assert sorted(k for k in kids if k.startswith("c")) == [f"c{i:02d}.zarr.zip"
                                                               for i in range(1, 20)]  # fmt: skip
    assert bucket.deep_lists <= 2


@pytest.mark.parametrize("file_first", [True, False])
def test_a_plain_object_and_a_folder_of_its_name_go_by_upload_time(file_first: bool) -> None:
    """Red team 83 F2: a key `results/x` put by anyone who may add keys hid a plain file
    `results` published long before, on every host (the folder always kept the name). The one
    uploaded first keeps it now, as between a folder and an archive."""
    t0 = 1_700_000_000.0
    file_at, folder_at = (t0, t0 + 100) if file_first else (t0 + 100, t0)
    files = {"results": b"the victim's results\n", "results/x": b"planted"}
    bucket = DatedBucket(files, {"results": file_at, "results/x": folder_at})
    kids = make_tree(bucket).scan(ObjectPath.of_url(bucket.name))
    assert list(kids) == ["results"]
    assert kids["results"].is_dir != file_first


def test_archives_presenting_one_name_go_by_upload_time_not_by_their_names(
    archive: tuple[str, bytes],
) -> None:
    """Red team 46: `NAME.zarr.zip` uploaded after `run.zarr.zip` presenting NAME took NAME on
    every host, being named after it. A tie still goes to the one named after it."""
    name, data = archive
    t0 = 1_700_000_000.0
    later = {"run.zarr.zip": t0, f"{name}.zarr.zip": t0 + 1}
    kids = make_tree(DatedBucket({k: data for k in later}, later)).scan(
        ObjectPath.of_url("s3://bkt/pre")
    )
    assert str(kids[name].real).endswith("/run.zarr.zip") and f"{name}.zarr.zip" in kids
    tie = {"run.zarr.zip": t0, f"{name}.zarr.zip": t0}
    kids = make_tree(DatedBucket({k: data for k in tie}, tie)).scan(
        ObjectPath.of_url("s3://bkt/pre")
    )
    assert str(kids[name].real).endswith(f"/{name}.zarr.zip") and "run.zarr.zip" in kids


def test_a_folder_s_age_the_store_cannot_tell_keeps_its_name_without_asking_again(
    archive: tuple[str, bytes],
) -> None:
    """The store down while a folder clashes with an archive: the folder keeps its name, and
    the answer is kept, so each later scan does not wait out the store's timeout again."""
    name, data = archive
    files = {f"{name}/x.bin": b"x", "c.zarr.zip": data}
    bucket = DatedBucket(files, {f"{name}/x.bin": 1_700_000_100.0})
    tree = make_tree(bucket)

    def down(prefix: str = "") -> list[ObjectInfo]:
        bucket.deep_lists += 1
        raise StoreError(f"{bucket.name}: listing: object store failed after retries")

    bucket.list = down  # type: ignore[method-assign]
    for _ in range(3):
        tree.expire()  # the folder's own listing is read again; its age is not
        assert tree.scan(ObjectPath.of_url(bucket.name))[name].is_dir
    assert bucket.deep_lists == 1


class OneKeyRefused(FakeBucket):
    """A store that lists a key but will not serve it (an SSE-C object read without its key:
    400 on every HEAD and GET; or a volume down under that one object)."""

    refused = ""

    def open(self, key: str) -> Blob:
        if key == self.refused:
            raise StoreError(f"{self.name}/{key}: HEAD: object store failed after retries (400)")
        return super().open(key)


def test_an_archive_the_store_will_not_serve_is_left_out_not_the_whole_folder(
    archive: tuple[str, bytes],
) -> None:
    """Red team 58 F1: describing one such archive raised, and the whole folder listing with
    it (EIO on `ls` and on every lookup in it, on every host; at the prefix's root, the whole
    mount). It is left out, described again at the next listing: once the store serves it, it
    shows."""
    name, data = archive
    bucket = OneKeyRefused({f"{name}.zarr.zip": data, "evil.tif.zarr.zip": data, "a.txt": b"1"})
    bucket.refused = "evil.tif.zarr.zip"
    tree = make_tree(bucket)
    assert sorted(tree.scan(tree.root)) == sorted([name, "a.txt"])
    bucket.refused = ""
    tree.expire()
    shown = tree.scan(tree.root)
    # Served now; its original's name is taken by the other archive: shown under its own.
    assert sorted(shown) == sorted([name, "a.txt", "evil.tif.zarr.zip"])
    assert shown["evil.tif.zarr.zip"].backend is not None


def test_a_failed_relist_says_how_old_the_listing_shown_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Red team 58 F7: it said "the listing of inf s ago" (the relist had reset its time)."""
    bucket = FakeBucket({"a.bin": b"1"})
    tree = make_tree(bucket)
    tree.scan(tree.root)
    bucket.down = True
    tree.expire()
    with caplog.at_level("WARNING"):
        assert sorted(tree.scan(tree.root)) == ["a.bin"]
    said = [r.getMessage() for r in caplog.records if "cannot list" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("showing the listing of 0 s ago"), said


def test_an_archive_left_out_is_tried_again_at_the_next_relist_of_the_same_listing(
    archive: tuple[str, bytes],
) -> None:
    """It was "described again at the next listing" only if that listing differed: a folder
    whose LIST stayed the same kept it out until a restart (seen with a proxy flipping bits)."""
    name, data = archive
    bucket = OneKeyRefused({f"{name}.zarr.zip": data, "a.txt": b"1"})
    bucket.refused = f"{name}.zarr.zip"
    tree = make_tree(bucket)
    first = tree.stamp_folder(tree.root)
    assert sorted(tree.scan(tree.root)) == ["a.txt"]
    bucket.refused = ""
    tree.expire()
    assert tree.stamp_folder(tree.root) == first + 1  # the same LIST: presented afresh
    assert sorted(tree.scan(tree.root)) == ["a.txt", name]
    tree.expire()
    assert tree.stamp_folder(tree.root) == first + 1  # settled


class DamagedOnTheWay(FakeBucket):
    """Serves `damaged` keys with their end-of-central-directory record flipped, as a proxy
    flipping a bit would (under the same ETag); counts opens, and what it was told to forget."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.damaged: set[str] = set()
        self.opens = 0
        self.forgot: list[str] = []

    def open(self, key: str) -> Blob:
        self.opens += 1
        blob = super().open(key)
        if key in self.damaged:
            flipped = bytearray(blob.data)
            flipped[-22] ^= 0x40
            blob.data = bytes(flipped)
        return blob

    def forget_fetched(self, url: str) -> None:
        self.forgot.append(url)


def test_an_archive_shown_raw_in_a_bucket_is_described_again_later_and_less_often(
    archive: tuple[str, bytes],
) -> None:
    """A local archive that does not parse is shown raw until it changes; a bucket's may have
    been damaged on the way under its ETag: described again after one relist interval, then
    after twice as long at each failure (not a GET per junk archive every interval), its
    ranges kept in --disk-cache let go each time."""
    name, data = archive
    bucket = DamagedOnTheWay({f"{name}.zarr.zip": data})
    bucket.damaged.add(f"{name}.zarr.zip")
    tree = make_tree(bucket)
    tree.relist = 0.2

    def shown() -> list[str]:
        tree.expire()
        tree.stamp_folder(tree.root)
        return sorted(tree.scan(tree.root))

    assert shown() == [f"{name}.zarr.zip"] and bucket.opens == 1
    assert bucket.forgot == [f"{bucket.name}/{name}.zarr.zip"]
    assert shown() == [f"{name}.zarr.zip"] and bucket.opens == 1  # held for 0.2 s
    time.sleep(0.25)
    assert shown() == [f"{name}.zarr.zip"] and bucket.opens == 2  # failed again: held 0.4 s
    time.sleep(0.25)
    assert shown() == [f"{name}.zarr.zip"] and bucket.opens == 2
    bucket.damaged.clear()
    time.sleep(0.2)
    assert shown() == [name] and bucket.opens == 3


def test_a_folder_is_presented_afresh_when_a_hold_lapses_not_at_each_relist_before(
    archive: tuple[str, bytes],
) -> None:
    """A folder of many objects is presented again (a new generation) for an archive shown
    raw only once its hold has lapsed, whatever relists come between."""
    name, data = archive
    bucket = DamagedOnTheWay({f"{name}.zarr.zip": data, "a.txt": b"1"})
    bucket.damaged.add(f"{name}.zarr.zip")
    tree = make_tree(bucket)
    tree.relist = 0.3
    first = tree.stamp_folder(tree.root)
    tree.scan(tree.root)  # shown raw: held 0.3 s
    tree.expire()
    assert tree.stamp_folder(tree.root) == first  # the same LIST, the hold still on
    time.sleep(0.35)
    tree.expire()
    assert tree.stamp_folder(tree.root) == first + 1
    tree.scan(tree.root)  # raw again: held 0.6 s
    time.sleep(0.35)
    tree.expire()
    assert tree.stamp_folder(tree.root) == first + 1
    time.sleep(0.3)
    tree.expire()
    assert tree.stamp_folder(tree.root) == first + 2


def test_an_object_uploaded_or_copied_before_its_entry_is_noted_shows_as_the_file_it_came_from(
    tmp_path: Path,
) -> None:
    """Noted as pending (no ETag yet) before the upload or the copy: a kill after the object
    is in the bucket, before its real entry, showed a 0600 file 0444 root's to every local
    user (red team 60, F1, F2). While pending it is shown private and root's: the object may
    be another host's, put meanwhile, which as the user's they could `rm` (red team 92, F1b).
    The real entry gives it to the user, across a restart too."""
    import stat as stat_mod

    bucket = FakeBucket({"a.txt": b"private"})
    journal = tmp_path / "published.jsonl"
    tree = make_tree(bucket)
    tree.keep_published(journal)
    private = spooled_stat(7)
    tree.note_published("a.txt", "", private)  # then killed

    def shown(t: BucketTree) -> tuple[int, int]:
        st = t.scan(t.root)["a.txt"]
        return stat_mod.S_IMODE(st.mode), st.uid

    assert shown(tree) == (0o400, 0)
    again = make_tree(bucket)  # a restart
    again.keep_published(journal)
    assert shown(again) == (0o400, 0)
    etag = bucket._info("a.txt").etag
    again.note_published("a.txt", etag or "", private)
    third = make_tree(bucket)
    third.keep_published(journal)
    assert ("a.txt", "") not in third._published and ("a.txt", etag) in third._published
    assert shown(third) == (0o400, 1001)


def test_a_start_gives_a_pending_key_back_to_its_user_only_with_this_host_s_token(
    tmp_path: Path,
) -> None:
    """A kill mid-upload leaves pending notes. At the next start, a key holding this host's
    signed upload is shown as the user's file again (its ETag noted); one holding another
    host's object is forgotten (shown 0444, as every host shows it); one the store does not
    answer for stays root's and private until the upload's retry decides."""
    import stat as stat_mod

    from vfs.stores.s3uploads import UploadTokens

    tokens = UploadTokens(b"k" * 32)
    bucket = FakeBucket({"ours": b"uploaded here", "theirs": b"another host's", "dark": b"?"})
    signed = {"ours": tokens.new("ours"), "theirs": UploadTokens(b"o" * 32).new("theirs")}

    def upload_token(key: str) -> str | None:
        if key == "dark":
            raise StoreError("s3://bkt/pre/dark: HEAD: object store failed after retries")
        return signed.get(key)

    bucket.upload_token = upload_token  # type: ignore[attr-defined]
    journal = tmp_path / "published.jsonl"
    tree = make_tree(bucket)
    tree.keep_published(journal)
    private = spooled_stat(7)
    for key in ("ours", "theirs", "dark"):
        tree.note_published(key, "", private)  # then killed
    again = make_tree(bucket)  # a restart
    again.keep_published(journal)
    again.drop_pending_not_ours(tokens, 5.0)
    shown = {n: (stat_mod.S_IMODE(st.mode), st.uid) for n, st in again.scan(again.root).items()}
    assert shown == {"ours": (0o400, 1001), "theirs": (0o444, 0), "dark": (0o400, 0)}
    third = make_tree(bucket)  # and so across the next restart
    third.keep_published(journal)
    assert {n: st.uid for n, st in third.scan(third.root).items()} == {
        "ours": 1001,
        "theirs": 0,
        "dark": 0,
    }


def test_the_same_bytes_put_again_at_a_published_key_are_not_this_host_s_user_s(
    tmp_path: Path,
) -> None:
    """Red team 92, F3: host A published a user's empty 0600 file; it was deleted through
    another host, and another user's empty file uploaded there. Same bytes, same ETag: A
    showed it as its own user's (who could `rm` it, and its owner could not read it through
    A). The entry holds the upload's time, which the second upload does not share."""
    import stat as stat_mod

    bucket = FakeBucket({"notes.txt": b""})
    journal = tmp_path / "published.jsonl"
    tree = make_tree(bucket)
    tree.keep_published(journal)
    private = spooled_stat(0)
    tree.note_published("notes.txt", bucket._info("notes.txt").etag or "", private)

    def shown(t: BucketTree) -> tuple[int, int]:
        st = t.scan(t.root)["notes.txt"]
        return stat_mod.S_IMODE(st.mode), st.uid

    assert shown(tree) == (0o400, 1001)
    bucket.times["notes.txt"] = 1_700_000_000.0 + 600  # deleted, and put again by another host
    tree.expire()
    assert shown(tree) == (0o444, 0)
    again = make_tree(bucket)  # and across a restart (the time is in the journal)
    again.keep_published(journal)
    assert shown(again) == (0o444, 0)
    bucket.times.pop("notes.txt")  # the object this host published: still the user's
    third = make_tree(bucket)
    third.keep_published(journal)
    assert shown(third) == (0o400, 1001)


def test_an_entry_noted_without_its_upload_time_takes_it_from_the_first_listing(
    tmp_path: Path,
) -> None:
    """Red team 94 F7b, F8: an entry noted without the object's upload time (the HEAD after
    the upload failed; a journal written before times were kept) matched any object of the
    same bytes at its key for good. The first listing that shows it gives it its time."""
    import json
    import stat as stat_mod

    bucket = FakeBucket({"old.txt": b"", "new.txt": b""})
    journal = tmp_path / "published.jsonl"
    etag = bucket._info("old.txt").etag or ""
    journal.write_text(json.dumps(["old.txt", etag, 0o600, 1001, 1001, 5 * 10**9]) + "\n")
    tree = make_tree(bucket)
    tree.keep_published(journal)
    real_stat = bucket.stat

    def head_fails(key: str) -> None:
        raise StoreError(f"s3://bkt/pre/{key}: HEAD: object store failed after retries")

    bucket.stat = head_fails  # type: ignore[method-assign]
    tree.note_published("new.txt", etag, spooled_stat(0))  # its HEAD fails: no time
    bucket.stat = real_stat  # type: ignore[method-assign]

    def shown(t: BucketTree) -> dict[str, tuple[int, int]]:
        return {n: (stat_mod.S_IMODE(st.mode), st.uid) for n, st in t.scan(t.root).items()}

    assert shown(tree) == {"old.txt": (0o400, 1001), "new.txt": (0o400, 1001)}
    for key in ("old.txt", "new.txt"):  # deleted, the same bytes put again by another host
        bucket.times[key] = 1_700_000_000.0 + 600
    tree.expire()
    assert shown(tree) == {"old.txt": (0o444, 0), "new.txt": (0o444, 0)}
    again = make_tree(bucket)  # the times were kept in the journal
    again.keep_published(journal)
    assert shown(again) == {"old.txt": (0o444, 0), "new.txt": (0o444, 0)}


def test_an_entry_without_a_time_whose_object_is_gone_is_forgotten(tmp_path: Path) -> None:
    """Red team 96 N3: an entry noted without its upload time whose object was deleted before
    any listing showed it took the time of the next object of the same bytes put at the key,
    and showed another host's user's file as this host's user's. A listing of its folder
    without it forgets it."""
    import json
    import stat as stat_mod

    bucket = FakeBucket({"keep.txt": b"kept"})
    etag = hashlib.md5(b"").hexdigest()
    journal = tmp_path / "published.jsonl"
    journal.write_text(json.dumps(["notes.txt", etag, 0o600, 1001, 1001, 5 * 10**9]) + "\n")
    tree = make_tree(bucket)
    tree.keep_published(journal)
    assert set(tree.scan(tree.root)) == {"keep.txt"}  # notes.txt is gone: its entry goes
    bucket.files["notes.txt"] = b""  # another host's user puts an empty notes.txt
    bucket.times["notes.txt"] = 1_700_000_000.0 + 600
    tree.expire()
    st = tree.scan(tree.root)["notes.txt"]
    assert (stat_mod.S_IMODE(st.mode), st.uid) == (0o444, 0)
    again = make_tree(bucket)  # and the journal forgot it too
    again.keep_published(journal)
    st = again.scan(again.root)["notes.txt"]
    assert (stat_mod.S_IMODE(st.mode), st.uid) == (0o444, 0)


def test_an_entry_noted_after_a_listing_began_is_not_forgotten_by_it(tmp_path: Path) -> None:
    """A listing read before an upload landed does not hold it: an entry noted without a time
    since (its HEAD failed) is not forgotten by that listing (it would show the user's file
    0444 to all), only by one begun after it."""
    import stat as stat_mod

    bucket = FakeBucket({"keep.txt": b"kept"})
    tree = make_tree(bucket)
    tree.keep_published(tmp_path / "published.jsonl")
    assert set(tree.scan(tree.root)) == {"keep.txt"}
    before = tree._listings[""]
    bucket.files["new.txt"] = b"uploaded now"
    real_stat = bucket.stat

    def head_fails(key: str) -> None:
        raise StoreError(f"s3://bkt/pre/{key}: HEAD: object store failed after retries")

    bucket.stat = head_fails  # type: ignore[method-assign]
    tree.note_published("new.txt", bucket._info("new.txt").etag or "", spooled_stat(12))
    bucket.stat = real_stat  # type: ignore[method-assign]
    tree._forget_timeless("", before)  # a scan presenting the listing read before the upload
    st = tree.scan(tree.root)["new.txt"]
    assert (stat_mod.S_IMODE(st.mode), st.uid) == (0o400, 1001)


def test_a_file_removed_during_its_upload_is_noted_until_its_removal_is_settled(
    tmp_path: Path,
) -> None:
    """An `rm` of a file while it uploads notes the key and the upload's token (red team 60,
    F1): across restarts, after its upload's real entry (which clears the pending one) too,
    and until the start that deleted what the upload left settles it."""

    bucket = FakeBucket({"a.tif.zarr.zip": b"x"})
    journal = tmp_path / "published.jsonl"
    tree = make_tree(bucket)
    tree.keep_published(journal)
    st = spooled_stat(7)
    tree.note_published("a.tif.zarr.zip", "", st)  # the upload begins
    tree.note_withdrawn("a.tif.zarr.zip", "tok1")  # rm meanwhile
    tree.note_withdrawn("b.tif.zarr.zip", "tok2")
    tree.note_published("a.tif.zarr.zip", "etag1", st)  # it completes; then killed
    assert tree.withdrawn() == [("b.tif.zarr.zip", "tok2"), ("a.tif.zarr.zip", "tok1")]
    again = make_tree(bucket)
    again.keep_published(journal)  # compacts the journal
    assert again.withdrawn() == [("b.tif.zarr.zip", "tok2"), ("a.tif.zarr.zip", "tok1")]
    again.settle_withdrawn(["a.tif.zarr.zip"])
    third = make_tree(bucket)
    third.keep_published(journal)
    assert third.withdrawn() == [("b.tif.zarr.zip", "tok2")]
    third.settle_withdrawn(["b.tif.zarr.zip"])
    fourth = make_tree(bucket)
    fourth.keep_published(journal)
    assert fourth.withdrawn() == [] and fourth.pending() == []
