"""AcqStore collections through a real mount: the members view, its files, bad collections, changes.

Every check compares against an independent source: the original TIFF's bytes, the collection's
own files, the OME-Zarr arrays read with zarr, tifffile and libtiff's `tiffinfo`, and the lines
`decant acqstore validate` prints.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
import zarr

from tests.conftest import load_tool
from tests.mount.conftest import Mount
from vfs.decant.packer import pack_file

COLLECTION = "acqstore/collection.json"
ARCHIVE = "images/scan.tif.zarr.zip"  # the decant archive member; mirrored as images/scan.tif
# variant of tools/make_acqstore_corpus.py → a phrase its own validator message must contain
INVALID = {
    "dotdot_path": "contains a '..' segment",
    "absolute_path": "is absolute",
    "url_path": "is a URL",
    "duplicate_member_id": "duplicate member id 'img-a'",
    "duplicate_roi_id": "duplicate ROI id",
    "mismatched_image_id": "image_id 'img-zzz' does not match",
    "unknown_property": "'colour' was unexpected",
    "wrong_format": 'must be "acqstore-ome-zarr-collection"',
}

Cli = Callable[..., tuple[int, str, str]]


@dataclass(frozen=True)
class Corpus:
    template: Path  # a valid collection (read-only: tests copy it)
    original: Path  # the TIFF packed into ARCHIVE


@dataclass(frozen=True)
class Served:
    src: Path
    mount: Mount
    original: Path

    @property
    def mnt(self) -> Path:
        return self.mount.mnt


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """Kymograph 1: a decant archive of a tifffile TIFF; Stack 2: a czyx OME-Zarr directory whose
    planes take two 1 MiB strips and whose chunks hold three planes; a reference image."""
    base = tmp_path_factory.mktemp("acqstore")
    rng = np.random.default_rng(11)
    original = base / "scan.tif"
    scan = rng.integers(0, 60000, (4, 96, 72), dtype=np.uint16)
    tifffile.imwrite(original, scan, photometric="minisblack")
    packed = pack_file(original, base / "scan.tif.zarr.zip")
    generator = load_tool("make_acqstore_corpus")
    root = base / "template"
    generator.make_collection(root, decant_archive=packed.archive)
    assert (root / ARCHIVE).is_file()
    stack = rng.integers(0, 4096, (2, 3, 300, 1800), dtype=np.uint16)
    generator.write_ome_zarr(
        root / "images/stack.zarr", stack, "czyx", [1.0, 2.0, 0.5, 0.5], chunks=(1, 3, 300, 1800)
    )
    return Corpus(root, original)


@pytest.fixture(scope="module")
def served(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One mount of: `valid/`, `taken/` (already holds `members`), and `bad-VARIANT/` folders."""
    base = tmp_path_factory.mktemp("acqstore-mount")
    src = base / "src"
    src.mkdir()
    shutil.copytree(corpus.template, src / "valid")
    taken = Path(shutil.copytree(corpus.template, src / "taken"))
    (taken / "members").mkdir()
    (taken / "members" / "notes.txt").write_text("a real folder called members\n")
    mutations = load_tool("make_acqstore_corpus").MUTATIONS
    for variant in INVALID:
        mutations[variant](Path(shutil.copytree(corpus.template, src / f"bad-{variant}")))
    mount = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        yield Served(src, mount.start(), corpus.original)
    finally:
        mount.stop()


# -- helpers ---------------------------------------------------------------------------------


def _collection(root: Path) -> dict[str, Any]:
    return json.loads((root / COLLECTION).read_text())  # type: ignore[no-any-return]


def _expected_mirror(real: Path, original: Path) -> dict[str, Path]:
    """Relative path the mount must show → the file whose bytes it must serve there."""
    out = {p.relative_to(real).as_posix(): p for p in sorted(real.rglob("*")) if p.is_file()}
    if out.pop(ARCHIVE, None) is not None:
        out[ARCHIVE.removesuffix(".zarr.zip")] = original
    return out


