"""The write side of a mount over a bucket: spooled files uploaded, read back, then unspooled.

`BucketPlacer` is what `publish` (vfs/ingest/publish.py) hands a spooled file to when SRC is a
bucket: a TIFF is packed into the local staging folder, a plain file goes as it is; either is
uploaded with `put_verified` (one PUT with If-None-Match: * up to 256 MiB, HEAD + multipart
above) to the final key, read back by ranged GETs and checked (an archive restores to the
spooled file's sha256; a plain file equals it byte for byte) before the queue deletes the
spooled copy. A PUT is atomic, so nothing is ever half-visible. A key that is already taken
(another host's object) is never overwritten: the file stays spooled, failed, with the reason.

`BucketWriteSide` holds the write rules that differ over a bucket: folders live in the spool
until a file in them is published (a bucket has no empty folders), and what is already in the
bucket is never changed in place. With `--allow-delete`, an object is deleted (`rm`) and a plain
object renamed (a server-side copy, then the delete: another host may list both names for a
moment, never neither) — each only while the key still holds the object the mount listed (a
HEAD first: S3 has no conditional DELETE, so a replacement landing in the round trip between
that HEAD and the DELETE is lost). An archive is not renamed (the name of its original is inside
it), nor a `NAME.zarr/` folder archive deleted (many keys, no atomic delete).
Synchronous and FUSE-free, like the rest of vfs/ingest.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from vfs.decant import temp_name
from vfs.errors import DecantError, StoreError
from vfs.ingest.publish import (
    SPACE_MARGIN,
    Published,
    SourceChangedError,
    archive_name,
    check,
    looks_like_tiff,
    nameable,
    read_as_archive,
    require_space,
    signature,
    size_text,
    with_plane_bound,
)
from vfs.ingest.space import SpaceGuard
from vfs.ingest.spool import Spool, make_folders
from vfs.ingest.writeside import Attrs, WriteSide, refuse
from vfs.nodes import Node, mirror_node
from vfs.stores.base import ObjectInfo, etag_number, join_key
from vfs.stores.s3uploads import SECRET_BYTES, UPLOAD_TOKEN, UploadTokens

if TYPE_CHECKING:
    from vfs.decant.packer import PackOptions
    from vfs.stores.s3 import S3Folder
    from vfs.stores.upload import Verify

log = logging.getLogger(__name__)

# What a placed object is remembered by: its key (relative to the mounted folder), its ETag
# and the spooled file's stat (mode, owner, mtime: what `rsync -a` gave it); None: withdrawn.
OnPlaced = Callable[[str, str, os.stat_result | None], None]
# A file removed or renamed away through the mount during its upload: its key and the upload's
# token, noted for the next start (BucketTree.note_withdrawn; vfs.stores.s3uploads).
OnWithdrawn = Callable[[str, str], None]


class KeyTakenError(StoreError):
    """The final key already holds another object: it is not overwritten."""


class BucketPlacer:
    """Puts spooled files into a bucket folder (see the module docstring)."""

    def __init__(
        self,
        folder: S3Folder,
        on_placed: OnPlaced | None = None,
        on_withdrawn: OnWithdrawn | None = None,
        tokens: UploadTokens | None = None,
    ) -> None:
        self.folder = folder
        self.on_placed = on_placed
        self.on_withdrawn = on_withdrawn
        # What this host's uploads carry, and what tells them from anyone else's.
        self.tokens = tokens or UploadTokens(secrets.token_bytes(SECRET_BYTES))
        # spooled relpath → (key, token) of its upload under way, until it ends or fails
        self._uploading: dict[str, tuple[str, str]] = {}
        self._ours: dict[str, tuple[str, str]] = {}  # URL → (key, ETag) of what it uploaded
        # URL → ETag of what it uploaded, the spooled file being noted in its spool as placed
        # (`Spool.mark_placed`, forgotten once its spooled name goes): an earlier state of that
        # very file, which its newer state replaces (see `_already`).
        self._sources: dict[str, str] = {}
        self._lock = threading.Lock()

    def publish(
        self,
        spool: Spool,
        relpath: str,
        pack_all: bool,
        options: PackOptions | None,
        cancel: threading.Event | None = None,
    ) -> Published:
        from vfs.decant.packer import file_sha256

        source = spool.path(relpath)
        st = source.stat()
        if not stat.S_ISREG(st.st_mode):
            raise FileNotFoundError(errno.ENOENT, "not a regular file", str(source))
        # As on a local SRC, a file whose archive name would pass NAME_MAX goes as it is: no
        # mount shows a longer name, and its staged temp name could not even be made (it was
        # failed for good: "File name too long").
        packed = pack_all or read_as_archive(source.name) or looks_like_tiff(source, st.st_size)
        archive = packed and nameable(source.name)
        name = archive_name(source.name) if archive else source.name
        folder = relpath.rpartition("/")[0]  # not `.strip(".")`: `.git/x` went to `git/x`
        key = join_key(folder, name)

        def progress(_nbytes: int) -> None:
            check(cancel)

        sha = file_sha256(source, progress) if archive else ""
        verify = _restores_to(source.name, sha, st.st_size) if archive else _same_as(source)
        other = source.name if archive else archive_name(source.name)
        rival = join_key(key.rpartition("/")[0], other)
        existing = self.folder.stat(key)
        if existing is not None:
            done = self._already(spool, relpath, key, rival, existing.etag or "", st, verify)
            if done is not None:
                return done
        if self.folder.stat(rival) is not None:
            raise KeyTakenError(f"{self.folder.url_of(key)}: {other} is already in the bucket "
                                "and one would hide the other; not published")  # fmt: skip
        if not archive:
            return self._upload(spool, relpath, key, rival, source, st, verify, "plain", "", cancel)
        return self._pack_and_upload(
            spool, relpath, key, rival, source, st, verify, options, cancel
        )

    def _pack_and_upload(
        self,
        spool: Spool,
        relpath: str,
        key: str,
        rival: str,
        source: Path,
        st: os.stat_result,
        verify: Verify,
        options: PackOptions | None,
        cancel: threading.Event | None,
    ) -> Published:
        from vfs.decant.packer import PackOptions, pack_file

        def progress(_nbytes: int) -> None:
            check(cancel)

        spool.staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        need = st.st_blocks * 512 + SPACE_MARGIN
        require_space(spool.staging, need, f"needs about {size_text(need)} free to pack")
        staged = spool.staging / temp_name(key.rpartition("/")[2])  # within NAME_MAX
        try:
            bounded = with_plane_bound(options or PackOptions(), spool.max_plane,
                                       spool.max_segments)  # fmt: skip
            result = pack_file(source, staged, bounded, progress)
            check(cancel)
            return self._upload(spool, relpath, key, rival, staged, st, verify, result.mode,
                                result.reason, cancel)  # fmt: skip
        finally:
            staged.unlink(missing_ok=True)

    def _upload(
        self,
        spool: Spool,
        relpath: str,
        key: str,
        rival: str,
        local: Path,
        st: os.stat_result,
        verify: Verify,
        mode: str,
        reason: str,
        cancel: threading.Event | None = None,
    ) -> Published:
        spooled = spool.path(relpath)
        if signature(spooled.stat()) != signature(st):
            raise SourceChangedError(spooled)  # before anything is uploaded

        def going_on() -> None:
            """Asked before each read of a multipart upload's parts: a stop (SIGTERM, unmount)
            ends the upload, and so does the spooled file removed or written to (red team 50s:
            an `rm` of a file being uploaded left its upload running to its end)."""
            check(cancel)
            try:
                now = signature(spooled.stat())
            except FileNotFoundError:
                now = ()
            if now != signature(st):
                raise SourceChangedError(spooled)

        from vfs.stores.upload import ObjectExistsError, put_verified

        with self._noted(key, st):
            token = self.tokens.new(key)
            with self._lock:
                self._uploading[relpath] = (key, token)
            try:
                uploaded = put_verified(self.folder, key, local, verify, check=going_on,
                                        metadata={UPLOAD_TOKEN: token})  # fmt: skip
            except ObjectExistsError:
                why = "already exists (written by another host?); not overwritten"
                if self.folder.stat(key) is None:  # refused, yet no object there
                    why = ("refused as taken, though no object is there (SeaweedFS keeps the "
                           "entry of a folder of that name emptied: remove it with the "
                           "store's tools); not published")  # fmt: skip
                raise KeyTakenError(f"{self.folder.url_of(key)}: {why}") from None
            finally:
                with self._lock:
                    if self._uploading.get(relpath) == (key, token):
                        del self._uploading[relpath]
            clash = self._clash(key, rival)
            if clash is not None:
                gone = self._delete_if(key, uploaded.etag)
                left = (
                    "" if gone else " (its upload could not be deleted: the listing rule decides)"
                )
                raise KeyTakenError(f"{self.folder.url_of(key)}: {clash}; not published{left}")
            with self._lock:
                self._ours[uploaded.url] = (key, uploaded.etag)
                self._sources[uploaded.url] = uploaded.etag
            spool.mark_placed(relpath, st)
            self._placed(key, uploaded.etag, st)
        return Published(relpath, self._target(key), mode, reason, signature(st))

    @contextlib.contextmanager
    def _noted(self, key: str, st: os.stat_result) -> Iterator[None]:
        """The key noted as this file's while its upload runs: shown as the spooled file until
        its real entry comes (BucketTree's PENDING: a kill once it is uploaded, before that
        entry, left it 0444 to every user). An upload that fails in any way ends its note:
        left, the next object another host put at the key was shown as this host's user's,
        who could then `rm` it (an `rm` during its upload left it; red team 73, F3)."""
        self._placed(key, "", st)
        try:
            yield
        except BaseException:
            if self.on_placed is not None:
                self.on_placed(key, "", None)
            raise

    def _clash(self, key: str, rival: str) -> str | None:
        return clash(self.folder, key, rival)

    def _delete_if(self, key: str, etag: str) -> bool:
        return delete_if(self.folder, key, etag)

    def withdrawing(self, relpath: str) -> None:
        """The spooled file (or folder) `relpath` is about to be removed or renamed away
        through the mount: an upload of it under way is noted, so that the next start deletes
        what it leaves in the bucket if the daemon stops before it is withdrawn."""
        inside = relpath + "/"
        with self._lock:
            going = [v for r, v in self._uploading.items() if r == relpath or r.startswith(inside)]
        if self.on_withdrawn is not None:
            for key, token in going:
                self.on_withdrawn(key, token)

    def _already(
        self,
        spool: Spool,
        relpath: str,
        key: str,
        rival: str,
        etag: str,
        st: os.stat_result,
        verify: Verify,
    ) -> Published | None:
        """The key is taken: by this very file (uploaded before a crash or a stop, its spooled
        copy not yet deleted), or by something else, which is never overwritten. None: it holds
        an earlier state of this very spooled file, uploaded by this mount (the file was
        written to while it was published, after the check of what was uploaded), now deleted
        so the newer state goes up in its place: refused as another host's, the newer bytes
        stayed spooled and failed for good, the bucket serving the older ones to every host."""
        try:
            verify(self.folder, key)
        except (DecantError, OSError) as exc:
            url = self.folder.url_of(key)
            with self._lock:
                ours = self._sources.get(url) == etag
            # An inode number comes back for other files once its file is gone: the spool
            # forgets what it placed once the spooled name goes (published), so a file renamed
            # over the name later never replaces the object (a key taken stays taken).
            earlier = ours and spool.placed_ident(relpath) == (st.st_dev, st.st_ino)
            if earlier and self._withdraw_earlier(key, etag):
                return None
            if self.on_placed is not None:  # a pending note of a killed upload ends: the
                self.on_placed(key, "", None)  # object was shown as this file's (red team 90)
            why = f"already exists and holds other bytes ({exc}); not overwritten"
            raise KeyTakenError(f"{url}: {why}") from None
        # Uploaded before a stop or a kill that came before its check (see `_upload`): checked
        # now. The object is left where it is, and a file that failed stays spooled with the
        # reason. Only this host's own upload counts: another host's of the same bytes (a user
        # there may copy them from this spool, readable through the mount) was taken for it,
        # this file's spooled copy deleted, and that user then deleted the object as theirs on
        # their host, the only copy gone (red team 83, F1); so too when this host had begun an
        # upload there, or had uploaded those bytes there before (red team 86, F1).
        if not self._uploaded_here(key):
            if self.on_placed is not None:  # not shown as this file's any more
                self.on_placed(key, "", None)
            raise KeyTakenError(
                f"{self.folder.url_of(key)}: holds this file's bytes, but not from an upload of "
                "this host (another host's, or put there directly); left as it is, and the file "
                "stays spooled: remove it through the mount once that object is the one wanted"
            )
        clash = self._clash(key, rival)
        if clash is not None:
            if self.on_placed is not None:
                self.on_placed(key, "", None)
            raise KeyTakenError(f"{self.folder.url_of(key)}: {clash}; the object holding this "
                                "file's bytes is left as it is, not published again")  # fmt: skip
        self._placed(key, etag, st)
        return Published(relpath, self._target(key), "already", signature=signature(st))

    def _uploaded_here(self, key: str) -> bool:
        """Whether the object at `key` carries a token this host signed for it (a HEAD)."""
        return self.tokens.signed(key, self.folder.upload_token(key))

    def _withdraw_earlier(self, key: str, etag: str) -> bool:
        """Delete the object at `key` if it is still the upload of ETag `etag` (a HEAD first: S3
        has no conditional DELETE); whether it is gone."""
        import obstore

        from vfs.stores.s3 import scrubbed

        url = self.folder.url_of(key)
        info = self.folder.stat(key)
        if info is None or info.etag != etag:
            return info is None
        try:
            obstore.delete(self.folder.client, self.folder.full_key(key))
        except Exception as exc:  # obstore errors: the file stays spooled, failed
            log.warning("%s: could not delete the earlier upload: %s", url, scrubbed(exc))
            return False
        log.info("%s: the spooled file changed after it was uploaded; its earlier upload is "
                 "deleted and the newer state uploaded", url)  # fmt: skip
        with self._lock:
            self._sources.pop(url, None)
            self._ours.pop(url, None)
        if self.on_placed is not None:
            self.on_placed(key, etag, None)
        return True

    def _placed(self, key: str, etag: str, st: os.stat_result) -> None:
        if self.on_placed is not None:
            self.on_placed(key, etag, st)

    def _target(self, key: str) -> Path:
        from vfs.stores.base import ObjectPath

        return ObjectPath.of_url(self.folder.url_of(key))

    def retract(self, target: Path, placed: tuple[int, int]) -> None:
        """Withdraw an object this mount just uploaded (its spooled file was deleted or renamed
        through the mount meanwhile), if it is still ours: never another writer's."""
        import obstore

        from vfs.stores.s3 import scrubbed

        with self._lock:
            ours = self._ours.get(str(target))
        if ours is None:
            return
        key, etag = ours
        try:
            info = self.folder.stat(key)
            if info is None or info.etag != etag:
                return
            obstore.delete(self.folder.client, self.folder.full_key(key))
        except Exception as exc:  # obstore errors, StoreError: logged, the object stays
            log.warning("%s: could not withdraw it: %s", self.folder.url_of(key), scrubbed(exc))
            return
        with self._lock:
            self._ours.pop(str(target), None)
        if self.on_placed is not None:
            self.on_placed(key, etag, None)


