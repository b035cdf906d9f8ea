"""What a presented name may be: the one check for names that come from untrusted data.

Archive member names, manifest keys and document ids are attacker input. A name the mount
presents must be a single Linux file name that `lookup` can find again: the daemon decodes the
kernel's bytes with `os.fsdecode`, so a name is presentable only if `os.fsencode` turns it into
at most NAME_MAX bytes without "/" or NUL, and `os.fsdecode` gives the very same string back.

Undecodable bytes: `tarfile`, `os.listdir` and friends decode them to lone surrogates
(U+DC80..U+DCFF, the "surrogateescape" handler). Those names are accepted: they encode back to
the original bytes, which is what the kernel shows. Any other lone surrogate cannot be encoded,
and surrogates that re-encode into valid UTF-8 ("\\udcc3\\udca9" is b"\\xc3\\xa9", which decodes
to "é") would be looked up under a different string: both are refused.

A refused name is dropped (and logged by the caller), never truncated or rewritten: a rewritten
name could collide with, or impersonate, another one.
"""

from __future__ import annotations

import os

NAME_MAX = 255  # bytes in one path component (Linux NAME_MAX)
MAX_DEPTH = 64  # components in a presented path below its archive; deeper ones are dropped


def name_problem(name: str) -> str | None:
    """Why `name` cannot be presented as one file or folder name, or None when it can."""
    if not name:
        return "empty name"
    if name == "..":
        return "'..' would escape to the parent folder"
    if name == ".":
        return "'.' names the folder itself"
    if "/" in name:
        return "contains '/'"
    if "\0" in name:
        return "contains a NUL byte"
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError as exc:
        return f"not encodable as a file name ({exc.reason} at character {exc.start})"
    if len(raw) > NAME_MAX:
        return f"longer than {NAME_MAX} bytes ({len(raw)})"
    if os.fsdecode(raw) != name:
        return "escaped bytes that decode to a different name"
    return None


def is_utf8(name: str) -> bool:
    """Whether `name` is text, not a file name's undecodable bytes (held as lone surrogates):
    what UTF-8 stores (sqlite, JSON) can keep only those that are."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def path_problem(path: str, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a slash-separated relative path cannot be presented, checked component by component.

    The depth is counted before the path is split, so a hostile path costs no allocation.
    """
    if not path:
        return "empty name"
    if path.startswith("/"):
        return "absolute path"
    depth = path.count("/") + 1
    if depth > max_depth:
        return f"{depth} levels deep (more than {max_depth})"
    for number, part in enumerate(path.split("/"), 1):
        problem = name_problem(part)
        if problem is not None:
            return problem if depth == 1 else f"component {number}: {problem}"
    return None


__all__ = ["MAX_DEPTH", "NAME_MAX", "name_problem", "path_problem"]
