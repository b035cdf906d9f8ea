"""Persistent index of archive descriptions and verified digests: a remount lists without reopening.

Descriptions are keyed by archive path, size, mtime, inode number and ctime: a changed archive
misses and is described afresh (objects of a mounted bucket: by URL, size, last-modified and ETag,
in a table of their own). So is a verified state: an archive rewritten in place with its mtime
restored (`cp -p`, `touch -r`) is neither "verified" nor described as the archive it replaced (its
predecessor's description, and so its sha256, stood in for it: a valid archive failed as damaged).
The schema version is kept in SQLite's `user_version`; an index of another version is set aside
and rebuilt (as ratarmount does), never misread. SQLite gives atomic, crash-safe writes; a damaged
index file is set aside the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path

from vfs.backends.base import DESCRIPTION_VERSION, Description, Entry
from vfs.decant import archive_stat
from vfs.names import is_utf8
from vfs.stores.base import ObjectInfo, ObjectPath, etag_number

log = logging.getLogger(__name__)

SCHEMA_VERSION = 5
# Descriptions up to this long (a few hundred members) are read back together for a listing;
# larger ones one at a time, each handed to the trees' LRU before the next (get_many). Their
# trees are kept once for all the archives that present the same one (`trees`, by SHA-256):
# hard links cost their maker nothing, and each kept a copy (100 links to a package of 20,000
# members: 424 MB of index on root's disk, red team 95 F4).
RECALL_TOGETHER = 64 * 1024
_ROWS_A_QUERY = 500  # names in one `IN (...)`: SQLite took at most 999 variables before 3.32
LOCK_WAIT = 30.0  # seconds a connection waits for another's write (SQLite's busy timeout)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS descriptions (
    path TEXT NOT NULL, backend TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, doc TEXT NOT NULL, tree TEXT,
    PRIMARY KEY (path, backend));
CREATE INDEX IF NOT EXISTS descriptions_tree ON descriptions (tree);
CREATE INDEX IF NOT EXISTS descriptions_ino ON descriptions (ino);
CREATE TABLE IF NOT EXISTS trees (hash TEXT NOT NULL PRIMARY KEY, root TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS verified (
    path TEXT NOT NULL, member TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, sha256 TEXT NOT NULL,
    PRIMARY KEY (path, member));
CREATE TABLE IF NOT EXISTS object_descriptions (
    url TEXT NOT NULL, backend TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    etag TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (url, backend));
CREATE TABLE IF NOT EXISTS chunk_digests (
    path TEXT NOT NULL PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, doc TEXT NOT NULL);
"""

Stamp = tuple[int, int, int, int]  # size, mtime_ns, inode number, ctime_ns of the archive file


def _text(value: Path | str) -> str:
    """A path or member name as the index stores it: itself, or, for a name that is not UTF-8
    (the bytes of a file name are anyone's choice, and sqlite stores text as UTF-8), a NUL and
    its bytes in hex, which no real name can be mistaken for (no name holds a NUL)."""
    text = str(value)
    return text if is_utf8(text) else "\0" + os.fsencode(text).hex()


def stamp_of(path: Path) -> Stamp:
    """The archive's stamp; for an object, from the identity its listing gave (no request)."""
    if isinstance(path, ObjectPath):
        info = getattr(path, "info", None)
        if info is None:
            raise OSError(f"{path}: no listing identity")
        return info.size, int(info.mtime * 1e9), etag_number(info.etag), 0
    st = archive_stat(path, os.stat(path))  # a folder archive's: its manifest's folded in
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


class _OtherVersionError(sqlite3.DatabaseError):
    pass


