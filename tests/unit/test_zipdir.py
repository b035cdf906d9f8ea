"""The compact zip directory (vfs.decant.zipdir) reads what zipfile reads, refuses what a hostile
zip can claim, and costs a fraction of zipfile's memory an entry."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.toolbox import traced_peak, zip_of_many
from vfs.decant import zipdir
from vfs.decant.store import ZipArchiveStore
from vfs.decant.zipdir import ZipDirectory
from vfs.errors import CorruptArchiveError

PART = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"), min_size=1,
               max_size=12)  # fmt: skip
ENTRY = st.tuples(
    st.lists(PART, min_size=1, max_size=3).map("/".join),
    st.binary(max_size=400),
    st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]),
    st.binary(max_size=12),  # the body of an extra field of ours
    st.binary(max_size=8),  # comment
    st.booleans(),  # ZIP64 records
)


def build(entries: list[tuple[str, bytes, int, bytes, bytes, bool]], prefix: bytes) -> bytes:
    """A zip zipfile writes, after `prefix` (as a self-extracting archive has its stub)."""
    out = io.BytesIO()
    out.write(prefix)
    with zipfile.ZipFile(out, "w") as zf:
        for name, data, method, extra, comment, zip64 in entries:
            info = zipfile.ZipInfo(name, (2026, 12, 1, 0, 0, 0))
            info.compress_type = method
            info.extra = struct.pack("<HH", 0xCAFE, len(extra)) + extra
            info.comment = comment
            with zf.open(info, "w", force_zip64=zip64) as member:
                member.write(data)
    return out.getvalue()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entries=st.lists(ENTRY, max_size=12, unique_by=lambda e: e[0]),
    prefix=st.binary(max_size=40),
    window=st.sampled_from([zipdir.WINDOW, 64, 200]),
    max_groups=st.sampled_from([zipdir.MAX_GROUPS, 1]),
)
def test_the_directory_is_the_one_zipfile_reads(
    entries: list[tuple[str, bytes, int, bytes, bytes, bool]],
    prefix: bytes,
    window: int,
    max_groups: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(zipdir, "WINDOW", window)  # small windows: records cross their ends
    monkeypatch.setattr(zipdir, "MAX_GROUPS", max_groups)  # 1: listed without groups
    path = tmp_path / "z.zip"
    path.write_bytes(build(entries, prefix))
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        with ZipArchiveStore(path) as store:
            directory = store._entries
            assert list(directory.names()) == [i.filename for i in infos]
            for info in infos:
                got = directory.get(info.filename)
                assert got is not None
                assert got[1:] == (
                    info.filename, info.header_offset, info.compress_size, info.file_size,
                    info.CRC, info.compress_type, info.flag_bits, len(info.extra),
                )  # fmt: skip
                assert store.get(info.filename, 1 << 20) == zf.read(info)
            for head in {i.filename.partition("/")[0] for i in infos}:
                assert store.listed(f"{head}/") == [
                    i.filename for i in infos if i.filename.startswith(f"{head}/")
                ]
            if infos:
                first = min(infos, key=lambda i: i.header_offset)
                entry = directory.get(first.filename)
                assert entry is not None
                by_offset = sorted(infos, key=lambda i: i.header_offset)[1:]
                assert [e.name for e in directory.following(entry, 64)] == [
                    i.filename for i in by_offset
                ]
            assert directory.get("no such entry") is None
            assert not store.has("a/\udcff")  # not even encodable


def test_listing_each_of_many_first_parts_is_not_a_scan_of_every_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 102 F2: a series of 3,000 members keeps no groups (more first parts than
    MAX_GROUPS), and its describe listed each member's `husk_N/` by decoding every name:
    36 million names, 18-65 s for a 4.6 MB archive. Each listing now reads its own names."""
    count = 3 * zipdir.MAX_GROUPS
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for n in range(count):
            zf.writestr(f"husk_{n}/.zarray", b"{}")
            zf.writestr(f"husk_{n}/0", b"x")
        zf.writestr("husk_1x/0", b"a first part only a prefix of another's")
    raws = 0
    raw = ZipDirectory._raw

    def counted(self: ZipDirectory, row: int) -> bytes:
        nonlocal raws
        raws += 1
        return raw(self, row)

    monkeypatch.setattr(ZipDirectory, "_raw", counted)
    with ZipArchiveStore(path) as store:
        assert store._entries._groups is None
        for n in range(count):
            assert store.listed(f"husk_{n}/") == [f"husk_{n}/.zarray", f"husk_{n}/0"]
        assert store.listed("husk_1x/") == ["husk_1x/0"]
        assert store.listed("husk_/") == []
    assert raws < 10 * 2 * count  # a scan a listing: 2 * count each