LIST_LOOK = 1000  # objects of a folder `clash` looks at for one older than a file (one LIST page)
# How long before its own an object counts as put, not racing it: longer than an upload's read
# back and check take (a multipart upload's Last-Modified is when it began: longer still).
RACE_WINDOW = 600.0


def clash(folder: S3Folder, key: str, rival: str) -> str | None:
    """Why the object just put at `key` (the other form of its name: `rival`, `NAME` beside
    `NAME.zarr.zip`) would hide, or be hidden by, an entry another host put in the bucket since
    the checks before it (each host lists its folders up to --relist old, and packing takes
    seconds), or None. Asked once the object is in: of two that clash, the later always finds
    the earlier (a PUT is visible to every reader once it returns), and either one that finds
    the other gives way, so one at most is left, whatever the store's clocks say (a multipart
    upload's Last-Modified is when it began). Both give way if each finds the other: both
    files stay spooled, failed, and nothing is hidden. Without this a TIFF published on one
    host and a plain file of its name on another both reported success, and every host served
    one of them; a file published on one host vanished from all when another, listing from
    before it, made a folder of its name (red team 70, F1 and F2), or an archive presenting it
    (red team 72, F1); so did one `mv`-ed there (red team 72, F2).
    One HEAD for the other form of the name, two LISTs (the name shown as a folder, and as a
    folder archive `NAME.zarr/`), two HEADs per folder above the key (an object and an archive
    named like it; four for a folder archive's `X.zarr`: `X` too), and where one is found, a
    HEAD of this object and a LIST of that folder to tell whether this object is what hides it.
    """
    if folder.stat(rival) is not None:
        name = rival.rpartition("/")[2]
        return f"{name} was put in the bucket meanwhile (another host?); one would hide the other"
    shown = rival if key.endswith(".zarr.zip") else key  # the name it is listed under
    if next(iter(folder.list(shown)), None) is not None:
        return "a folder of that name was made in the bucket meanwhile (by another host?)"
    # A folder archive presents the original it holds: NAME.zarr/ is shown as NAME (red team
    # 73, F1: one copied in after a plain NAME took the name over on the hosts started before).
    if next(iter(folder.list(f"{shown}.zarr")), None) is not None:
        name = shown.rpartition("/")[2]
        return (f"{name}.zarr (a folder archive presenting {name}) is in the bucket; one would "
                "hide the other")  # fmt: skip
    parts = key.split("/")[:-1]
    for depth in range(len(parts), 0, -1):
        above = "/".join(parts[:depth])
        names = [above, f"{above}.zarr.zip"]
        if above.endswith(".zarr"):  # this object is in a folder archive, shown as its stem
            names += [above.removesuffix(".zarr"), f"{above.removesuffix('.zarr')}.zarr.zip"]
        hidden = next((info for n in names if (info := folder.stat(n)) is not None), None)
        if hidden is None:
            continue
        # A file or an archive shown as a folder the key is in is shown only while that
        # folder holds nothing: this object hides it unless others' objects did so already,
        # those older than the file or put well before this one. Others' objects put since
        # may be uploads racing this one, each in its window between its PUT and its check
        # (two hosts making the folder at once both passed, and the file vanished from every
        # host: red team 73, F4): each gives way.
        ours = folder.stat(key)
        before = max(hidden.mtime, ours.mtime - RACE_WINDOW) if ours else hidden.mtime
        older = (info for info in itertools.islice(folder.list(above), LIST_LOOK)
                 if info.key != key and info.mtime < before)  # fmt: skip
        if next(older, None) is None:
            return (f"{hidden.key.removesuffix('.zarr.zip')} is a file in the bucket (another "
                    "host's?); its folder would hide it")  # fmt: skip
        break  # a folder of older objects there already: so are the ones above it
    return None


