"""One exception tree for every format: cores raise these, the FUSE boundary maps them to errno."""

from __future__ import annotations

import errno


class DecantError(Exception):
    """Base of every error this package raises on purpose. Messages name the file and the reason."""

    errno: int = errno.EIO


class ManifestError(DecantError):
    """A manifest (or other metadata document) is missing, malformed or inconsistent."""


class UnsupportedFormatError(DecantError):
    """A well-formed input in a format, version or layout this reader does not implement."""

    errno = errno.EOPNOTSUPP


class CorruptArchiveError(DecantError):
    """The bytes on disk are damaged: truncated container, undecodable chunk, digest mismatch."""


class IntegrityError(CorruptArchiveError):
    """Reconstructed bytes do not hash to the recorded digest."""


class ArchiveChangedError(CorruptArchiveError):
    """The archive was written in place since this reader opened it, so what it reads may be
    another version's bytes. Not damage: no verdict on either version; an open made now reads
    the current one."""


class DecryptError(DecantError):
    """No key opens a crypt4gh header, or a cipher segment fails authentication."""

    errno = errno.EACCES


class UnsafeMemberError(DecantError):
    """An archive member name that would escape its folder or is not a regular file."""

    errno = errno.EPERM


class NotAnArchiveError(DecantError):
    """The path is not an archive of the kind asked for."""

    errno = errno.EINVAL


class ArchiveGoneError(NotAnArchiveError):
    """Nothing is at the archive's path now (removed, or its folder renamed away): no verdict
    on the archive itself."""

    errno = errno.ENOENT


class OpenArchivesFullError(DecantError):
    """Opening one more archive would take what open archives hold past the daemon's budget."""

    errno = errno.ENOMEM


class DecodeTooLargeError(DecantError):
    """One decode would hold more than the mount lets one decode hold (vfs.cache): a plane or
    block that large is not read, whatever the archive; a larger --cache-size reads it."""

    errno = errno.ENOMEM


class PackError(DecantError):
    """Packing refused or failed; nothing was published."""


class StoreError(DecantError):
    """A byte source (object store, remote folder) could not deliver: unreachable, timed out or
    failing after bounded retries. Messages name the URL and key, never a credential."""


class ObjectMissingError(StoreError):
    """The key (object or prefix) does not exist in the store."""

    errno = errno.ENOENT


class StoreAccessError(StoreError):
    """The store refused the credentials or the request (wrong key, no permission)."""

    errno = errno.EACCES


class ObjectChangedError(StoreError):
    """The object was replaced since it was opened (its ETag changed): bytes would mix versions."""

    errno = errno.ESTALE
