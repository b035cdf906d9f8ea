"""Collection loading and §10 validation: every violation, with its document and JSON pointer."""

from __future__ import annotations

import errno
import itertools
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import jsonschema_rs

from vfs.acqstore import paths
from vfs.acqstore.ngff import NgffImage, inspect_image
from vfs.acqstore.paths import ENTRY_POINT
from vfs.beneath import read_beneath_stat, stat_beneath
from vfs.decant.limits import MAX_JSON_COST, MiB, json_cost, json_kept, parse_json
from vfs.errors import ManifestError
from vfs.perms import readable_below, user_groups

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

# A collection's JSON documents: bytes, what parsing each may cost in memory (json_cost,
# MAX_JSON_COST), and what all of them keep parsed together (json_kept): they are kept until
# the view is built. The 10,000-member corpus (tools/make_acqstore_corpus.py large) keeps
# 141 MiB by json_kept (82 MiB by tracemalloc): ~13,000 such members fit.
MAX_DOCUMENT_BYTES = 16 * MiB
MAX_COLLECTION_COST = 4 * MAX_JSON_COST
# Issues kept: each is a few hundred bytes (and a schema error a few KiB while it is sorted), so
# a document of 262,144 wrong members cost ~1 GiB of RSS when all were listed.
MAX_ISSUES = 1000

_SCHEMA_DEFS = {
    "collection": "collection",
    "acqimage": "acqimage",
    "analyses": "analyses",
    "reference-image": "referenceImage",
}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Issue:
    severity: Severity
    document: str  # path relative to the collection root
    pointer: str  # RFC 6901 JSON pointer into that document ("" is the whole document)
    message: str

    def line(self) -> str:
        where = f"{self.document} {self.pointer}" if self.pointer else self.document
        return f"{self.severity}: {where}: {self.message}"

    def to_json(self) -> dict[str, str]:
        return {
            "severity": self.severity,
            "document": self.document,
            "pointer": self.pointer,
            "message": self.message,
        }


NOT_THE_AUTHORS = "does not exist, or its collection's owner may not read it there"


@dataclass
class Validation:
    """The outcome, plus what was loaded on the way so the view is built without reading twice."""

    root: Path
    issues: list[Issue] = field(default_factory=list)
    documents: dict[str, Any] = field(default_factory=dict)  # relpath -> parsed JSON
    # relpath -> (st_dev, st_ino) of the file each was read from: the view shows its names
    # only to who may read that file (vfs.mount.tree), not one swapped in at its path since
    read_from: dict[str, tuple[int, int]] = field(default_factory=dict)
    # relpath -> (st_dev, st_ino) of each reference as its author's check found it (a user's
    # collection): what is looked at again by path must be that file (`same_as_checked`)
    checked: dict[str, tuple[int, int]] = field(default_factory=dict)
    images: dict[str, NgffImage] = field(default_factory=dict)  # relpath -> inspected image

    def same_as_checked(self, key: str, st: os.stat_result) -> bool:
        """Whether `st` is of the file the author's check found at `key` (no check: yes). The
        owner of a folder on the way swapped a folder of theirs for another user's private
        one between the check and the look, and the view showed that user's file's size."""
        want = self.checked.get(key)
        return want is None or want == (st.st_dev, st.st_ino)

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "valid": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "issues": [i.to_json() for i in self.issues],
        }


def validate_collection(root: Path) -> Validation:
    """Validate the collection whose `acqstore/collection.json` lies under `root`."""
    run = _Run(Path(root))
    run.collection()
    # A document linked by two members is checked twice; say each thing once.
    run.result.issues = list(dict.fromkeys(run.result.issues))
    if run.dropped:
        worst: Severity = "error" if "error" in run.dropped else "warning"
        more = f"more issues not listed (only the first {MAX_ISSUES} are kept)"
        run.result.issues.append(Issue(worst, ENTRY_POINT, "", more))
    return run.result


def pointer(*parts: object) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        return False
    text = value.upper().replace("Z", "+00:00").replace(" ", "T")
    text = text[:17] + "59" + text[19:] if text[17:19] == "60" else text  # leap second
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


