"""The inode table and folder listings: one owner for the mount's shared namespace state.

Inodes are handed to the kernel by lookup, readdir, create and mkdir, each counting one kernel
reference; `forget` drops them, and a node the kernel no longer references is freed (pyfuse3's
passthrough example does the same). A folder's listing keeps a cookie per name, assigned when the
name enters the listing, so `readdir` offsets stay valid while the folder changes between batches.

Lock discipline: every mutation of a folder's listing (create, rename, unlink, mkdir, rmdir,
rescan, publish) runs under that folder's `trio.Lock` (`InodeTable.locked`); two folders are
always locked in inode order. A listing read before the lock is taken is taken under it with
the names changed meanwhile as the listing has them (`Folder.note`). Everything here runs on
the trio thread; nothing blocks.
"""

from __future__ import annotations

import bisect
import itertools
import time
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import trio

from vfs.nodes import Node, NodeKey

ROOT_INODE = 1
# Children of the listings of archives' folders kept across them (the most recently used): one
# is rebuilt from its archive's tree with the same names in the same cookie order, so a listing
# let go costs a rebuild, never a readdir offset.
ARCHIVE_LISTED = 100_000
# Children of the listings of SRC's own folders kept across them, and file entries the kernel
# is let keep (each holds its node and table rows, ~700 B): past it the least recently used
# listings go and the kernel is asked to drop the oldest file entries (it then forgets their
# inodes). A user's five folders of 200,000 empty files, listed once, held the daemon at
# 890 MiB (red team 71).
LISTED_ENTRIES = 100_000


NOTED_MAX = 10_000  # names a listing notes as changed while it is read before its lock


@dataclass
class Folder:
    """A listed folder: its children by name, in cookie order, and when it was last checked."""

    children: dict[str, Node] = field(default_factory=dict)
    cookies: dict[str, int] = field(default_factory=dict)
    mtime_ns: int = 0
    checked: float = 0.0
    next_cookie: int = 1
    # An unlink took its own change of the stamp (ops.unlink): until the next full read, a
    # stamp equal to `mtime_ns` no longer proves that nobody else changed the folder.
    absorbed: bool = False
    # Names in cookie order and their cookies: no tuple per name (a listing may hold a million).
    _order: tuple[list[str], array[int]] | None = None
    # Names put or dropped while someone reads the folder before taking its lock (ops._prescan,
    # ops._read_ahead): what they read of these is older than the listing's (see `note`).
    _log: list[str] | None = None
    _log_users: int = 0
    _log_lost: bool = False

    def note(self) -> int:
        """Begin noting the names put or dropped: a mark for `changed_since`. End with
        `unnote`."""
        if self._log is None:
            self._log, self._log_lost = [], False
        self._log_users += 1
        return len(self._log)

    def changed_since(self, mark: int) -> set[str] | None:
        """The names put or dropped since `mark` (by a listing taken meanwhile, those it
        changed); None when that cannot be told (more than NOTED_MAX)."""
        if self._log is None or self._log_lost:
            return None
        return set(self._log[mark:])

    def unnote(self) -> None:
        self._log_users -= 1
        if self._log_users <= 0:
            self._log, self._log_users, self._log_lost = None, 0, False

    def _noted(self, name: str) -> None:
        log = self._log
        if log is not None and not self._log_lost:
            if len(log) >= NOTED_MAX:
                self._log_lost = True
            else:
                log.append(name)

    def put(self, name: str, node: Node) -> None:
        self._noted(name)
        if name not in self.cookies:
            self.cookies[name] = self.next_cookie
            self.next_cookie += 1
            self._order = None
        self.children[name] = node

    def drop(self, name: str) -> Node | None:
        self._noted(name)
        if name in self.cookies:
            del self.cookies[name]
            self._order = None
        return self.children.pop(name, None)

    def merge(self, fresh: dict[str, Node]) -> list[str]:
        """Take a rescan's result: names kept keep their cookie. Returns names changed or gone."""
        # Another entry at a name (its inode in SRC) is a change too, a folder's as well: the
        # kernel must look it up again, not check callers against the first one's attributes.
        changed = [n for n, node in self.children.items() if n not in fresh or
                   _key(fresh[n]) != _key(node) or fresh[n].ino != node.ino]  # fmt: skip
        log, self._log = self._log, None  # noted below: the names that changed, not all
        try:
            for name in [n for n in self.children if n not in fresh]:
                self.drop(name)
            new = [name for name in fresh if name not in self.children]
            for name, node in fresh.items():
                self.put(name, node)
        finally:
            self._log = log
        for name in (*changed, *new):
            self._noted(name)
        return changed

    def after(self, cookie: int) -> Iterator[tuple[int, str, Node]]:
        """Entries whose cookie is greater than `cookie`, in cookie order."""
        if self._order is None:
            # Already in cookie order: `put` alone adds names, each with a cookie above all
            # before it, and a dict keeps insertion order. Sorting a million names took 0.74 s
            # of the event loop after each change to the folder.
            self._order = list(self.cookies), array("q", self.cookies.values())
        names, cookies = self._order  # never changed: a change makes a new order
        for i in range(bisect.bisect_right(cookies, cookie), len(names)):
            node = self.children.get(names[i])
            if node is not None:
                yield cookies[i], names[i], node