def _mounted_files(folder: Path, skip: set[str]) -> dict[str, Path]:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        if Path(dirpath) == folder:
            dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            path = Path(dirpath) / name
            out[path.relative_to(folder).as_posix()] = path
    return out


def _assert_mirrored(real: Path, shown: Path, original: Path, skip: set[str]) -> None:
    expected = _expected_mirror(real, original)
    found = _mounted_files(shown, skip)
    assert sorted(found) == sorted(expected)
    for rel, path in expected.items():
        assert found[rel].read_bytes() == path.read_bytes(), rel


def _full_resolution(image: Path) -> tuple[np.ndarray, list[str], list[float]]:
    """(pixels, axis names, scale) of level 0, read with zarr from the image's own .zattrs."""
    ms = json.loads((image / ".zattrs").read_text())["multiscales"][0]
    dataset = ms["datasets"][0]
    scale = next(t["scale"] for t in dataset["coordinateTransformations"] if t["type"] == "scale")
    data = zarr.open_array(str(image / dataset["path"]), mode="r")[...]
    return np.asarray(data), [a["name"] for a in ms["axes"]], scale


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except OSError:
            pass  # a folder replaced between listing and reading
        time.sleep(0.1)
    return False


def _edit(path: Path, change: Callable[[dict[str, Any]], None], atomic: bool = False) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    text = json.dumps(doc, indent=2) + "\n"
    if atomic:  # as editors that save by rename do
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    else:
        path.write_text(text)


# -- a valid collection ----------------------------------------------------------------------


def test_validator_accepts_the_collection(served: Served, decant_cli: Cli) -> None:
    for name in ("valid", "taken"):
        status, out, err = decant_cli("acqstore", "validate", served.src / name)
        assert (status, out) == (0, ""), err
        assert "valid (0 errors, 0 warnings)" in err


def test_collection_folder_is_still_mirrored(served: Served) -> None:
    shown = served.mnt / "valid"
    assert sorted(os.listdir(shown)) == ["acqstore", "images", "members"]
    assert "scan.tif" in os.listdir(shown / "images")  # the decant archive as its original
    _assert_mirrored(served.src / "valid", shown, served.original, skip={"members"})


def test_members_are_listed_by_name(served: Served) -> None:
    doc = _collection(served.src / "valid")
    view = served.mnt / "valid" / "members"
    assert sorted(os.listdir(view)) == sorted([m["name"] for m in doc["members"]] + ["tables"])
    for member in doc["members"]:
        analyses = json.loads((served.src / "valid" / member["resources"]["analyses"]).read_text())
        expected = {f"{member['name']}.tif", "acqimage.json", "analyses.json"}
        expected |= {a["id"] for a in analyses["analyses"]}
        if "reference_image" in member:
            expected |= {"reference.tif", "reference-image.json"}
        assert set(os.listdir(view / member["name"])) == expected
    with pytest.raises(OSError):
        (view / "Stack 2" / "new.txt").write_text("read-only")


