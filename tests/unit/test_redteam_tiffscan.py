"""A hostile TIFF written into the mount is scanned by the daemon (root) before it is packed:
a file of minimal IFDs (18-byte pages, thousands of them) must not cost memory far beyond its
own size. tifffile's page objects take a few KiB each; the scan keeps only its page records."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.decant.tiffscan import NotByteExact, scan_tiff

PAGES = 20_000


def many_ifds(path: Path, n: int) -> int:
    """A classic little-endian TIFF of `n` one-pixel pages whose IFDs follow one another."""
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    tags = [(256, 3, 1, 1), (257, 3, 1, 1), (258, 3, 1, 8), (273, 4, 1, 0), (279, 4, 1, 1)]
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", *t) for t in tags)
    for i in range(n):
        nxt = len(out) + len(ifd) + 4 if i < n - 1 else 0
        out += ifd + struct.pack("<I", nxt)
    path.write_bytes(out)
    return len(out)


def test_a_tiff_of_many_tiny_pages_costs_memory_near_its_size(tmp_path: Path) -> None:
    size = many_ifds(tmp_path / "many.tif", PAGES)
    tracemalloc.start()
    try:
        with pytest.raises(NotByteExact):  # its strips overlap: mode V
            scan_tiff(tmp_path / "many.tif", size)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Measured: 39x the file's size with every tifffile page kept, 12x with records only.
    assert peak < 20 * size, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB file"


def test_many_pages_too_tiny_to_carry_mode_d_go_verbatim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 pages of 2 x 2: mode D costs ~4.7 KiB of memory a page to pack (and made a
    12 MB archive of 30,000 such pages, 3.4 MB as a TIFF), so the file goes verbatim. The scan
    says so once the pages seen are too many, not after recording every page (red team 71:
    200,000 such pages held ~0.9 KiB of records each in the daemon, 35 s of its pack worker)."""
    from vfs.decant import tiffscan
    from vfs.decant.limits import PAGE_OVERHEAD, PAGES_OVERHEAD_FREE

    tif = tmp_path / "tiny.tif"
    tifffile.imwrite(tif, np.zeros((20_000, 2, 2), np.uint8), photometric="minisblack")
    recorded = []
    record = tiffscan._page_record
    monkeypatch.setattr(tiffscan, "_page_record", lambda *a: recorded.append(1) or record(*a))
    with pytest.raises(NotByteExact, match="more than 16384 pages of 4 bytes: mode D would cost"):
        scan_tiff(tif, tif.stat().st_size)
    assert len(recorded) == PAGES_OVERHEAD_FREE // PAGE_OVERHEAD + 1  # 16,385, not 20,000


def test_a_stack_of_small_pages_within_the_free_overhead_stays_mode_d(tmp_path: Path) -> None:
    tif = tmp_path / "small.tif"
    tifffile.imwrite(tif, np.zeros((8192, 4, 4), np.uint8), photometric="minisblack")
    assert len(scan_tiff(tif, tif.stat().st_size).pages) == 8192


def many_subifds(path: Path, n: int) -> int:
    """One good 64 x 64 uint8 page whose SubIFDs tag lists `n` offsets, every one of the same
    small IFD (red team 56 listed 2^20 of one with 4,095 entries: 4 MB)."""
    pixels = bytes(range(256)) * 16
    junk_at = 8 + len(pixels)
    junk = struct.pack("<H", 8) + b"".join(struct.pack("<HHIHH", 40000 + i, 3, 1, i, 0)
                                          for i in range(8)) + struct.pack("<I", 0)  # fmt: skip
    ifd_at = junk_at + len(junk)
    tags = [(256, 4, 1, 64), (257, 4, 1, 64), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, 1, 8), (277, 3, 1, 1), (278, 4, 1, 64), (279, 4, 1, 4096)]  # fmt: skip
    offsets_at = ifd_at + 2 + 12 * (len(tags) + 1) + 4
    table = struct.pack("<H", len(tags) + 1)
    for tag, kind, count, value in tags:
        fmt = "<HHIHH" if kind == 3 else "<HHII"
        table += (
            struct.pack(fmt, tag, kind, count, value, 0)
            if kind == 3
            else struct.pack(fmt, tag, kind, count, value)
        )
    table += struct.pack("<HHII", 330, 4, n, offsets_at) + struct.pack("<I", 0)
    data = b"II*\x00" + struct.pack("<I", ifd_at) + pixels + junk + table
    data += struct.pack(f"<{n}I", *([junk_at] * n))
    path.write_bytes(data)
    return len(data)


