"""Decant archives (spec v1): pure, synchronous format logic — no FUSE, no trio."""

SUPPORTED_FORMATS = frozenset({1})
TEMP_PREFIX = ".decant-tmp-"  # archives being written carry it until renamed into place
MANIFEST_KEY = ".decant/manifest.json"


def archive_stem(name: str) -> str:
    for suffix in (".zarr.zip", ".zarr"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
