#!/usr/bin/env python3
"""Generate AcqStore collections: a valid two-member corpus, an N-member one, and broken variants.

make_acqstore_corpus.py valid OUT [--decant-archive ARCHIVE]
make_acqstore_corpus.py large OUT [-n 1000] [--validate]
make_acqstore_corpus.py invalid OUT VARIANT [VARIANT ...]
make_acqstore_corpus.py variants
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

try:
    import vfs  # noqa: F401
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vfs.acqstore.ngff import inspect_image

SPACE_UM = {"type": "space", "unit": "micrometer"}
ROI_SPACE = "primary-image-full-resolution-pixels"


def ngff_axes(names: str) -> list[dict[str, str]]:
    """NGFF 0.4 axes for a string such as "tczyx"."""
    kinds = {"t": {"type": "time", "unit": "second"}, "c": {"type": "channel"}}
    return [{"name": n, **kinds.get(n, SPACE_UM)} for n in names]


def _multiscales(axes: list[dict[str, str]], scales: list[list[float]]) -> dict[str, Any]:
    datasets = [
        {"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": s}]}
        for i, s in enumerate(scales)
    ]
    return {
        "multiscales": [{"version": "0.4", "name": "image", "axes": axes, "datasets": datasets}]
    }


def write_ome_zarr(
    path: Path,
    data: np.ndarray,
    axes: str,
    scale: list[float],
    chunks: tuple[int, ...] | None = None,
) -> Path:
    """A plain OME-Zarr directory: zarr 3 writing zarr_format=2, NGFF 0.4, with a 2x XY level 1."""
    import zarr

    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    level1 = data[..., ::2, ::2]
    for name, arr in (("0", data), ("1", level1)):
        shape_chunks = chunks if name == "0" and chunks else (1,) * (arr.ndim - 2) + arr.shape[-2:]
        out = group.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=shape_chunks)
        out[...] = arr
    coarse = [*scale[:-2], scale[-2] * 2, scale[-1] * 2]
    group.attrs.update(_multiscales(ngff_axes(axes), [scale, coarse]))
    return path


def write_ome_zarr_zip(
    path: Path,
    data: np.ndarray,
    axes: str,
    scale: list[float],
    extra: dict[str, bytes] | None = None,
) -> Path:
    """The same image as a STORED zip (`.zarr.zip` / `.ozx`); `extra` adds keys such as a
    `.decant/manifest.json`, which is what makes a decant archive recognisable."""
    with tempfile.TemporaryDirectory() as tmp:
        src = write_ome_zarr(Path(tmp) / "img.zarr", data, axes, scale)
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
            for file in sorted(p for p in src.rglob("*") if p.is_file()):
                zf.write(file, file.relative_to(src).as_posix())
            for key, value in (extra or {}).items():
                zf.writestr(key, value)
    return path


def write_ome_zarr_stub(path: Path, shape: tuple[int, ...], dtype: str, axes: str) -> Path:
    """Metadata only (absent chunks read as the fill value): a valid image, quick to write."""
    (path / "0").mkdir(parents=True)
    (path / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (path / ".zattrs").write_text(json.dumps(_multiscales(ngff_axes(axes), [[1.0] * len(shape)])))
    zarray = {
        "zarr_format": 2,
        "shape": list(shape),
        "chunks": [1] * (len(shape) - 2) + list(shape[-2:]),
        "dtype": np.dtype(dtype).str,
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
    }
    (path / "0" / ".zarray").write_text(json.dumps(zarray))
    return path


def _write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _write_csv(path: Path, rows: list[list[Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")


def _member_docs(
    root: Path,
    mid: str,
    size: tuple[int, int],
    axis_display: dict[str, Any] | None,
    analyses: list[tuple[str, str, str | None]],
) -> dict[str, str]:
    """acqimage.json (point, line, rectangle ROIs) and analyses.json with CSVs for one member."""
    width, height = size
    base = f"acqstore/members/{mid}"
    common = {"coordinate_space": ROI_SPACE}
    centre = [width // 2, height // 2]
    rois = [
        {"id": f"{mid}-roi-point", "type": "point", **common, "position": centre},
        {"id": f"{mid}-roi-line", "type": "line", **common, "name": "scan line",
         "start": [0, height // 3], "stop": [width - 1, height // 3]},
        {"id": f"{mid}-roi-rect", "type": "rectangle", **common, "metadata": {"colour": "red"},
         "start": [1, 1], "stop": [max(2, width // 2), max(2, height // 2)]},
    ]  # fmt: skip
    acq: dict[str, Any] = {
        "format": "acqstore-acqimage",
        "version": 1,
        "image_id": mid,
        "accepted": True,
        "rois": rois,
        "experiment_metadata": {"condition": "control", "date": "2024-05-01"},
    }
    if axis_display:
        acq["axis_display"] = axis_display
    _write_json(root / base / "acqimage.json", acq)
    entries = []
    for aid, kind, roi in analyses:
        resources = []
        for rid in ("results", "summary"):
            rel = f"{base}/analyses/{aid}/{rid}.csv"
            _write_csv(root / rel, [["frame", "value"], *[[i, i * 0.5] for i in range(4)]])
            resources.append({"id": rid, "media_type": "text/csv", "path": rel})
        entry: dict[str, Any] = {
            "id": aid,
            "type": kind,
            "resources": resources,
            "parameters": {"window": 5},
        }
        if roi:
            entry["roi_id"] = f"{mid}-roi-{roi}"
        entries.append(entry)
    _write_json(
        root / base / "analyses.json",
        {"format": "acqstore-analyses", "version": 1, "image_id": mid, "analyses": entries},
    )
    return {"acqimage": f"{base}/acqimage.json", "analyses": f"{base}/analyses.json"}


def make_collection(root: Path, decant_archive: Path | None = None) -> dict[str, Any]:
    """The two-member corpus; returns the facts tests check against (ids, names, image paths)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    if decant_archive is not None:
        primary_a = f"images/{decant_archive.name}"
        (root / "images").mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if decant_archive.is_dir() else shutil.copy2
        copy(decant_archive, root / primary_a)
    else:
        primary_a = "images/kymograph.zarr"
        data = rng.integers(0, 4000, size=(120, 64), dtype=np.uint16)
        write_ome_zarr(root / primary_a, data, "yx", [0.2, 0.2])
    image_a = inspect_image(root / primary_a)
    display = (
        {"y": {"type": "time", "unit": "second", "scale": 0.002}}
        if "y" in image_a.axis_names
        else None
    )
    stack = rng.integers(0, 255, size=(2, 3, 48, 40), dtype=np.uint16)
    write_ome_zarr(
        root / "images/stack.zarr", stack, "czyx", [1.0, 2.0, 0.5, 0.5], chunks=(1, 3, 48, 40)
    )
    write_ome_zarr(
        root / "images/reference.zarr", rng.integers(0, 255, (64, 64), np.uint8), "yx", [1.0, 1.0]
    )
    _write_json(
        root / "acqstore/members/img-a/reference-image.json",
        {
            "format": "acqstore-reference-image",
            "version": 1,
            "image_id": "img-a",
            "metadata": {"objective": "60x"},
            "scan_path": {
                "coordinate_space": "reference-image-full-resolution-pixels",
                "points": [[5, 10], [30, 12], [60, 40]],
            },
        },
    )
    docs_a = _member_docs(
        root, "img-a", image_a.plane_size(), display,
        [("an-velocity", "velocity", "rect"), ("an-intensity", "sum-intensity", "line")],
    )  # fmt: skip
    docs_b = _member_docs(root, "img-b", (40, 48), None, [("an-velocity", "velocity", "point")])
    tables = []
    for tid in ("velocity-pool", "sum-intensity-pool"):
        _write_csv(
            root / f"acqstore/tables/{tid}.csv",
            [["image_id", "value"], ["img-a", 1.5], ["img-b", 2.5]],
        )
        tables.append({"id": tid, "media_type": "text/csv", "path": f"acqstore/tables/{tid}.csv"})
    members = [
        {
            "id": "img-a",
            "name": "Kymograph 1",
            "ome_zarr": primary_a,
            "resources": docs_a,
            "reference_image": {
                "ome_zarr": "images/reference.zarr",
                "metadata": "acqstore/members/img-a/reference-image.json",
            },
            "summary": {"rois": 3},
        },
        {"id": "img-b", "name": "Stack 2", "ome_zarr": "images/stack.zarr", "resources": docs_b},
    ]
    collection = {
        "format": "acqstore-ome-zarr-collection",
        "version": 1,
        "id": "col-0001",
        "name": "Test collection",
        "created": "2024-05-01T12:00:00Z",
        "producer": {"name": "make_acqstore_corpus", "version": "1"},
        "members": members,
        "resources": {"tables": tables},
        "metadata": {"lab": "test"},
    }
    _write_json(root / "acqstore/collection.json", collection)
    return {"root": root, "members": members, "tables": tables, "primary_a": primary_a}


