"""AcqStore OME-Zarr Collection v1: validation, and the virtual view of a collection's members."""

from __future__ import annotations

from typing import Any

from vfs.acqstore.paths import ENTRY_POINT

__all__ = ["ENTRY_POINT", "Issue", "Validation", "validate_collection"]


def __getattr__(name: str) -> Any:
    # The validator pulls in jsonschema and numpy; a daemon without collections never pays it.
    if name in ("Issue", "Validation", "validate_collection"):
        from vfs.acqstore import validate

        return getattr(validate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
