"""Small helpers the c4gh backend tests share."""

from __future__ import annotations

from typing import Any

from vfs.backends.base import Entry
from vfs.backends.c4gh import C4ghBackend
from vfs.cache import PageCache

SEG = 65536


def backend(*keys: Any, **kw: Any) -> C4ghBackend:
    """A backend holding the secret halves of generated key pairs, with a small cache."""
    return C4ghBackend([k.secret for k in keys], PageCache(256 * SEG), **kw)


def files(entry: Entry, prefix: str = "") -> dict[str, Entry]:
    """Every file below `entry`, by slash-separated path."""
    out = {}
    for name, child in entry.children.items():
        path = f"{prefix}{name}"
        out.update(files(child, path + "/") if child.is_dir else {path: child})
    return out