@cache
def _schema(kind: str) -> dict[str, Any]:
    """One document kind's schema: its $defs entry of schema.json, references inlined."""
    schema = json.loads(resources.files("vfs.acqstore").joinpath("schema.json").read_text("utf-8"))
    sub: dict[str, Any] = _inline(schema["$defs"][_SCHEMA_DEFS[kind]], schema["$defs"])
    return sub


@cache
def validator(kind: str) -> Draft202012Validator:
    """The compiled schema for one document kind, which words every error. Imported when first
    needed: a collection whose documents all conform never loads jsonschema (~60 ms)."""
    from jsonschema import Draft202012Validator, FormatChecker

    checker = FormatChecker(formats=())
    checker.checks("date-time")(_is_datetime)
    return Draft202012Validator(_schema(kind), format_checker=checker)


@cache
def _quick(kind: str) -> jsonschema_rs.Draft202012Validator:
    """The same schema compiled by jsonschema-rs, which only says whether a document conforms.
    Measured on the 1,000-member corpus: 0.004 s for its 2,000 member documents against 0.5 s
    for `jsonschema` (a quarter of a cold validation). A document it refuses is checked again
    by `validator`, which words every error, so reports read as before."""
    return jsonschema_rs.Draft202012Validator(
        _schema(kind), formats={"date-time": _is_datetime}, validate_formats=True
    )


def conforms(kind: str, doc: Any) -> bool:
    """True when `doc` certainly passes `validator(kind)`; False means "ask it"."""
    try:
        return bool(_quick(kind).is_valid(doc))
    except Exception:  # any doubt is settled by the full validator
        return False
    except BaseException as exc:  # a panic in the Rust code arrives as pyo3's PanicException
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        return False


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Substitute the schema's local `$ref`s (it has no cycles): validation runs ~40% faster
    without per-instance reference resolution, which matters at thousands of documents."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {k: _inline(v, defs) for k, v in node.items() if k != "$ref"}
            return {**_inline(defs[ref.removeprefix("#/$defs/")], defs), **rest}
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _pixel(value: Any) -> tuple[int, int] | None:
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return value[0], value[1]
    return None