Key = NodeKey | str  # a mirrored entry's key is kept as its path alone (see `_key`)


def _key(node: Node) -> Key:
    """`node.key` as the table keeps it: one object per inode, shared by both maps, and for a
    mirrored entry (no backend, member or version) one string, not a tuple: a folder's path
    (`folder_of` finds it by that), a file's path and its inode number in SRC. The two forms
    never meet: a string never equals a tuple. Another file at the same name (renamed over it)
    is another inode of the mount, as on any filesystem: kept as one, the kernel checked a
    caller's rights against the attributes it had cached of the first while the daemon opened
    the second, for up to MIRROR_TIMEOUT (red team 66, F4)."""
    if node.backend is None and not node.member and not node.version:
        if node.ino and not node.is_dir:
            return f"{node.real_text}\0{node.ino}"
        return node.real_text
    return node.key


class _Members(set[int]):
    """The inodes whose nodes live in one folder (`InodeTable._at`), and that folder's path."""

    __slots__ = ("place",)

    def __init__(self, place: str) -> None:
        super().__init__()
        self.place = place


def _place(node: Node, key: Key, root_text: str) -> str:
    """The path of the folder of SRC a node (of table key `key`) lives in, as text: a real
    entry's folder (an archive's member: its archive's folder), a spooled file's folder in
    SRC, not in the spool."""
    if node.spooled:
        head, sep, _name = node.spooled.rpartition("/")
        return f"{root_text}/{head}" if sep else root_text
    real_text = key if isinstance(key, str) else key[0]
    return real_text.rpartition("/")[0]


class LetGoListing:
    """What is kept of a listing of SRC let go: its stamp, and a 64-bit hash of each name
    (8 bytes a name, not ~450): read again, its new names are told from the old, so the
    kernel drops what it may remember of them as missing (a negative entry, 10 s). Made on
    the event loop when the listing goes, so not sorted: 0.06 s for a million names, 0.52 s
    sorted; the rare listing read again makes a set of them once (`new_names`)."""

    __slots__ = ("names", "stamp")

    def __init__(self, folder: Folder) -> None:
        self.stamp = folder.mtime_ns
        self.names = array("q", map(hash, folder.children))

    def new_names(self, names: Iterable[str]) -> list[str]:
        """Those of `names` the listing let go did not have."""
        had = set(self.names)
        return [name for name in names if hash(name) not in had]


