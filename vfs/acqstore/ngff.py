"""Whether a path is a conforming OME-NGFF image, and what its full-resolution array looks like."""

from __future__ import annotations

import errno
import math
import os
import stat
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import numpy as np

from vfs.acqstore.paths import path_problems
from vfs.beneath import not_shown, open_beneath, read_beneath, stat_beneath
from vfs.decant.limits import (
    MAX_CHUNK_BYTES,
    MAX_METADATA_BYTES,
    MAX_METADATA_COST,
    compressed_bound,
    parse_json,
)
from vfs.errors import CorruptArchiveError, ManifestError
from vfs.walk import MAX_WALK_DEPTH, walk

if TYPE_CHECKING:
    from vfs.acqstore.chunks import PlaneReader

ZIP_SUFFIXES = (".zarr.zip", ".ozx")
DECANT_MANIFEST = ".decant/manifest.json"
# Any key of an image folder read whole (metadata, or a chunk zarr-python asks for).
MAX_KEY_BYTES = compressed_bound(MAX_CHUNK_BYTES)
# NGFF orders axes by type: time, then channel or custom, then space.
_TYPE_RANK = {"time": 0, "space": 2}
_UNVERSIONED_TRANSFORMS = {"0.1", "0.2", "0.3"}
# Bytes of a zipped image's central directory zipfile may read. zipfile reads the whole
# directory its end record claims at once and makes a ZipInfo (~600 B) per entry: a 95 MB .ozx
# of 1,000,000 one-byte entries took the daemon to 637 MB when its collection was listed (2.3 GB
# linked into four collections listed at once, 4.3 GB held by eight opens of its TIFF), and a
# 4 KiB sparse one whose end record claims 4 GiB of directory to 4.25 GB. 1 MiB is ~20,000
# entries (~12 MB parsed); a larger image is kept as a folder.
MAX_ZIP_DIRECTORY = 1 << 20
# Bytes a compressed (deflated) entry of a zipped image may inflate to. zarr reads an entry
# whole, as long as the directory says it is: a 312 KB .ozx whose one chunk of 15 KB was a
# deflated run of 300 MB of zeros took the daemon to 1.3 GB for one read of its TIFF. Chunks
# are compressed by their codec already, and stored so by every writer we know of; a stored
# entry is as large on disk as in memory, bounded as a chunk file of a folder image is.
MAX_INFLATED_ENTRY = 16 << 20
# Chunks a plane may span (128 x 128 tiles of a 16384 x 16384 plane): each is a file lookup and
# a zarr-python task at every read of the plane, and a few bytes of `.zarray` may ask for 1 x 1
# chunks (red team 50: a 1 GiB plane in 32,768 chunks left 26,683 tasks pending at shutdown).
MAX_CHUNKS_PER_PLANE = 1 << 14


@dataclass(frozen=True)
class Axis:
    name: str
    type: str | None = None
    unit: str | None = None


@dataclass(frozen=True)
class NgffImage:
    """Enough of an image to check ROIs and axis names and to lay out a TIFF, without pixels."""

    path: Path
    zipped: bool
    zarr_format: Literal[2, 3]
    axes: tuple[Axis, ...]
    shape: tuple[int, ...]
    dtype: str
    dataset: str
    scale: tuple[float, ...]
    decant: bool

    @property
    def metadata_keys(self) -> tuple[str, str]:
        """Where a folder image's shape and dtype are read from (a synthesized TIFF's size):
        the group's and its full-resolution array's metadata documents."""
        if self.zarr_format == 3:
            return "zarr.json", f"{self.dataset}/zarr.json"
        return ".zattrs", f"{self.dataset}/.zarray"

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(axis.name for axis in self.axes)

    def plane_size(self) -> tuple[int, int]:
        """(width, height) at full resolution for ROI bounds; x (else the last axis) is width."""
        names = self.axis_names
        x = names.index("x") if "x" in names else len(names) - 1
        y = names.index("y") if "y" in names else len(names) - 2
        return self.shape[x], self.shape[y]


