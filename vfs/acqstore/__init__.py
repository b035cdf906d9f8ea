"""AcqStore OME-Zarr Collection v1: validation, and the virtual view of a collection's members."""

from vfs.acqstore.validate import ENTRY_POINT, Issue, Validation, validate_collection

__all__ = ["ENTRY_POINT", "Issue", "Validation", "validate_collection"]