def _pages_parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every TiffPage tifffile builds from now on (one item each)."""
    built: list[int] = []
    init = tifffile.TiffPage.__init__

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(tifffile.TiffPage, "__init__", counted)
    return built


def test_a_page_listing_thousands_of_subifds_is_scanned_without_parsing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generic series of tifffile parses every SubIFD as a page (2^20 of them held the shared
    pack worker for over 30 minutes): the scan asks for no series of a file that names no axes."""
    path = tmp_path / "subifds.tif"
    size = many_subifds(path, 3000)
    built = _pages_parsed(monkeypatch)
    layout = scan_tiff(path, size)
    assert (layout.plane_order, len(layout.pages)) == (("z",), 1)
    assert len(built) <= 2, f"{len(built)} pages parsed for a file of one page"


def test_a_named_series_keeps_its_axes_unless_it_declares_too_many_subifds(
    tmp_path: Path,
) -> None:
    from vfs.decant.tiffscan import MAX_SERIES_SUBIFDS, _leading

    path = tmp_path / "czyx.ome.tif"
    tifffile.imwrite(path, np.zeros((2, 3, 8, 8), np.uint16), metadata={"axes": "CZYX"})
    with tifffile.TiffFile(path) as tif:
        assert tif.is_ome
        assert _leading(tif, 6, 0) == (("c", "z"), (2, 3))
        assert _leading(tif, 6, MAX_SERIES_SUBIFDS + 1) == (("z",), (6,))
    assert scan_tiff(path, path.stat().st_size).plane_order == ("c", "z")


def _ome(pixels: str, extra: str = "") -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06">'
        '<Image ID="Image:0"><Pixels ID="Pixels:0" DimensionOrder="XYZCT" Type="uint8" '
        f'SizeX="32" SizeY="32" {pixels}>{extra}</Pixels></Image></OME>'
    )


@pytest.mark.parametrize(
    ("pixels", "extra"),
    [
        ('SizeZ="100000000" SizeC="1" SizeT="1"', '<TiffData IFD="0" PlaneCount="100000000"/>'),
        ('SizeZ="4" SizeC="50000" SizeT="50000"', '<TiffData IFD="0" PlaneCount="4"/>'),
        (
            'SizeZ="4" SizeC="1" SizeT="1"',
            '<TiffData IFD="0"><UUID FileName="/dev/zero">x</UUID></TiffData>',
        ),
    ],
)
def test_an_ome_xml_declaring_more_than_the_file_holds_is_not_asked_for_its_series(
    tmp_path: Path, pixels: str, extra: str
) -> None:
    """A 4.7 KB OME-TIFF declaring 10^8 planes made tifffile allocate 1.6 GB (red team 56); one
    naming another file has tifffile open it. Neither is asked for its series: a flat stack."""
    path = tmp_path / "hostile.ome.tif"
    tifffile.imwrite(path, np.zeros((4, 32, 32), np.uint8), photometric="minisblack",
                     description=_ome(pixels, extra),
                     metadata=None)  # fmt: skip
    tracemalloc.start()
    try:
        layout = scan_tiff(path, path.stat().st_size)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert layout.plane_order == ("z",) and len(layout.pages) == 4
    assert peak < 20 << 20, f"peak {peak / 1e6:.0f} MB"


def test_an_ome_xml_that_declares_what_the_file_holds_keeps_its_axes(tmp_path: Path) -> None:
    """As Bio-Formats writes one file: its TiffData names the file itself (its own UUID)."""
    path = tmp_path / "fine.ome.tif"
    own = "urn:uuid:00000000-0000-4000-8000-000000000056"
    xml = _ome(
        'SizeZ="2" SizeC="2" SizeT="1"',
        f'<TiffData IFD="0" PlaneCount="4"><UUID FileName="fine.ome.tif">{own}</UUID></TiffData>',
    ).replace("<OME ", f'<OME UUID="{own}" ')
    tifffile.imwrite(
        path,
        np.zeros((4, 32, 32), np.uint8),
        photometric="minisblack",
        description=xml,
        metadata=None,
    )
    assert scan_tiff(path, path.stat().st_size).plane_order == ("c", "z")