def test_a_cp437_name_is_read_as_zipfile_reads_it(tmp_path: Path) -> None:
    """Without the UTF-8 flag a name is cp437 (0x81 is ü), in the directory and local header."""
    data = bytearray(build([("a/x", b"pixels", zipfile.ZIP_STORED, b"", b"", False)], b""))
    for at in (data.index(b"PK\x03\x04") + 30, data.index(b"PK\x01\x02") + 46):
        assert data[at : at + 3] == b"a/x"
        data[at + 2] = 0x81
    path = tmp_path / "cp437.zip"
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as zf:
        assert zf.namelist() == ["a/\u00fc"]
    with ZipArchiveStore(path) as store:
        assert list(store.all_keys()) == ["a/\u00fc"]
        assert store.get("a/\u00fc", 100) == b"pixels"


def zip_with(change: object, tmp_path: Path, name: str = "bad.zip") -> Path:
    """The zip of two small entries, its bytes passed through `change` (a function)."""
    two = [("a/0", b"zero", zipfile.ZIP_STORED, b"", b"", False),
           ("a/1", b"one", zipfile.ZIP_STORED, b"", b"", False)]  # fmt: skip
    data = bytearray(build(two, b""))
    change(data)  # type: ignore[operator]
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def central(data: bytearray, n: int) -> int:
    at = -1
    for _ in range(n + 1):
        at = data.index(b"PK\x01\x02", at + 1)
    return at


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("signature", "central directory is damaged"),
        ("name past the end", "central directory is truncated"),
        ("duplicate", "two entries named 'a/0'"),
        ("nul", "holds a NUL"),
        ("version", "needs zip version 9.9"),
        ("zip64 without its field", "damaged ZIP64 extra field"),
        ("not utf-8", "is not valid UTF-8"),
        ("no end record", "no end record"),
    ],
)
def test_a_damaged_directory_is_refused_by_name(case: str, message: str, tmp_path: Path) -> None:
    def change(data: bytearray) -> None:
        second = central(data, 1)
        if case == "signature":
            data[second : second + 4] = b"PK\x09\x09"
        elif case == "name past the end":
            struct.pack_into("<H", data, second + 28, 5000)
        elif case == "duplicate":
            data[second + 46 : second + 49] = b"a/0"
        elif case == "nul":
            data[second + 48] = 0
        elif case == "version":
            data[second + 6] = 99
        elif case == "zip64 without its field":
            struct.pack_into("<I", data, second + 20, 0xFFFFFFFF)
        elif case == "not utf-8":
            struct.pack_into("<H", data, second + 8, 0x800)
            data[second + 48] = 0xFF
        elif case == "no end record":
            data[data.rindex(b"PK\x05\x06") : data.rindex(b"PK\x05\x06") + 4] = b"PK\x00\x00"

    path = zip_with(change, tmp_path)
    with pytest.raises(CorruptArchiveError, match=message) as info:
        ZipArchiveStore(path)
    assert str(path) in str(info.value)


