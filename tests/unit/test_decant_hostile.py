"""Hostile archives: every claim beyond what the archive holds is a DecantError naming the file and
the field, raised before anything large is allocated — at describe() where the store can tell.

Each archive is a good one the packer wrote, with one thing altered (zip entries are STORED, so
every other entry stays byte-identical). Peak memory is measured with tracemalloc per case, and
for the headline cases of the brief in a fresh process with getrusage.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest

from tests.toolbox import load_tool
from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.decant.limits import MAX_MANIFEST_ITEMS
from vfs.decant.packer import PackOptions, PackResult
from vfs.decant.series import pack_series
from vfs.errors import CorruptArchiveError, DecantError, ManifestError, UnsupportedFormatError

fuzz = load_tool("fuzz")
Edit = Callable[[str, bytes], bytes | None]
MANIFEST = ".decant/manifest.json"
D = "imagej_hyperstack_tzc_u16.tif"  # mode D: 0 shape [2, 2, 3, 20, 30], husk/0
V = "zlib_u16.tif"  # mode V: original/0
T = "tiled_chunky_u16.tif"  # mode D, tiled 32x32 over 64x96
PLANE = "0/0.0.0.0.0"
GIB = 1 << 30
PEAK_LIMIT = 100 << 20  # per case, traced by tracemalloc


NESTED = "[" + ",".join(["[" * 400 + "]" * 400] * (MAX_MANIFEST_ITEMS // 400 + 1)) + "]"


def zarray(key: str, **fields: Any) -> Edit:
    return fuzz.json_edit(key, lambda d: d.update(fields))


def manifest(change: Callable[[dict[str, Any]], None]) -> Edit:
    return fuzz.json_edit(MANIFEST, change)


def setf(**fields: Any) -> Edit:
    return manifest(lambda d: d.update(fields))


def page(i: int, **fields: Any) -> Edit:
    return manifest(lambda d: d["pages"][i].update(fields))


def drop(key: str) -> Edit:
    return lambda n, d: None if n == key else d


def put(key: str, make: Callable[[bytes], bytes]) -> Edit:
    return lambda n, d: make(d) if n == key else d


def raw_text(key: str, field: str, text: str) -> Edit:
    """Set a manifest field to raw JSON text (deep nesting, huge ints json.dumps cannot make)."""

    def edit(name: str, data: bytes) -> bytes:
        if name != key:
            return data
        doc = json.loads(data)
        doc[field] = "@@"
        return json.dumps(doc).replace('"@@"', text).encode()

    return edit


def half_plane(data: bytes) -> bytes:
    codec = numcodecs.Blosc("zstd", 5, 1)
    return bytes(codec.encode(np.zeros(300, np.uint16)))


def blosc_cbytes(data: bytes) -> bytes:
    buf = bytearray(data)
    struct.pack_into("<I", buf, 12, 1 << 30)  # cbytes: c-blosc would trust it and read past
    return bytes(buf)


def bomb_chunks(d: dict[str, Any]) -> None:
    d["chunks"] = [GIB]


def pixel_chunks(planes: int) -> Edit:
    return zarray("0/.zarray", chunks=[planes, 2, 3, 20, 30])


def span(d: dict[str, Any]) -> None:
    d["pages"][1]["index"] = d["pages"][0]["index"]


def tiny_tiles(d: dict[str, Any]) -> None:
    d["pages"][0].update(tilewidth=1, tilelength=1)


# id → (base, edit, where it must fail, error class, words the message must contain)
CASES: dict[str, tuple[str, Edit, str, type[DecantError], list[str]]] = {
    "husk-chunk-2gib": (
        D, zarray("husk/.zarray", chunks=[2 * GIB]), "describe", CorruptArchiveError,
        ["array 'husk'", "chunks [2147483648]", "64 MiB"],
    ),
    "husk-bomb-1gib": (
        D, fuzz.chain(fuzz.json_edit("husk/.zarray", bomb_chunks),
                      put("husk/0", lambda d: fuzz.blosc_bomb(GIB))),
        "describe", CorruptArchiveError, ["array 'husk'", "1073741824 bytes"],
    ),
    "husk-bomb-in-small-chunk": (
        D, put("husk/0", lambda d: fuzz.blosc_bomb(GIB)), "read", CorruptArchiveError,
        ["chunk 'husk/0'", "states 1073741824 decoded bytes, expected 262144"],
    ),
    "husk-entry-larger-than-its-chunk-can-be": (
        D, put("husk/0", lambda d: os.urandom(1 << 20)), "read", CorruptArchiveError,
        ["'husk/0' holds 1048576 bytes, more than the 276 KiB"],
    ),
    "pixel-chunk-2gib": (
        D, pixel_chunks(2 * GIB // 1200), "describe", CorruptArchiveError,
        ["array '0'", "more than the 1 GiB"],
    ),
    "pixel-chunk-spans-planes": (
        D, pixel_chunks(2), "describe", ManifestError, ["array '0'", "one plane per chunk"],
    ),
    "pixel-shape-2e40-planes": (
        D, zarray("0/.zarray", shape=[1 << 40, 2, 3, 20, 30]), "describe", CorruptArchiveError,
        ["array '0'", "planes, more than"],
    ),
    "size-2e62": (
        D, setf(original_size=1 << 62), "describe", ManifestError,
        ["original_size", "4611686018427387904"],
    ),
    "verbatim-size-2e62": (
        V, setf(original_size=1 << 62), "describe", ManifestError, ["original_size", "claims"],
    ),
    "verbatim-size-2e40-shape-agrees": (
        V, fuzz.chain(setf(original_size=1 << 40), zarray("original/.zarray", shape=[1 << 40])),
        "describe", CorruptArchiveError, ["chunk 'original/1' is missing"],
    ),
    "verbatim-size-0-with-data": (
        V, setf(original_size=0), "describe", ManifestError,
        ["array 'original'", "longer than the 0"],
    ),
    "verbatim-empty-array-with-data": (
        V, fuzz.chain(setf(original_size=0), zarray("original/.zarray", shape=[0])),
        "describe", CorruptArchiveError, ["'original/0' beyond the 0 bytes"],
    ),
    "verbatim-chunk-missing": (
        V, drop("original/0"), "describe", CorruptArchiveError, ["chunk 'original/0' is missing"],
    ),
    "pixel-chunk-missing": (
        D, drop(PLANE), "describe", CorruptArchiveError, [f"chunk '{PLANE}' is missing"],
    ),
    "husk-chunk-missing": (
        D, drop("husk/0"), "describe", CorruptArchiveError, ["chunk 'husk/0' is missing"],
    ),
    "chunk-decodes-short": (
        D, put(PLANE, half_plane), "read", CorruptArchiveError,
        [f"chunk '{PLANE}'", "states 600 decoded bytes, expected 1200"],
    ),
    "blosc-cbytes-lie": (
        D, put(PLANE, blosc_cbytes), "read", CorruptArchiveError,
        [f"chunk '{PLANE}'", "no valid blosc header"],
    ),
    "pickle-compressor": (
        D, zarray("husk/.zarray", compressor={"id": "pickle"}), "describe",
        UnsupportedFormatError, ["array 'husk'", "compressor 'pickle'"],
    ),
    "pickle-filter": (
        D, zarray("0/.zarray", filters=[{"id": "pickle"}]), "describe", UnsupportedFormatError,
        ["array '0'", "filter 'pickle'"],
    ),
    "object-dtype": (
        D, zarray("0/.zarray", dtype="|O"), "describe", UnsupportedFormatError, ["dtype '|O'"],
    ),
    "subarray-dtype": (
        D, zarray("husk/.zarray", dtype="(1000000000,)u1"), "describe", UnsupportedFormatError,
        ["array 'husk'", "dtype"],
    ),
    "manifest-nested-deep": (
        D, raw_text(MANIFEST, "notes", "[" * 100_000 + "]" * 100_000), "describe",
        ManifestError, ["nested too deeply"],
    ),
    "manifest-int-5000-digits": (
        D, raw_text(MANIFEST, "original_size", "9" * 5000), "describe", ManifestError,
        ["not valid JSON"],
    ),
    "manifest-too-many-values": (
        D, setf(notes="," * (MAX_MANIFEST_ITEMS + 1)), "describe", ManifestError,
        ["manifest not parsed", "JSON values"],
    ),
    "manifest-nested-values-without-commas": (  # 400 deep: ~48 bytes of memory per byte
        D, raw_text(MANIFEST, "notes", NESTED), "describe", ManifestError,
        ["manifest not parsed", "JSON lists"],
    ),
    "page-bytes-disagree-with-shape": (
        D, page(0, databytecounts=[1198]), "describe", ManifestError,
        ["pages[0]", "databytecounts sum to 1198", "makes 1200"],
    ),
    "tiles-1x1": (
        T, manifest(tiny_tiles), "describe", ManifestError, ["pages[0]", "geometry makes"],
    ),
    "duplicate-page-index": (
        D, manifest(span), "describe", ManifestError, ["page index 0 repeats"],
    ),
    "page-dtype-unknown": (
        D, page(0, dtype="complex128"), "describe", UnsupportedFormatError,
        ["pages[0]", "'complex128'"],
    ),
    "original-name-300-bytes": (
        D, setf(original_name="x" * 300), "describe", ManifestError, ["original_name", "xxx"],
    ),
    "original-name-lone-surrogate": (
        V, raw_text(MANIFEST, "original_name", '"a\\ud800.tif"'), "describe", ManifestError,
        ["original_name"],
    ),
    "plane-order-missing": (
        D, setf(plane_order=[]), "describe", ManifestError, ["plane_order"],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def bases(packed_corpus: dict[str, PackResult]) -> dict[str, Path]:
    return {name: packed_corpus[name].archive for name in (D, V, T)}


def build(case: str, bases: dict[str, Path], folder: Path) -> Path:
    base, edit, *_ = CASES[case]
    return fuzz.rewrite_zip(bases[base], folder / f"{case}.tif.zarr.zip", edit)


def describe_and_read(path: Path) -> None:
    backend = DecantBackend(PageCache(8 << 20))
    desc = backend.describe(path)
    handle = backend.open(path, "", desc.root)
    try:
        for offset in range(0, handle.size, 1 << 16):
            handle.read(offset, 1 << 16)
    finally:
        handle.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_archive(case: str, bases: dict[str, Path], tmp_path: Path) -> None:
    _, _, stage, error, words = CASES[case]
    bad = build(case, bases, tmp_path)
    backend = DecantBackend(PageCache(8 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(error) as info:
            if stage == "describe":
                backend.describe(bad)
            else:
                backend.describe(bad)  # must pass: only a read finds this one
                describe_and_read(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert str(bad) in message
    for word in words:
        assert word in message, (word, message)
    assert peak < PEAK_LIMIT, f"{case}: peak {peak >> 20} MiB"


def test_headline_cases_stay_small_in_a_fresh_process(
    bases: dict[str, Path], tmp_path: Path
) -> None:
    """The brief's numbers (6.3 GB, 3.2 GB peaks) came from whole processes: measure one."""
    made = fuzz.headline_cases(bases[D], bases[V], tmp_path / "hostile")
    code = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from tests.unit.test_decant_hostile import describe_and_read\n"
        "from vfs.errors import DecantError\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        describe_and_read(Path(p))\n"
        "        print('served', p)\n"
        "    except DecantError as exc:\n"
        "        print('refused', exc)\n"
        "print('growth', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, made.values())],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("refused") for line in lines) == len(made), proc.stdout
    growth_kib = int(lines[-1].split()[1])
    assert growth_kib < 200 * 1024, proc.stdout