class _Listings:
    """Listings kept by recency, their children counted against a budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.counts: OrderedDict[int, int] = OrderedDict()  # inode → children
        self.children = 0

    def keep(self, ino: int, folder: Folder) -> None:
        self.children -= self.counts.pop(ino, 0)
        self.counts[ino] = len(folder.children)
        self.children += len(folder.children)

    def used(self, ino: int) -> None:
        if ino in self.counts:
            self.counts.move_to_end(ino)

    def drop(self, ino: int) -> None:
        self.children -= self.counts.pop(ino, 0)

    def over(self, keep: Callable[[int], bool]) -> list[int]:
        """The oldest listings to let go until the rest fit (never the newest, nor one `keep`
        holds), taken out of the count."""
        excess = self.children - self.budget
        if excess <= 0 or len(self.counts) < 2:
            return []
        newest = next(reversed(self.counts))
        out: list[int] = []
        for old, count in self.counts.items():
            if excess <= 0:
                break
            if old != newest and not keep(old):
                out.append(old)
                excess -= count
        for old in out:
            self.children -= self.counts.pop(old)
        return out


class InodeTable:
    def __init__(
        self,
        root: Node,
        archive_listed: int = ARCHIVE_LISTED,
        listed_entries: int = LISTED_ENTRIES,
    ) -> None:
        self._nodes: dict[int, Node] = {ROOT_INODE: root}
        # The inodes by the folder their nodes live in: a folder moved (`rekey_below`) visits
        # the nodes below it, not every node of the table (a user renaming an empty folder in a
        # loop held the event loop ~1.9 s a rename with 100,000 names listed anywhere).
        self._root_text = root.real_text
        self._at: dict[str, _Members] = {}
        self._place_of: dict[int, _Members] = {}
        key = _key(root)
        self._index(ROOT_INODE, root, key)
        self._ino_of: dict[Key, int] = {key: ROOT_INODE}
        # The key each inode was registered under: a node moved in place (the write side renames
        # it) no longer shows its old key, and that mapping must still go.
        self._key_of: dict[int, Key] = {ROOT_INODE: key}
        self._refs: dict[int, int] = {ROOT_INODE: 1}
        self._next = ROOT_INODE + 1
        self.folders: dict[int, Folder] = {}
        self._locks: dict[int, trio.Lock] = {}
        # When each folder's lock was last let go (a count of all lettings-go): a listing read
        # before the lock was taken is good only if nobody held it meanwhile (ops._prescan).
        self._released: dict[int, int] = {}
        self._releases = itertools.count(1)
        self._pinned: dict[int, int] = {}  # open handles per inode: kept while open
        self.moves = 0  # folders moved so far: a scan begun before a move may hold old paths
        self._archive_listings = _Listings(archive_listed)
        self._src_listings = _Listings(listed_entries)
        self._open_dirs: dict[int, int] = {}  # opendir handles per folder: listings kept
        self._gone: dict[int, LetGoListing] = {}  # SRC listings let go, by inode
        # Where the kernel was last handed each inode (folder inode, name), least recently
        # first: past `listed_entries` the oldest are asked to go (`overflow`).
        self._named: OrderedDict[int, tuple[int, str]] = OrderedDict()

    @property
    def archive_listed(self) -> int:
        return self._archive_listings.budget

    @archive_listed.setter
    def archive_listed(self, budget: int) -> None:
        self._archive_listings.budget = budget

    @property
    def listed_entries(self) -> int:
        return self._src_listings.budget

    @listed_entries.setter
    def listed_entries(self, budget: int) -> None:
        self._src_listings.budget = budget

    def __len__(self) -> int:
        return len(self._nodes)

    # -- identity --------------------------------------------------------------------------

    def get(self, ino: int) -> Node | None:
        return self._nodes.get(ino)

    def known(self, node: Node) -> int | None:
        return self._ino_of.get(_key(node))

    def hand_out(self, node: Node, at: tuple[int, str] | None = None) -> int:
        """The inode for `node`, counting one more kernel reference to it (the kernel's entry
        of it `at` (folder inode, name))."""
        ino = self.assign(node)
        self.count(ino, at)
        return ino

    def assign(self, node: Node) -> int:
        """The inode for `node` (a new one for a key never seen), without a kernel reference.
        The caller either counts a reference (`hand_out`/`count`) or lets `release_unused` go."""
        key = _key(node)
        ino = self._ino_of.get(key)
        if ino is None:
            ino = self._ino_of[key] = self._next
            self._key_of[ino] = key
            self._next += 1
        self._nodes[ino] = node
        self._index(ino, node, key)
        return ino

    def count(self, ino: int, at: tuple[int, str] | None = None) -> None:
        self._refs[ino] = self._refs.get(ino, 0) + 1
        if at is None:
            return
        node = self._nodes.get(ino)
        # Files only: a folder's entry dropped loses the path of every process whose working
        # folder it is (getcwd fails with ENOENT, and `git`, `python`… with it).
        if node is not None and not node.is_dir:
            self._named[ino] = at
            self._named.move_to_end(ino)

    def renamed(self, ino: int, at: tuple[int, str]) -> None:
        """The kernel's entry of `ino` moved (a rename through the mount)."""
        if ino in self._named:
            self._named[ino] = at

    def overflowing(self) -> bool:
        return len(self._named) > self.listed_entries

    def overflow(self, most: int) -> list[tuple[int, str]]:
        """Up to `most` kernel entries to ask the kernel to drop (`invalidate_entry`), the
        least recently handed out first, until those left fit `listed_entries`: the kernel
        then forgets their inodes (unless a process still holds one), and their nodes go. An
        open file's entry is kept (it is in use). Each is returned once: handed out again, it
        counts again."""
        excess = min(most, len(self._named) - self.listed_entries)
        if excess <= 0:
            return []
        victims: list[int] = []
        in_use: list[int] = []
        for ino in self._named:
            if len(victims) >= excess:
                break
            if self._pinned.get(ino):
                in_use.append(ino)
            else:
                victims.append(ino)
        for ino in in_use:  # as if used now: not walked past again at every call
            self._named.move_to_end(ino)
        return [self._named.pop(ino) for ino in victims]

    def release_unused(self, ino: int) -> None:
        if not self._refs.get(ino) and not self._pinned.get(ino):
            self._drop(ino)

    def replace(self, ino: int, node: Node) -> None:
        """The same inode now stands for `node` (a write moved it into the spool, a rename)."""
        key = _key(node)
        self._register(ino, key)
        self._nodes[ino] = node
        self._index(ino, node, key)

    def _register(self, ino: int, key: Key) -> None:
        old = self._key_of.get(ino)
        if old is not None and old != key and self._ino_of.get(old) == ino:
            del self._ino_of[old]
        self._ino_of[key] = ino
        self._key_of[ino] = key

    def _index(self, ino: int, node: Node, key: Key) -> None:
        place = _place(node, key, self._root_text)
        held = self._place_of.get(ino)
        if held is not None:
            if held.place == place:
                return
            self._unindex(ino, held)
        members = self._at.get(place)
        if members is None:
            members = self._at[place] = _Members(place)
        members.add(ino)
        self._place_of[ino] = members

    def _unindex(self, ino: int, members: _Members) -> None:
        members.discard(ino)
        if not members:
            del self._at[members.place]

    def _below_inos(self, old: Path, new: Path) -> set[int]:
        """The inodes whose nodes may lie below the folder `old`, moved to `new`: those of
        every folder at or below it, and the folder's own (its node moved or not yet)."""
        top = str(old)
        prefix = top.rstrip("/") + "/"
        found: set[int] = set()
        for place, members in self._at.items():
            if place == top or place.startswith(prefix):
                found |= members
        for path in (old, new):
            ino = self._ino_of.get(str(path))
            if ino is not None:
                found.add(ino)
        return found

    def forget(self, ino: int, n: int) -> None:
        if ino == ROOT_INODE:
            return
        left = self._refs.get(ino, 0) - n
        if left > 0:
            self._refs[ino] = left
            return
        self._refs.pop(ino, None)
        if not self._pinned.get(ino):
            self._drop(ino)

    def pin(self, ino: int) -> None:
        self._pinned[ino] = self._pinned.get(ino, 0) + 1

    def unpin(self, ino: int) -> None:
        left = self._pinned.get(ino, 0) - 1
        if left > 0:
            self._pinned[ino] = left
            return
        self._pinned.pop(ino, None)
        if not self._refs.get(ino):
            self._drop(ino)

    def _drop(self, ino: int) -> None:
        self._nodes.pop(ino, None)
        members = self._place_of.pop(ino, None)
        if members is not None:
            self._unindex(ino, members)
        key = self._key_of.pop(ino, None)
        if key is not None and self._ino_of.get(key) == ino:
            del self._ino_of[key]
        self.folders.pop(ino, None)
        self._archive_listings.drop(ino)
        self._src_listings.drop(ino)
        self._named.pop(ino, None)
        self._gone.pop(ino, None)
        lock = self._locks.get(ino)
        if lock is not None and not _busy(lock):  # else `locked` drops it when released
            del self._locks[ino]
            self._released.pop(ino, None)

    # -- folders ---------------------------------------------------------------------------

    def keep_archive_listing(self, ino: int, folder: Folder) -> None:
        """Hold the listing of an archive's folder among the most recently used ones; older
        ones past `archive_listed` children in all are let go (never the newest, nor one whose
        lock is held: it is being read or rebuilt). A readdir of one runs without a checkpoint
        (the listing is not dropped under it), and one let go between two readdir calls is
        rebuilt with the same cookies."""
        self.folders[ino] = folder
        self._archive_listings.keep(ino, folder)
        for old in self._archive_listings.over(self._busy):
            self.folders.pop(old, None)

    def keep_listing(self, ino: int, folder: Folder) -> None:
        """Hold the listing of a folder of SRC (its children may have changed) among the most
        recently used ones; older ones past `listed_entries` children in all are let go, and
        read again from SRC when next asked for. Never the root's, one whose lock is held, nor
        one a readdir may be half way through (an opendir handle is open): a listing read
        again numbers its names anew, and the reader's offset would skip or repeat names."""
        self.folders[ino] = folder
        self._gone.pop(ino, None)
        if ino == ROOT_INODE:
            return
        self._src_listings.keep(ino, folder)
        self._let_listings_go()

    def _let_listings_go(self) -> None:
        for old in self._src_listings.over(lambda i: self._busy(i) or i in self._open_dirs):
            folder = self.folders.pop(old, None)
            if folder is not None:
                self._gone[old] = LetGoListing(folder)

    def stamp_let_go(self, ino: int, now: int) -> bool:
        """Whether the folder whose listing went changed since (its stamp now `now`); the
        stamp is kept, so each change is told once."""
        gone = self._gone.get(ino)
        if gone is None:
            return True
        before, gone.stamp = gone.stamp, now
        return before != now

    def taken_back(self, ino: int) -> LetGoListing | None:
        """What is known of the listing of `ino` let go, for the listing read again now."""
        return self._gone.pop(ino, None)

    def held_files_in(self, path: Path) -> list[tuple[int, int, str]]:
        """(inode, folder inode, name) of the kernel's entries of files in `path`."""
        members = self._at.get(str(path), ())
        return [(ino, *at) for ino in members if (at := self._named.get(ino)) is not None]

    def drop_listing(self, ino: int) -> None:
        """Let go of a folder's listing (it is read again when next asked for)."""
        self.folders.pop(ino, None)
        self._archive_listings.drop(ino)
        self._src_listings.drop(ino)

    def used_listing(self, ino: int) -> None:
        self._archive_listings.used(ino)
        self._src_listings.used(ino)

    def opened_dir(self, ino: int) -> None:
        self._open_dirs[ino] = self._open_dirs.get(ino, 0) + 1

    def released_dir(self, ino: int) -> None:
        left = self._open_dirs.pop(ino, 0) - 1
        if left > 0:
            self._open_dirs[ino] = left
        else:  # a listing kept for its reader past the budget may go now
            self._let_listings_go()

    def _busy(self, ino: int) -> bool:
        return _busy(self._locks.get(ino))

    def drop_archive_listings(self, real: Path) -> None:
        """Let go of the listings of the folders of the archive at `real` (its tree was read
        again as another): each is rebuilt from the tree at its next lookup or readdir."""
        for ino in [i for i in self._archive_listings.counts if (n := self._nodes.get(i))
                    is not None and n.real == real and not self._busy(i)]:  # fmt: skip
            self._archive_listings.drop(ino)
            self.folders.pop(ino, None)

    def folder_of(self, path: Path) -> tuple[int, Folder] | None:
        """A mirrored folder of SRC the kernel holds, and its listing, by its real path."""
        ino = self._ino_of.get(str(path))  # a mirrored folder's key (`_key`)
        if ino is None or ino not in self.folders:
            return None
        return ino, self.folders[ino]

    def held_unlisted(self, path: Path) -> int | None:
        """A mirrored folder of SRC the kernel holds whose listing was let go (`keep_listing`),
        by its real path: the kernel may still hold entries of its names."""
        ino = self._ino_of.get(str(path))
        return ino if ino is not None and ino not in self.folders else None

    def file_entries_in(self, path: Path) -> list[tuple[int, str]]:
        """The kernel's entries (folder inode, name) of files in the folder of SRC at `path`."""
        return [(parent, name) for _ino, parent, name in self.held_files_in(path)]

    def lock(self, ino: int) -> trio.Lock:
        found = self._locks.get(ino)
        if found is None:
            found = self._locks[ino] = trio.Lock()
        return found

    @asynccontextmanager
    async def locked(self, *inos: int) -> AsyncIterator[None]:
        """Hold the listing locks of one or two folders (always taken in inode order). A free
        lock is taken without a checkpoint: `Lock.acquire` yields to the scheduler even then, a
        pass through the run loop (and an epoll_wait) twice per file rsync copies."""
        held: list[trio.Lock] = []
        try:
            for ino in sorted(set(inos)):
                lock = self.lock(ino)
                try:
                    lock.acquire_nowait()
                except trio.WouldBlock:
                    await lock.acquire()
                held.append(lock)
            yield
        finally:
            for ino in sorted(set(inos))[: len(held)]:
                self._released[ino] = next(self._releases)
            for lock in reversed(held):
                lock.release()
            for ino in inos:  # an inode forgotten meanwhile (or never in the table) keeps none
                lock = self._locks.get(ino)
                if lock is not None and ino not in self._nodes and not _busy(lock):
                    del self._locks[ino]
                    self._released.pop(ino, None)

    def released(self, ino: int) -> int:
        """When the folder's lock was last let go: unchanged, nobody held it since."""
        return self._released.get(ino, 0)

    def rekey_below(self, old: Path, new: Path) -> None:
        """A real folder moved from `old` to `new`: every node below it follows (same inodes),
        the folder itself included, whether or not the caller already moved its `real`.

        Listings below it keep their cookies (a readdir may be half way through one) and are
        checked against SRC at their next use; files spooled below it follow too. Only the
        nodes below it are visited (`_at`), and the listings of those folders: a listing holds
        the entries of its own folder only."""
        self.moves += 1
        root = self._nodes[ROOT_INODE].real
        spool_move = (_relpath(root, old), _relpath(root, new))
        seen: dict[int, Node] = {}
        below = self._below_inos(old, new)
        for ino in below:
            found = self._nodes.get(ino)
            if found is None:
                continue
            node = self._nodes[ino] = _follow(found, old, new, spool_move, seen)
            key = _key(node)
            if self._key_of.get(ino) != key:
                self._register(ino, key)
            self._index(ino, node, key)
        for ino in below:
            folder = self.folders.get(ino)
            if folder is None:
                continue
            for name, child in list(folder.children.items()):
                folder.children[name] = _follow(child, old, new, spool_move, seen)
            node = self._nodes.get(ino)
            if node is not None and node.backend is None and _below(node.real, new):
                folder.checked, folder.mtime_ns = 0.0, 0  # spooled names: read afresh

    def stale_folders(self, older_than: float) -> list[int]:
        now = time.monotonic()
        return [i for i, f in self.folders.items() if now - f.checked > older_than]


