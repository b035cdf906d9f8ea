"""The archive trees the mount keeps (`DescribedTrees`) and how a tree let go comes back."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.unit.inprocess import InProcessMount, fake_session
from vfs.backends.base import EMPTY, Description, Entry
from vfs.errors import ManifestError
from vfs.mount.described import DescribedTrees
from vfs.mount.index import DescriptionIndex
from vfs.mount.tree import READ_AHEAD_MAX, SourceTree, read_ahead


def tree_of(size: int, tag: int) -> Entry:
    """A folder of `size - 1` files (`size` entries in all), told apart by `tag`."""
    root = Entry(is_dir=True)
    for i in range(size - 1):
        root.children[f"f{i}"] = Entry(size=tag, locator={"offset": i})
    return root


class TreesMachine(RuleBasedStateMachine):
    """Kept entries never exceed the budget but by the most recent tree alone; what a get
    returns equals what was put; a tree let go loads again equal."""

    def __init__(self) -> None:
        super().__init__()
        self.trees = DescribedTrees(budget=20)
        self.made: dict[int, tuple[int, int]] = {}  # key → (size, tag) of the tree put last
        self.tag = 0

    def fresh(self, key: int) -> Entry:
        size, tag = self.made[key]
        return tree_of(size, tag)

    @rule(key=st.integers(0, 5), size=st.integers(1, 30))
    def put(self, key: int, size: int) -> None:
        self.tag += 1
        self.made[key] = (size, self.tag)
        self.trees.put(key, tree_of(size, self.tag))
        assert self.trees.get(key) == self.fresh(key)  # the most recent is always kept

    @rule(key=st.integers(0, 5))
    def get(self, key: int) -> None:
        found = self.trees.get(key)
        if found is not None:
            assert found == self.fresh(key)

    @rule(key=st.integers(0, 5))
    def load(self, key: int) -> None:
        if key not in self.made:
            return
        loaded = self.trees.get_or_load(key, lambda: self.fresh(key))
        assert loaded == self.fresh(key)

    @invariant()
    def within_budget(self) -> None:
        assert self.trees.held <= self.trees.budget or len(self.trees) == 1


TestTreesMachine = TreesMachine.TestCase
TestTreesMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_kept_tree_shares_one_empty_mapping_that_refuses_changes() -> None:
    trees = DescribedTrees(budget=100)
    root = tree_of(3, 1)
    trees.put("k", root)
    leaf = root.children["f0"]
    assert leaf.children is EMPTY and leaf.xattrs is EMPTY and leaf.locator == {"offset": 0}
    with pytest.raises(TypeError):
        leaf.children["x"] = Entry()
    assert Description("a", root).to_json()["root"]["c"]["f0"] == {"d": False, "s": 1,
                                                                  "l": {"offset": 0}}  # fmt: skip


def test_one_load_at_a_time_per_key() -> None:
    trees = DescribedTrees(budget=1)
    started, release = threading.Event(), threading.Event()
    loads: list[int] = []

    def load() -> Entry:
        loads.append(1)
        started.set()
        release.wait(5)
        return tree_of(2, 7)

    got: list[Entry] = []
    first = threading.Thread(target=lambda: got.append(trees.get_or_load("k", load)))
    first.start()
    started.wait(5)
    second = threading.Thread(target=lambda: got.append(trees.get_or_load("k", load)))
    second.start()
    release.set()
    first.join(5)
    second.join(5)
    assert len(loads) == 1 and len(got) == 2 and got[0] is got[1]


# -- a tree let go, read again through SourceTree --------------------------------------------


class TarBackend:
    """A plain (unencrypted) TAR as a folder of its members: enough to test the tree."""

    name = "tar"

    def __init__(self) -> None:
        self.described = 0

    def claims(self, path: Path, is_dir: bool) -> bool:
        return not is_dir and path.name.endswith(".tar")

    def describe(self, path: Path) -> Description:
        self.described += 1
        root = Entry(is_dir=True)
        with tarfile.open(path) as tar:
            for info in tar.getmembers():
                folder, _, leaf = info.name.rpartition("/")
                node = root
                for part in filter(None, folder.split("/")):
                    node = node.children.setdefault(part, Entry(is_dir=True))
                node.children[leaf] = Entry(size=info.size, locator={"offset": info.offset_data})
        return Description(path.name, root)

    def open(self, path: Path, member: str, entry: Entry) -> Any:
        raise NotImplementedError


def write_tar(path: Path, names: list[str]) -> None:
    with tarfile.open(path, "w") as tar:
        for name in names:
            data = name.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    write_tar(folder / "a.tar", [f"d/a{i}" for i in range(5)])
    write_tar(folder / "b.tar", [f"d/b{i}" for i in range(5)])
    return folder


def test_a_tree_let_go_is_read_again_from_the_index_with_the_same_children(
    src: Path, tmp_path: Path
) -> None:
    backend = TarBackend()
    index = DescriptionIndex(tmp_path / "index" / "index.sqlite")
    tree = SourceTree(src, [backend], index=index, described_entries=8)  # one tree of 7
    shown = tree.scan(src)
    assert backend.described == 2 and len(tree.trees) == 1  # a.tar's tree let go
    a = shown["a.tar"]
    assert a.entry is None  # a folder's node keeps no tree
    (d,) = tree.children_of_archive_node(a).values()
    kids = tree.children_of_archive_node(d)
    assert list(kids) == [f"a{i}" for i in range(5)]  # TAR order: the listing's cookie order
    assert backend.described == 2 and tree.trees.loads == 1  # from the index, not the TAR
    assert kids["a3"].entry is not None and kids["a3"].entry.locator["offset"] > 0
    index.close()


def test_a_changed_archive_never_lends_its_tree_to_the_old_version(
    src: Path, tmp_path: Path
) -> None:
    backend = TarBackend()
    tree = SourceTree(src, [backend], described_entries=8)
    shown = tree.scan(src)
    a = shown["a.tar"]
    (d,) = tree.children_of_archive_node(shown["b.tar"]).values()  # b is kept: a let go
    write_tar(src / "a.tar", [f"d/new{i}" for i in range(9)])
    os.utime(src / "a.tar", ns=(1, 1))
    with pytest.raises(OSError) as raised:
        tree.children_of_archive_node(a)
    assert raised.value.errno == errno.ESTALE
    assert list(tree.children_of_archive_node(d)) == [f"b{i}" for i in range(5)]
    fresh = tree.scan(src)["a.tar"]  # the folder's rescan shows the new version
    (d,) = tree.children_of_archive_node(fresh).values()
    assert list(tree.children_of_archive_node(d)) == [f"new{i}" for i in range(9)]


class OneFileBackend:
    """`NAME.one` presents one file NAME: a small archive's description."""

    name = "one"

    def claims(self, path: Path, is_dir: bool) -> bool:
        return not is_dir and path.name.endswith(".one")

    def describe(self, path: Path) -> Description:
        if path.name.startswith("bad"):
            raise ManifestError(f"{path}: not one of ours")
        return Description(path.name[: -len(".one")], Entry(size=path.stat().st_size))

    def open(self, path: Path, member: str, entry: Entry) -> Any:
        raise NotImplementedError