def delete_if(folder: S3Folder, key: str, etag: str) -> bool:
    """Delete the object at `key` if it is still the one of ETag `etag` (a HEAD first: S3 has
    no conditional DELETE); whether no such object is there now."""
    import obstore

    from vfs.stores.s3 import scrubbed

    try:
        info = folder.stat(key)
        if info is None or info.etag != etag:
            return True
        obstore.delete(folder.client, folder.full_key(key))
    except Exception as exc:  # obstore errors, StoreError: logged, the object stays
        log.warning("%s: could not delete it: %s", folder.url_of(key), scrubbed(exc))
        return False
    return True


def _same_as(local: Path) -> Verify:
    from vfs.stores.upload import same_bytes

    return same_bytes(local)


def _restores_to(name: str, sha: str, size: int) -> Verify:
    """A verifier: the archive, opened from the bucket by ranged GETs, restores to one original
    `name` of `size` bytes whose sha256 is the spooled file's."""

    def verify(folder: object, key: str) -> None:
        from vfs.decant.reader import DecantArchive
        from vfs.decant.verify import verify_opened
        from vfs.stores.upload import UploadVerifyError

        with DecantArchive.open_at(folder, key) as archive:  # type: ignore[arg-type]
            sizes = [info.size for info in archive.originals()]
            verdicts = verify_opened(archive)
        bad = [v for v in verdicts if not v.ok or v.actual != sha or v.relpath != name]
        if len(verdicts) != 1 or bad or sizes != [size]:
            got = ", ".join(f"{v.relpath} {v.actual}" for v in verdicts) or "no original"
            raise UploadVerifyError(f"restores to {got}, not {name} {sha}")

    return verify


