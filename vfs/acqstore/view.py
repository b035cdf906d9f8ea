"""The virtual `members/` tree of a valid collection: members by human name, as plain files."""

from __future__ import annotations

import logging
import os
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vfs.acqstore import paths
from vfs.acqstore.ngff import NgffImage
from vfs.acqstore.synth_tiff import layout_for_image
from vfs.acqstore.validate import ENTRY_POINT, Validation
from vfs.backends.base import Entry
from vfs.beneath import stat_beneath
from vfs.decant import archive_stat
from vfs.errors import DecantError, ManifestError

log = logging.getLogger(__name__)

TABLES = "tables"
_NAME_MAX = 200  # bytes; leaves room below NAME_MAX (255) for a suffix such as " (id).tif"

# Given an archive's path, the file Entry the decant backend presents for it (None: cannot).
DecantDescriber = Callable[[Path], Entry | None]


def view_name(root: Path) -> str:
    """`members`, or `.members` when the collection already holds an entry called `members`."""
    if not os.path.lexists(root / "members"):
        return "members"
    if not os.path.lexists(root / ".members"):
        return ".members"
    raise ManifestError(
        f"{root}: both 'members' and '.members' exist; no name is left for the view"
    )


def safe_name(text: str, fallback: str = "_") -> str:
    """One path component: no slash, NUL or control character, no leading dot, not too long."""
    out = "".join(
        "_" if ch == "/" or unicodedata.category(ch) in ("Cc", "Cs") else ch
        for ch in unicodedata.normalize("NFC", text)
    ).strip()
    if out.startswith("."):
        out = "_" + out[1:]  # a leading dot would hide the entry from `ls` and globbing scripts
    # Cut in one step (the partial character at the cut dropped): shortened a character at a
    # time, re-encoding the whole name each time, 300,000 characters took a core 33 s.
    out = out.encode("utf-8")[:_NAME_MAX].decode("utf-8", errors="ignore")
    return out or fallback


class UniqueNames:
    """The names given so far in one folder: `name`, else `name_2`, `name_3`… The next number
    is kept per name, so N equal names cost N steps: tried from 2 each time, 27,000 members
    whose names were cut to the same 200 bytes took minutes (red team 57)."""

    def __init__(self, taken: tuple[str, ...] = ()) -> None:
        self.taken = set(taken)
        self._last: dict[str, int] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.taken

    def give(self, name: str) -> str:
        candidate, n = name, self._last.get(name, 1)
        while candidate in self.taken:  # every name_k up to _last[name] is taken: none is freed
            n += 1
            candidate = f"{name}_{n}"
        self._last[name] = n
        self.taken.add(candidate)
        return candidate


def build_view(result: Validation, describe_decant: DecantDescriber | None = None) -> Entry:
    """The folder Entry to show as `members/`; `result` must be free of errors."""
    if not result.ok:
        raise ManifestError(f"{result.root}: cannot build a view of an invalid collection")
    collection = result.documents[ENTRY_POINT]
    # Its names are read from this document (vfs.mount.tree): judged by that very file's modes
    view = Entry(is_dir=True, locator={"read_from": list(result.read_from[ENTRY_POINT])})
    tables = collection.get("resources", {}).get("tables", [])
    used = UniqueNames((TABLES,) if tables else ())
    for member, folder in zip(
        collection["members"], _member_folders(collection["members"], used), strict=True
    ):
        view.children[folder] = _member_entry(result, member, folder, describe_decant)
    if tables:
        shelf = view.children[TABLES] = Entry(is_dir=True)
        names = UniqueNames()
        for table in tables:
            name = names.give(safe_name(table["id"]) + ".csv")
            shelf.children[name] = _file(result, table["path"])
    return view


def _member_folders(members: list[dict[str, Any]], used: UniqueNames) -> list[str]:
    """Folder names: the safe member name, with the id appended where names collide."""
    wanted = [safe_name(m["name"], fallback=safe_name(m["id"])) for m in members]
    counts: dict[str, int] = {}
    for name in wanted:
        counts[name] = counts.get(name, 0) + 1
    out = []
    for name, member in zip(wanted, members, strict=True):
        if counts[name] > 1 or name in used:
            name = safe_name(f"{name} ({safe_name(member['id'])})")
        out.append(used.give(name))
    return out