def test_a_folder_s_one_file_descriptions_go_to_the_index_together_and_trees_at_once(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing's descriptions of small archives are written in one transaction (one commit
    each cost ~7 % of a cold `ls -l` of 1,000 archives); a tree is written when described, so
    a folder of packages never holds their trees together."""
    for i in range(40):
        (src / f"f{i:02d}.one").write_bytes(b"x" * i)
    index = DescriptionIndex(tmp_path / "index" / "index.sqlite")
    calls: list[list[str]] = []
    real = index.put_many

    def put_many(rows: Any) -> Any:
        calls.append(sorted(Path(r[0]).name for r in rows))
        return real(rows)

    monkeypatch.setattr(index, "put_many", put_many)
    tree = SourceTree(src, [TarBackend(), OneFileBackend()], index=index)
    shown = tree.scan(src)
    assert sorted(shown) == sorted([f"f{i:02d}" for i in range(40)] + ["a.tar", "b.tar"])
    assert sorted(calls) == sorted([["a.tar"], ["b.tar"], [f"f{i:02d}.one" for i in range(40)]])
    fresh = SourceTree(src, [TarBackend(), OneFileBackend()], index=index)
    monkeypatch.setattr(OneFileBackend, "describe", lambda *_: pytest.fail("not from the index"))
    assert sorted(fresh.scan(src)) == sorted(shown)
    index.close()


# -- listings of archives' folders: let go past their budget, rebuilt with the same cookies -----


def test_listings_of_archive_folders_are_let_go_and_rebuilt_with_their_cookies(
    tmp_path: Path,
) -> None:
    """Listing the folders of many archives kept every listing (and its nodes) while the kernel
    held the folder. Past `archive_listed` children in all, the oldest are let go; one let go
    between two readdir calls of it is rebuilt with the same cookies: the reader sees every
    name once, in the same order."""
    src = tmp_path / "src"
    src.mkdir()
    for archive in "abc":
        write_tar(src / f"{archive}.tar", [f"d/{archive}{i:03d}" for i in range(40)])
    m = InProcessMount(src, tmp_path / "work", read_only=True)
    m.tree.backends.insert(0, TarBackend())
    m.ops.inodes.archive_listed = 50
    listings = m.ops.inodes.folders

    async def run() -> None:
        whole = await m.listdir("a.tar/d")
        assert whole == [f"a{i:03d}" for i in range(40)]
        first = await m.resolve("a.tar/d")
        others = iter(["b.tar/d", "c.tar/d"])

        async def list_another() -> None:
            other = next(others, None)
            if other is not None:
                await m.listdir(other)
                assert first not in listings  # let go, while its reader is half way
            held = [f for i, f in listings.items() if m.ops.inodes.get(i).backend is not None]
            assert sum(len(f.children) for f in held) <= 50 or len(held) == 1

        again = [name for name, _ in await m.readdir(first, room=15, between=list_another)]
        assert again == whole

    with fake_session():
        m.run(run)


# -- what the index stores of a tree, written entry by entry -----------------------------------

names = st.text(min_size=1, max_size=8)
leaves = st.builds(
    Entry,
    size=st.integers(0, 2**40),
    sha256=st.none() | st.just("ab" * 32),
    xattrs=st.dictionaries(names, st.text(max_size=4), max_size=2),
    locator=st.dictionaries(names, st.integers() | st.text(max_size=3), max_size=2),
)


def folder_of(children: dict[str, Entry]) -> Entry:
    return Entry(is_dir=True, children=children)


entries = st.recursive(leaves, lambda kids: st.dictionaries(names, kids, max_size=4).map(folder_of))


@settings(max_examples=200, deadline=None)
@given(root=entries, name=names)
def test_json_text_is_the_json_of_to_json(root: Entry, name: str) -> None:
    desc = Description(name, root)
    assert desc.json_text() == json.dumps(desc.to_json(), separators=(",", ":"))
    assert Description.from_json(json.loads(desc.json_text())).root == root


# -- a listing's archives: index rows read first, the rest read ahead ----------------------------


def resident(path: Path) -> int:
    """Bytes of `path` in the page cache, as util-linux's fincore counts them (not vfs's)."""
    done = subprocess.run(["fincore", "-b", "-n", "-o", "RES", str(path)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout.split()[0])


def evicted(path: Path) -> Path:
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert resident(path) == 0, f"{path} could not be evicted from the page cache here"
    return path


def settled(path: Path, want: bool) -> bool:
    """Whether `path` is (`want`) or is not in the page cache within a second."""
    deadline = time.monotonic() + 1.0
    while (resident(path) > 0) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return (resident(path) > 0) == want


def test_read_ahead_reads_a_file_into_the_page_cache_and_never_through_a_link(
    tmp_path: Path,
) -> None:
    target = tmp_path / "outside.bin"
    target.write_bytes(os.urandom(64 * 1024))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "link.zarr.zip").symlink_to(target)
    os.mkfifo(tmp_path / "d" / "fifo.zarr.zip")  # swapped in after the listing: no hang
    (tmp_path / "d" / "small.zarr.zip").write_bytes(os.urandom(64 * 1024))
    evicted(target)
    evicted(tmp_path / "d" / "small.zarr.zip")
    fd = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in ("link.zarr.zip", "fifo.zarr.zip", "missing.zarr.zip", "small.zarr.zip"):
            read_ahead(fd, name)
    finally:
        os.close(fd)
    assert settled(tmp_path / "d" / "small.zarr.zip", True)
    assert settled(target, False)


def test_a_listing_reads_ahead_only_the_small_archives_it_describes_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is asked about every archive at once, before any is described; the archives
    it knows, those that failed before and large ones are not read ahead."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.one").write_bytes(b"x" * (i + 1))
    (src / "big.one").write_bytes(b"x" * (READ_AHEAD_MAX + 1))
    (src / "bad.one").write_bytes(b"junk")
    index = DescriptionIndex(tmp_path / "index.sqlite")
    tree = SourceTree(src, [OneFileBackend()], index=index)
    tree.scan(src)  # all in the index now, bad.one remembered as failed
    for i in (1, 4):
        (src / f"f{i}.one").write_bytes(b"changed")  # described afresh
    (src / "big.one").write_bytes(b"y" * (READ_AHEAD_MAX + 1))  # afresh, but too big
    asked: list[str] = []
    monkeypatch.setattr("vfs.mount.tree.read_ahead", lambda _fd, name: asked.append(name))
    asks: list[list[str]] = []
    real_get_many = index.get_many
    monkeypatch.setattr(index, "get", lambda *_: pytest.fail("asked for one archive"))

    def get_many(wanted: Any) -> Any:
        asks.append(sorted(Path(w[0]).name for w in wanted))
        return real_get_many(wanted)

    monkeypatch.setattr(index, "get_many", get_many)
    shown = tree.scan(src)
    assert sorted(asked) == ["f1.one", "f4.one"]
    assert asks == [sorted(["bad.one", "big.one", *(f"f{i}.one" for i in range(6))])]
    assert shown["f1"].size == len(b"changed") and shown["f0"].size == 1
    index.close()


class ManyMembersBackend:
    """`NAME.many` presents a folder of as many members as the file has bytes."""

    name = "many"

    def __init__(self) -> None:
        self.described: list[str] = []
        self.gate: threading.Event | None = None

    def claims(self, path: Path, is_dir: bool) -> bool:
        return not is_dir and path.name.endswith(".many")

    def describe(self, path: Path) -> Description:
        self.described.append(path.name)
        if self.gate is not None:
            self.gate.wait(5)
        root = Entry(is_dir=True)
        for i in range(path.stat().st_size):
            root.children[f"member-{i:08d}"] = Entry(size=i)
        return Description(path.name[: -len(".many")], root)

    def open(self, path: Path, member: str, entry: Entry) -> Any:
        raise NotImplementedError


def test_a_listing_reads_the_large_trees_the_index_holds_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing asks the index for every archive at once, but a large tree comes back
    unread, and is read alone when its archive is, and handed to the trees' LRU before the
    next: a remount's listing of 100 links to a package of 20,000 members held every tree at
    once (2.25 GB with a 64 MiB cache, red team 95 F4)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"p{i}.many").write_bytes(b"x" * 5000)
    (src / "s.many").write_bytes(b"x" * 3)
    index = DescriptionIndex(tmp_path / "index.sqlite")
    backend = ManyMembersBackend()
    first = SourceTree(src, [backend], index=index).scan(src)
    assert len(backend.described) == 5
    tree = SourceTree(src, [backend], index=index)  # a remount: all in the index
    held: list[int] = []
    real_get = index.get

    def get(*args: Any) -> Any:
        held.append(len(tree.trees))  # trees in the LRU when the next is read
        return real_get(*args)

    monkeypatch.setattr(index, "get", get)
    shown = tree.scan(src)
    assert len(backend.described) == 5, "described afresh, not read from the index"
    assert sorted(shown) == sorted(first) and len(held) == 4
    assert all(n >= i for i, n in enumerate(held)), "read before the one before went to the LRU"
    root = tree.tree_of(shown["p2"])
    assert len(root.children) == 5000
    index.close()


def test_one_archive_is_described_once_at_a_time(tmp_path: Path) -> None:
    """Two threads that want the description of the same version of an archive (a listing
    read before the folder's lock, and the watcher's word of the same new names) make it
    once: the second waits for the first's."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "p.many").write_bytes(b"x" * 300)
    backend = ManyMembersBackend()
    backend.gate = threading.Event()
    tree = SourceTree(src, [backend], index=None)
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(tree.scan(src)))
               for _ in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    time.sleep(0.3)
    backend.gate.set()
    for t in threads:
        t.join(10)
    assert backend.described == ["p.many"]
    assert len(results) == 2 and all(r["p"].is_dir for r in results)


def test_a_listing_read_when_the_mount_stops_ends_at_its_next_archive(tmp_path: Path) -> None:
    """Red team 100 R3: a listing read behind, describing forty archives when the mount was
    unmounted, held the daemon's exit past its 10 s grace (a worker thread does not stop).
    Once the tree is told the mount stops, a scan describes no further archive."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"p{i}.many").write_bytes(b"x" * 10)
    backend = ManyMembersBackend()
    tree = SourceTree(src, [backend], index=None)
    real = backend.describe

    def then_stop(path: Path) -> Description:
        tree.stopping = True  # the unmount, while the first is described
        return real(path)

    backend.describe = then_stop  # type: ignore[method-assign]
    with pytest.raises(OSError) as stopped:
        tree.scan(src)
    assert stopped.value.errno == errno.ECANCELED
    assert len(backend.described) == 1
