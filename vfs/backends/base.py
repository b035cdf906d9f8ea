"""The one small interface every format serves the mount through: describe and open."""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Bumped whenever the rules for what a backend presents change, so that descriptions persisted
# under older rules (e.g. member names cut short at a NUL before 2; before 3, a GDI package
# whose first member is not manifest.json, served unchecked; before 4, the same when that first
# member was one the mount drops, a `..` name) are rebuilt, not served.
DESCRIPTION_VERSION = 4
DEFAULT_MODE_MASK = 0o555  # a backend without `mode_mask`: the archive's mode minus write bits


_compact_json = json.JSONEncoder(separators=(",", ":")).encode


class FrozenEmpty(dict):  # type: ignore[type-arg]
    """An empty mapping that refuses to change: shared by every entry of a kept tree that has
    no children, xattrs or locator (`Entry.compact`), three empty dicts a member saved. A
    change through one would show in all of them: it raises instead."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a shared empty mapping of a kept tree: give the entry its own dict")

    __setitem__ = __delitem__ = setdefault = update = pop = popitem = clear = _refuse  # type: ignore[assignment]
    __ior__ = _refuse  # type: ignore[assignment]


EMPTY: Any = FrozenEmpty()


@dataclass(eq=False, repr=False, slots=True)
class Entry:
    """A presented file or folder: plain data, so the persistent index can keep it.

    Trees come from untrusted archives, so nothing here recurses: to_json, from_json, equality
    and repr walk with an explicit stack (a 500-deep member path once overflowed Python's stack
    while the index was written, and took the whole mount down with it).
    """

    is_dir: bool = False
    size: int = 0
    sha256: str | None = None  # full-content digest, when the format records one
    xattrs: dict[str, str] = field(default_factory=dict)
    children: dict[str, Entry] = field(default_factory=dict)
    # Backend-private facts needed to open the entry (e.g. a TAR member's data offset). Kept in
    # the persistent index with the rest, so a remount opens members without re-walking archives.
    locator: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The tree as nested JSON objects ("c" holds the children), built without recursion."""
        root = self._fields_json()
        stack = [(self, root)]
        while stack:
            entry, out = stack.pop()
            if entry.children:
                kids: dict[str, Any] = {}
                out["c"] = kids
                for name, child in entry.children.items():
                    kids[name] = doc = child._fields_json()
                    stack.append((child, doc))
        return root

    def json_text(self) -> str:
        """`json.dumps(self.to_json(), separators=(",", ":"))`, without building the documents
        first: a string or two an entry, not a dict (what the index stores of a tree)."""
        parts: list[str] = []
        stack: list[Entry | str] = [self]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                parts.append(item)
                continue
            fields = _compact_json(item._fields_json())
            if not item.children:
                parts.append(fields)
                continue
            parts.append(fields[:-1] + ',"c":{')
            stack.append("}}")
            kids = list(item.children.items())
            for i in range(len(kids) - 1, -1, -1):
                name, child = kids[i]
                stack.append(child)
                stack.append(("," if i else "") + _compact_json(name) + ":")
        return "".join(parts)

    def _fields_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"d": self.is_dir, "s": self.size}
        if self.sha256:
            out["h"] = self.sha256
        if self.xattrs:
            out["x"] = self.xattrs
        if self.locator:
            out["l"] = self.locator
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Entry:
        """The tree `to_json` wrote; ValueError, KeyError or TypeError when `doc` is malformed."""
        root = cls._from_fields(doc)
        stack = [(root, doc)]
        while stack:
            entry, node = stack.pop()
            kids = node.get("c", {})
            if not isinstance(kids, dict):
                raise ValueError(f"entry children are {type(kids).__name__}, not an object")
            for name, kid in kids.items():
                entry.children[name] = child = cls._from_fields(kid)
                stack.append((child, kid))
        return root

    @classmethod
    def _from_fields(cls, doc: Any) -> Entry:
        if not isinstance(doc, dict):
            raise ValueError(f"an entry is {type(doc).__name__}, not an object")
        return cls(
            is_dir=bool(doc["d"]),
            size=int(doc["s"]),
            sha256=doc.get("h"),
            xattrs=dict(doc.get("x", {})),
            locator=dict(doc.get("l", {})),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        stack = [(self, other)]
        while stack:
            a, b = stack.pop()
            if a._fields() != b._fields() or a.children.keys() != b.children.keys():
                return False
            stack.extend((child, b.children[name]) for name, child in a.children.items())
        return True

    def _fields(self) -> tuple[Any, ...]:
        return (self.is_dir, self.size, self.sha256, self.xattrs, self.locator)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        kind = f"folder of {len(self.children)}" if self.is_dir else f"file of {self.size} bytes"
        return f"Entry({kind}, sha256={self.sha256!r})"

    def compact(self) -> int:
        """Share one `EMPTY` among the empty dicts of this tree (it is kept, not built on any
        more); the number of entries in it. Without recursion, as everything here."""
        count, stack = 0, [self]
        while stack:
            entry = stack.pop()
            count += 1
            if entry.children:
                stack.extend(entry.children.values())
            else:
                entry.children = EMPTY
            if not entry.xattrs:
                entry.xattrs = EMPTY
            if not entry.locator:
                entry.locator = EMPTY
        return count

    def walk(self, relpath: str) -> Entry | None:
        """The entry at a slash-separated path below this one ("" is this entry)."""
        node: Entry | None = self
        for part in filter(None, relpath.split("/")):
            if node is None or not node.is_dir:
                return None
            node = node.children.get(part)
        return node


@dataclass
class Description:
    """What one archive on disk presents: the name it is shown under and its entry tree."""

    name: str
    root: Entry

    def to_json(self) -> dict[str, Any]:
        return {"v": DESCRIPTION_VERSION, "name": self.name, "root": self.root.to_json()}

    def json_text(self) -> str:
        """`json.dumps(self.to_json(), separators=(",", ":"))`, built entry by entry."""
        return f'{self.head_json_text()[:-1]},"root":{self.root.json_text()}}}'

    def head_json_text(self) -> str:
        """`json_text` without the root: `head[:-1] + ',"root":' + root + '}'` is the whole."""
        return _compact_json({"v": DESCRIPTION_VERSION, "name": self.name})

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Description:
        """ValueError for a description another version wrote: the index then re-describes."""
        if doc.get("v") != DESCRIPTION_VERSION:
            raise ValueError(f"description version {doc.get('v')!r}, not {DESCRIPTION_VERSION}")
        return cls(name=str(doc["name"]), root=Entry.from_json(doc["root"]))


class RandomAccess(Protocol):
    """An opened presented file. Its methods block (decode, decrypt): run them in threads.

    Optional, looked up by the mount (vfs.mount.reads), all cheap enough for its event loop:
    `read_cached(offset, size)` (the bytes if nothing needs decoding, else None),
    `readahead_needed(offset)`, and `loading(offset, size)` (a concurrent Future of a read-ahead
    decode those bytes wait for, else None)."""

    size: int

    def read(self, offset: int, size: int) -> bytes | memoryview: ...

    def readahead(self, offset: int) -> None:
        """Warm the cache for the block that follows `offset` (sequential access was seen)."""

    def close(self) -> None: ...


class Backend(Protocol):
    """One archive format. `claims` must be cheap: it sees every name in the source tree.

    Optional attribute `mode_mask: int`: the permission bits a member may have at most; the
    tree presents `presented_mode(archive st_mode, mode_mask, is_dir)`. Backends without it get
    DEFAULT_MODE_MASK (read `mode_mask_of(backend)`); c4gh defaults to 0o440, so decrypted
    members are never readable by "other" unless the operator says so (--c4gh-mode).
    """

    name: str

    def claims(self, path: Path, is_dir: bool) -> bool: ...

    def describe(self, path: Path) -> Description:
        """Read just enough of the archive to list it; DecantError when it cannot be served."""
        ...

    def open(self, path: Path, member: str, entry: Entry) -> RandomAccess:
        """Open the presented file `entry` at `member` ("" when the archive presents one file)."""
        ...


def mode_mask_of(backend: object) -> int:
    """The backend's `mode_mask`, or DEFAULT_MODE_MASK when it declares none."""
    mask = getattr(backend, "mode_mask", DEFAULT_MODE_MASK)
    return mask if isinstance(mask, int) else DEFAULT_MODE_MASK


def serves_owner(backend: object, uid: int) -> bool:
    """Whether the backend presents an archive whose file `uid` owns: its `owners` (a set of
    uids), or anyone's when it declares none."""
    owners = getattr(backend, "owners", None)
    return owners is None or uid in owners


def presented_mode(archive_mode: int, mask: int, is_dir: bool) -> int:
    """Permission bits of a presented member: the archive's, never more than `mask` allows.

    Pass the archive's whole st_mode. Write and setuid/setgid/sticky bits never survive (the view
    is read-only). A folder gets x exactly where it has r (a folder one may list but not enter
    helps nobody). A folder archive's x bits mean "search", not "execute", so its files lose them.
    """
    bits = stat.S_IMODE(archive_mode) & mask & 0o555
    if is_dir:
        readable = bits & 0o444
        return readable | readable >> 2
    if stat.S_ISDIR(archive_mode):
        bits &= ~0o111
    return bits
