"""Red team, round 34a: the read side of AcqStore collections and GDI packages, through a real
mount.

Expected bytes (or the expected failure) come from what was handed to the writers (the arrays
and chunk bytes written, the TAR plaintext), never from vfs.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.conftest import load_tool
from tests.mount.conftest import RUNUSER, Mount, User, open_tmp
from tests.mount.helpers import dd_direct, small_reads_fail_within
from tests.mount.test_redteam33b import swapped_segments

acq: ModuleType = load_tool("make_acqstore_corpus")

PLANE = (1024, 1024)  # uint8: a 1 MiB plane, the size the daemon's buffer pool recycles


def test_the_daemon_runs_this_worktree_s_code(tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    """The mount these tests start runs `python -m vfs.cli` from this worktree (its cwd comes
    first on sys.path), not another checkout's `vfs`."""
    src = tmp_path / "src"
    src.mkdir()
    m = make_mount(src)
    assert m.proc is not None
    here = Path(__file__).resolve().parents[2]
    assert Path(f"/proc/{m.proc.pid}/cwd").resolve() == here
    environ = Path(f"/proc/{m.proc.pid}/environ").read_bytes().split(b"\0")
    assert not any(e.startswith(b"PYTHONPATH=") for e in environ)


def _as_user(u: User, *cmd: str) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    return subprocess.run([RUNUSER, "-u", u.name, "--", *cmd], capture_output=True, timeout=60,
                          cwd="/", env=env, check=False)  # fmt: skip


