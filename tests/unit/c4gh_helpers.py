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
    """Every file below `entry`, by slash-separated path (iterative: trees may be deep)."""
    out, stack = {}, [(prefix, entry)]
    while stack:
        path, node = stack.pop()
        for name, child in node.children.items():
            if child.is_dir:
                stack.append((f"{path}{name}/", child))
            else:
                out[f"{path}{name}"] = child
    return out