def make_large_collection(root: Path, n: int) -> Path:
    """`n` members, each with an image (metadata-only), acqimage.json, analyses.json and a CSV."""
    members = []
    for i in range(n):
        mid = f"m{i:05d}"
        write_ome_zarr_stub(root / f"images/{mid}.zarr", (4, 256, 256), "uint16", "zyx")
        docs = _member_docs(root, mid, (256, 256), None, [(f"{mid}-an", "velocity", "rect")])
        members.append(
            {"id": mid, "name": f"Member {i}", "ome_zarr": f"images/{mid}.zarr", "resources": docs}
        )
    _write_csv(root / "acqstore/tables/pool.csv", [["image_id"], *[[m["id"]] for m in members]])
    tables = [{"id": "pool", "media_type": "text/csv", "path": "acqstore/tables/pool.csv"}]
    doc = {
        "format": "acqstore-ome-zarr-collection",
        "version": 1,
        "id": "col-large",
        "name": f"{n} members",
        "members": members,
        "resources": {"tables": tables},
    }
    _write_json(root / "acqstore/collection.json", doc)
    return root


# -- invalid variants: each mutates a valid two-member corpus to break exactly one rule ------------


def _edit(root: Path, rel: str, change: Callable[[dict[str, Any]], None]) -> None:
    path = root / rel
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