class BucketWriteSide(WriteSide):
    """The write rules over a bucket (see the module docstring); `root` is the mount's
    ObjectPath, spooled files are local."""

    def __init__(
        self,
        root: Path,
        spool: Spool,
        folder: S3Folder,
        guard: SpaceGuard | None = None,
        allow_delete: bool = False,
    ) -> None:
        super().__init__(root, spool, allow_delete=allow_delete, guard=guard)
        self.folder = folder
        # The tree's hook (BucketTree.note_published through the placer): a key deleted or
        # made here makes the listings above it be read again, not served from memory.
        self._changed: OnPlaced | None = getattr(spool.placer, "on_placed", None)

    def _relpath(self, path: Path) -> str:
        text = str(path)
        if text.startswith(self._root_text):
            return text[len(self._root_text) :]
        return "" if path == self.root else path.relative_to(self.root).as_posix()

    def refresh(self, node: Node) -> Node:
        if node.spooled:
            return super().refresh(node)
        return node  # a folder or an object of the bucket: nothing local to look at

    def setattr(self, node: Node, attrs: Attrs) -> Node:
        if node.spooled:
            return super().setattr(node, attrs)
        if node.is_dir:
            # A bucket folder keeps no mode or times: accepted (rsync -a sets them on every
            # folder it made), kept on its spool folder while it has one.
            local = self.spool.path(self._relpath(node.real))
            if local.is_dir():
                self._set(mirror_node(local, local.stat(), True), local, attrs)
                st = local.stat()
                node.mode, node.uid, node.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
                node.mtime_ns = st.st_mtime_ns
            return node
        if _unchanged(node, attrs):
            return node
        raise refuse(errno.EPERM, f"{node.real}: an object in the bucket keeps the metadata "
                     "it was published with")  # fmt: skip

    def open_for_write(self, node: Node, flags: int) -> tuple[Node, int]:
        if not node.spooled:
            raise refuse(errno.EPERM, f"{node.real}: objects in the bucket are not rewritten")
        return super().open_for_write(node, flags)

    def rename(
        self,
        old_parent: Node,
        old: str,
        node: Node,
        new_parent: Node,
        new: str,
        behind: Node | None = None,
        over: tuple[Node | None, ...] = (),
    ) -> Node:
        """Only spooled files move. Over an object of the bucket (`behind`), the spooled file
        hides it; its upload then finds the key taken and it stays spooled, failed."""
        if node.spooled:  # an upload of it, or of a file it replaces, is withdrawn
            self._withdrawing(node.spooled)
            self._withdrawing(self._rel(new_parent, new))
            return super().rename(old_parent, old, node, new_parent, new, None)
        if node.is_dir or node.backend is None or node.backend.name != "object":
            what = "a folder" if node.is_dir else "an archive (its original's name is inside it)"
            raise refuse(errno.EPERM, f"{node.real}: {what} in the bucket is not renamed")
        if not self.allow_delete:
            raise refuse(errno.EPERM, f"{node.real}: renaming an object of the bucket deletes "
                         "its old key: it needs decant-mount --allow-delete")  # fmt: skip
        old_key, new_key = self._relpath(node.real), self._rel(new_parent, new)
        if self.folder.stat(new_key) is not None or self.spool.path(new_key).exists():
            raise refuse(errno.EEXIST, f"{self.folder.url_of(new_key)}: taken; not replaced")
        self._still_listed(node, old_key)
        if self._changed is not None:  # as in _upload: shown so before the copy exists
            self._changed(new_key, "", _shown_stat(node))
        try:
            copied = self._copy_checked(old_key, new_key, node)
        except BaseException as exc:
            # The note ends where no copy was left (the key taken, or the copy given way);
            # else it stays, and whatever is at the key is shown root's and private until
            # the next start (ended, a copy left by a HEAD that failed after it was shown 0444
            # to all: red team 96; told by its ETag, another host's upload of the same bytes
            # was taken for it, and the user could `rm` it: red team 97).
            if self._changed is not None and _no_copy_left(exc):
                self._changed(new_key, "", None)
            raise
        if self._changed is not None:
            # The new key shows the mode, owner and mtime the old one showed (what this host
            # published): shown as any object's, 0444, a 0600 file `mv`-ed became readable by
            # every local user. Noted before the old key's delete: one that failed left the
            # note pending, and a start, finding no token of this host's on the copy (a copy
            # keeps none), showed the file 0444 to all (red team 94, F6).
            self._changed(new_key, copied.etag or "", _shown_stat(node))
        # Looked at again right before its delete: another host's object put there during
        # the copy and its checks was deleted (red team 96); now only within this round trip.
        self._delete(old_key, self._still_listed(node, old_key))
        moved = self.root / new_key
        moved.info = copied  # type: ignore[attr-defined]  # the listing's, as a scan gives it
        node.real = moved
        # The version of the object now listed there, made as `_still_listed` makes it: else a
        # second mv or an rm of the new name found "another" object and refused it (ESTALE).
        number = etag_number(f"{copied.key}\0{copied.etag}") or 1
        node.version = (number, copied.size, int(copied.mtime * 1e9))
        return node

    def _copy_checked(self, old_key: str, new_key: str, node: Node) -> ObjectInfo:
        """Copy the object to a key that must still be free, then check it for clashes as an
        upload is checked: the copy gives way (deleted), the object stays where it was."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, BaseError

        from vfs.stores.s3 import translate

        try:
            # Conditional: an object another host put at the new key between the check before
            # and the copy was overwritten, its bytes lost, though its upload said done (red
            # team 73, F2). A store that ignores the condition still overwrites it.
            obstore.copy(self.folder.client, self.folder.full_key(old_key),  # type: ignore[attr-defined]
                         self.folder.full_key(new_key), overwrite=False)  # fmt: skip
            copied = self.folder.stat(new_key)
            if copied is None or copied.size != node.size:
                raise StoreError(f"{self.folder.url_of(new_key)}: the copy is not there whole")
        except AlreadyExistsError:
            taken = refuse(errno.EEXIST, f"{self.folder.url_of(new_key)}: taken meanwhile (by "
                           "another host?); not replaced")  # fmt: skip
            # Or by this very copy: its request retried after a reply that was lost (the
            # first went through) is refused by its own condition (red team 98).
            taken.copy_may_be_left = True  # type: ignore[attr-defined]
            raise taken from None
        except (BaseError, OSError) as exc:
            raise translate(exc, self.folder.url_of(new_key), "copy:") from None
        stem = new_key.removesuffix(".zarr.zip")
        why = clash(self.folder, new_key, stem if stem != new_key else f"{new_key}.zarr.zip")
        if why is not None:
            if not delete_if(self.folder, new_key, copied.etag or ""):
                raise StoreError(f"{self.folder.url_of(new_key)}: {why}; not moved, and its copy "
                                 "could not be deleted")  # fmt: skip
            raise refuse(errno.EEXIST, f"{self.folder.url_of(new_key)}: {why}; not moved")
        return copied

    def _still_listed(self, node: Node, key: str) -> str:
        """The ETag of `key` if it still holds the object the mount listed as `node` (its
        inode number is made of key and ETag), else a refusal."""
        info = self.folder.stat(key)
        if info is None:
            raise refuse(errno.ENOENT, f"{self.folder.url_of(key)}: gone from the bucket")
        if not node.version or etag_number(f"{info.key}\0{info.etag}") != node.version[0]:
            self._notify(key, "")  # listed again at its next use: the new version shows
            raise refuse(errno.ESTALE, f"{self.folder.url_of(key)}: replaced (by another "
                         "host?) since it was listed; left alone")  # fmt: skip
        return info.etag or ""

    def _delete(self, key: str, etag: str) -> None:
        import obstore
        from obstore.exceptions import BaseError

        from vfs.stores.s3 import translate

        try:
            obstore.delete(self.folder.client, self.folder.full_key(key))
        except (BaseError, OSError) as exc:
            raise translate(exc, self.folder.url_of(key), "delete:") from None
        log.info("%s: deleted through the mount", self.folder.url_of(key))
        self._notify(key, etag)

    def _notify(self, key: str, etag: str) -> None:
        if self._changed is not None:
            self._changed(key, etag, None)

    def _remove_object(self, node: Node) -> None:
        """`rm` of an object of the bucket (--allow-delete; see the module docstring)."""
        key = self._relpath(node.real)
        if not self.allow_delete:
            raise refuse(errno.EPERM, f"{node.real}: deleting needs decant-mount --allow-delete")
        if node.member:  # its key is the whole archive's: every other member would go too
            raise refuse(errno.EPERM, f"{node.real}: members of an archive cannot be deleted")
        if node.backend is not None and node.backend.name != "object" and key.endswith(".zarr"):
            raise refuse(errno.EPERM, f"{node.real}: a folder archive (many keys) is not "
                         "deleted through the mount")  # fmt: skip
        self._delete(key, self._still_listed(node, key))

    def _check_free(
        self, parent: Node, name: str, over: tuple[Node | None, ...], is_dir: bool
    ) -> None:
        """Nothing to check: an upload never replaces a key (a taken one leaves the file
        spooled, failed) and a plain file's publish sets no archive aside."""

    def _check_shown(self, target: Path, spool_only: bool = False) -> None:
        """Nothing to check: a bucket holds objects only, none hidden from the mount (no links,
        FIFOs); its keys are not local paths."""

    def unlink(self, parent: Node, name: str, node: Node, behind: Node | None = None) -> None:
        if node.is_dir:
            raise refuse(errno.EISDIR, str(node.real))
        if not node.spooled:
            return self._remove_object(node)
        # The version it hid goes too, as in a local SRC, when it is shown as the same owner's
        # (this host's upload of that user's file): an object another host published under
        # the name of a file spooled here before is not the remover's, and `rm` of the spooled
        # file deleted it, past the sticky bit (red team 90, F1).
        hid = behind is not None and not behind.spooled and behind.uid == node.uid
        if hid and self.allow_delete:
            self._remove_object(behind)  # type: ignore[arg-type]
        self._withdrawing(node.spooled)
        self.spool.remove(node.spooled)  # else whatever it hid in the bucket shows again

    def _withdrawing(self, relpath: str) -> None:
        placer = self.spool.placer
        if isinstance(placer, BucketPlacer):
            placer.withdrawing(relpath)

    def mkdir(self, parent: Node, name: str, mode: int, uid: int, gid: int) -> Node:
        """A folder is a spool folder until a file in it is published (its prefix then exists
        in the bucket)."""
        rel = self._rel(parent, name)
        self._need_room(0, rel)
        local = self.spool.path(rel)
        make_folders(local.parent)  # 0755, the daemon's: folders of the bucket above it
        local.mkdir(mode=stat.S_IMODE(mode) | 0o700)
        if os.geteuid() == 0:
            os.chown(local, uid, gid)
        return mirror_node(self.root / rel, local.stat(), writable=True)

    def rmdir(self, parent: Node, name: str, node: Node) -> None:
        if node.backend is not None or not node.is_dir:
            raise refuse(errno.EPERM if node.backend is not None else errno.ENOTDIR, name)
        rel = self._rel(parent, name)
        dirs, files = self.folder.list_dir(rel)
        if dirs or files or self.spool.listdir(rel):
            raise refuse(errno.ENOTEMPTY, name)
        with contextlib.suppress(FileNotFoundError):  # only ever in the bucket
            self.spool.path(rel).rmdir()


