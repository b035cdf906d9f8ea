"""JSON that would cost the daemon hundreds of MiB to parse, beside good files in a real mount.

Each document is within its byte limit and the JSON value count the daemon used to check
(commas and brackets), but is made of nested one-key objects (~200 bytes of Python objects each).
Parsed, the archive's manifest alone took ~500 MiB of daemon RSS and the collection's ~380 MiB.
Now each is refused unparsed (the manifest by its count of objects, the collection by
json_cost): the archive is shown raw, the collection is mirrored
without a view, each with a log line naming it, and the good archive and collection beside them
are served as before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from tests.toolbox import load_tool

GOOD = "imagej_hyperstack_tzc_u16.tif"
MANIFEST = ".decant/manifest.json"
CACHE = "64M"
# The daemon's peak RSS: the cache, the interpreter and its libraries (~130 MiB), what parsing
# a document may cost (MAX_JSON_COST 48 MiB, ~40 MiB in fact) and room. Before, ~1 GiB.
RSS_LIMIT_MIB = 64 + 250


def nested_objects(count: int) -> bytes:
    """`count` one-key objects nested 500 deep, in a list: ~6 bytes of text each."""
    group = b'{"a":' * 500 + b"0" + b"}" * 500
    return b"[" + b",".join([group] * (count // 500)) + b"]"


def vm_hwm_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) >> 10
    raise AssertionError("no VmHWM")


def sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_costly_json_fails_alone(make_mount, mount_corpus, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    originals, corpus_src = mount_corpus
    src = tmp_path / "src"
    src.mkdir()
    good = shutil.copy(corpus_src / f"{GOOD}.zarr.zip", src / f"{GOOD}.zarr.zip")
    # 2.5 M objects: 15 MiB of manifest, 2.5 M values (the old limit: 10.5 M values).
    junk = nested_objects(2_500_000)
    costly = load_tool("fuzz").rewrite_zip(
        Path(good),
        src / "costly.tif.zarr.zip",
        lambda name, data: (
            data.replace(b'"notes": ""', b'"notes": ' + junk) if name == MANIFEST else data
        ),
    )
    corpus = load_tool("make_acqstore_corpus")
    corpus.make_collection(src / "collection")
    bad = Path(shutil.copytree(src / "collection", src / "costly-collection"))
    doc = bad / "acqstore/collection.json"
    # 1.9 M objects: 11 MiB, under the old 16 MiB and 2,097,152-value limits.
    doc.write_bytes(
        doc.read_bytes().rstrip()[:-1] + b', "junk": ' + nested_objects(1_900_000) + b"}"
    )

    m = make_mount(src, "--read-only", "--cache-size", CACHE)
    assert m.proc is not None
    shown = set(os.listdir(m.mnt))
    assert costly.name in shown and GOOD in shown, shown  # refused: shown raw
    assert sha256(m.mnt / costly.name) == sha256(costly)
    assert sha256(m.mnt / GOOD) == sha256(originals / GOOD)
    assert "members" in os.listdir(m.mnt / "collection")
    assert "members" not in os.listdir(m.mnt / "costly-collection")
    assert (
        m.mnt / "costly-collection/acqstore/collection.json"
    ).stat().st_size == doc.stat().st_size

    assert m.proc.poll() is None, "the daemon exited"
    hwm = vm_hwm_mib(m.proc.pid)
    print(f"daemon VmHWM {hwm} MiB")
    assert hwm < RSS_LIMIT_MIB, f"daemon peak RSS {hwm} MiB"

    log = m.log_text()
    lines = [line for line in log.splitlines() if costly.name in line]
    assert any("shown as the raw file" in line and "not parsed" in line for line in lines), log
    lines = [line for line in log.splitlines() if "acqstore/collection.json" in line]
    assert any("memory to parse" in line for line in lines), log
    assert f"{bad}: not a valid AcqStore collection" in log
