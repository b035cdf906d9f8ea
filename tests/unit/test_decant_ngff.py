"""Archives as OME-Zarr, read by code no one here wrote: zarr, ome-zarr-py, ome-zarr-models.

The expected pixels come from tifffile reading the original, mapped to the canonical t, c, z, y, x
(, s) order here, independently of vfs: a file's storage order is whatever tifffile's series axes
say, and its planes must land where NGFF's canonical order puts them.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
import zarr
from ome_zarr.io import parse_url
from ome_zarr.reader import Reader
from ome_zarr_models.v04 import Image

from vfs.decant.packer import PackResult

Mode = Callable[[Path], str]

CANONICAL = "tcz"  # time → channel → space, then y, x (and samples last, as spec §3 keeps them)
AXIS_TYPES = {"t": "time", "c": "channel", "z": "space", "y": "space", "x": "space", "s": "channel"}
STORAGE_ORDER_FILES = (
    "imagej_hyperstack_tzc_u16.tif",  # TZC
    "ome_zcyx_u16.ome.tif",  # ZC
    "ome_ztcyx_u8.ome.tif",  # ZTC
    "ome_czyx_u16.ome.tif",  # CZ (already canonical: the control)
)


def canonical_pixels(path: Path) -> tuple[np.ndarray, list[str]]:
    """tifffile's image of the file, transposed to canonical axis order, and the axis names.

    Leading axes T/C/Z keep their identity; any other leading axis (tifffile's generic Q or I), or
    none at all, makes the pages a plain z stack.
    """
    with tifffile.TiffFile(path) as tif:
        series = tif.series[0]
        data, axes = series.asarray(), series.axes
    lead = [i for i, a in enumerate(axes) if a not in "YXS"]
    plane = [axes.index(a) for a in "YXS" if a in axes]
    names = [a.lower() for a in axes]
    if lead and all(axes[i] in "TCZ" for i in lead):
        lead.sort(key=lambda i: CANONICAL.index(names[i]))
        return data.transpose(lead + plane), [names[i] for i in lead + plane]
    stacked = data.transpose(lead + plane)
    stacked = stacked.reshape(-1, *stacked.shape[len(lead) :])
    return stacked, ["z"] + [names[i] for i in plane]


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape, dtype kind/size and bits, whatever the byte order (NaN payloads included)."""
    if a.shape != b.shape or a.dtype.name != b.dtype.name:
        return False
    little = a.dtype.newbyteorder("<")
    return bool(
        np.ascontiguousarray(a, dtype=little).tobytes()
        == np.ascontiguousarray(b, dtype=little).tobytes()
    )


@pytest.fixture(scope="module")
def groups(packed_corpus: dict[str, PackResult]) -> Iterator[dict[str, Any]]:
    """Each archive opened as a Zarr v2 group straight from its .zarr.zip, by zarr-python."""
    stores = {name: zarr.storage.ZipStore(r.archive, mode="r") for name, r in packed_corpus.items()}
    try:
        yield {name: zarr.open_group(s, mode="r", zarr_format=2) for name, s in stores.items()}
    finally:
        for store in stores.values():
            store.close()


@pytest.fixture(scope="module")
def unzipped(
    tmp_path_factory: pytest.TempPathFactory, packed_corpus: dict[str, PackResult]
) -> dict[str, Path]:
    """Each archive's keys unpacked into a NAME.zarr folder (what ome-zarr-py opens by path)."""
    base = tmp_path_factory.mktemp("unzipped")
    out = {}
    for name, result in packed_corpus.items():
        with zipfile.ZipFile(result.archive) as zf:
            zf.extractall(base / f"{name}.zarr")
        out[name] = base / f"{name}.zarr"
    return out


def is_pixel_archive(group: Any, path: Path, expected_mode: Mode) -> bool:
    """Whether the archive holds an image, checked against what the original's tags demand."""
    has_image = "multiscales" in group.attrs
    assert has_image == (expected_mode(path) == "byte-exact"), path.name
    return has_image


def test_canonical_mapping_is_not_identity(corpus: dict[str, Path]) -> None:
    """Guard for the oracle itself: the non-canonical files really get transposed."""
    for name, expected in (
        ("imagej_hyperstack_tzc_u16.tif", ["t", "c", "z", "y", "x"]),
        ("ome_ztcyx_u8.ome.tif", ["t", "c", "z", "y", "x"]),
        ("tiled_planar_rgb_u16_edge.tif", ["z", "y", "x", "s"]),
        ("bigtiff_u16_2pages.tif", ["z", "y", "x"]),
    ):
        pixels, names = canonical_pixels(corpus[name])
        assert names == expected
        raw = tifffile.imread(corpus[name])
        assert pixels.size == raw.size
    pixels, _ = canonical_pixels(corpus["imagej_hyperstack_tzc_u16.tif"])
    raw = tifffile.imread(corpus["imagej_hyperstack_tzc_u16.tif"])  # T, Z, C, Y, X
    assert np.array_equal(pixels[1, 0, 2], raw[1, 2, 0])


def test_zarr_reads_pixels_at_canonical_coordinates(
    expected_mode: Mode, corpus_name: str, corpus: dict[str, Path], groups: dict[str, Any]
) -> None:
    group = groups[corpus_name]
    if not is_pixel_archive(group, corpus[corpus_name], expected_mode):
        # Mode V: no image, but plain zarr still reads the whole original back.
        assert np.asarray(group["original"][:]).tobytes() == corpus[corpus_name].read_bytes()
        return
    expected, names = canonical_pixels(corpus[corpus_name])
    pixels = group[group.attrs["decant"]["pixels"]]
    assert pixels.shape == expected.shape
    page_ndim = 3 if names[-1] == "s" else 2
    lead = len(names) - page_ndim
    assert pixels.chunks == (1,) * lead + expected.shape[lead:]  # one plane per chunk
    assert same_values(np.asarray(pixels[...]), expected)


def test_multiscales_metadata(
    expected_mode: Mode, corpus_name: str, corpus: dict[str, Path], groups: dict[str, Any]
) -> None:
    group = groups[corpus_name]
    if not is_pixel_archive(group, corpus[corpus_name], expected_mode):
        assert "original" in group.attrs["decant"]
        return
    _, names = canonical_pixels(corpus[corpus_name])
    (ms,) = group.attrs["multiscales"]
    assert ms["version"] == "0.4"
    assert [a["name"] for a in ms["axes"]] == names
    assert [a["type"] for a in ms["axes"]] == [AXIS_TYPES[n] for n in names]
    assert ms["datasets"][0]["path"] == "0"
    (transform,) = ms["datasets"][0]["coordinateTransformations"]
    assert transform["type"] == "scale" and len(transform["scale"]) == len(names)
    assert group.attrs["decant"]["pixels"] == "0"


def test_strict_ngff_validator(
    expected_mode: Mode, corpus_name: str, corpus: dict[str, Path], groups: dict[str, Any]
) -> None:
    """ome-zarr-models accepts every image without a sample axis; RGB keeps `s` last (§3)."""
    group = groups[corpus_name]
    if not is_pixel_archive(group, corpus[corpus_name], expected_mode):
        assert "multiscales" not in group.attrs
        return
    _, names = canonical_pixels(corpus[corpus_name])
    if names[-1] == "s":
        # NGFF 0.4 wants channels before space; spec §3 keeps samples last. Documented caveat.
        assert [a["name"] for a in group.attrs["multiscales"][0]["axes"]][-3:] == ["y", "x", "s"]
        return
    image = Image.from_zarr(group)
    assert [a.name for a in image.attributes.multiscales[0].axes] == names


def test_ome_zarr_reader(
    expected_mode: Mode, corpus: dict[str, Path], unzipped: dict[str, Path], groups: dict[str, Any]
) -> None:
    """ome-zarr-py's Reader on every mode-D archive without a sample axis (it rejects `s` last)."""
    read = 0
    for name, folder in unzipped.items():
        if not is_pixel_archive(groups[name], corpus[name], expected_mode):
            continue
        expected, names = canonical_pixels(corpus[name])
        if names[-1] == "s":
            continue
        location = parse_url(str(folder))
        assert location is not None, name
        image = next(iter(Reader(location)()))
        assert [a["name"] for a in image.metadata["axes"]] == names, name
        assert same_values(np.asarray(image.data[0]), expected), name
        read += 1
    assert read >= 10


@pytest.mark.parametrize("name", STORAGE_ORDER_FILES)
def test_every_plane_individually(
    name: str, corpus: dict[str, Path], groups: dict[str, Any]
) -> None:
    """Plane by plane at each canonical coordinate, for the files stored out of canonical order."""
    expected, _ = canonical_pixels(corpus[name])
    pixels = groups[name]["0"]
    lead = expected.shape[:-2]
    assert len(lead) >= 2
    for coord in np.ndindex(*lead):
        assert same_values(np.asarray(pixels[coord]), expected[coord]), coord