def _member_entry(
    result: Validation, member: dict[str, Any], folder: str, describe_decant: DecantDescriber | None
) -> Entry:
    docs = result.documents
    entry = Entry(is_dir=True, xattrs={"user.acqstore.member_id": member["id"]})
    used = UniqueNames()

    def add(name: str, child: Entry) -> None:
        entry.children[used.give(name)] = child

    add(f"{folder}.tif", _image(result, member["ome_zarr"], member["name"], describe_decant))
    ref = member.get("reference_image")
    if ref:
        add(
            "reference.tif",
            _image(result, ref["ome_zarr"], f"{member['name']} reference", describe_decant),
        )
        add("reference-image.json", _file(result, ref["metadata"]))
    add("acqimage.json", _file(result, member["resources"]["acqimage"]))
    analyses_path = member["resources"].get("analyses")
    if analyses_path:
        # The folder lists analysis ids read from this document (vfs.mount.tree): shown only
        # to a class that may read it, as `members/` is for collection.json.
        doc = paths.normalize(analyses_path)
        where = {"kind": "folder", "path": doc, "read_from": list(result.read_from[doc])}
        entry.locator = dict(where)
        add("analyses.json", _file(result, analyses_path))
        for analysis in docs[doc]["analyses"]:
            sub = Entry(
                is_dir=True,
                xattrs={"user.acqstore.analysis_id": analysis["id"]},
                # its name and its files' names come from this document (vfs.mount.tree)
                locator=dict(where),
            )
            names = UniqueNames()
            for res in analysis["resources"]:
                sub.children[names.give(safe_name(res["id"]) + ".csv")] = _file(result, res["path"])
            add(safe_name(analysis["id"]), sub)
    return entry


def _file(result: Validation, rel: str) -> Entry:
    key = paths.normalize(rel)
    st = stat_beneath(result.root, paths.resolve(result.root, key))  # never a link's target's
    if not result.same_as_checked(key, st):
        raise ManifestError(f"{key}: not the file checked for the collection's owner")
    size = st.st_size
    return Entry(
        size=size, xattrs={"user.acqstore.source": key}, locator={"kind": "file", "path": key}
    )


def _image(
    result: Validation, rel: str, title: str, describe_decant: DecantDescriber | None
) -> Entry:
    """The byte-exact original of a decant archive when the decant backend can give it, otherwise
    a TIFF synthesized from the full-resolution array."""
    key = paths.normalize(rel)
    image: NgffImage = result.images[key]
    xattrs = {"user.acqstore.source": key}
    if image.decant and describe_decant is not None:
        try:
            # The archive's version before it is read: the member is keyed by it (a new version
            # is a new view), and an open or a verdict of another file than this is refused.
            st = archive_stat(image.path, os.lstat(image.path))  # as the mount keys it
            if not result.same_as_checked(key, st):
                raise ManifestError(f"{key}: not the archive checked for the collection's owner")
            stamp = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            original = describe_decant(image.path)
        except (DecantError, OSError) as exc:
            log.warning(
                "%s: decant archive not served as its original (%s); synthesizing", image.path, exc
            )
            original = None
        if original is not None and not original.is_dir:
            locator = {"kind": "decant", "path": key, "entry": original.to_json(), "stamp": stamp}
            xattrs = {**original.xattrs, **xattrs}
            return Entry(size=original.size, sha256=original.sha256, xattrs=xattrs, locator=locator)
    try:
        layout = layout_for_image(image, name=title)
    except DecantError as exc:
        raise type(exc)(f"{key}: {exc}") from None
    locator: dict[str, object] = {"kind": "tiff", "path": key, "name": title}
    if not image.zipped:  # a zip is one file: its own modes cover what is read from inside
        # Where the TIFF's size (the image's shape and dtype) is read from: the mount shows it
        # only to those who may read these there (tree._as_its_source).
        locator["documents"] = list(image.metadata_keys)
    return Entry(size=layout.size, xattrs=xattrs, locator=locator)
