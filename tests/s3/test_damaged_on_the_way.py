"""Bytes of a bucket archive damaged on the way (a flipped bit over plain http, a broken proxy):
the archive is refused for one --relist interval, not until a restart, and what was kept of it
(--disk-cache ranges, decoded pages) is dropped, so that the next try reads the store's bytes
(red team 58, F4: refused until a restart, and after it served from the damaged range kept)."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import socket
import tarfile
import time
from pathlib import Path

import numpy as np
import obstore
import pytest
import tifffile

from tests.mount.conftest import HAVE_FUSE
from tests.s3.conftest import MountFactory, S3Bucket, client
from tests.s3.stall import PassingProxy, _shut
from tests.toolbox import load_tool
from vfs.decant.packer import PackOptions, PackResult, pack_file

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3"),
]

EVERY = 256 << 10  # while armed, one bit of every EVERY bytes answered is flipped,
FIRST = 50_000  # the first this far in: past the small answers (HEAD, LIST) a connection opens with


class FlippingProxy(PassingProxy):
    """Passes everything on; while armed, flips one bit in each EVERY bytes of the answers
    (a chunk of the archive here holds ~800 KB)."""

    def __init__(self, upstream: int) -> None:
        super().__init__(upstream)
        self.armed = False
        self.flips = 0

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        seen = 0
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                if self.armed:
                    damaged = bytearray(data)
                    for at in range((FIRST - seen) % EVERY, len(data), EVERY):
                        damaged[at] ^= 0x40
                        self.flips += 1
                    data = bytes(damaged)
                seen += len(data)
                dst.sendall(data)
        _shut(src, dst)


@pytest.mark.parametrize("index", ["verified in the index", "fresh index"])
def test_an_archive_damaged_on_the_way_is_read_again_after_one_relist(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path, index: str
) -> None:
    rng = np.random.default_rng(58)
    tif = tmp_path / "stack.tif"
    tifffile.imwrite(tif, rng.integers(0, 4096, (6, 512, 1024), dtype=np.uint16))
    original = tif.read_bytes()
    archive = pack_file(tif, tmp_path / "stack.tif.zarr.zip", PackOptions()).archive
    obstore.put(client(s3_bucket), s3_bucket.key("stack.tif.zarr.zip"), archive.read_bytes())
    proxy = FlippingProxy(int(s3_bucket.endpoint.rsplit(":", 1)[1]))
    cache = tmp_path / "disk-cache"
    args = ("--disk-cache", str(cache), "--relist", "3", "--s3-endpoint", proxy.endpoint)
    try:
        if index.startswith("verified"):
            m = bucket_mount(s3_bucket.url(), *args, name="m2")
            assert (m.mnt / "stack.tif").read_bytes() == original
            m.stop()
            for entry in cache.iterdir():  # read from the store again, through the proxy
                entry.unlink()
        m2 = bucket_mount(s3_bucket.url(), *args, name="m2")
        assert (m2.mnt / "stack.tif").stat().st_size == len(original)  # described: its tail
        proxy.armed = True
        with pytest.raises(OSError) as err:  # the read that meets the damage
            (m2.mnt / "stack.tif").read_bytes()
        assert err.value.errno == errno.EIO and proxy.flips
        deadline = time.monotonic() + 20
        while os.getxattr(m2.mnt / "stack.tif", "user.decant.verified") != b"no":
            assert time.monotonic() < deadline, "not refused: " + m2.log.read_text()[-3000:]
            time.sleep(0.1)
        proxy.armed = False  # the store's bytes come through again
        deadline = time.monotonic() + 20  # the refusal holds 3 s; a verification may run
        while True:
            try:
                got = (m2.mnt / "stack.tif").read_bytes()
                break
            except OSError as exc:
                assert exc.errno == errno.EIO
                assert time.monotonic() < deadline, "refused: " + m2.log.read_text()[-3000:]
                time.sleep(0.5)
        assert got == original
        m2.stop()
        m3 = bucket_mount(s3_bucket.url(), *args, name="m2")  # a restart, with the ranges kept
        assert (m3.mnt / "stack.tif").read_bytes() == original
    finally:
        proxy.close()


@pytest.mark.parametrize("first", [700, 20_000])
def test_while_bits_flip_on_the_way_no_wrong_byte_is_served_and_all_comes_back_after(
    s3_bucket: S3Bucket,
    bucket_mount: MountFactory,
    packed_corpus: dict[str, PackResult],
    corpus: dict[str, Path],
    tmp_path: Path,
    first: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every corpus archive and a c4gh package's members read while one bit of every 48 KiB
    answered flips (`first`: 700 damages LIST and HEAD answers too, 20,000 mostly the zip tails
    and chunks): each read is byte-exact or EIO, never wrong, the log holds no traceback, and
    once the flips stop everything reads byte-exact again within a few relists. Before: a
    LIST answer with a damaged status line was a traceback and an EIO of the lookup, and
    archives left out or shown raw stayed so while their folder's LIST was the same."""
    from crypt4gh import lib as c4gh_lib

    monkeypatch.setattr(__name__ + ".EVERY", 48 << 10)
    monkeypatch.setattr(__name__ + ".FIRST", first)
    store = client(s3_bucket)
    want: dict[str, bytes] = {}
    for name, result in packed_corpus.items():
        obstore.put(store, s3_bucket.key(f"a/{name}.zarr.zip"), result.archive.read_bytes())
        want[f"a/{name}"] = corpus[name].read_bytes()
    c4gh = load_tool("make_c4gh_corpus")
    node, writer = (c4gh.make_keypair(tmp_path / "keys", n) for n in ("node", "writer"))
    package = tmp_path / "run.tar.c4gh"
    c4gh.write_package(package, c4gh.gdi_members(parquet_rows=(150000, 900)), writer, [node])
    obstore.put(store, s3_bucket.key("gdi/run.tar.c4gh"), package.read_bytes())
    plain = io.BytesIO()
    c4gh_lib.decrypt([(0, node.secret, None)], io.BytesIO(package.read_bytes()), plain)
    with tarfile.open(fileobj=io.BytesIO(plain.getvalue())) as tar:
        data = plain.getvalue()
        members = {m.name: data[m.offset_data : m.offset_data + m.size] for m in tar if m.isfile()}
    proxy = FlippingProxy(int(s3_bucket.endpoint.rsplit(":", 1)[1]))
    try:
        m = bucket_mount(s3_bucket.url(), "--c4gh-key", str(node.secret_path), "--relist", "2",
                         "--s3-endpoint", proxy.endpoint, "--disk-cache", str(tmp_path / "dc"),
                         "--s3-retries", "1", "--s3-timeout", "3")  # fmt: skip
        (shown,) = os.listdir(m.mnt / "gdi")
        want.update({f"gdi/{shown}/{k}": v for k, v in members.items()})
        proxy.armed = True
        outcomes: dict[str, int] = {}
        for rel, data in want.items():
            try:
                got = (m.mnt / rel).read_bytes()
            except OSError as exc:
                outcome = errno.errorcode.get(exc.errno or 0, "?")
            else:
                outcome = "exact" if got == data else f"WRONG {rel}"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        proxy.armed = False
        assert proxy.flips and not [o for o in outcomes if o.startswith("WRONG")], outcomes
        assert outcomes.get("EIO"), outcomes  # the flips did reach what was read
        deadline = time.monotonic() + 30
        for rel, data in want.items():
            while True:
                try:
                    if (m.mnt / rel).read_bytes() == data:
                        break
                    raise AssertionError(f"{rel}: wrong bytes served")
                except OSError:
                    assert time.monotonic() < deadline, f"{rel} not served again: {outcomes}"
                    time.sleep(0.5)
        said = m.log.read_text()
        assert "Traceback" not in said and "unexpected" not in said, said[-3000:]
    finally:
        proxy.close()