class _Keys:
    """Read store keys from a directory or a zip, so both containers are checked by one routine.

    The container is opened once, its last component without following a link, and a
    directory's keys are read below that descriptor with no link followed (vfs/beneath.py):
    a key swapped for a link to /etc/shadow is refused, not parsed as metadata."""

    def __init__(
        self, path: Path, within: Path | None = None, expect: tuple[int, int] | None = None
    ) -> None:
        self.path = path
        self.zip: zipfile.ZipFile | None = None
        self._file: BinaryIO | None = None
        self.names: set[str] = set()
        self.anchor = Anchor(path, within, expect)
        try:
            if not self.anchor.is_dir:
                self._file = self.anchor.file()
                self.zip = open_zip(self._file)
                self.names = set(self.zip.namelist())
        except BaseException:
            self.close()
            raise

    def has(self, key: str) -> bool:
        if self.zip is not None:
            return key in self.names
        try:
            return stat.S_ISREG(stat_beneath(self.anchor.root, self.anchor.root / key).st_mode)
        except OSError:
            return False

    def json(self, key: str) -> Any | None:
        """The parsed document at `key`, or None when absent; a malformed one is an error."""
        try:
            if self.zip is not None:
                raw = None
                if key in self.names:
                    size = self.zip.getinfo(key).file_size  # zipfile reads no more than this
                    if size > MAX_METADATA_BYTES:
                        raise ValueError(f"{size} bytes, more than {MAX_METADATA_BYTES}")
                    raw = self.zip.read(key)
            else:
                raw = _read_key(self.anchor.root, key, MAX_METADATA_BYTES)
            return None if raw is None else parse_json(raw, MAX_METADATA_COST)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ManifestError(f"{key} cannot be read: {exc}") from exc

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()
        if self._file is not None:
            self._file.close()  # ZipFile leaves a file object it was given open
        self.anchor.close()


