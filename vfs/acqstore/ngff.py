"""Whether a path is a conforming OME-NGFF image, and what its full-resolution array looks like."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from vfs.acqstore.paths import path_problems
from vfs.errors import CorruptArchiveError, ManifestError

if TYPE_CHECKING:
    from vfs.acqstore.chunks import PlaneReader

ZIP_SUFFIXES = (".zarr.zip", ".ozx")
DECANT_MANIFEST = ".decant/manifest.json"
# NGFF orders axes by type: time, then channel or custom, then space.
_TYPE_RANK = {"time": 0, "space": 2}
_UNVERSIONED_TRANSFORMS = {"0.1", "0.2", "0.3"}


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
    def axis_names(self) -> tuple[str, ...]:
        return tuple(axis.name for axis in self.axes)

    def plane_size(self) -> tuple[int, int]:
        """(width, height) at full resolution for ROI bounds; x (else the last axis) is width."""
        names = self.axis_names
        x = names.index("x") if "x" in names else len(names) - 1
        y = names.index("y") if "y" in names else len(names) - 2
        return self.shape[x], self.shape[y]


class _Keys:
    """Read store keys from a directory or a zip, so both containers are checked by one routine."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip: zipfile.ZipFile | None = None
        self.names: set[str] = set()
        if path.is_file():
            self.zip = zipfile.ZipFile(path)
            self.names = set(self.zip.namelist())

    def has(self, key: str) -> bool:
        if self.zip is not None:
            return key in self.names
        return (self.path / key).is_file()

    def json(self, key: str) -> Any | None:
        """The parsed document at `key`, or None when absent; a malformed one is an error."""
        try:
            if self.zip is not None:
                raw = self.zip.read(key) if key in self.names else None
            else:
                raw = (self.path / key).read_bytes() if (self.path / key).is_file() else None
            return None if raw is None else json.loads(raw)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ManifestError(f"{key} cannot be read: {exc}") from exc

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()


def is_zip_image_name(path: Path) -> bool:
    return path.name.lower().endswith(ZIP_SUFFIXES)


def inspect_image(path: Path) -> NgffImage:
    """Check `path` is an OME-NGFF image (directory group, `.zarr.zip` or `.ozx`) and describe it.

    Raises ManifestError whose message is the reason, without the path (callers name the path).
    """
    if path.is_dir():
        zipped = False
    elif path.is_file():
        if not is_zip_image_name(path):
            raise ManifestError("a file that is not a .zarr.zip or .ozx OME-Zarr container")
        if not zipfile.is_zipfile(path):
            raise ManifestError("not a readable zip file")
        zipped = True
    else:
        raise ManifestError("does not exist")
    try:
        keys = _Keys(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ManifestError(f"cannot be opened: {exc}") from exc
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
    return tuple(shape), dtype.str


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
    for base, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            if os.path.islink(os.path.join(base, name)):
                raise CorruptArchiveError(
                    f"{folder}: {os.path.join(base, name)} is a symlink (refused: the mount never "
                    "follows links)"
                )


def open_full_resolution(image: NgffImage) -> tuple[PlaneReader, Callable[[], None]]:
    """The full-resolution zarr array (with a fast plane reader) and a function that releases
    its store.

    zarr is imported here, not at module level: validation never reads pixels and stays quick.
    """
    import zarr
    from zarr.storage import LocalStore, ZipStore

    from vfs.acqstore.chunks import PlaneReader, store_folder

    if not image.zipped:
        refuse_links(image.path)
    store: Any = (
        ZipStore(image.path, mode="r", read_only=True)
        if image.zipped
        else LocalStore(image.path, read_only=True)
    )
    array = zarr.open_array(
        store=store, path=image.dataset, mode="r", zarr_format=image.zarr_format
    )
    return PlaneReader(array, store_folder(array)), store.close