def _image(
    path: Path,
    shape: tuple[int, ...],
    compressor: dict | None,
    chunk: bytes,
    filters: list[dict] | None = None,
) -> None:
    """An OME-Zarr folder (zarr v2, one level) whose only chunk file holds `chunk` as given."""
    shutil.rmtree(path, ignore_errors=True)
    (path / "0").mkdir(parents=True)
    axes = "zyx"[-len(shape) :]
    (path / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    attrs = acq._multiscales(acq.ngff_axes(axes), [[1.0] * len(shape)])
    (path / ".zattrs").write_text(json.dumps(attrs))
    zarray = {"zarr_format": 2, "shape": list(shape), "chunks": list(shape), "dtype": "|u1",
              "compressor": compressor, "fill_value": 0, "filters": filters,
              "order": "C"}  # fmt: skip
    (path / "0" / ".zarray").write_text(json.dumps(zarray))
    key = ".".join("0" * len(shape))
    (path / "0" / key).write_bytes(chunk)


def _collection(root: Path) -> Path:
    """The corpus collection; its member img-a's reference image is `images/reference.zarr`."""
    acq.make_collection(root)
    return root / "images" / "reference.zarr"


@pytest.mark.parametrize("codec", ["zstd", "gzip", "blosc"])
def test_a_chunk_that_decodes_short_is_an_error_not_another_image_s_pixels(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, codec: str
) -> None:
    """A synthesized TIFF's plane is decoded into a recycled buffer of the daemon's pool (planes
    of other images it served). numcodecs' decode into `out` fills only what the stream holds:
    a chunk stating 16 bytes where the plane has 1 MiB left the rest of the buffer as it was,
    and the TIFF served it with exit 0 -- a plane of another user's image, read by someone who
    could not read that image in SRC. A chunk must decode to exactly its plane, else EIO."""
    import numcodecs

    u = unprivileged
    base = open_tmp(tmp_path_factory, f"rt34a-short-{codec}")
    src = base / "src"
    secret_root, mine_root = src / "secret", src / "mine"
    rng = np.random.default_rng(5)
    secret = rng.integers(1, 255, (8, *PLANE), dtype=np.uint8)  # no zero byte in it
    acq.make_collection(secret_root)
    acq.write_ome_zarr(secret_root / "images/reference.zarr", secret, "zyx", [1.0, 1.0, 1.0])
    os.chmod(secret_root, 0o700)  # root's: the user cannot read any of it
    factory = {"zstd": numcodecs.Zstd, "gzip": numcodecs.GZip, "blosc": numcodecs.Blosc}[codec]
    written = np.zeros(16, np.uint8)
    chunk = factory().encode(written)
    _image(_collection(mine_root), PLANE, factory().get_config(), chunk)
    subprocess.run(["chown", "-R", f"{u.uid}:{u.gid}", str(mine_root)], check=True)
    src.chmod(0o755)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--cache-size", "8M")
        view = m.mnt / "secret" / "members" / "Kymograph 1" / "reference.tif"
        served = view.read_bytes()  # root reads its image: planes pass through the pool
        assert secret[0].tobytes() in served
        mine = m.mnt / "mine" / "members" / "Kymograph 1" / "reference.tif"
        got = _as_user(u, "/usr/bin/cat", str(mine))
        body = got.stdout
        leaked = sum(plane.tobytes()[4096:8192] in body for plane in secret)
        assert got.returncode != 0 and b"Input/output error" in got.stderr, (
            f"a {codec} chunk of {len(written)} bytes for a {PLANE} plane was served "
            f"(exit {got.returncode}, {len(body)} bytes, holding pixels of {leaked} of "
            "root's planes)"
        )
    finally:
        m.stop()


def _reference_at(rel: str):  # type: ignore[no-untyped-def]
    def change(doc: dict) -> None:  # type: ignore[type-arg]
        doc["members"][0]["reference_image"]["ome_zarr"] = rel

    return change


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


@functools.cache
def _bz2_bomb() -> bytes:
    """bz2 of 1 GiB of zeros (~5 s to make: once for every test here)."""
    import bz2

    return bz2.compress(bytes(1 << 30))


@pytest.mark.parametrize("way", ["folder", "filtered", "zip"])
def test_a_compression_bomb_chunk_costs_the_daemon_no_more_than_its_plane(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
    way: str,
) -> None:
    """A collection image's `.zarray` may name any numcodecs compressor. A bz2 chunk of a few
    KiB (within the bound a 4 KiB plane's chunk file may have) inflates to GiBs: numcodecs
    decodes it whole before copying it into the plane, so one read of a 4 KiB TIFF plane made
    the daemon allocate all of it (its peak RSS grew by the bomb), and a few users at once end
    it for everyone. A chunk is decoded to at most its plane's size, else EIO."""
    root = tmp_path / "src" / "col"
    bomb = _bz2_bomb()  # 1 GiB of zeros, 785 bytes stored: within compressed_bound(64 * 64)
    image = _collection(root)
    filters = [{"id": "delta", "dtype": "|u1"}] if way == "filtered" else None
    _image(image, (64, 64), {"id": "bz2", "level": 9}, bomb, filters)
    if way == "zip":  # the same keys in a STORED `.ozx`: read by zarr-python's ZipStore
        with zipfile.ZipFile(image.with_suffix(".ozx"), "w") as zf:
            for file in sorted(p for p in image.rglob("*") if p.is_file()):
                zf.write(file, file.relative_to(image).as_posix())
        shutil.rmtree(image)
        acq._edit(root, "acqstore/collection.json", _reference_at("images/reference.ozx"))
    m = make_mount(tmp_path / "src")
    assert m.proc is not None
    before = _peak_rss_mib(m.proc.pid)
    tif = m.mnt / "col" / "members" / "Kymograph 1" / "reference.tif"
    with pytest.raises(OSError) as failed:
        tif.read_bytes()
    grew = _peak_rss_mib(m.proc.pid) - before
    assert grew < 256, f"reading a 4 KiB plane grew the daemon's peak RSS by {grew:.0f} MiB"
    assert failed.value.errno == 5


def _v3_image(path: Path, codecs: list[dict], chunk: bytes) -> None:
    """An OME-Zarr 0.5 folder (zarr v3, one 64 x 64 uint8 level) whose chunk holds `chunk`."""
    shutil.rmtree(path, ignore_errors=True)
    (path / "0" / "c").mkdir(parents=True)
    ms = acq._multiscales(acq.ngff_axes("yx"), [[1.0, 1.0]])["multiscales"]
    group = {"zarr_format": 3, "node_type": "group",
             "attributes": {"ome": {"version": "0.5", "multiscales": ms}}}  # fmt: skip
    (path / "zarr.json").write_text(json.dumps(group))
    array = {"zarr_format": 3, "node_type": "array", "shape": [64, 64], "data_type": "uint8",
             "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [64, 64]}},
             "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
             "fill_value": 0, "codecs": codecs, "attributes": {}}  # fmt: skip
    (path / "0" / "zarr.json").write_text(json.dumps(array))
    (path / "0" / "c" / "0").mkdir()
    (path / "0" / "c" / "0" / "0").write_bytes(chunk)


def test_a_compression_bomb_chunk_of_a_zarr_v3_image_is_bounded_too(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """The same bomb in a Zarr v3 image that zarr-python decodes (a transpose before `bytes`
    keeps it off the fast path): a gzip chunk of 1 MiB for a 4 KiB plane."""
    import zlib

    root = tmp_path / "src" / "col"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(64 << 20)
    bomb = b"".join(packer.compress(block) for _ in range(16)) + packer.flush()  # 1 GiB
    codecs = [{"name": "transpose", "configuration": {"order": [1, 0]}},
              {"name": "bytes"}, {"name": "gzip", "configuration": {"level": 9}}]  # fmt: skip
    _v3_image(_collection(root), codecs, bomb)
    m = make_mount(tmp_path / "src")
    assert m.proc is not None
    before = _peak_rss_mib(m.proc.pid)
    tif = m.mnt / "col" / "members" / "Kymograph 1" / "reference.tif"
    with pytest.raises(OSError) as failed:
        tif.read_bytes()
    grew = _peak_rss_mib(m.proc.pid) - before
    assert grew < 256, f"reading a 4 KiB plane grew the daemon's peak RSS by {grew:.0f} MiB"
    assert failed.value.errno == 5


# -- GDI packages ----------------------------------------------------------------------------

c4gh: ModuleType = load_tool("make_c4gh_corpus")
SEG = 65536
CIPHER_SEG = SEG + 28


def test_swapped_segments_stay_caught_when_another_segment_of_the_member_is_damaged(
    tmp_path: Path,
) -> None:
    """Segments authenticate alone, not their place: two segments of a member swapped both
    decrypt, and only the member's declared sha256 tells. A member read in part is verified in
    the background; but a segment that fails its MAC anywhere in the member ended that
    verification with no verdict ("authenticated": only the reads touching it fail), so one
    damaged segment at the member's end kept every small read of the swapped ones serving
    another segment's plaintext with exit 0, for good. A member whose declared digest cannot
    be checked is refused whole."""
    src, secret, name, data, off = swapped_segments(tmp_path, 12 * SEG, bad=10)

    m = Mount(src, tmp_path / "mnt", tmp_path / "log", tmp_path / "index")
    m.start("--c4gh-key", str(secret))
    try:
        member = m.mnt / "P.tar.c4gh" / name
        small_reads_fail_within(member, off, data[off : off + 4096], data, 15)
    finally:
        m.stop()


def test_a_damaged_manifest_does_not_switch_the_member_digests_off(tmp_path: Path) -> None:
    """`manifest.json` declares every member's sha256, the only check that tells segments
    swapped inside a member. One flipped bit in a segment wholly inside a manifest of a few
    segments made its read fail, and the package was then served with no member digests at
    all ("no member digests from manifest.json", at info level): segments swapped in a member
    were served with exit 0 however it was read. A manifest that fails authentication leaves
    nothing of the package served as checked: the package is shown raw."""
    keys = {n: c4gh.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(8 * SEG)
    name = "allele-freq.chr1.0.br10000000.00000000000000aa.parquet"
    members = [(name, data)]
    manifest = c4gh.manifest(members, notes="n" * (3 * SEG))  # spans four segments
    plain = c4gh.write_package(
        src / "P.tar.c4gh", [("manifest.json", manifest), *members],
        keys["writer"], [keys["node"]],
    )  # fmt: skip
    at, inside = plain.index(data), plain.index(manifest) // SEG + 2  # wholly in the manifest
    package = bytearray((src / "P.tar.c4gh").read_bytes())
    head = c4gh.header_len_of(bytes(package))
    a, b = at // SEG + 2, at // SEG + 4  # two segments wholly inside the member's data
    sa = slice(head + a * CIPHER_SEG, head + (a + 1) * CIPHER_SEG)
    sb = slice(head + b * CIPHER_SEG, head + (b + 1) * CIPHER_SEG)
    package[sa], package[sb] = package[sb], package[sa]
    package[head + inside * CIPHER_SEG + 100] ^= 0x01
    (src / "P.tar.c4gh").write_bytes(bytes(package))

    m = Mount(src, tmp_path / "mnt", tmp_path / "log", tmp_path / "index")
    m.start("--c4gh-key", str(keys["node"].secret_path))
    try:
        member = m.mnt / "P.tar.c4gh" / name
        whole = subprocess.run(["cat", str(member)], capture_output=True, timeout=30)
        assert whole.returncode != 0 or whole.stdout == data, (
            f"a member with two segments swapped was served whole ({len(whole.stdout)} bytes, "
            "not its plaintext) with exit 0"
        )
    finally:
        m.stop()


@pytest.mark.parametrize("how", ["rewritten", "replaced"])
def test_an_image_rewritten_after_it_was_read_serves_its_new_pixels(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
    how: str,
) -> None:
    """A synthesized TIFF's planes are kept in the daemon's cache by collection, image and
    page, and the kernel keeps its pages (the view's node is the same: its description, sizes
    and paths, did not change). An image whose chunk files were written anew in place, or
    replaced by a new folder renamed over it, went on serving its old pixels with exit 0."""
    root = tmp_path / "src" / "col"
    rng = np.random.default_rng(3)
    old, new = (rng.integers(0, 255, (2, 128, 128), dtype=np.uint8) for _ in range(2))
    image = _collection(root)
    acq.write_ome_zarr(image, old, "zyx", [1.0, 1.0, 1.0])
    m = make_mount(tmp_path / "src")
    tif = m.mnt / "col" / "members" / "Kymograph 1" / "reference.tif"
    first = tif.read_bytes()
    assert old[1].tobytes() in first
    if how == "rewritten":  # the same files, written again in place
        fresh = tmp_path / "fresh.zarr"
        acq.write_ome_zarr(fresh, new, "zyx", [1.0, 1.0, 1.0])
        for file in fresh.rglob("*"):
            if file.is_file():
                (image / file.relative_to(fresh)).write_bytes(file.read_bytes())
    else:
        acq.write_ome_zarr(tmp_path / "src" / "col" / "images" / "next.zarr", new, "zyx",
                           [1.0, 1.0, 1.0])  # fmt: skip
        shutil.rmtree(image)
        os.rename(image.with_name("next.zarr"), image)
    deadline = time.monotonic() + 10
    while True:
        served = tif.read_bytes()
        if new[1].tobytes() in served and new[0].tobytes() in served:
            break
        assert time.monotonic() < deadline, (
            f"10 s after its image was {how}, the TIFF still served "
            f"{'its old pixels' if old[1].tobytes() in served else 'other bytes'} with exit 0"
        )
        time.sleep(0.5)


def test_an_image_of_huge_planes_costs_the_daemon_no_memory(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """An image is its `.zarray`: a few hundred bytes may declare planes of any size, their
    chunks absent (the fill value). The synthesized TIFF's strip tables are built when the
    view is listed, one entry a strip of a row or more, so listing a collection whose image
    has 2^25 rows of 32 MiB made the daemon build 1.5 GiB of them (2^28 rows: more than this
    machine holds). Anyone who may create a folder in SRC could end the daemon for everyone."""
    what, shape = "2^25 strips", (1 << 25, 1 << 25)
    root = tmp_path / "src" / "col"
    image = _collection(root)
    shutil.rmtree(image)
    acq.write_ome_zarr_stub(image, shape, "uint8", "yx")
    m = make_mount(tmp_path / "src")
    assert m.proc is not None
    before = _peak_rss_mib(m.proc.pid)
    member = m.mnt / "col" / "members" / "Kymograph 1"
    done = dd_direct(member / "reference.tif", 1 << 20)  # inside the first plane
    grew = _peak_rss_mib(m.proc.pid) - before
    assert m.proc.poll() is None, f"the daemon ended: {done.stderr!r}"
    assert grew < 256, f"{what}: the daemon's peak RSS grew by {grew:.0f} MiB"
    assert (m.mnt / "col" / "acqstore" / "collection.json").is_file()


@pytest.mark.parametrize("private", ["array folder", "chunk file"])
def test_pixels_the_user_cannot_read_in_src_are_not_served_as_a_tiff(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, private: str
) -> None:
    """A member TIFF opens only for a caller who could read what it is made of. The check
    looked at the image folder alone: an image whose array folder is 0700 (or whose chunk
    file is 0600) of its owner, the folder around it readable, was served to any user as a
    TIFF, pixels included, though none of them could read a byte of it in SRC."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, f"rt34a-private-{private.replace(' ', '-')}")
    src = base / "src"
    root = src / "col"
    rng = np.random.default_rng(8)
    pixels = rng.integers(1, 255, (2, 64, 64), dtype=np.uint8)
    image = _collection(root)
    acq.write_ome_zarr(image, pixels, "zyx", [1.0, 1.0, 1.0])
    subprocess.run(["chmod", "-R", "a+rX", str(src)], check=True)
    if private == "array folder":
        (image / "0").chmod(0o700)
    else:
        for chunk in (image / "0").iterdir():
            if not chunk.name.startswith("."):
                chunk.chmod(0o600)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other")
        tif = m.mnt / "col" / "members" / "Kymograph 1" / "reference.tif"
        got = _as_user(u, "/usr/bin/cat", str(tif))
        leaked = pixels[0].tobytes() in got.stdout
        assert not leaked, (
            f"the user read pixels of an image whose {private} they cannot read in SRC "
            f"(exit {got.returncode}, {len(got.stdout)} bytes)"
        )
        assert b"Permission denied" in got.stderr, got.stderr
        assert pixels[0].tobytes() in tif.read_bytes()  # root still reads it
    finally:
        m.stop()


def test_a_verified_member_held_open_never_serves_segments_swapped_in_place(
    tmp_path: Path,
) -> None:
    """A member that verified opens with no running hash (segments carry MACs). A package
    rewritten in place (same inode: `dd conv=notrunc`, a tool writing into it) with two of the
    member's segments swapped gives every new open ESTALE and a fresh check, but a handle
    opened before went on reading the file it holds: the swapped segments decrypt, and it
    served another segment's plaintext with exit 0."""
    keys = {n: c4gh.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(8 * SEG)
    name = "allele-freq.chr1.0.br10000000.00000000000000aa.parquet"
    members = [(name, data)]
    path = src / "P.tar.c4gh"
    plain = c4gh.write_package(
        path, [("manifest.json", c4gh.manifest(members)), *members],
        keys["writer"], [keys["node"]],
    )  # fmt: skip
    at = plain.index(data)
    head = c4gh.header_len_of(path.read_bytes())
    a, b = at // SEG + 2, at // SEG + 4  # two segments wholly inside the member's data

    m = Mount(src, tmp_path / "mnt", tmp_path / "log", tmp_path / "index")
    m.start("--c4gh-key", str(keys["node"].secret_path))
    try:
        member = m.mnt / "P.tar.c4gh" / name
        assert member.read_bytes() == data
        deadline = time.monotonic() + 10
        while "verified sha256" not in m.log_text():
            assert time.monotonic() < deadline, "the member did not verify"
            time.sleep(0.1)
        fd = os.open(member, os.O_RDONLY)
        try:
            with open(path, "r+b") as fh:  # in place: the same inode
                fh.seek(head + a * CIPHER_SEG)
                first = fh.read(CIPHER_SEG)
                fh.seek(head + b * CIPHER_SEG)
                second = fh.read(CIPHER_SEG)
                fh.seek(head + a * CIPHER_SEG)
                fh.write(second)
                fh.seek(head + b * CIPHER_SEG)
                fh.write(first)
            time.sleep(1.5)  # the watcher sees it: the package is described anew
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # no page kept by the kernel
            off = a * SEG - at + 4096
            try:
                got = os.pread(fd, 4096, off)
            except OSError as exc:
                assert exc.errno in (5, 116), exc  # EIO or ESTALE
            else:
                assert got == data[off : off + 4096], (
                    "a handle held open on a verified member served another segment's "
                    f"plaintext with exit 0 (matches offset {data.find(got)}, asked {off})"
                )
        finally:
            os.close(fd)
    finally:
        m.stop()


def test_a_table_linked_to_a_private_file_tells_nothing_of_it(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A collection's CSV may be a symlink: validation checked it with `is_file()` and the view
    took its size with `stat()`, both through the link. The open is refused (no link is
    followed), but the view listed the table with the size of whatever the link named: a
    user's collection told them the size of root's 0600 file in a 0700 folder. A link is no
    table: the collection is invalid, and says why."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt34a-link-size")
    private = base / "private"
    private.mkdir(mode=0o700)
    secret = private / "secret.txt"
    secret.write_bytes(b"s" * 12345)
    secret.chmod(0o600)
    src = base / "src"
    root = src / "col"
    _collection(root)
    table = root / "acqstore" / "tables" / "velocity-pool.csv"
    table.unlink()
    table.symlink_to(secret)
    subprocess.run(["chown", "-hR", f"{u.uid}:{u.gid}", str(root)], check=True)
    src.chmod(0o755)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other")
        shown = m.mnt / "col" / "members" / "tables" / "velocity-pool.csv"
        size = _as_user(u, "/usr/bin/stat", "-c", "%s", str(shown)).stdout.strip()
        assert size != b"12345", "the view told the user the size of root's private file"
        assert "velocity-pool.csv' is a symlink" in m.log_text()
    finally:
        m.stop()