def test_legacy_archive_reads_omitted_chunks_as_fill(
    bases: dict[str, Path], tmp_path: Path
) -> None:
    """Archives written before all_chunks_stored omitted all-zero chunks (zarr's default): a
    missing chunk there is the fill value, as their writer meant (the compatibility policy)."""
    zero_plane = bytes(numcodecs.Blosc("zstd", 5, 1).encode(np.zeros(600, np.uint16)))
    legacy = fuzz.rewrite_zip(
        bases[D],
        tmp_path / "legacy.zarr.zip",
        fuzz.chain(
            put(PLANE, lambda d: zero_plane), manifest(lambda d: d.pop("all_chunks_stored"))
        ),
    )
    omitted = fuzz.rewrite_zip(
        bases[D],
        tmp_path / "omitted.zarr.zip",
        fuzz.chain(drop(PLANE), manifest(lambda d: d.pop("all_chunks_stored"))),
    )
    backend = DecantBackend(PageCache(8 << 20))
    served = []
    for path in (legacy, omitted):
        desc = backend.describe(path)
        handle = backend.open(path, "", desc.root)
        served.append(bytes(handle.read(0, handle.size)))
        handle.close()
    assert served[0] == served[1]


def test_legacy_verbatim_without_any_data_is_refused(
    bases: dict[str, Path], tmp_path: Path
) -> None:
    bad = fuzz.rewrite_zip(
        bases[V],
        tmp_path / "empty.zarr.zip",
        fuzz.chain(drop("original/0"), manifest(lambda d: d.pop("all_chunks_stored"))),
    )
    with pytest.raises(CorruptArchiveError, match="holds no data") as info:
        DecantBackend(PageCache(0)).describe(bad)
    assert str(bad) in str(info.value)