class _Run:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.result = Validation(root)
        self._schema_checked: set[tuple[str, str]] = set()
        self._kept = 0  # json_kept of every document read so far
        # Whose references the collection's are: its collection.json's owner, as read. What it
        # points at is looked at only where that user may read it in SRC (`target`).
        self.author: int | None = None
        self.groups: set[int] = set()
        self.dropped: set[Severity] = set()  # severities of issues past MAX_ISSUES

    def error(self, document: str, ptr: str, message: str) -> None:
        self.issue(Issue("error", document, ptr, message))

    def warning(self, document: str, ptr: str, message: str) -> None:
        self.issue(Issue("warning", document, ptr, message))

    def issue(self, issue: Issue) -> None:
        if len(self.result.issues) < MAX_ISSUES:
            self.result.issues.append(issue)
        else:
            self.dropped.add(issue.severity)

    def collection(self) -> None:
        doc = self.load(ENTRY_POINT, "collection")
        if not isinstance(doc, dict):
            return
        self.unique(ENTRY_POINT, ("members",), _list(doc.get("members")), "member id")
        tables = _list(_obj(doc.get("resources")).get("tables"))
        self.unique(ENTRY_POINT, ("resources", "tables"), tables, "table id")
        for j, table in enumerate(tables):
            self.csv(ENTRY_POINT, ("resources", "tables", j, "path"), _obj(table).get("path"))
        for i, member in enumerate(_list(doc.get("members"))):
            if isinstance(member, dict):
                self.member(i, member)

    def member(self, i: int, m: dict[str, Any]) -> None:
        base = ("members", i)
        mid = m.get("id") if isinstance(m.get("id"), str) else None
        owner = f"the owning member id {mid!r} ({ENTRY_POINT} {pointer(*base, 'id')})"
        image = self.image(ENTRY_POINT, (*base, "ome_zarr"), m.get("ome_zarr"))
        res = _obj(m.get("resources"))
        rois: set[str] | None = None
        linked = self.linked(
            ENTRY_POINT, (*base, "resources", "acqimage"), res.get("acqimage"), "acqimage"
        )
        if linked:
            rois = self.acqimage(*linked, mid, owner, image)
        if "analyses" in res:
            linked = self.linked(
                ENTRY_POINT, (*base, "resources", "analyses"), res["analyses"], "analyses"
            )
            if linked:
                self.analyses(*linked, mid, owner, rois)
        ref = m.get("reference_image")
        if isinstance(ref, dict):
            ref_image = self.image(
                ENTRY_POINT, (*base, "reference_image", "ome_zarr"), ref.get("ome_zarr")
            )
            linked = self.linked(
                ENTRY_POINT,
                (*base, "reference_image", "metadata"),
                ref.get("metadata"),
                "reference-image",
            )
            if linked:
                self.reference(*linked, mid, owner, ref_image)

    # -- one document each ------------------------------------------------------------------

    def acqimage(
        self, rel: str, doc: dict[str, Any], mid: str | None, owner: str, image: NgffImage | None
    ) -> set[str]:
        self.image_id(rel, doc, mid, owner)
        rois = _list(doc.get("rois"))
        ids = self.unique(rel, ("rois",), rois, "ROI id")
        size = image.plane_size() if image else None
        for j, roi in enumerate(rois):
            roi = _obj(roi)
            if roi.get("type") == "rectangle":
                start, stop = _pixel(roi.get("start")), _pixel(roi.get("stop"))
                if start and stop:
                    for axis, a, b in zip("xy", start, stop, strict=True):
                        if b <= a:
                            self.error(
                                rel,
                                pointer("rois", j, "stop", "xy".index(axis)),
                                f"rectangle stop {axis} ({b}) must be greater than "
                                f"start {axis} ({a})",
                            )
            if size:
                self.bounds(rel, ("rois", j), roi, size, "primary")
        display = _obj(doc.get("axis_display"))
        if display and image is not None:
            for key in display:
                if key not in image.axis_names:
                    self.error(
                        rel,
                        pointer("axis_display", key),
                        f"axis_display key {key!r} is not an axis of the primary image "
                        f"(axes: {', '.join(image.axis_names)})",
                    )
        return ids

    def analyses(
        self, rel: str, doc: dict[str, Any], mid: str | None, owner: str, rois: set[str] | None
    ) -> None:
        self.image_id(rel, doc, mid, owner)
        items = _list(doc.get("analyses"))
        self.unique(rel, ("analyses",), items, "analysis id")
        for k, analysis in enumerate(items):
            analysis = _obj(analysis)
            roi_id = analysis.get("roi_id")
            if rois is not None and isinstance(roi_id, str) and roi_id not in rois:
                self.error(
                    rel,
                    pointer("analyses", k, "roi_id"),
                    f"roi_id {roi_id!r} names no ROI of the member's acqimage.json",
                )
            resources_ = _list(analysis.get("resources"))
            self.unique(rel, ("analyses", k, "resources"), resources_, "resource id")
            for r, res in enumerate(resources_):
                self.csv(rel, ("analyses", k, "resources", r, "path"), _obj(res).get("path"))

    def reference(
        self, rel: str, doc: dict[str, Any], mid: str | None, owner: str, image: NgffImage | None
    ) -> None:
        self.image_id(rel, doc, mid, owner)
        points = _list(_obj(doc.get("scan_path")).get("points"))
        if image is None:
            return
        width, height = image.plane_size()
        for j, point in enumerate(points):
            xy = _pixel(point)
            if xy and not (xy[0] < width and xy[1] < height):
                self.warning(
                    rel,
                    pointer("scan_path", "points", j),
                    f"scan path point {list(xy)} lies outside the {width}x{height} "
                    "full-resolution reference image",
                )

    # -- shared checks ----------------------------------------------------------------------

    def image_id(self, rel: str, doc: dict[str, Any], mid: str | None, owner: str) -> None:
        image_id = doc.get("image_id")
        if mid is not None and isinstance(image_id, str) and image_id != mid:
            self.error(rel, "/image_id", f"image_id {image_id!r} does not match {owner}")

    def bounds(
        self,
        rel: str,
        base: tuple[Any, ...],
        roi: dict[str, Any],
        size: tuple[int, int],
        which: str,
    ) -> None:
        """ROIs are only warned about when outside the image: a stale ROI should not hide data."""
        width, height = size
        kind = roi.get("type")
        for key in ("position", "start", "stop"):
            xy = _pixel(roi.get(key))
            if xy is None:
                continue
            # A rectangle's stop is exclusive, so it may equal the image size.
            limit_x, limit_y = (
                (width + 1, height + 1)
                if kind == "rectangle" and key == "stop"
                else (width, height)
            )
            if not (xy[0] < limit_x and xy[1] < limit_y):
                self.warning(
                    rel,
                    pointer(*base, key),
                    f"{kind} {key} {list(xy)} lies outside the {width}x{height} "
                    f"full-resolution {which} image",
                )

    def unique(self, rel: str, base: tuple[Any, ...], items: list[Any], what: str) -> set[str]:
        seen: dict[str, int] = {}
        for j, item in enumerate(items):
            ident = _obj(item).get("id")
            if not isinstance(ident, str):
                continue
            if ident in seen:
                self.error(
                    rel,
                    pointer(*base, j, "id"),
                    f"duplicate {what} {ident!r} (also at {pointer(*base, seen[ident], 'id')})",
                )
            else:
                seen[ident] = j
        return set(seen)

    def target(self, rel: str, where: tuple[Any, ...], value: Any) -> tuple[str, Path] | None:
        """Apply the §2 rules to a stored path; the resolved target when it is usable."""
        if not isinstance(value, str):
            return None  # the schema reports the wrong type
        problems = paths.path_problems(value)
        for problem in problems:
            self.error(rel, pointer(*where), problem)
        if problems:
            return None
        key, path = paths.normalize(value), paths.resolve(self.root, value)
        if self.author:
            st = readable_below(self.root, path, self.author, self.groups)
            if st is None:
                # Missing and refused read alike: the daemon (root) looked at what the author
                # may not, and a collection of theirs pointing into another user's 0700
                # folder showed its files' sizes, and whether a name exists there.
                self.error(rel, pointer(*where), f"{key!r} {NOT_THE_AUTHORS}")
                return None
            self.result.checked.setdefault(key, (st.st_dev, st.st_ino))
        return key, path

    def image(self, rel: str, where: tuple[Any, ...], value: Any) -> NgffImage | None:
        found = self.target(rel, where, value)
        if found is None:
            return None
        key, path = found
        if key in self.result.images:
            return self.result.images[key]
        try:
            image = inspect_image(path, self.root, self.result.checked.get(key))
        except ManifestError as exc:
            reason = str(exc)
            if reason == "does not exist":
                self.error(rel, pointer(*where), f"OME-Zarr image {key!r} does not exist")
            else:
                self.error(
                    rel, pointer(*where), f"{key!r} is not a conforming OME-NGFF image: {reason}"
                )
            return None
        if self.author and not image.zipped and not self._author_reads_metadata(path, image):
            # The TIFF's size is the image's shape and dtype, read from these: the author of a
            # collection naming root's image folder (0755) with a 0600 `.zarray` saw its size.
            self.error(rel, pointer(*where), f"the metadata of image {key!r} {NOT_THE_AUTHORS}")
            return None
        self.result.images[key] = image
        return image

    def _author_reads_metadata(self, path: Path, image: NgffImage) -> bool:
        assert self.author is not None
        return all(
            readable_below(self.root, path / key, self.author, self.groups)
            for key in image.metadata_keys
        )

    def csv(self, rel: str, where: tuple[Any, ...], value: Any) -> None:
        found = self.target(rel, where, value)
        if found is None:
            return
        key, path = found
        kind = self.kind(path, key)
        if kind == "folder":
            self.error(rel, pointer(*where), f"CSV path {key!r} is a folder, not a text/csv file")
        elif kind != "file":
            self.error(rel, pointer(*where), f"CSV file {key!r} {kind}")

    def kind(self, path: Path, key: str = "") -> str:
        """ "file", "folder", or why `path` is neither, looked at from the collection with no
        link followed: a link is never a resource (its target's size would show in the view,
        whoever's file it is)."""
        try:
            st = stat_beneath(self.root, path)
        except FileNotFoundError:
            return "does not exist"
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return "is a symlink, or lies below one (links are not followed)"
            return f"cannot be looked at ({exc.strerror})"
        if not self.result.same_as_checked(key, st):
            return NOT_THE_AUTHORS
        if stat.S_ISDIR(st.st_mode):
            return "folder"
        if stat.S_ISLNK(st.st_mode):
            return "is a symlink (links are not followed)"
        return "file" if stat.S_ISREG(st.st_mode) else "is not a regular file"

    def linked(
        self, rel: str, where: tuple[Any, ...], value: Any, kind: str
    ) -> tuple[str, dict[str, Any]] | None:
        found = self.target(rel, where, value)
        if found is None:
            return None
        key, path = found
        if path.is_dir():
            self.error(
                rel, pointer(*where), f"{kind} document {key!r} is a folder, not a JSON file"
            )
            return None
        if not path.is_file():
            self.error(rel, pointer(*where), f"{kind} document {key!r} does not exist")
            return None
        doc = self.load(key, kind)
        return (key, doc) if isinstance(doc, dict) else None

    def load(self, rel: str, kind: str) -> Any:
        """Parse and schema-check a document once, however many members link it."""
        if rel in self.result.documents:
            doc = self.result.documents[rel]
        else:
            try:
                # From the collection without following a link (nor waiting on a FIFO): a
                # document swapped for one is not read as root (vfs/beneath.py).
                raw, st = read_beneath_stat(
                    self.root, paths.resolve(self.root, rel), MAX_DOCUMENT_BYTES
                )
                if not self.result.same_as_checked(rel, st):
                    self.error(rel, "", f"document {NOT_THE_AUTHORS}")
                    return None
                self.result.read_from[rel] = (st.st_dev, st.st_ino)
                if rel == ENTRY_POINT:
                    self.author, self.groups = st.st_uid, user_groups(st.st_uid)
                if json_cost(raw) <= MAX_JSON_COST:  # else parse_json says so
                    self._kept += json_kept(raw)
                if self._kept > MAX_COLLECTION_COST:
                    raise ValueError(
                        f"the collection's documents up to this one could take more than "
                        f"{MAX_COLLECTION_COST >> 20} MiB of memory to keep parsed"
                    )
                doc = parse_json(raw, parse_constant=_no_constant, parse_float=_finite)
            except FileNotFoundError:
                self.error(rel, "", "document does not exist")
                return None
            except (OSError, ValueError) as exc:
                self.error(rel, "", f"not a readable JSON document: {exc}")
                return None
            self.result.documents[rel] = doc
        if (rel, kind) not in self._schema_checked:
            self._schema_checked.add((rel, kind))
            if not conforms(kind, doc):
                # No more errors built than can be kept: each is a few KiB until it is a message.
                errors = itertools.islice(validator(kind).iter_errors(doc), MAX_ISSUES + 1)
                for err in sorted(errors, key=lambda e: list(map(str, e.absolute_path))):
                    self.error(rel, pointer(*err.absolute_path), _schema_message(err))
        return doc


def _schema_message(err: Any) -> str:
    """jsonschema's text, except a constant (format, version) names both values."""
    if err.validator == "const":
        return f"must be {json.dumps(err.validator_value)}, not {json.dumps(err.instance)}"
    return str(err.message)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    """A JSON number as a float, refused where it is out of a double's range (`1e400` parses
    to infinity, which the spec refuses as it refuses `Infinity`)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range for a number")
    return value