def test_the_records_are_counted_not_the_end_records_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An end record that claims one entry does not let a directory hold a million."""
    monkeypatch.setattr(zipdir, "MAX_ZIP_ENTRIES", 50)
    with open(zip_of_many(tmp_path / "ok.zip", 50), "rb") as fh:
        assert len(ZipDirectory("ok", fh)) == 50
    lying = zip_of_many(tmp_path / "lying.zip", 51, claim=1)
    with pytest.raises(CorruptArchiveError, match="holds more than 50 entries"):
        ZipArchiveStore(lying)


def test_entries_zipfile_reads_but_decant_does_not_are_refused_when_read(tmp_path: Path) -> None:
    def method_and_flag(data: bytearray) -> None:
        for at in (data.index(b"PK\x03\x04"), central(data, 0)):
            struct.pack_into("<H", data, at + (8 if at == central(data, 0) else 6), 0x1)
        for at in (data.rindex(b"PK\x03\x04"), central(data, 1)):
            struct.pack_into("<H", data, at + (10 if at == central(data, 1) else 8), 12)

    path = zip_with(method_and_flag, tmp_path)
    with ZipArchiveStore(path) as store:
        with pytest.raises(CorruptArchiveError, match="'a/0' is encrypted"):
            store.get("a/0", 100)
        with pytest.raises(CorruptArchiveError, match="compression method 12"):
            store.get("a/1", 100)


def test_a_damaged_deflated_entry_fails_its_check(tmp_path: Path) -> None:
    body = bytes(range(256)) * 40
    data = bytearray(build([("a/0", body, zipfile.ZIP_DEFLATED, b"", b"", False)], b""))
    path = tmp_path / "good.zip"
    path.write_bytes(bytes(data))
    with ZipArchiveStore(path) as store:
        assert store.get("a/0", len(body)) == body
        with pytest.raises(CorruptArchiveError, match="holds 10240 bytes, more than"):
            store.get("a/0", len(body) - 1)
    data[30 + 3 + 40] ^= 0x55  # within the deflated stream
    path.write_bytes(bytes(data))
    with ZipArchiveStore(path) as store, pytest.raises(CorruptArchiveError, match="'a/0'"):
        store.get("a/0", len(body))


def test_an_entry_costs_a_fraction_of_what_zipfile_makes_of_it(tmp_path: Path) -> None:
    """50,000 one-byte entries: zipfile allocates ~600 bytes an entry (a ZipInfo, its name, a
    date tuple, a dozen ints); the directory keeps the name and ~50 bytes of columns."""
    count = 50_000
    path = zip_of_many(tmp_path / "many.zip", count)
    _, theirs = traced_peak(lambda: zipfile.ZipFile(path).infolist())
    store, ours = traced_peak(lambda: ZipArchiveStore(path))
    with store:
        assert store.get(f"a/{count - 1}", 1) == b"x"
        assert len(store.listed("a/")) == count
    assert theirs > 400 * count  # what the bound below is measured against
    assert ours < 200 * count, f"{ours // count} bytes an entry"


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=6),
    window=st.sampled_from([zipdir.WINDOW, 50]),
)
def test_any_damage_to_the_directory_is_refused_or_read_as_zipfile_reads_it(
    flips: list[tuple[int, int]], window: int
) -> None:
    """Bytes changed anywhere from the central directory on (records, ZIP64 fields, end
    records): the store opens or raises CorruptArchiveError, nothing else; what it opens holds
    the entries zipfile reads, where zipfile reads any."""
    entries = [(f"a/{n}", bytes([n]) * 40, zipfile.ZIP_STORED, b"", b"", n == 1) for n in range(3)]
    data = bytearray(build(entries, b""))
    start = data.index(b"PK\x01\x02")
    for at, xor in flips:
        data[start + at % (len(data) - start)] ^= xor
    raw = bytes(data)
    zipdir.WINDOW, saved = window, zipdir.WINDOW
    try:
        try:
            ours = list(ZipDirectory("fuzzed", io.BytesIO(raw)).names())
        except CorruptArchiveError as exc:
            assert str(exc).startswith("fuzzed: ")
            return
    finally:
        zipdir.WINDOW = saved
    try:
        theirs = zipfile.ZipFile(io.BytesIO(raw)).namelist()
    except Exception:
        return  # zipfile refuses what this reads (e.g. a bad extra field it parses and we skip)
    assert ours == theirs


def test_large_directories_are_parsed_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory past LARGE_DIRECTORY waits for the one-at-a-time lock before it is parsed
    (a user's many links to one huge zip, listed at once, parsed together cost their sum); a
    smaller one does not. The lock is held here, as another parse would hold it: the large
    parse must not finish until it is let go. Through a mount: test_redteam30 (slow tests)."""
    import threading

    big = zip_of_many(tmp_path / "big.zip", 2000)  # a ~90 KB directory
    small = zip_of_many(tmp_path / "small.zip", 10)
    monkeypatch.setattr(zipdir, "LARGE_DIRECTORY", 4096)
    parsed: list[ZipDirectory] = []

    def parse(path: Path) -> None:
        with open(path, "rb") as fh:
            parsed.append(ZipDirectory(path, fh))

    with zipdir._LARGE:
        parse(small)  # not held up
        waiting = threading.Thread(target=parse, args=(big,))
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive() and len(parsed) == 1  # waits its turn
    waiting.join(10)
    assert not waiting.is_alive() and len(parsed) == 2
    assert len(parsed[1]) == 2000