def test_an_imagej_description_declaring_more_images_than_pages_is_a_flat_stack(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ij.tif"
    tifffile.imwrite(path, np.zeros((2, 3, 16, 16), np.uint8), imagej=True,
                     metadata={"axes": "ZCYX"})  # fmt: skip
    assert scan_tiff(path, path.stat().st_size).plane_order == ("z", "c")
    raw = path.read_bytes().replace(b"images=6", b"images=9")  # same length: offsets hold
    assert raw != path.read_bytes()
    path.write_bytes(raw)
    assert scan_tiff(path, path.stat().st_size).plane_order == ("z",)


def tags_at_one_blob(path: Path, pages: int, count: int, entries: int, kind: int = 3) -> int:
    """`pages` one-strip 4x4 pages whose IFDs each hold `entries` extra entries (private tag
    codes) of `count` values of TIFF type `kind`, all pointing at one shared blob."""
    size = {3: 2, 5: 8}[kind] * count
    blob, strip = 8, 8 + size
    first = strip + 16
    base = [(256, 3, 1, 4), (257, 3, 1, 4), (258, 3, 1, 8), (273, 4, 1, strip), (277, 3, 1, 1),
            (278, 3, 1, 4), (279, 4, 1, 16)]  # fmt: skip
    tags = base + [(65000 + i, kind, count, blob) for i in range(entries)]
    ifd_size = 2 + 12 * len(tags) + 4
    out = bytearray(b"II*\x00" + struct.pack("<I", first)) + bytes(size) + bytes(range(16))
    for p in range(pages):
        nxt = first + (p + 1) * ifd_size if p < pages - 1 else 0
        out += struct.pack("<H", len(tags))
        out += b"".join(struct.pack("<HHII", *t) for t in tags) + struct.pack("<I", nxt)
    path.write_bytes(out)
    return len(out)


def test_tag_values_that_share_one_blob_are_counted_before_tifffile_reads_them(
    tmp_path: Path,
) -> None:
    """Red team 75, F1: entries of one IFD all pointing at one blob of SHORTs: tifffile made a
    tuple of Python ints of each (~36 bytes a value), 1.6 GiB of the daemon for a 4 MB file."""
    from tests.toolbox import traced_peak

    path = tmp_path / "dup.tif"
    size = tags_at_one_blob(path, pages=1, count=200_000, entries=20)

    def scan() -> str:
        with pytest.raises(NotByteExact) as refused:
            scan_tiff(path, size)
        return str(refused.value)

    why, peak = traced_peak(scan)
    assert "IFD 1's tag values: 4000000 numbers" in why
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB traced for a {size / 1e6:.1f} MB file"


def test_tag_values_repeated_on_every_page_are_bounded_for_the_chain(tmp_path: Path) -> None:
    """Red team 75, F2: every page's IFD pointing at one 8 MB blob: tifffile read it again for
    each page (2,500 pages: the pack worker, shared by every user, held 3 minutes)."""
    path = tmp_path / "pages.tif"
    size = tags_at_one_blob(path, pages=300, count=8_000, entries=1, kind=5)
    with pytest.raises(NotByteExact, match=r"the tag values of its first \d+ IFDs"):
        scan_tiff(path, size)


def test_an_ome_xml_of_too_many_elements_is_not_parsed(tmp_path: Path) -> None:
    """Red team 75, F1: 4 million empty elements (16 MB): 895 MiB of ElementTree. The pages
    are packed as a flat stack; the description stays in the husk as it was."""
    from tests.toolbox import traced_peak

    path = tmp_path / "ome.tif"
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?><OME xmlns="http://www.openmicroscopy.org/'
        'Schemas/OME/2016-06"><Image ID="Image:0"><Pixels ID="Pixels:0" DimensionOrder="XYZCT"'
        ' Type="uint8" SizeX="4" SizeY="4" SizeZ="1" SizeC="1" SizeT="2">'
        + "<a/>" * 250_000
        + "</Pixels></Image></OME>"
    )
    data = np.zeros((2, 4, 4), np.uint8)
    tifffile.imwrite(path, data, photometric="minisblack", description=xml, metadata=None)
    with tifffile.TiffFile(path) as tif:
        assert tif.is_ome
    layout, peak = traced_peak(lambda: scan_tiff(path, path.stat().st_size))
    assert (layout.plane_order, layout.storage_leading) == (("z",), (2,))  # not ("t",)
    assert peak < 24 << 20, f"{peak / 2**20:.0f} MiB traced"