def _no_copy_left(exc: BaseException) -> bool:
    """Whether an `mv`'s copy that raised `exc` surely left nothing at its key: a clash
    whose copy was deleted again (EEXIST). Not the store's condition refusing the copy: a
    retried request is refused by the copy its first attempt made (red team 98)."""
    return (isinstance(exc, OSError) and exc.errno == errno.EEXIST
            and not getattr(exc, "copy_may_be_left", False))  # fmt: skip


def _shown_stat(node: Node) -> os.stat_result:
    """What `node` shows (mode, owner, mtime), as the stat `OnPlaced` records."""
    seconds = node.mtime_ns / 1e9
    fields = (stat.S_IFREG | node.mode, 0, 0, 1, node.uid, node.gid, node.size, seconds, seconds,
              seconds)  # fmt: skip
    return os.stat_result(fields, {"st_mtime_ns": node.mtime_ns})


def _unchanged(node: Node, attrs: Attrs) -> bool:
    return (
        attrs.size is None
        and (attrs.mode is None or stat.S_IMODE(attrs.mode) == node.mode)
        and (attrs.uid is None or attrs.uid == node.uid)
        and (attrs.gid is None or attrs.gid == node.gid)
        and (attrs.mtime_ns is None or attrs.mtime_ns == node.mtime_ns)
    )
