"""The §2 path rules: every stored path is a plain relative, slash-separated path under the root."""

from __future__ import annotations

import re
from pathlib import Path

ENTRY_POINT = "acqstore/collection.json"

# A scheme ("https:", "file:") or a drive letter ("C:") both match; neither is a relative path.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


def path_problems(value: object) -> list[str]:
    """Every §2 rule `value` breaks, as sentences; empty when it is a usable relative path.

    A URL gets one message rather than a cascade (its `//` would also read as an empty segment).
    """
    if not isinstance(value, str) or not value:
        return ["a path must be a non-empty string"]
    if _SCHEME.match(value) or value.startswith("//"):
        return [f"path {value!r} is a URL or drive path, not a relative path"]
    problems = []
    if value.startswith("/"):
        problems.append(f"path {value!r} is absolute")
    if "\\" in value:
        problems.append(f"path {value!r} contains a backslash")
    if "?" in value:
        problems.append(f"path {value!r} contains a query string")
    if "#" in value:
        problems.append(f"path {value!r} contains a fragment")
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in value):
        problems.append(f"path {value!r} contains a control character")
    segments = value.strip("/").split("/")
    if ".." in segments:
        problems.append(f"path {value!r} contains a '..' segment")
    if "." in segments:
        problems.append(f"path {value!r} contains a '.' segment")
    if "" in segments:
        problems.append(f"path {value!r} contains an empty segment")
    return problems


def normalize(value: str) -> str:
    """The key a valid path is known by (a trailing slash on a folder path is not significant)."""
    return value.rstrip("/")


def resolve(root: Path, value: str) -> Path:
    """The file a path that passed `path_problems` names; the base is always the collection root."""
    return root.joinpath(*normalize(value).split("/"))