def central_record(data: bytes, name: str) -> int:
    """Offset of `name`'s central directory record in a zip's bytes."""
    end = data.rindex(b"PK\x05\x06")
    pos = struct.unpack_from("<I", data, end + 16)[0]
    while data[pos : pos + 4] == b"PK\x01\x02":
        n, m, k = struct.unpack_from("<HHH", data, pos + 28)
        if data[pos + 46 : pos + 46 + n] == name.encode():
            return pos
        pos += 46 + n + m + k
    raise KeyError(name)


def patched(src: Path, dest: Path, change: Callable[[bytearray], None]) -> Path:
    data = bytearray(src.read_bytes())
    change(data)
    dest.write_bytes(bytes(data))
    return dest


def test_central_directory_size_claim(bases: dict[str, Path], tmp_path: Path) -> None:
    def huge_cd(data: bytearray) -> None:
        struct.pack_into("<I", data, data.rindex(b"PK\x05\x06") + 12, 0xFFFFFFF0)

    bad = patched(bases[D], tmp_path / "cd.zarr.zip", huge_cd)
    with pytest.raises(CorruptArchiveError, match="central directory claims 4294967280") as info:
        DecantBackend(PageCache(0)).describe(bad)
    assert str(bad) in str(info.value)


def test_zip_entry_count_bound(
    bases: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("vfs.decant.zipdir.MAX_ZIP_ENTRIES", 5)
    with pytest.raises(CorruptArchiveError, match=r"claims \d+ entries, more than 5"):
        DecantBackend(PageCache(0)).describe(bases[D])


def test_manifest_size_bound(bases: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vfs.decant.reader.MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(CorruptArchiveError, match=r"manifest\.json' holds \d+ bytes, more than"):
        DecantBackend(PageCache(0)).describe(bases[D])


def test_stored_entry_size_lie(bases: dict[str, Path], tmp_path: Path) -> None:
    """The directory says husk/0 holds 2 GiB: refused from the number, nothing read."""

    def lie(data: bytearray) -> None:
        at = central_record(bytes(data), "husk/0")
        struct.pack_into("<II", data, at + 20, 1 << 31, 1 << 31)  # compress_size, file_size

    bad = patched(bases[D], tmp_path / "lie.zarr.zip", lie)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptArchiveError, match="'husk/0' holds 2147483648 bytes"):
            describe_and_read(bad)
        assert tracemalloc.get_traced_memory()[1] < PEAK_LIMIT
    finally:
        tracemalloc.stop()


def test_flipped_bit_on_disk_fails_crc(bases: dict[str, Path], tmp_path: Path) -> None:
    def flip(data: bytearray) -> None:
        with zipfile.ZipFile(bases[D]) as zf:
            info = zf.getinfo("husk/0")
        data[info.header_offset + 30 + len(info.filename) + len(info.extra) + 40] ^= 0x10

    bad = patched(bases[D], tmp_path / "flip.zarr.zip", flip)
    with pytest.raises(CorruptArchiveError, match="'husk/0' fails its CRC-32") as info:
        describe_and_read(bad)
    assert str(bad) in str(info.value)


def test_local_header_of_another_entry(bases: dict[str, Path], tmp_path: Path) -> None:
    """A directory offset pointing at another entry's header would serve that entry's bytes."""

    def cross(data: bytearray) -> None:
        with zipfile.ZipFile(bases[D]) as zf:
            offsets = {i.filename: i.header_offset for i in zf.infolist()}
        at = central_record(bytes(data), PLANE)
        struct.pack_into("<I", data, at + 42, offsets["0/0.0.1.0.0"])

    bad = patched(bases[D], tmp_path / "cross.zarr.zip", cross)
    with pytest.raises(CorruptArchiveError, match="local header disagrees"):
        describe_and_read(bad)


# ---------------------------------------------------------------- folders: .zarr/ and nested


def unpacked(zip_path: Path, folder: Path) -> Path:
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(folder)
    return folder


@pytest.mark.parametrize("target", ["/etc/hostname", "/dev/zero"])
def test_directory_archive_symlink_chunk(
    bases: dict[str, Path], tmp_path: Path, target: str
) -> None:
    """A chunk file that is a symlink could make the daemon (root) serve any file: refused."""
    archive = unpacked(bases[V], tmp_path / "v.zarr")
    (archive / "original/0").unlink()
    os.symlink(target, archive / "original/0")
    with pytest.raises(CorruptArchiveError, match="'original/0' is a symlink") as info:
        describe_and_read(archive)
    assert str(archive) in str(info.value)


def test_directory_archive_fifo_chunk(bases: dict[str, Path], tmp_path: Path) -> None:
    archive = unpacked(bases[V], tmp_path / "v.zarr")
    (archive / "original/0").unlink()
    os.mkfifo(archive / "original/0")
    with pytest.raises(CorruptArchiveError, match="not a regular file"):
        describe_and_read(archive)


def test_directory_archive_reads_like_its_zip(bases: dict[str, Path], tmp_path: Path) -> None:
    archive = unpacked(bases[D], tmp_path / "d.zarr")
    backend = DecantBackend(PageCache(8 << 20))
    got = []
    for path in (archive, bases[D]):
        handle = backend.open(path, "", backend.describe(path).root)
        got.append(bytes(handle.read(0, handle.size)))
        handle.close()
    assert got[0] == got[1]


def test_directory_archive_missing_chunk(bases: dict[str, Path], tmp_path: Path) -> None:
    """A folder store cannot list for free: the missing chunk is found by the read, not zeros."""
    archive = unpacked(bases[D], tmp_path / "d.zarr")
    (archive / PLANE).unlink()
    with pytest.raises(CorruptArchiveError, match=f"chunk '{PLANE}' is missing"):
        describe_and_read(archive)


@pytest.fixture
def nested(corpus: dict[str, Path], tmp_path: Path) -> Path:
    folder = tmp_path / "plates"
    folder.mkdir()
    for name in ("zstack_u16.tif", "zlib_u16.tif"):
        (folder / name).write_bytes(corpus[name].read_bytes())
    return pack_series(folder, tmp_path / "plates.zarr", PackOptions()).archive


def edit_nested(archive: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads((archive / MANIFEST).read_bytes())
    change(doc)
    (archive / MANIFEST).write_text(json.dumps(doc), encoding="utf-8")


def test_nested_member_size_disagrees_with_its_bundle(nested: Path) -> None:
    edit_nested(nested, lambda d: d["members"][0].update(original_size=1 << 40))
    with pytest.raises(ManifestError, match="claims 1099511627776 bytes") as info:
        DecantBackend(PageCache(0)).describe(nested)
    assert str(nested) in str(info.value)


def test_nested_bundle_name_escapes(nested: Path) -> None:
    edit_nested(nested, lambda d: d["members"][0].update(subarchive="../other.zarr.zip"))
    with pytest.raises(ManifestError, match=r"subarchive '\.\./other\.zarr\.zip' is not a plain"):
        DecantBackend(PageCache(0)).describe(nested)


def test_nested_bundle_symlink(nested: Path, bases: dict[str, Path]) -> None:
    bundle = nested / json.loads((nested / MANIFEST).read_bytes())["members"][0]["subarchive"]
    bundle.unlink()
    os.symlink(bases[D], bundle)
    with pytest.raises(CorruptArchiveError, match="symlink"):
        DecantBackend(PageCache(0)).describe(nested)


def test_nested_bundle_swapped_for_a_symlink_after_its_check(
    nested: Path, bases: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap lands between the lstat that refuses links and the open by path: the file
    opened is not the one seen, so it is refused, not read through the link."""
    from vfs.decant import reader

    bundle = nested / json.loads((nested / MANIFEST).read_bytes())["members"][0]["subarchive"]
    real_open = reader.DecantArchive.open.__func__  # type: ignore[attr-defined]

    def swapped_open(cls: type, path: Path, *args: Any, **kwargs: Any) -> Any:
        if path == bundle and not bundle.is_symlink():
            bundle.unlink()
            os.symlink(bases[D], bundle)
        return real_open(cls, path, *args, **kwargs)

    monkeypatch.setattr(reader.DecantArchive, "open", classmethod(swapped_open))
    with pytest.raises(CorruptArchiveError, match="changed while opened"):
        DecantBackend(PageCache(0)).describe(nested)


def test_nested_bundle_that_is_a_series(nested: Path, tmp_path: Path) -> None:
    """A member bundle must be mode D or V: no series inside a series (no recursion)."""
    doc = json.loads((nested / MANIFEST).read_bytes())
    bundle = nested / doc["members"][1]["subarchive"]
    fuzz.rewrite_zip(bundle, tmp_path / "b.zip", setf(mode="series", members=doc["members"]))
    bundle.write_bytes((tmp_path / "b.zip").read_bytes())
    with pytest.raises(ManifestError, match="must be byte-exact or verbatim"):
        DecantBackend(PageCache(0)).describe(nested)


def test_nested_member_relpath_too_deep(nested: Path) -> None:
    """The mount builds folders from relpaths: their depth is bounded, as is each name."""
    edit_nested(nested, lambda d: d["members"][0].update(relpath="a/" * 100 + "x.tif"))
    with pytest.raises(ManifestError, match=r"relpath 'a/a/a.* is unsafe"):
        DecantBackend(PageCache(0)).describe(nested)


def test_packer_stores_every_chunk(tmp_path: Path) -> None:
    """All-zero planes and husk blocks are written too, and the manifest says so: a reader can
    then treat any missing chunk as damage (zarr's default would skip chunks equal to fill)."""
    import tifffile

    from vfs.decant.packer import pack_file

    planes = np.zeros((3, 16, 16), np.uint16)
    planes[1] = 7
    tifffile.imwrite(tmp_path / "z.tif", planes, photometric="minisblack")
    (tmp_path / "zeros.bin").write_bytes(bytes(3 << 20))
    for name, want in (("z.tif", {"0/0.0.0", "0/1.0.0", "0/2.0.0"}),
                       ("zeros.bin", {"original/0", "original/1", "original/2"})):  # fmt: skip
        out = pack_file(tmp_path / name, tmp_path / f"{name}.zarr.zip", PackOptions()).archive
        with zipfile.ZipFile(out) as zf:
            assert want <= set(zf.namelist()), zf.namelist()
            assert json.loads(zf.read(MANIFEST))["all_chunks_stored"] is True


def test_a_hard_link_takes_another_link_s_description_under_its_own_name() -> None:
    """SourceTree._linked: a series is named after its archive file (each link presents its
    own name), one original after its manifest (every link presents the same)."""
    from vfs.backends.base import Description, Entry
    from vfs.backends.decant import DecantBackend

    series = Description("run", Entry(is_dir=True))
    taken = DecantBackend.described_as(series, Path("/src/other.zarr.zip"))
    assert taken.name == "other" and taken.root is series.root
    one = Description("scan.tif", Entry(size=5))
    assert DecantBackend.described_as(one, Path("/src/copy.zarr.zip")) is one