def test_decant_member_tiff_is_byte_exact(served: Served) -> None:
    original = served.original.read_bytes()
    shown = served.mnt / "valid" / "members" / "Kymograph 1" / "Kymograph 1.tif"
    assert os.stat(shown).st_size == len(original)
    fd = os.open(shown, os.O_RDONLY)
    try:  # random access first, then the whole file
        for offset in (len(original) - 100, 7, len(original) // 2):
            assert os.pread(fd, 4096, offset) == original[offset : offset + 4096]
    finally:
        os.close(fd)
    assert shown.read_bytes() == original


@pytest.mark.parametrize(
    ("member", "file", "image"),
    [
        ("Stack 2", "Stack 2.tif", "images/stack.zarr"),
        ("Kymograph 1", "reference.tif", "images/reference.zarr"),
    ],
)
def test_synthesized_tiff_has_the_zarr_pixels(
    served: Served, member: str, file: str, image: str
) -> None:
    data, axes, _scale = _full_resolution(served.src / "valid" / image)
    shown = served.mnt / "valid" / "members" / member / file
    raw = shown.read_bytes()
    assert len(raw) == os.stat(shown).st_size
    with tifffile.TiffFile(shown) as tif:
        series = tif.series[0]
        assert len(tif.pages) == int(np.prod(data.shape[:-2]))
        order = [axes.index(letter.lower()) for letter in series.axes]
        assert sorted(order) == list(range(data.ndim))
        expected = data.transpose(order)
        assert series.shape == expected.shape
        assert series.dtype == data.dtype
        np.testing.assert_array_equal(series.asarray(), expected)
    fd = os.open(shown, os.O_RDONLY)
    try:  # random access agrees with the sequential read
        for offset in (len(raw) - 5000, 3, len(raw) // 3, len(raw) // 2 + 1234):
            offset = max(0, offset)
            assert os.pread(fd, 70000, offset) == raw[offset : offset + 70000]
    finally:
        os.close(fd)


def test_synthesized_tiff_carries_axes_and_pixel_sizes(served: Served) -> None:
    _data, axes, scale = _full_resolution(served.src / "valid" / "images/stack.zarr")
    assert axes == ["c", "z", "y", "x"]
    with tifffile.TiffFile(served.mnt / "valid/members/Stack 2/Stack 2.tif") as tif:
        assert tif.is_imagej  # uint16 with c and z: an ImageJ hyperstack
        meta = tif.imagej_metadata
        assert meta is not None
        assert (meta["channels"], meta["slices"], meta["hyperstack"]) == (2, 3, True)
        assert meta["spacing"] == pytest.approx(scale[1])
        page = tif.pages.first
        for tag, size in (("XResolution", scale[3]), ("YResolution", scale[2])):
            num, den = page.tags[tag].value
            assert num / den == pytest.approx(1 / size)


@pytest.mark.skipif(shutil.which("tiffinfo") is None, reason="tiffinfo (libtiff-tools) missing")
@pytest.mark.parametrize("file", ["Stack 2/Stack 2.tif", "Kymograph 1/reference.tif"])
def test_tiffinfo_reads_the_synthesized_tiff(served: Served, file: str) -> None:
    shown = served.mnt / "valid" / "members" / file
    done = subprocess.run(["tiffinfo", "-D", str(shown)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""
    with tifffile.TiffFile(shown) as tif:
        assert done.stdout.count("=== TIFF directory") == len(tif.pages)


def test_documents_and_csvs_are_byte_identical(served: Served) -> None:
    real = served.src / "valid"
    view = served.mnt / "valid" / "members"
    doc = _collection(real)
    expected: dict[str, str] = {}  # shown path → collection path
    for member in doc["members"]:
        name, res = member["name"], member["resources"]
        expected[f"{name}/acqimage.json"] = res["acqimage"]
        expected[f"{name}/analyses.json"] = res["analyses"]
        if "reference_image" in member:
            expected[f"{name}/reference-image.json"] = member["reference_image"]["metadata"]
        for analysis in json.loads((real / res["analyses"]).read_text())["analyses"]:
            for resource in analysis["resources"]:
                expected[f"{name}/{analysis['id']}/{resource['id']}.csv"] = resource["path"]
    for table in doc["resources"]["tables"]:
        expected[f"tables/{table['id']}.csv"] = table["path"]
    assert sum(p.endswith(".csv") for p in expected) == 8  # 3 analyses x 2, and 2 tables
    for shown, rel in expected.items():
        assert (view / shown).read_bytes() == (real / rel).read_bytes(), shown
    assert sorted(os.listdir(view / "tables")) == sorted(
        f"{t['id']}.csv" for t in doc["resources"]["tables"]
    )


def test_existing_members_entry_gets_dot_members(served: Served) -> None:
    shown = served.mnt / "taken"
    assert sorted(os.listdir(shown)) == [".members", "acqstore", "images", "members"]
    assert sorted(os.listdir(shown / ".members")) == ["Kymograph 1", "Stack 2", "tables"]
    assert (shown / ".members/Kymograph 1/Kymograph 1.tif").read_bytes() == (
        served.original.read_bytes()
    )
    _assert_mirrored(served.src / "taken", shown, served.original, skip={".members"})


# -- invalid collections ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(INVALID))
def test_invalid_collection_gets_no_view(served: Served, decant_cli: Cli, variant: str) -> None:
    real, shown = served.src / f"bad-{variant}", served.mnt / f"bad-{variant}"
    status, out, _err = decant_cli("acqstore", "validate", real)
    lines = out.splitlines()
    assert status == 1 and any(INVALID[variant] in line for line in lines), out
    names = os.listdir(shown)
    assert "members" not in names and ".members" not in names
    _assert_mirrored(real, shown, served.original, skip=set())
    log = served.mount.log_text()
    assert f"{real}: not a valid AcqStore collection" in log
    for line in lines:
        assert line in log


# -- changes while mounted -------------------------------------------------------------------


@pytest.fixture
def live(corpus: Corpus, tmp_path: Path) -> Path:
    """SRC holding one collection `coll/` that a test may change."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(corpus.template, src / "coll")
    return src


def test_view_follows_collection_changes(live: Path, make_mount: Any) -> None:
    m = make_mount(live)
    view = m.mnt / "coll" / "members"
    assert sorted(os.listdir(view)) == ["Kymograph 1", "Stack 2", "tables"]
    before = (view / "Stack 2" / "Stack 2.tif").read_bytes()

    _edit(live / "coll" / COLLECTION, lambda d: d["members"][1].update(name="Renamed stack"))
    assert _wait_for(lambda: "Renamed stack" in os.listdir(view)), os.listdir(view)
    assert sorted(os.listdir(view)) == ["Kymograph 1", "Renamed stack", "tables"]
    assert (view / "Renamed stack" / "Renamed stack.tif").read_bytes() == before

    # A linked document, two folders down, saved by rename.
    analyses = live / "coll" / "acqstore/members/img-b/analyses.json"
    _edit(analyses, lambda d: d["analyses"][0].update(id="an-speed"), atomic=True)
    member = view / "Renamed stack"
    assert _wait_for(lambda: "an-speed" in os.listdir(member)), os.listdir(member)
    assert "an-velocity" not in os.listdir(member)
    assert (member / "analyses.json").read_bytes() == analyses.read_bytes()
    csv = live / "coll" / "acqstore/members/img-b/analyses/an-velocity/results.csv"
    assert (member / "an-speed" / "results.csv").read_bytes() == csv.read_bytes()


def test_view_appears_and_disappears_with_validity(
    live: Path, make_mount: Any, decant_cli: Cli
) -> None:
    path = live / "coll" / COLLECTION
    _edit(path, lambda d: d.update(format="acqstore-collection"))
    m = make_mount(live)
    shown = m.mnt / "coll"
    assert "members" not in os.listdir(shown)

    _edit(path, lambda d: d.update(format="acqstore-ome-zarr-collection"))
    assert _wait_for(lambda: "members" in os.listdir(shown)), os.listdir(shown)
    assert sorted(os.listdir(shown / "members")) == ["Kymograph 1", "Stack 2", "tables"]

    _edit(path, lambda d: d["members"][0].update(ome_zarr="../outside.zarr"), atomic=True)
    assert _wait_for(lambda: "members" not in os.listdir(shown)), os.listdir(shown)
    status, out, _err = decant_cli("acqstore", "validate", live / "coll")
    assert status == 1 and "'..' segment" in out
    assert _wait_for(lambda: all(line in m.log_text() for line in out.splitlines()))
    assert sorted(os.listdir(shown)) == ["acqstore", "images"]
