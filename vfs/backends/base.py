"""The one small interface every format serves the mount through: describe and open."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class Entry:
    """A presented file or folder: plain data, so the persistent index can keep it."""

    is_dir: bool = False
    size: int = 0
    sha256: str | None = None  # full-content digest, when the format records one
    xattrs: dict[str, str] = field(default_factory=dict)
    children: dict[str, Entry] = field(default_factory=dict)
    # Backend-private facts needed to open the entry (e.g. a TAR member's data offset). Kept in
    # the persistent index with the rest, so a remount opens members without re-walking archives.
    locator: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"d": self.is_dir, "s": self.size}
        if self.sha256:
            out["h"] = self.sha256
        if self.xattrs:
            out["x"] = self.xattrs
        if self.locator:
            out["l"] = self.locator
        if self.children:
            out["c"] = {name: child.to_json() for name, child in self.children.items()}
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Entry:
        return cls(
            is_dir=bool(doc["d"]),
            size=int(doc["s"]),
            sha256=doc.get("h"),
            xattrs=dict(doc.get("x", {})),
            locator=dict(doc.get("l", {})),
            children={k: cls.from_json(v) for k, v in doc.get("c", {}).items()},
        )

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
        return {"name": self.name, "root": self.root.to_json()}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Description:
        return cls(name=str(doc["name"]), root=Entry.from_json(doc["root"]))


class RandomAccess(Protocol):
    """An opened presented file. Its methods block (decode, decrypt): run them in threads."""

    size: int

    def read(self, offset: int, size: int) -> bytes | memoryview: ...

    def readahead(self, offset: int) -> None:
        """Warm the cache for the block that follows `offset` (sequential access was seen)."""

    def close(self) -> None: ...


class Backend(Protocol):
    """One archive format. `claims` must be cheap: it sees every name in the source tree."""

    name: str

    def claims(self, path: Path, is_dir: bool) -> bool: ...

    def describe(self, path: Path) -> Description:
        """Read just enough of the archive to list it; DecantError when it cannot be served."""
        ...

    def open(self, path: Path, member: str, entry: Entry) -> RandomAccess:
        """Open the presented file `entry` at `member` ("" when the archive presents one file)."""
        ...
