"""Decant archives (spec v1): pure, synchronous format logic — no FUSE, no trio."""

import os
import secrets

SUPPORTED_FORMATS = frozenset({1})
TEMP_PREFIX = ".decant-tmp-"  # archives being written carry it until renamed into place
MANIFEST_KEY = ".decant/manifest.json"
_NAME_MAX = 255


def temp_name(name: str) -> str:
    """A fresh temp name for building `name` beside it: TEMP_PREFIX, the pid, a random tag and
    as much of the end of `name` as fits in NAME_MAX bytes (its suffix, `.zarr.zip`, says
    what is built). `name` itself may be up to NAME_MAX long."""
    head = f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
    room = _NAME_MAX - len(head)
    while len(os.fsencode(name)) > room:
        name = name[1:]
    return head + name


def archive_stem(name: str) -> str:
    for suffix in (".zarr.zip", ".zarr"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