class _Capped:
    """A zip container, read by zipfile, whose reads are bounded while its central directory
    is parsed (`limit`; None once parsed: a member is read in one read of its size). Not a
    check of the end record made beforehand: the file's owner may rewrite it in between, and
    zipfile reads the end record again itself."""

    def __init__(self, raw: BinaryIO, limit: int | None) -> None:
        self._raw = raw
        self.limit = limit

    def read(self, size: int | None = -1) -> bytes:
        if self.limit is not None and size is not None and size > self.limit:
            raise zipfile.BadZipFile(
                f"its central directory is {size} bytes, more than the {self.limit} a zipped "
                "image may have (about 20,000 entries: keep a larger image as a folder)"
            )
        return self._raw.read(-1 if size is None else size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()


def open_zip(file: BinaryIO, limit: int = MAX_ZIP_DIRECTORY) -> zipfile.ZipFile:
    """zipfile's reader of `file`, its central directory parsed from at most `limit` bytes
    (zipfile.BadZipFile beyond: what it raises for any zip it cannot read). The caller
    closes `file` (zipfile leaves a file object it was given open)."""
    capped = _Capped(file, limit)
    zf = zipfile.ZipFile(capped)  # type: ignore[arg-type]
    capped.limit = None
    return zf


class Anchor:
    """An image container held by a descriptor, reached from `within` (its collection folder,
    else its own parent) without following a link: what is read from it afterwards cannot be
    redirected by swapping the container, or a folder between it and `within`, for a link."""

    def __init__(
        self, path: Path, within: Path | None = None, expect: tuple[int, int] | None = None
    ) -> None:
        base = within if within is not None and path != within else path.parent
        self.fd = open_beneath(base, path, os.O_PATH)
        try:
            st = os.fstat(self.fd)
            if expect is not None and (st.st_dev, st.st_ino) != expect:
                # Not the container a check found there (vfs.acqstore.validate): as if gone.
                raise FileNotFoundError(errno.ENOENT, "not the image checked", str(path))
            if stat.S_ISLNK(st.st_mode):
                raise CorruptArchiveError(f"{path}: a symlink (refused: the mount never follows "
                                          "links)")  # fmt: skip
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise not_shown(path, st)
        except BaseException:
            os.close(self.fd)
            raise
        self.is_dir = stat.S_ISDIR(st.st_mode)
        # The descriptor's magic link: opening it (or a path below it) reaches exactly this
        # container; everything below is walked from it with no link followed.
        self.root = Path(f"/proc/self/fd/{self.fd}")

    def file(self) -> BinaryIO:
        """The container file itself, opened for reading (a zip)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_CLOEXEC)
        return os.fdopen(fd, "rb")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read_key(root: Path, key: str, limit: int = MAX_KEY_BYTES) -> bytes | None:
    """A key's bytes read below `root` with no link followed, or None when absent."""
    try:
        return read_beneath(root, root / key, limit)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def is_zip_image_name(path: Path) -> bool:
    return path.name.lower().endswith(ZIP_SUFFIXES)


def inspect_image(
    path: Path, within: Path | None = None, expect: tuple[int, int] | None = None
) -> NgffImage:
    """Check `path` is an OME-NGFF image (directory group, `.zarr.zip` or `.ozx`) and describe it.
    Nothing is read through a link below `within` (default: the image's own folder).

    Raises ManifestError whose message is the reason, without the path (callers name the path).
    `expect`: the (st_dev, st_ino) the container must have (else "does not exist").
    """
    try:
        keys = _Keys(path, within, expect)
    except FileNotFoundError:
        raise ManifestError("does not exist") from None
    except zipfile.BadZipFile as exc:
        raise ManifestError(f"not a readable zip file ({exc})") from None
    except OSError as exc:
        raise ManifestError(f"cannot be opened: {exc}") from exc
    zipped = keys.zip is not None
    if zipped and not is_zip_image_name(path):
        keys.close()
        raise ManifestError("a file that is not a .zarr.zip or .ozx OME-Zarr container")
    try:
        return _inspect(keys, zipped)
    finally:
        keys.close()


def _inspect(keys: _Keys, zipped: bool) -> NgffImage:
    v3 = keys.json("zarr.json")
    zarr_format: Literal[2, 3]
    if isinstance(v3, dict):
        if v3.get("node_type") != "group":
            raise ManifestError("zarr.json is not a Zarr group")
        attrs = v3.get("attributes") or {}
        attrs = attrs.get("ome", attrs) if isinstance(attrs, dict) else {}
        zarr_format = 3
    else:
        if not keys.has(".zgroup"):
            raise ManifestError("not a Zarr group (no .zgroup or zarr.json)")
        attrs = keys.json(".zattrs") or {}
        zarr_format = 2
    multiscales = attrs.get("multiscales") if isinstance(attrs, dict) else None
    if not isinstance(multiscales, list) or not multiscales or not isinstance(multiscales[0], dict):
        raise ManifestError("no OME-NGFF multiscales metadata")
    ms = multiscales[0]
    axes = _axes(ms.get("axes"))
    datasets = ms.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        raise ManifestError("multiscales has no datasets")
    paths = []
    for i, ds in enumerate(datasets):
        if not isinstance(ds, dict) or not isinstance(ds.get("path"), str) or not ds["path"]:
            raise ManifestError(f"multiscales datasets[{i}] has no path")
        if path_problems(ds["path"]):  # a key inside this store, never a way out of it
            raise ManifestError(f"multiscales datasets[{i}] path {ds['path']!r} is not a store key")
        paths.append(ds["path"].strip("/"))
    shape, dtype = _array_meta(keys, paths[0], zarr_format)
    for p in paths[1:]:
        if not keys.has(f"{p}/.zarray" if zarr_format == 2 else f"{p}/zarr.json"):
            raise ManifestError(f"dataset array {p!r} is missing")
    if len(shape) != len(axes):
        raise ManifestError(
            f"dataset {paths[0]!r} has {len(shape)} dimensions but {len(axes)} axes"
        )
    version = str(ms.get("version") or attrs.get("version") or "")
    scale = _scale(datasets[0], ms, len(axes), required=version not in _UNVERSIONED_TRANSFORMS)
    return NgffImage(
        path=keys.path,
        zipped=zipped,
        zarr_format=zarr_format,
        axes=axes,
        shape=shape,
        dtype=dtype,
        dataset=paths[0],
        scale=scale,
        decant=keys.has(DECANT_MANIFEST),
    )


def _axes(raw: Any) -> tuple[Axis, ...]:
    if not isinstance(raw, list) or not 2 <= len(raw) <= 5:
        raise ManifestError("multiscales axes must list 2 to 5 axes")
    axes = []
    for item in raw:
        if isinstance(item, str):  # NGFF 0.3 listed bare names
            item = {"name": item}
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ManifestError("an axis has no name")
        kind, unit = item.get("type"), item.get("unit")
        axes.append(
            Axis(
                item["name"],
                kind if isinstance(kind, str) else None,
                unit if isinstance(unit, str) else None,
            )
        )
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise ManifestError(f"axis names are not unique: {names}")
    if all(a.type for a in axes):
        if sum(a.type == "space" for a in axes) not in (2, 3):
            raise ManifestError("axes must include 2 or 3 of type 'space'")
        ranks = [_TYPE_RANK.get(a.type or "", 1) for a in axes]
        if ranks != sorted(ranks):
            raise ManifestError("axes are not ordered time, channel/custom, space")
    return tuple(axes)


def _array_meta(keys: _Keys, path: str, zarr_format: Literal[2, 3]) -> tuple[tuple[int, ...], str]:
    meta = keys.json(f"{path}/.zarray" if zarr_format == 2 else f"{path}/zarr.json")
    if not isinstance(meta, dict):
        raise ManifestError(f"dataset array {path!r} is missing")
    if zarr_format == 3 and meta.get("node_type") != "array":
        raise ManifestError(f"dataset {path!r} is not a Zarr array")
    shape = meta.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ManifestError(f"dataset array {path!r} has no valid shape")
    raw_dtype = meta.get("dtype" if zarr_format == 2 else "data_type")
    try:
        dtype = np.dtype(raw_dtype)
    except (TypeError, ValueError, KeyError):
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise ManifestError(f"dataset array {path!r} has a non-pixel dtype {raw_dtype!r}")
    problem = _grid_problem(meta, shape, zarr_format) or _fill_problem(meta, dtype)
    if problem:
        raise ManifestError(f"dataset array {path!r} {problem}")
    return tuple(shape), dtype.str


def _grid_problem(meta: dict[str, Any], shape: list[int], zarr_format: Literal[2, 3]) -> str:
    """Why the array's chunk grid cannot be read, or "": zarr-python met zero, negative or
    fractional chunks and odd separators with a ZeroDivisionError, ValueError or TypeError at
    the first read (red team 50), after the view was shown. Chunks so small that a plane has
    millions of them cost a task and a file lookup each at every read."""
    ndim = len(shape)
    if zarr_format == 2:
        chunks = meta.get("chunks")
        separator = meta.get("dimension_separator", ".")
        if separator not in (".", "/", None):
            return f"has a dimension separator {separator!r} (not '.' or '/')"
    else:
        grid = meta.get("chunk_grid")
        config = grid.get("configuration") if isinstance(grid, dict) else None
        chunks = config.get("chunk_shape") if isinstance(config, dict) else None
    ok = isinstance(chunks, list) and len(chunks) == ndim
    if not ok or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in chunks):
        return f"has chunks {chunks!r}, not {ndim} positive whole numbers"
    per_plane = math.prod(-(-n // c) for n, c in zip(shape[-2:], chunks[-2:], strict=True))
    if per_plane > MAX_CHUNKS_PER_PLANE:  # a read of a plane visits every one of them
        return f"has {per_plane} chunks per plane (at most {MAX_CHUNKS_PER_PLANE})"
    return ""


def _fill_problem(meta: dict[str, Any], dtype: np.dtype[Any]) -> str:
    """Why the array's fill value is not one of its dtype's, or "" (JSON null, a number in
    range, a bool, or "NaN"/"Infinity"/"-Infinity" for floats, as the Zarr specs write them)."""
    fill = meta.get("fill_value")
    if fill is None:
        return ""
    if dtype.kind == "f":
        if fill in ("NaN", "Infinity", "-Infinity"):
            return ""
        ok = isinstance(fill, int | float) and not isinstance(fill, bool)
        if ok and abs(fill) <= np.finfo(dtype).max:
            return ""
    elif isinstance(fill, bool) or (isinstance(fill, int) and dtype.kind == "b"):
        if fill in (0, 1):
            return ""
    elif isinstance(fill, int) and np.iinfo(dtype).min <= fill <= np.iinfo(dtype).max:
        return ""
    return f"has a fill value {fill!r} that is not a {dtype}"


def _scale(
    dataset: dict[str, Any], ms: dict[str, Any], ndim: int, required: bool
) -> tuple[float, ...]:
    """Full-resolution pixel size per axis: the dataset scale times the multiscale-wide scale."""
    level = _find_scale(dataset.get("coordinateTransformations"), ndim, "datasets[0]")
    if level is None and required:
        raise ManifestError("datasets[0] has no scale coordinateTransformation")
    common = _find_scale(ms.get("coordinateTransformations"), ndim, "multiscales")
    out = level or (1.0,) * ndim
    return tuple(a * b for a, b in zip(out, common or (1.0,) * ndim, strict=True))


def _find_scale(transforms: Any, ndim: int, where: str) -> tuple[float, ...] | None:
    if not isinstance(transforms, list):
        return None
    for t in transforms:
        if isinstance(t, dict) and t.get("type") == "scale":
            values = t.get("scale")
            if (
                not isinstance(values, list)
                or len(values) != ndim
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            ):
                raise ManifestError(f"{where} scale must list {ndim} numbers")
            return tuple(float(v) for v in values)
    return None


def refuse_links(folder: Path) -> None:
    """zarr reads chunk files by path and follows symlinks: an image folder holding one (a
    chunk linked to /etc/shadow) would serve bytes from outside SRC as pixels. Refused whole."""
    if folder.is_symlink():
        raise CorruptArchiveError(f"{folder}: the image folder is a symlink (refused)")
    for base, dirs, files in walk(folder, too_deep=too_deep_image):
        for name in dirs + files:
            if os.path.islink(os.path.join(base, name)):
                raise CorruptArchiveError(
                    f"{folder}: {os.path.join(base, name)} is a symlink (refused: the mount never "
                    "follows links)"
                )


def too_deep_image(folder: Path) -> None:
    """An image folder deeper than a walk goes is refused, not checked in part (os.walk raised
    RecursionError on one a few thousand levels deep)."""
    raise CorruptArchiveError(f"{folder}: folders more than {MAX_WALK_DEPTH} levels deep (refused)")


def open_full_resolution(
    image: NgffImage, within: Path | None = None
) -> tuple[PlaneReader, Callable[[], None]]:
    """The full-resolution zarr array (with a fast plane reader) and a function that releases
    its store. The container is held by a descriptor reached without links below `within`; a
    folder's keys are read below it with no link followed, by zarr-python too (`_NoLinkStore`),
    so a chunk swapped for a link after `refuse_links` looked is refused, not read as root.

    zarr is imported here, not at module level: validation never reads pixels and stays quick.
    """
    import zarr

    from vfs.acqstore.chunks import PlaneReader, bounded, store_folder

    if not image.zipped:
        refuse_links(image.path)  # one clear error for a folder that holds links at all
    anchor = Anchor(image.path, within)
    try:
        if image.zipped:
            if anchor.is_dir:
                raise ManifestError("changed from a zip to a folder since it was inspected")
            store: Any = _capped_zip_store()(anchor.root, mode="r", read_only=True)
            store.label = str(image.path)
        else:
            if not anchor.is_dir:
                raise ManifestError("changed from a folder to a file since it was inspected")
            store = _no_link_store()(anchor.root, read_only=True)
        array = bounded(
            zarr.open_array(
                store=store, path=image.dataset, mode="r", zarr_format=image.zarr_format
            )
        )
    except zipfile.BadZipFile as exc:
        anchor.close()
        raise ManifestError(f"{image.path}: not a readable zip file ({exc})") from None
    except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:  # zarr-python's own
        anchor.close()  # verdict on metadata inspect_image let through
        raise ManifestError(f"{image.path}: zarr cannot open its array ({exc})") from None
    except BaseException:
        anchor.close()
        raise

    def release() -> None:
        store.close()
        anchor.close()

    return PlaneReader(array, store_folder(array), image.path / image.dataset), release


_CAPPED_ZIP_STORE: type | None = None


def _capped_zip_store() -> type:
    """zarr-python's ZipStore, its zip opened by `open_zip` (its central directory bounded: an
    open parses it again, and the file may have changed since it was inspected). Made on first
    use: zarr is imported lazily."""
    global _CAPPED_ZIP_STORE
    if _CAPPED_ZIP_STORE is not None:
        return _CAPPED_ZIP_STORE
    import threading

    from zarr.storage import ZipStore

    class CappedZipStore(ZipStore):  # type: ignore[misc]
        _file: BinaryIO | None = None
        label = ""  # the image's path, for errors (`path` is the descriptor's magic link)

        def _sync_open(self) -> None:
            if self._is_open:
                raise ValueError("store is already open")
            self._lock = threading.RLock()
            self._file = open(self.path, "rb")  # noqa: SIM115  # closed by close()
            try:
                self._zf = open_zip(self._file)
            except BaseException:
                self._file.close()
                raise
            self._is_open = True

        def _get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            if not self._is_open:
                self._sync_open()
            try:
                info = self._zf.getinfo(key)
            except KeyError:
                return None
            stored = info.compress_type == zipfile.ZIP_STORED
            limit = MAX_KEY_BYTES if stored else MAX_INFLATED_ENTRY
            if info.file_size > limit:
                raise ManifestError(
                    f"{self.label}: zip entry {key!r} is {info.file_size} bytes"
                    f"{'' if stored else ' inflated'}, more than the {limit} it may be"
                )
            return super()._get(key, prototype, byte_range)

        def close(self) -> None:
            try:
                super().close()
            finally:
                if self._file is not None:
                    self._file.close()
                    self._file = None

    _CAPPED_ZIP_STORE = CappedZipStore
    return CappedZipStore


def _no_link_store() -> type:
    """zarr-python's LocalStore, every key read below its root with no link followed (it reads
    by path and follows links). Made on first use: zarr is imported lazily."""
    global _NO_LINK_STORE
    if _NO_LINK_STORE is not None:
        return _NO_LINK_STORE
    import asyncio

    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import LocalStore

    class NoLinkStore(LocalStore):  # type: ignore[misc]
        def _read(self, key: str, prototype: Any, byte_range: Any) -> Any:
            raw = _read_key(self.root, key)
            if raw is None:
                return None
            if isinstance(byte_range, RangeByteRequest):
                raw = raw[byte_range.start : byte_range.end]
            elif isinstance(byte_range, OffsetByteRequest):
                raw = raw[byte_range.offset :]
            elif isinstance(byte_range, SuffixByteRequest):
                raw = raw[max(0, len(raw) - byte_range.suffix) :]
            elif byte_range is not None:
                raise TypeError(f"unexpected byte_range {byte_range!r}")
            return (prototype or default_buffer_prototype()).buffer.from_bytes(raw)

        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            if not self._is_open:
                await self._open()
            return await asyncio.to_thread(self._read, key, prototype, byte_range)

        def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
            self._ensure_open_sync()
            return self._read(key, prototype, byte_range)

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
            return [await self.get(key, prototype, rng) for key, rng in key_ranges]

        async def exists(self, key: str) -> bool:
            try:
                st = await asyncio.to_thread(stat_beneath, self.root, self.root / key)
            except OSError:
                return False
            return stat.S_ISREG(st.st_mode)

    _NO_LINK_STORE = NoLinkStore
    return NoLinkStore


_NO_LINK_STORE: type | None = None