def test_metamorph_uic1_entries_count_as_what_tifffile_makes_of_them(tmp_path: Path) -> None:
    """Red team 77, F1a: UIC1tag (33628), which tifffile always loads, read as `count` dicts
    of two 255-character strings each: 2^20 entries pointing at one 520-byte blob took the
    daemon to 1 GiB, within the numbers bound. Each counts as 32 numbers now."""
    blob, strip = 8, 8 + 520
    first = strip + 16
    n = 1 << 16
    tags = [(256, 3, 1, 4), (257, 3, 1, 4), (258, 3, 1, 8), (273, 4, 1, strip), (277, 3, 1, 1),
            (278, 3, 1, 4), (279, 4, 1, 16), (33628, 4, 2 * n, blob)]  # fmt: skip
    out = bytearray(b"II*\x00" + struct.pack("<I", first)) + bytes(520) + bytes(range(16))
    out += struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", *t) for t in tags)
    path = tmp_path / "uic.tif"
    path.write_bytes(out + struct.pack("<I", 0))
    with pytest.raises(NotByteExact, match="IFD 1's tag values"):
        scan_tiff(path, path.stat().st_size)


def test_an_ome_xml_of_too_many_attributes_is_not_parsed(tmp_path: Path) -> None:
    """Red team 77, F1b: one element with 3 million empty attributes passed the count of
    elements, and ElementTree took the daemon to 1 GiB. Attributes count too."""
    from tests.toolbox import traced_peak

    path = tmp_path / "attrs.tif"
    attrs = " ".join(f"a{i}=''" for i in range(300_000))
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?><OME xmlns="http://www.openmicroscopy.org/'
        f'Schemas/OME/2016-06" {attrs}><Image ID="Image:0"><Pixels ID="Pixels:0" '
        'DimensionOrder="XYZCT" Type="uint8" SizeX="4" SizeY="4" SizeZ="1" SizeC="1" '
        'SizeT="2"><TiffData/></Pixels></Image></OME>'
    )
    data = np.zeros((2, 4, 4), np.uint8)
    tifffile.imwrite(path, data, photometric="minisblack", description=xml, metadata=None)
    layout, peak = traced_peak(lambda: scan_tiff(path, path.stat().st_size))
    assert (layout.plane_order, layout.storage_leading) == (("z",), (2,))
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB traced"


def test_many_strips_too_small_to_carry_mode_d_go_verbatim_before_tifffile_reads_them(
    tmp_path: Path,
) -> None:
    """Red team 84: a 16 MB TIFF of 2 million one-byte strips (or 1x1 tiles), under mode D's
    segment bound, was packed in mode D: the daemon peaked at 2.3-2.8 GiB whatever its cache,
    40 s of the shared pack worker, a 51 MB archive. Past 65,536 segments they must average
    1 KiB, told from the file's size before tifffile reads any offsets."""
    import os

    path = tmp_path / "strips.tif"
    data = np.arange(100_000, dtype=np.uint8).reshape(100_000, 1)
    tifffile.imwrite(path, data, rowsperstrip=1)  # 100,000 strips of one byte
    tracemalloc.start()
    try:
        with pytest.raises(NotByteExact, match="more per strip or tile than its pixels"):
            scan_tiff(path, os.path.getsize(path))
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB traced: tifffile read the offsets"


def test_the_segment_rule_leaves_real_layouts_alone() -> None:
    from vfs.decant.tiffscan import _check_segments

    _check_segments(2_000_000, 2_000_000 * 4096)  # one 4 KiB row a strip: mode D as before
    _check_segments(65_536, 65_536)  # few enough, whatever their size
    with pytest.raises(NotByteExact):
        _check_segments(65_537, 65_537 * 8)