def _busy(lock: trio.Lock | None) -> bool:
    if lock is None:
        return False
    stats = lock.statistics()
    return stats.locked or stats.tasks_waiting > 0


def _below(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _relpath(root: Path, path: Path) -> str | None:
    return path.relative_to(root).as_posix() if _below(path, root) and path != root else None


def _follow(
    node: Node,
    old: Path,
    new: Path,
    spool_move: tuple[str | None, str | None],
    seen: dict[int, Node],
) -> Node:
    """`node` as it is after the folder `old` moved to `new` (once per node object: `seen`)."""
    done = seen.get(id(node))
    if done is not None:
        return done
    seen[id(node)] = node
    if _below(node.real, old):
        node.real = new / node.real.relative_to(old)  # in place: listings share the object
        return node
    old_rel, new_rel = spool_move
    rel = node.spooled
    if not rel or old_rel is None or new_rel is None:
        return node
    if rel != old_rel and not rel.startswith(old_rel + "/"):
        return node
    depth = len(PurePosixPath(rel).parts)
    files = node.real.parents[depth - 1]
    if files / rel != node.real:
        return node
    moved_rel = new_rel + rel[len(old_rel) :]
    # A copy, not in place: open handles share this object, and the pack queue counts their
    # opens and closes under the relpath they were opened with.
    moved = seen[id(node)] = node.moved(files / moved_rel, moved_rel)
    return moved