COLLECTION = "acqstore/collection.json"
ACQ_A, ACQ_B = "acqstore/members/img-a/acqimage.json", "acqstore/members/img-b/acqimage.json"
ANALYSES_A = "acqstore/members/img-a/analyses.json"


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: Any) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value

    return change


def _duplicate_member_id(root: Path) -> None:
    _edit(root, COLLECTION, _set("members", 1, "id", value="img-a"))
    for rel in (ACQ_B, "acqstore/members/img-b/analyses.json"):
        _edit(root, rel, _set("image_id", value="img-a"))


def _csv_folder(root: Path) -> None:
    (root / "acqstore/tables/folder.csv").mkdir()
    _edit(
        root, COLLECTION, _set("resources", "tables", 1, "path", value="acqstore/tables/folder.csv")
    )


def _rois_dup(doc: dict[str, Any]) -> None:
    doc["rois"][0]["id"] = doc["rois"][1]["id"]  # the point ROI, which no analysis names


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "dotdot_path": lambda r: _edit(
        r, COLLECTION, _set("members", 0, "ome_zarr", value="../outside.zarr")
    ),
    "absolute_path": lambda r: _edit(
        r, COLLECTION, _set("members", 1, "resources", "acqimage", value=f"/{ACQ_B}")
    ),
    "url_path": lambda r: _edit(
        r, COLLECTION, _set("resources", "tables", 0, "path", value="https://example.org/pool.csv")
    ),
    "missing_target": lambda r: _edit(
        r, COLLECTION, _set("members", 1, "ome_zarr", value="images/gone.zarr")
    ),
    "csv_folder": _csv_folder,
    "duplicate_member_id": _duplicate_member_id,
    "duplicate_roi_id": lambda r: _edit(r, ACQ_A, _rois_dup),
    "duplicate_analysis_id": lambda r: _edit(
        r, ANALYSES_A, _set("analyses", 1, "id", value="an-velocity")
    ),
    "mismatched_image_id": lambda r: _edit(r, ACQ_B, _set("image_id", value="img-zzz")),
    "unknown_roi_id": lambda r: _edit(
        r, ANALYSES_A, _set("analyses", 0, "roi_id", value="no-such-roi")
    ),
    "collapsed_rectangle": lambda r: _edit(r, ACQ_A, _set("rois", 2, "stop", value=[1, 9])),
    "unknown_property": lambda r: _edit(r, ACQ_A, _set("rois", 0, "colour", value="red")),
    "axis_display_not_axis": lambda r: _edit(
        r,
        ACQ_B,
        _set("axis_display", value={"w": {"type": "time", "unit": "second", "scale": 1.0}}),
    ),
    "wrong_format": lambda r: _edit(r, COLLECTION, _set("format", value="acqstore-collection")),
    "wrong_version": lambda r: _edit(r, ACQ_B, _set("version", value=2)),
}


def make_invalid(root: Path, *variants: str, decant_archive: Path | None = None) -> Path:
    make_collection(root, decant_archive)
    for name in variants:
        MUTATIONS[name](root)
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("valid")
    p.add_argument("out", type=Path)
    p.add_argument("--decant-archive", type=Path)
    p = sub.add_parser("large")
    p.add_argument("out", type=Path)
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--validate", action="store_true", help="then time one validation")
    p = sub.add_parser("invalid")
    p.add_argument("out", type=Path)
    p.add_argument("variants", nargs="+", choices=sorted(MUTATIONS))
    sub.add_parser("variants")
    args = parser.parse_args(argv)
    if args.cmd == "valid":
        make_collection(args.out, args.decant_archive)
    elif args.cmd == "large":
        make_large_collection(args.out, args.n)
        if args.validate:
            from vfs.acqstore.validate import validate_collection

            start = time.perf_counter()
            result = validate_collection(args.out)
            took = time.perf_counter() - start
            print(f"{args.n} members: {len(result.errors)} errors, validated in {took:.3f} s")
    elif args.cmd == "invalid":
        make_invalid(args.out, *args.variants)
    else:
        print("\n".join(sorted(MUTATIONS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