class DescriptionIndex:
    def __init__(self, db_path: Path) -> None:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        self.path = db_path
        self._lock = threading.Lock()
        self._told = False  # `_unreadable` logged
        # The last tree read, by its hash: the links of a package, read one after the other,
        # share it (decoding a tree of 20,000 members took 0.2 s a link), and writing one
        # that holds it does not make its JSON again (put_many).
        self._last_tree: tuple[str, Entry] | None = None
        try:
            self._db = self._connect(db_path)
        except sqlite3.OperationalError:
            # Locked past the timeout, the disk full or failing: nothing says the file is
            # bad, so it is not set aside (that renamed a live index of another mount away
            # and deleted its -wal); the start fails, saying why, and is tried again.
            raise
        except sqlite3.DatabaseError as exc:
            kind = ".old" if isinstance(exc, _OtherVersionError) else ".corrupt"
            aside = db_path.with_suffix(kind)
            log.warning("index %s: %s; set aside as %s, starting a new one", db_path, exc, aside)
            for suffix in ("-wal", "-shm"):
                db_path.with_name(db_path.name + suffix).unlink(missing_ok=True)
            db_path.replace(aside)
            self._db = self._connect(db_path)

    @staticmethod
    def _connect(db_path: Path) -> sqlite3.Connection:
        _private(db_path)
        db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None,
                             timeout=LOCK_WAIT)  # fmt: skip
        try:
            _wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
            # The version checked, the tables made and the version set in one transaction:
            # two mounts starting at once on one index (the default folder is the same for
            # every mount of a user) saw each other's tables before their version was set,
            # took the index for another version's, and set the other's live index aside.
            db.execute("BEGIN IMMEDIATE")
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if tables and version != SCHEMA_VERSION:
                    raise _OtherVersionError(f"schema version {version}, not {SCHEMA_VERSION}")
                for statement in _SCHEMA.split(";"):  # executescript would commit first
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error:
            db.close()
            raise
        return db

    def get(
        self, path: Path, backend: str, size: int, mtime_ns: int, ino: int, ctime_ns: int
    ) -> Description | None:
        """The description kept for this very version of `path` (the inode and ctime too: a
        file rewritten in place with its size and mtime put back is another version)."""
        with self._lock:
            row = self._db.execute(
                "SELECT doc, tree FROM descriptions WHERE path=? AND backend=? AND size=? AND "
                "mtime_ns=? AND ino=? AND ctime_ns=?",
                (_text(path), backend, size, mtime_ns, ino, ctime_ns),
            ).fetchone()
            if row is None:
                return None
            doc, tree = row
            if tree is None:
                return _decoded((doc,))
            last = self._last_tree
            if last is not None and last[0] == tree:  # another link's, read just before
                return _with_root(doc, last[1])
            found = self._db.execute("SELECT root FROM trees WHERE hash=?", (tree,)).fetchone()
        if found is None:
            return None
        desc = _decoded((f'{doc[:-1]},"root":{found[0]}}}',))
        if desc is not None:
            with self._lock:
                self._last_tree = (tree, desc.root)
        return desc

    def get_linked(
        self, path: Path, backend: str, size: int, mtime_ns: int, ino: int, ctime_ns: int
    ) -> Description | None:
        """The description kept for another name of this very version of `path` in its folder
        (a hard link: same inode, size, mtime and ctime; the same folder, so the same
        device), or None. Its name is that link's: see `SourceTree._linked`."""
        with self._lock:
            rows = self._db.execute(
                "SELECT path FROM descriptions WHERE ino=? AND backend=? AND size=? AND "
                "mtime_ns=? AND ctime_ns=? LIMIT 64",
                (ino, backend, size, mtime_ns, ctime_ns),
            ).fetchall()
        here = _text(path)
        for (other,) in rows:
            if other != here and Path(other).parent == path.parent and is_utf8(other):
                return self.get(Path(other), backend, size, mtime_ns, ino, ctime_ns)
        return None

    def forget_links(self, path: Path, backend: str, ino: int) -> None:
        """Drop what is kept for the other names of `path`'s file in its folder (`doubt`: a
        link's description found wrong is another's too, and `SourceTree._linked` would take
        it back from there)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT path FROM descriptions WHERE ino=? AND backend=?", (ino, backend)
            ).fetchall()
            keys = [(p, backend) for (p,) in rows if Path(p).parent == path.parent]
            trees = self._trees_of(keys)
            self._db.executemany("DELETE FROM descriptions WHERE path=? AND backend=?", keys)
            self._drop_unused_trees(trees)

    def get_many(
        self, wanted: list[tuple[Path, str, int, int, int, int]]
    ) -> dict[tuple[str, str], Description | None]:
        """`get` of each (path, backend, size, mtime_ns, ino, ctime_ns), a few hundred rows a
        query: a remount's listing of 1,000 archives asked 1,000 times. Keyed by (path as
        `str`, backend); a row missing or for another version is left out. A description
        kept larger than RECALL_TOGETHER comes back as None, to be read alone (`get`) where
        it is wanted: a listing held every tree it recalled at once (100 links to a package
        of 20,000 members: 2.25 GB, red team 95 F4)."""
        found: dict[tuple[str, str], Description | None] = {}
        for at in range(0, len(wanted), _ROWS_A_QUERY):
            part = wanted[at : at + _ROWS_A_QUERY]
            want = {(_text(p), b): (size, m, ino, c) for p, b, size, m, ino, c in part}
            names = sorted({name for name, _b in want})
            marks = ",".join("?" * len(names))
            with self._lock:
                rows = self._db.execute(
                    "SELECT path, backend, size, mtime_ns, ino, ctime_ns, CASE WHEN tree IS "
                    "NULL AND length(doc) <= ? THEN doc END FROM descriptions "
                    f"WHERE path IN ({marks})",
                    [RECALL_TOGETHER, *names],
                ).fetchall()
            by_text = {_text(p): str(p) for p, *_rest in part}
            for name, backend, size, mtime_ns, ino, ctime_ns, doc in rows:
                if want.get((name, backend)) != (size, mtime_ns, ino, ctime_ns):
                    continue
                if doc is None:
                    found[(by_text[name], backend)] = None
                    continue
                desc = _decoded((doc,))
                if desc is not None:
                    found[(by_text[name], backend)] = desc
        return found

    def put(
        self,
        path: Path,
        backend: str,
        size: int,
        mtime_ns: int,
        desc: Description,
        ino: int,
        ctime_ns: int,
    ) -> None:
        for _path, exc in self.put_many([(path, backend, size, mtime_ns, desc, ino, ctime_ns)]):
            raise exc

    def put_many(
        self, rows: list[tuple[Path, str, int, int, Description, int, int]]
    ) -> list[tuple[Path, Exception]]:
        """`put` of each row (path, backend, size, mtime_ns, desc, ino, ctime_ns), in one
        transaction: a commit a row made a folder's first listing write the WAL a few pages
        at a time, and checkpoint every few hundred archives (~7 % of the daemon's CPU in a
        cold `ls -l` of 1,000 small archives). Returns the rows whose description could not be
        written as JSON (left out; the others are kept)."""
        values, trees, refused = [], {}, []
        reused: dict[str, Entry] = {}
        for path, backend, size, mtime_ns, desc, ino, ctime_ns in rows:
            last = self._last_tree
            try:  # not a dict an entry first: a package may hold 100,000
                head = desc.head_json_text()
                root = None if last is not None and desc.root is last[1] else desc.root.json_text()
            except (ValueError, RecursionError) as exc:
                refused.append((path, exc))
                continue
            doc, tree = head, None
            if root is None:  # the tree read last, kept under its hash: another link's
                assert last is not None
                tree = last[0]
                reused[tree] = last[1]
            elif len(root) > RECALL_TOGETHER:  # kept apart, once for all that present it
                tree = hashlib.sha256(root.encode()).hexdigest()
                trees[tree] = root
                self._last_tree = (tree, desc.root)
            else:
                doc = f'{head[:-1]},"root":{root}}}'
            values.append((_text(path), backend, size, mtime_ns, ino, ctime_ns, doc, tree))
        if not values:
            return refused
        with self._lock:
            self._db.execute("BEGIN")
            try:
                replaced = self._trees_of([(v[0], v[1]) for v in values])
                for tree, entry in reused.items():  # dropped since it was read: kept again
                    if tree not in trees and not self._db.execute(
                        "SELECT 1 FROM trees WHERE hash=?", (tree,)
                    ).fetchone():  # fmt: skip
                        trees[tree] = entry.json_text()
                self._db.executemany(
                    "INSERT OR IGNORE INTO trees VALUES (?, ?)", list(trees.items())
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO descriptions VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values
                )
                self._drop_unused_trees(replaced - set(trees))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return refused

    def _trees_of(self, keys: list[tuple[str, str]]) -> set[str]:
        """The trees the rows at these (path, backend) keys hold now (the caller holds the
        lock)."""
        found: set[str] = set()
        for path, backend in keys:
            row = self._db.execute(
                "SELECT tree FROM descriptions WHERE path=? AND backend=? AND tree IS NOT NULL",
                (path, backend),
            ).fetchone()
            if row is not None:
                found.add(row[0])
        return found

    def _drop_unused_trees(self, trees: Collection[str]) -> None:
        """Those of `trees` no row holds any more (the caller holds the lock): a package
        rewritten again and again, or its links removed, leaves no tree behind."""
        self._db.executemany(
            "DELETE FROM trees WHERE hash=? AND NOT EXISTS "
            "(SELECT 1 FROM descriptions WHERE tree=?)",
            [(tree, tree) for tree in trees],
        )

    def forget_description(self, path: Path, backend: str) -> None:
        """Drop what is kept for `path` (every version): it is described from the file again."""
        with self._lock:
            trees = self._trees_of([(_text(path), backend)])
            self._db.execute(
                "DELETE FROM descriptions WHERE path=? AND backend=?", (_text(path), backend)
            )
            self._drop_unused_trees(trees)

    def get_object(self, url: str, backend: str, info: ObjectInfo) -> Description | None:
        """An object's description, if the index holds one for this very identity (key, size,
        last-modified and ETag): a remount lists a bucket without a GET per archive."""
        with self._lock:
            row = self._db.execute(
                "SELECT doc FROM object_descriptions WHERE url=? AND backend=? AND size=? "
                "AND mtime_ns=? AND etag=?",
                (url, backend, info.size, int(info.mtime * 1e9), info.etag or ""),
            ).fetchone()
        return _decoded(row)

    def objects_in(
        self, folder_url: str, backend: str
    ) -> dict[str, tuple[tuple[int, int, str], str]]:
        """Every object row directly in `folder_url` for `backend`, as url → ((size, mtime_ns,
        etag), stored doc), in one query: a folder of 1,000 archives is then looked up once, not
        1,000 times (`object_description` checks a row's identity and decodes it)."""
        lo = folder_url.rstrip("/") + "/"
        hi = lo[:-1] + chr(ord("/") + 1)
        with self._lock:
            rows = self._db.execute(
                "SELECT url, size, mtime_ns, etag, doc FROM object_descriptions "
                "WHERE url >= ? AND url < ? AND backend=?",
                (lo, hi, backend),
            ).fetchall()
        return {url: ((size, mtime, etag), doc) for url, size, mtime, etag, doc in rows
                if "/" not in url[len(lo) :]}  # fmt: skip

    def put_object(self, url: str, backend: str, info: ObjectInfo, desc: Description) -> None:
        doc = desc.json_text()  # not a dict an entry first: a package may hold 100,000
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO object_descriptions VALUES (?, ?, ?, ?, ?, ?)",
                (url, backend, info.size, int(info.mtime * 1e9), info.etag or "", doc),
            )

    def is_verified(self, path: Path, member: str, stamp: Stamp, sha256: str) -> bool:
        """False also when the index cannot answer (see `_unreadable`): verified again."""
        try:
            with self._lock:
                row = self._db.execute(
                    "SELECT 1 FROM verified WHERE path=? AND member=? AND size=? AND mtime_ns=? "
                    "AND ino=? AND ctime_ns=? AND sha256=?",
                    (_text(path), _text(member), *stamp, sha256),
                ).fetchone()
        except sqlite3.Error as exc:
            self._unreadable(exc)
            return False
        return row is not None

    def mark_verified(self, path: Path, member: str, stamp: Stamp, sha256: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO verified VALUES (?, ?, ?, ?, ?, ?, ?)",
                (_text(path), _text(member), *stamp, sha256),
            )

    def forget_verified(self, path: Path, member: str) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM verified WHERE path=? AND member=?", (_text(path), _text(member))
            )
            self._db.execute("DELETE FROM chunk_digests WHERE path=?", (_text(path),))

    def put_digests(self, path: Path, stamp: Stamp, digests: Mapping[str, int]) -> None:
        """Fast digests of every stored chunk, recorded once the archive verified."""
        doc = json.dumps(dict(digests), separators=(",", ":"))
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO chunk_digests VALUES (?, ?, ?, ?, ?, ?)",
                             (_text(path), *stamp, doc))  # fmt: skip

    def digests(self, path: Path, stamp: Stamp) -> dict[str, int] | None:
        """None also when the index cannot answer (see `_unreadable`): reads are then checked
        as an unverified archive's are, by hashing what they serve."""
        try:
            with self._lock:
                row = self._db.execute(
                    "SELECT doc FROM chunk_digests WHERE path=? AND size=? AND mtime_ns=? "
                    "AND ino=? AND ctime_ns=?",
                    (_text(path), *stamp),
                ).fetchone()
        except sqlite3.Error as exc:
            self._unreadable(exc)
            return None
        if row is None:
            return None
        try:
            found = json.loads(row[0])
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def prune(self, src: Path) -> int:
        """Forget the rows of archives below `src` that are gone (blocking: a worker thread's).
        Rows were never deleted: a user who may write in SRC made, listed and deleted archives
        under ever new names (hard links cost them nothing) and the index, on root's disk,
        grew for as long as they liked. Only rows below this mount's SRC, which is there:
        another mount's (the default folder is shared) may be of a disk not plugged in now.
        Names that are not UTF-8 (kept as NUL and hex) are left as they are."""
        lo = str(src).rstrip("/") + "/"
        hi = lo[:-1] + chr(ord("/") + 1)
        gone = 0
        for table in ("descriptions", "verified", "chunk_digests"):
            with self._lock:
                rows = self._db.execute(
                    f"SELECT DISTINCT path FROM {table} WHERE path >= ? AND path < ?", (lo, hi)
                ).fetchall()
            for (path,) in rows:
                if os.path.lexists(path):
                    continue
                with self._lock:  # a statement at a time: lookups go on meanwhile
                    trees = self._trees_of_path(path) if table == "descriptions" else set()
                    self._db.execute(f"DELETE FROM {table} WHERE path=?", (path,))
                    self._drop_unused_trees(trees)
                gone += 1
        return gone

    def _trees_of_path(self, path: str) -> set[str]:
        rows = self._db.execute(
            "SELECT tree FROM descriptions WHERE path=? AND tree IS NOT NULL", (path,)
        ).fetchall()
        return {row[0] for row in rows}

    def prune_objects(self, folder_url: str, listed: Collection[str]) -> int:
        """Forget the object rows directly in `folder_url` (of any backend) whose URL is not in
        `listed`, the URLs a fresh listing of it gave (blocking: a worker thread's). As
        `prune` for a local SRC: rows of a bucket's objects were never deleted, so the index
        grew with every archive name ever listed there (a writer cycling names, a bucket's
        objects expiring). Only what a listing says is gone: a folder not listed again keeps
        its rows, and asking the bucket about each row would cost a request apiece."""
        lo = folder_url.rstrip("/") + "/"
        hi = lo[:-1] + chr(ord("/") + 1)
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT url FROM object_descriptions WHERE url >= ? AND url < ?",
                (lo, hi),
            ).fetchall()
        gone = [(url,) for (url,) in rows if "/" not in url[len(lo) :] and url not in listed]
        if not gone:
            return 0
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany("DELETE FROM object_descriptions WHERE url=?", gone)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return len(gone)

    def _unreadable(self, exc: sqlite3.Error) -> None:
        """A lookup the index could not answer: a page of the file damaged (the start opens
        only its first, so such damage passes it), the disk failing, the database locked too
        long. Raised, it failed the open of every verified archive with EIO, for every user,
        at every start until the file was removed; so the archive is treated as one the index
        knows nothing of (verified again by hashing), and the operator told once."""
        if not self._told:
            self._told = True
            log.error("index %s cannot be read (%s): archives are verified again as read; "
                      "if it stays so, stop the mount and remove it (it is rebuilt)",
                      self.path, exc)  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _wal(db: sqlite3.Connection) -> None:
    """WAL mode (kept in the file). Switching a new file to it while another connection has it
    open is refused at once ("database is locked": SQLite's busy timeout does not apply), so
    two mounts creating one index together try again for a while."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            if db.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):  # the disk full or failing: no wait mends that
                log.warning("index: could not switch to WAL mode (%s)", exc)
                return
        if time.monotonic() > deadline:  # the rollback journal still works: slower, not wrong
            log.warning("index: could not switch to WAL mode; using SQLite's rollback journal")
            return
        time.sleep(0.02)


def _private(db_path: Path) -> None:
    """The database (and its -wal and -shm, which SQLite makes with the database's mode) made
    or set 0600 before SQLite opens it. SQLite made it 0644 less the umask: in an --index-dir
    that already existed 0755 (`mkdir -p /var/cache/decant-mount/x`, as README's example; an
    fstab mount's umask is 022), every local user could read every archive's path, its members'
    names, sizes and digests, from folders they may not list. The folder was checked to be this
    user's own, no one else's to write (see open_index_at): nothing here follows their link."""
    os.close(os.open(db_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    for name in (db_path.name, db_path.name + "-wal", db_path.name + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(db_path.with_name(name), 0o600)


def object_description(
    row: tuple[tuple[int, int, str], str] | None, info: ObjectInfo
) -> Description | None:
    """A row of `objects_in` as the description `get_object` would give for `info`: None
    unless the row is of this very identity."""
    if row is None or row[0] != (info.size, int(info.mtime * 1e9), info.etag or ""):
        return None
    return _decoded((row[1],))


def _with_root(head: str, root: Entry) -> Description | None:
    """A description kept apart (its head's name, `root` its tree), or None as `_decoded`."""
    try:
        doc = json.loads(head)
        if doc.get("v") != DESCRIPTION_VERSION:
            return None
        return Description(name=str(doc["name"]), root=root)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _decoded(row: tuple[str] | None) -> Description | None:
    """A stored description, or None when there is none or it cannot be read back (another
    version wrote it, or it is damaged): the archive is then described afresh."""
    if row is None:
        return None
    try:
        return Description.from_json(json.loads(row[0]))
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
