#!/usr/bin/env python3
"""decant ingest benchmark (issue 5, "Speed"): `rsync -a` of generated TIFFs into a writable
decant-mount, timed until everything is published, against `rsync -a` of the same tree to a plain
folder on the same disk plus `decant pack` of that copy, measured in the same run. Meanwhile a
reader samples cold 4 KiB preads of another, already archived file through the same mount.

`python tools/bench.py ingest [--gib 1] [--files 8] [--settle 2] …`, or run this file directly.

`--small N` measures many small files instead (issue "Ingest that keeps every file"): rsync -a of
N files (90 % 1 KiB text, 10 % 20 KiB TIFFs) into the mount against the same rsync into a folder
on the same disk, both from a warm source, until everything is published; targets ≤ 5× for the
rsync and ≤ 10× until published. The daemon is this checkout's (`python -m vfs.cli`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import (
    MB,
    MiB,
    Mount,
    Report,
    common_options,
    cpu_seconds,
    drop_caches,
    latency_text,
    log,
    machine_context,
    median,
    mounted,
    note_end,
    percentile,
    require,
    run_child,
    timed_preads,
    tool,
    workdir,
)

RATIO_TARGET = 1.5  # time to published ÷ (rsync to a folder + decant pack)
P99_TARGET_MS = 50.0  # 4 KiB reads of another archived file while ingesting
READ_SIZE = 4096
READER_NAME = "reader.tif"


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if not drop_caches():
        log("cannot drop dentries and inodes (not root?): 'cold' runs may be warm")
    with workdir(args.workdir) as work:
        report = bench_small(args, work) if args.small else bench_ingest(args, work)
    note_end(report)
    print(report.render())
    return 0


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"bench.py {command}", parents=[common_options(repeat=1)], description=__doc__
    )
    p.add_argument("--files", type=int, default=8, help="TIFFs sharing --gib (default 8)")
    p.add_argument("--settle", type=float, default=2.0, help="decant-mount --settle (default 2)")
    p.add_argument("--pack-workers", type=int, default=1, help="decant-mount --pack-workers")
    p.add_argument(
        "--reader-mib", type=int, default=128, help="size of the archived file read meanwhile"
    )
    p.add_argument(
        "--cache-size",
        default="32M",
        help="decant-mount --cache-size: below the reader's size, so its reads keep decoding "
        "(default 32M)",
    )
    p.add_argument(
        "--read-every",
        type=float,
        default=0.02,
        metavar="S",
        help="pause between the reader's preads (default 0.02): a user reading, not a load test",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="give up waiting (seconds)")
    p.add_argument(
        "--small",
        type=int,
        default=0,
        metavar="N",
        help="instead: N small files (90%% 1 KiB text, 10%% 20 KiB TIFFs) in 15 folders, "
        "rsync -a into the mount vs into a folder on the same disk (uses --settle)",
    )
    p.add_argument(
        "--count-requests",
        action="store_true",
        help="with --small: one more, untimed round whose daemon counts FUSE requests by type",
    )
    return p


# -- inputs ----------------------------------------------------------------------------------


def write_stack(out: Path, nbytes: int, seed: int) -> Path:
    """A uint16 2048×2048 multi-page stack of about `nbytes`, its own noise per seed."""
    import numpy as np
    import tifffile
    from make_corpus import STACK_PLANE, stack_planes

    plane_bytes = STACK_PLANE[0] * STACK_PLANE[1] * 2
    count = max(1, round(nbytes / plane_bytes))
    tmp = out.with_name(out.name + ".part")
    with tifffile.TiffWriter(tmp, bigtiff=count * plane_bytes > 2**32 - 2**26) as tif:
        tif.write(stack_planes(count, seed), shape=(count, *STACK_PLANE), dtype=np.uint16,
                  metadata={"axes": "ZYX"})  # fmt: skip
    tmp.replace(out)
    return out


def ensure_tree(work: Path, gib: float, files: int) -> Path:
    """`files` stacks of gib/files GiB each in one folder (reused from `work` when present)."""
    tree = work / f"ingest-{gib:g}GiB-{files}"
    each = int(gib * 2**30 / files)
    for i in range(files):
        path = tree / f"stack-{i:02d}.tif"
        if not path.is_file():
            tree.mkdir(parents=True, exist_ok=True)
            log(f"generating {path.name} ({each / MiB:.0f} MiB)")
            write_stack(path, each, seed=100 + i)
    return tree


def ensure_reader(work: Path, mib: int) -> Path:
    """The archive read during the ingest: packed once with `decant pack`, reused."""
    archive = work / f"reader-{mib}MiB" / f"{READER_NAME}.zarr.zip"
    if not archive.is_file():
        archive.parent.mkdir(parents=True, exist_ok=True)
        stack = write_stack(archive.parent / READER_NAME, mib * MiB, seed=7)
        log(f"packing {stack.name}")
        require(run_child([*tool("decant"), "pack", stack, "-o", archive]), "decant pack")
        stack.unlink()
    return archive


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 * MiB):
            digest.update(block)
    return digest.hexdigest()


def fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def tree_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


# -- a reader through a mount --------------------------------------------------------------


class Reader(threading.Thread):
    """Cold 4 KiB preads of one open file (its kernel pages dropped before each, so each reaches
    the daemon) until stopped. One descriptor: the FUSE open is not what is measured."""

    def __init__(self, path: Path, offsets: list[int], pause: float) -> None:
        super().__init__(daemon=True)
        self.path, self.offsets, self.pause = path, offsets, pause
        self.samples: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i in itertools.count():
                if self.halt.wait(self.pause):
                    return
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                start = time.perf_counter()
                data = os.pread(fd, READ_SIZE, self.offsets[i % len(self.offsets)])
                self.samples.append(time.perf_counter() - start)
                if len(data) != READ_SIZE:
                    raise SystemExit(f"bench: short read of {self.path}")
        finally:
            os.close(fd)


@contextlib.contextmanager
def serving(
    args: argparse.Namespace, src: Path, work: Path, tag: str, *extra: str
) -> Iterator[tuple[Mount, Reader, list[float]]]:
    """decant-mount of `src` (which holds the reader archive), warmed up; yields the mount, a
    started Reader of the archived file, and idle latencies taken before it started."""
    mnt, logs = work / f"mnt-{tag}", work / "logs"
    cmd = [*tool("decant-mount"), str(src), str(mnt), "-f", "--log-file",
           str(logs / f"{tag}-{time.monotonic_ns()}.log"), "--index-dir",
           str(fresh(work / f"{tag}-index")), "--cache-size", args.cache_size, *extra]  # fmt: skip
    rng = random.Random(args.seed)
    with mounted(cmd, mnt, logs / f"{tag}-stderr.log") as m:
        shown = mnt / READER_NAME
        offsets = [rng.randrange(0, (shown.stat().st_size - READ_SIZE) // READ_SIZE) * READ_SIZE
                   for _ in range(4096)]  # fmt: skip
        timed_preads(shown, offsets[:64], evict=True)  # open, describe: not what we measure
        idle = timed_preads(shown, offsets[:512], evict=True)
        reader = Reader(shown, offsets, args.read_every)
        reader.start()
        try:
            yield m, reader, idle
        finally:
            reader.halt.set()
            reader.join()


# -- the baseline: rsync to a plain folder, then decant pack ---------------------------------


def baseline(args: argparse.Namespace, tree: Path, reader: Path, work: Path) -> dict[str, Any]:
    """Meanwhile the same reader reads through a read-only mount: the same load on both sides."""
    plain, packed, src = fresh(work / "plain"), fresh(work / "packed"), fresh(work / "base-src")
    shutil.copy2(reader, src / reader.name)
    drop_caches([tree])
    with serving(args, src, work, "base", "--read-only") as (_m, sampler, _idle):
        copy = require(run_child(["rsync", "-a", f"{tree}/", f"{plain}/"]), "rsync to a folder")
        inputs = sorted(plain.glob("*.tif"))
        pack = require(run_child([*tool("decant"), "pack", *inputs, "-o", packed]), "pack")
    out = {"rsync": copy.seconds, "pack": pack.seconds, "packed_bytes": tree_bytes(packed),
           "during": sampler.samples}  # fmt: skip
    for folder in (plain, packed, src):
        shutil.rmtree(folder)
    return out


# -- the ingest through the mount ------------------------------------------------------------


def status(mnt: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((mnt / ".decant-status").read_text())
    return doc


def wait_published(mnt: Path, spool: Path, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = status(mnt)
        idle = doc["queued"] == 0 and doc["packing"] == 0
        if idle and not any(p.is_file() for p in spool.rglob("*")):
            return doc
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: still {doc} after {timeout:.0f} s")
        time.sleep(0.05)


def ingest(args: argparse.Namespace, tree: Path, reader: Path, work: Path) -> dict[str, Any]:
    src = fresh(work / "ingest-src")
    shutil.copy2(reader, src / reader.name)
    extra = ("--settle", str(args.settle), "--pack-workers", str(args.pack_workers))
    with serving(args, src, work, "ingest", *extra) as (m, sampler, idle):
        drop_caches([tree])
        cpu0 = cpu_seconds(m.pid)
        start = time.perf_counter()
        require(run_child(["rsync", "-a", f"{tree}/", f"{m.mnt}/"]), "rsync into the mount")
        copied = time.perf_counter() - start
        doc = wait_published(m.mnt, src / ".decant-spool" / "files", args.timeout)
        published = time.perf_counter() - start
        sampler.halt.set()
        cpu = cpu_seconds(m.pid) - cpu0
        again = subprocess.run(["rsync", "-a", "--itemize-changes", f"{tree}/", f"{m.mnt}/"],
                               capture_output=True, text=True, check=True)  # fmt: skip
    archives = sorted(src.glob("stack-*.tif.zarr.zip"))
    return {
        "copied": copied,
        "published": published,
        "cpu": cpu,
        "status": doc,
        "idle": idle,
        "during": sampler.samples,
        "archives": archives,
        "archive_bytes": sum(a.stat().st_size for a in archives),
        "second_rsync": again.stdout.splitlines(),
    }


def check(tree: Path, run: dict[str, Any]) -> list[str]:
    """Every stack has a verified archive recording its sha256: problems, if any."""
    from vfs.decant.reader import DecantArchive

    problems = []
    want = {p.name: sha256(p) for p in sorted(tree.glob("*.tif"))}
    got = {}
    for archive in run["archives"]:
        with DecantArchive.open(archive) as a:
            (info,) = a.originals()
        got[info.relpath] = info.sha256
    if got != want:
        problems.append(f"archives record {len(got)} originals, {len(want)} expected or differ")
    if run["status"]["failed"]:
        problems.append(f"failed: {run['status']['failed']}")
    if run["second_rsync"]:
        problems.append(f"second rsync -a changed {len(run['second_rsync'])} entries")
    return problems


# -- the report ------------------------------------------------------------------------------


def bench_ingest(args: argparse.Namespace, work: Path) -> Report:
    tree = ensure_tree(work, args.gib, args.files)
    reader = ensure_reader(work, args.reader_mib)
    size = tree_bytes(tree, "*.tif")
    bases, runs = [], []
    for r in range(args.repeat):
        log(f"round {r + 1}/{args.repeat}: rsync to a folder + decant pack")
        bases.append(baseline(args, tree, reader, work))
        log(f"round {r + 1}/{args.repeat}: rsync into decant-mount, until published")
        runs.append(ingest(args, tree, reader, work))
        problems = check(tree, runs[-1])
        if problems:
            raise SystemExit("bench: ingest went wrong: " + "; ".join(problems))
    ctx = machine_context(
        input=f"{args.files} TIFF stacks, {size / MB:.1f} MB in all",
        mount=f"--settle {args.settle:g} --pack-workers {args.pack_workers} "
        f"--cache-size {args.cache_size}",
        reader=f"{READER_NAME} ({args.reader_mib} MiB, archived): 4 KiB preads, pages dropped, "
        f"one every {args.read_every * 1e3:g} ms",
        disk=str(work),
    )
    report = Report("decant bench: ingest", ctx)
    _report(report, bases, runs, size, args.settle)
    return report


def _report(
    report: Report, bases: list[dict[str, Any]], runs: list[dict[str, Any]], size: int,
    settle: float,
) -> None:  # fmt: skip
    rsync_s = median([b["rsync"] for b in bases])
    pack_s = median([b["pack"] for b in bases])
    base_s = median([b["rsync"] + b["pack"] for b in bases])
    pub_s = median([r["published"] for r in runs])
    report.section("baseline (same tree, same disk, same run)")
    report.add("rsync -a to a folder", f"{rsync_s:.2f} s", f"{size / MB / rsync_s:.0f} MB/s")
    report.add("decant pack of the copy", f"{pack_s:.2f} s", f"{size / MB / pack_s:.0f} MB/s")
    report.add("rsync + pack", f"{base_s:.2f} s")
    report.section("rsync -a into decant-mount")
    copied = median([r["copied"] for r in runs])
    report.add("rsync returns", f"{copied:.2f} s", f"{size / MB / copied:.0f} MB/s")
    report.add("all published", f"{pub_s:.2f} s", f"includes the {settle:g} s settle")
    report.add("daemon CPU", f"{median([r['cpu'] for r in runs]):.1f} s")
    report.target("published ÷ (rsync + pack)", pub_s / base_s, RATIO_TARGET, "", at_most=True)
    archive = median([r["archive_bytes"] for r in runs])
    base_archive = median([b["packed_bytes"] for b in bases])
    report.add("archive ÷ original", f"{archive / size:.3f}",
               f"decant pack alone: {base_archive / size:.3f}")  # fmt: skip
    report.add("second rsync -a", f"{len(runs[-1]['second_rsync'])} changes")
    report.section("4 KiB preads of another archived file")
    idle = [s for r in runs for s in r["idle"]]
    during = [s for r in runs for s in r["during"]]
    base = [s for b in bases for s in b["during"]]
    report.add(f"idle ({len(idle)})", latency_text(idle))
    report.add(f"during rsync + pack ({len(base)})", latency_text(base), "read-only mount")
    report.add(f"during ingest ({len(during)})", latency_text(during))
    report.target("p99 during ingest", percentile(during, 99) * 1e3, P99_TARGET_MS, "ms",
                  at_most=True)  # fmt: skip


# -- many small files (`--small N`) ----------------------------------------------------------

SMALL_RSYNC_TARGET = 5.0  # rsync -a into the mount ÷ rsync -a into a folder on the same disk
SMALL_PUBLISHED_TARGET = 10.0  # everything published ÷ the same rsync into a folder
SMALL_FOLDERS = 15


def ensure_small_tree(work: Path, n: int) -> Path:
    """N files in 15 folders: every tenth a 20 KiB uint16 TIFF, the rest 1 KiB of text."""
    import numpy as np
    import tifffile

    tree, done = work / f"small-{n}", work / f"small-{n}.done"
    if done.is_file():
        return tree
    log(f"generating {n} small files")
    shutil.rmtree(tree, ignore_errors=True)
    rng = np.random.default_rng(5)
    for i in range(n):
        folder = tree / f"run{i % SMALL_FOLDERS:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        if i % 10 == 9:
            tifffile.imwrite(folder / f"img{i:06d}.tif",
                             rng.integers(0, 4096, (128, 80), dtype=np.uint16))  # fmt: skip
        else:
            line = f"{i},{rng.random():.12f},sample-{i}\n".encode()
            (folder / f"rec{i:06d}.csv").write_bytes((line * (1024 // len(line) + 1))[:1024])
    done.touch()
    return tree


def vm_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a live process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(line.split()[1]) * 1024
    return out


def wait_done(mnt: Path, n: int, timeout: float) -> dict[str, Any]:
    """Until the status says all `n` files were published (and nothing is queued or failed)."""
    deadline = time.monotonic() + timeout
    while True:
        doc = status(mnt)
        if doc["done"] >= n and doc["queued"] == 0 and doc["packing"] == 0:
            return doc
        if doc["failed"] or time.monotonic() > deadline:
            raise SystemExit(f"bench: queue {dict(doc, failed=doc['failed'][:3])} after wait")
        time.sleep(0.05)


def transferred(stats: str) -> int:
    for line in stats.splitlines():
        if line.startswith("Number of regular files transferred:"):
            return int(line.split(":")[1].replace(",", ""))
    raise SystemExit(f"bench: no transfer count in rsync --stats:\n{stats}")


def small_problems(tree: Path, mnt: Path, src: Path) -> list[str]:
    """Every file under its name with its bytes; no temp names left in SRC or the spool."""
    problems = []
    names = sorted(p.relative_to(tree) for p in tree.rglob("*") if p.is_file())
    shown = sorted(p.relative_to(mnt) for p in mnt.rglob("*") if p.is_file())
    if shown != names:
        problems.append(f"mount lists {len(shown)} files, {len(names)} copied")
    bad = [r for r in names if (mnt / r).read_bytes() != (tree / r).read_bytes()]
    if bad:
        problems.append(f"{len(bad)} files differ, e.g. {bad[:3]}")
    left = [p for p in src.rglob(".*") if p.is_file()]
    left += [p for p in (src / ".decant-spool").rglob("*") if p.is_file()]
    if left:
        problems.append(f"{len(left)} temp or spooled files left in SRC, e.g. {left[:3]}")
    return problems


def this_daemon() -> list[str]:
    """decant-mount from this checkout (a worktree), not the one installed in the venv: the
    console script would import the editable install's `vfs`."""
    root = str(Path(__file__).resolve().parents[1])
    paths = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{root}{os.pathsep}{paths}" if paths else root
    return [sys.executable, "-m", "vfs.cli"]


def warm(tree: Path) -> None:
    """Both copies read a warm tree: the figure is the mount's cost, not the disk's (a cold
    tree made the folder baseline swing from 0.4 to 3 s with the machine's other I/O)."""
    for path in tree.rglob("*"):
        if path.is_file():
            path.read_bytes()


DELETED = ".deleted-at"  # in the work folder: when the last trees were deleted
INODE_GRACE = 31.0  # ext4 skips (scanning past) inodes freed less than ~30 s ago


def delete_and_mark(work: Path, folders: list[Path]) -> None:
    if folders:
        for folder in folders:
            shutil.rmtree(folder)
        (work / DELETED).write_text(str(time.time()))


def wait_for_deletions(work: Path) -> None:
    """No round starts within 30 s of deleting thousands of files: both copies would scan
    past them on every create (seen: a 0.24 s folder rsync took 1.65 s)."""
    try:
        left = INODE_GRACE - (time.time() - float((work / DELETED).read_text()))
    except (OSError, ValueError):
        return
    if left > 0:
        log(f"waiting {left:.0f} s: files were deleted here just now")
        time.sleep(left)


def small_round(args: argparse.Namespace, tree: Path, work: Path, n: int) -> dict[str, Any]:
    """One round. Nothing is deleted until all copies are timed: ext4 keeps just-deleted
    inodes out of allocation for ~30 s and scans past them on every create, so deleting a
    3,000-file tree made the next run's creates several times slower than the one before.
    The folder rsync runs twice before and twice after the mount (the machine is shared)."""
    tag = time.strftime("%H%M%S")
    warm(tree)
    plains = [fresh(work / f"small-plain-{tag}-{i}") for i in range(4)]

    def to_folder(folder: Path) -> float:
        return require(run_child(["rsync", "-a", f"{tree}/", f"{folder}/"]), "rsync").seconds

    bases = [to_folder(p) for p in plains[:2]]
    floor = null_floor(tree, work)
    src, mnt, logs = fresh(work / f"small-src-{tag}"), work / "small-mnt", work / "logs"
    cmd = [*this_daemon(), str(src), str(mnt), "-f", "--log-file",
           str(logs / f"small-{time.monotonic_ns()}.log"), "--index-dir",
           str(fresh(work / "small-index")), "--settle", str(args.settle),
           "--pack-workers", str(args.pack_workers)]  # fmt: skip
    warm(tree)
    with mounted(cmd, mnt, logs / "small-stderr.log") as m:
        cpu0 = cpu_seconds(m.pid)
        start = time.perf_counter()
        copy = require(run_child(["rsync", "-a", f"{tree}/", f"{mnt}/"]), "rsync into the mount")
        copied = time.perf_counter() - start
        cpu_rsync = cpu_seconds(m.pid) - cpu0
        doc = wait_done(mnt, n, args.timeout)
        published = time.perf_counter() - start
        cpu = cpu_seconds(m.pid) - cpu0
        memory = vm_status(m.pid)
        again = subprocess.run(["rsync", "-a", "--stats", f"{tree}/", f"{mnt}/"],
                               capture_output=True, text=True, check=True)  # fmt: skip
        problems = small_problems(tree, mnt, src)
    bases += [to_folder(p) for p in plains[2:]]
    return {"bases": bases, "floor": floor, "copied": copy.seconds, "wall": copied,
            "published": published, "cpu": cpu, "cpu_rsync": cpu_rsync, "memory": memory,
            "second": transferred(again.stdout), "problems": problems, "status": doc,
            "trash": [*plains, src]}  # fmt: skip


def counted_round(args: argparse.Namespace, tree: Path, work: Path, n: int) -> dict[str, int]:
    """rsync -a into a daemon that counts the FUSE requests it answers, by type (untimed: the
    counting wraps every handler)."""
    tag = time.strftime("%H%M%S")
    src, mnt, logs = fresh(work / f"small-src-count-{tag}"), work / "small-mnt", work / "logs"
    out = work / f"requests-{tag}.json"
    this_daemon()  # PYTHONPATH: this checkout's `vfs`
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--counting-daemon",
        str(out),
        str(src),
        str(mnt),
        "-f",
        "--log-file",
        str(logs / f"small-count-{tag}.log"),
        "--no-index",
        "--settle",
        str(args.settle),
    ]
    with mounted(cmd, mnt, logs / "small-stderr.log"):
        require(run_child(["rsync", "-a", f"{tree}/", f"{mnt}/"]), "rsync into the mount")
        wait_done(mnt, n, args.timeout)
    counts: dict[str, int] = json.loads(out.read_text())
    out.unlink()
    delete_and_mark(work, [src])
    return counts


def counting_daemon(out: Path, argv: list[str]) -> int:
    """decant-mount with every pyfuse3 handler counted; the counts go to `out` at exit."""
    import atexit
    import inspect
    from collections import Counter

    import pyfuse3

    from vfs import cli
    from vfs.mount.ops import DecantOperations

    counts: Counter[str] = Counter()
    for name, _fn in inspect.getmembers(pyfuse3.Operations, inspect.iscoroutinefunction):
        real = getattr(DecantOperations, name)

        async def counted(self: Any, *a: Any, _real: Any = real, _name: str = name) -> Any:
            counts[_name] += 1
            return await _real(self, *a)

        setattr(DecantOperations, name, counted)
    atexit.register(lambda: out.write_text(json.dumps(dict(counts))))
    return cli.main(argv)


def null_floor(tree: Path, work: Path) -> float:
    """rsync -a into NullFS: what pyfuse3 and the kernel alone cost per request here."""
    mnt = work / "small-nullfs"
    mnt.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--nullfs", str(mnt)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("bench: NullFS did not mount")
            time.sleep(0.05)
        return require(run_child(["rsync", "-a", f"{tree}/", f"{mnt}/"]), "rsync nullfs").seconds
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.wait(timeout=30)


class NullFS:
    """A writable pyfuse3 filesystem in memory whose handlers do nothing but keep a dict: the
    floor under any pyfuse3 daemon's rsync (built lazily: pyfuse3 is imported only here)."""

    @staticmethod
    def serve(mnt: Path) -> None:
        import errno
        import stat

        import pyfuse3
        import trio

        class Node:
            def __init__(self, ino: int, is_dir: bool, mode: int) -> None:
                self.ino, self.is_dir, self.mode = ino, is_dir, mode
                self.kids: dict[bytes, Node] = {}
                self.data, self.mtime = bytearray(), time.time_ns()

        class Ops(pyfuse3.Operations):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.nodes = {1: Node(1, True, 0o755)}

            def attrs(self, n: Node) -> Any:
                a = pyfuse3.EntryAttributes()
                a.st_ino, a.st_size, a.st_nlink = n.ino, len(n.data), 1
                a.st_mode = (stat.S_IFDIR if n.is_dir else stat.S_IFREG) | n.mode
                a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = n.mtime
                a.entry_timeout = a.attr_timeout = 2.0
                return a

            def new(self, parent: int, name: bytes, is_dir: bool, mode: int) -> Node:
                n = Node(len(self.nodes) + 1, is_dir, mode & 0o7777)
                self.nodes[n.ino] = self.nodes[parent].kids[name] = n
                return n

            async def lookup(self, parent: int, name: bytes, ctx: Any) -> Any:
                n = self.nodes[parent].kids.get(name)
                if n is None:
                    raise pyfuse3.FUSEError(errno.ENOENT)
                return self.attrs(n)

            async def getattr(self, ino: int, ctx: Any) -> Any:
                return self.attrs(self.nodes[ino])

            async def opendir(self, ino: int, ctx: Any) -> int:
                return ino

            async def readdir(self, fh: int, off: int, token: Any) -> None:
                for i, (name, n) in enumerate(list(self.nodes[fh].kids.items())[off:]):
                    if not pyfuse3.readdir_reply(token, name, self.attrs(n), off + i + 1):
                        break

            async def mkdir(self, parent: int, name: bytes, mode: int, ctx: Any) -> Any:
                return self.attrs(self.new(parent, name, True, mode))

            async def create(self, parent: int, name: bytes, mode: int, flags: int,
                             ctx: Any) -> Any:  # fmt: skip
                n = self.new(parent, name, False, mode)
                return pyfuse3.FileInfo(fh=n.ino), self.attrs(n)

            async def open(self, ino: int, flags: int, ctx: Any) -> Any:
                return pyfuse3.FileInfo(fh=ino)

            async def write(self, fh: int, off: int, buf: bytes) -> int:
                self.nodes[fh].data[off : off + len(buf)] = buf
                return len(buf)

            async def setattr(self, ino: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> Any:
                n = self.nodes[ino]
                if fields.update_mode:
                    n.mode = attr.st_mode & 0o7777
                if fields.update_mtime:
                    n.mtime = attr.st_mtime_ns
                return self.attrs(n)

            async def rename(self, p0: int, n0: bytes, p1: int, n1: bytes, flags: int,
                             ctx: Any) -> None:  # fmt: skip
                self.nodes[p1].kids[n1] = self.nodes[p0].kids.pop(n0)

            async def flush(self, fh: int) -> None:
                pass

            async def release(self, fh: int) -> None:
                pass

        pyfuse3.init(Ops(), str(mnt), {"fsname=nullfs", "default_permissions"})
        try:
            trio.run(pyfuse3.main)
        finally:
            pyfuse3.close(unmount=True)


def bench_small(args: argparse.Namespace, work: Path) -> Report:
    n = args.small
    tree = ensure_small_tree(work, n)
    trash = [*work.glob("small-plain*"), *work.glob("small-src*")]
    delete_and_mark(work, trash)  # an earlier run's, if it stopped before its clean-up
    wait_for_deletions(work)
    runs = []
    for r in range(args.repeat):
        log(f"round {r + 1}/{args.repeat}: {n} small files, rsync -a to a folder and the mount")
        runs.append(small_round(args, tree, work, n))
    delete_and_mark(work, [f for r in runs for f in r["trash"]])
    ctx = machine_context(
        input=f"{n} files in {SMALL_FOLDERS} folders: {n - n // 10} × 1 KiB text, "
        f"{n // 10} × 20 KiB TIFFs ({tree_bytes(tree) / MB:.1f} MB)",
        mount=f"--settle {args.settle:g} --pack-workers {args.pack_workers}",
        disk=str(work),
        code=str(Path(__file__).resolve().parents[1]),
    )
    report = Report(f"decant bench: ingest of {n} small files", ctx)
    bases = [b for r in runs for b in r["bases"]]
    # The fastest folder run: the disk is shared, and a slow baseline must not "meet" a target.
    base, copied = min(bases), median([r["copied"] for r in runs])
    published, floor = median([r["published"] for r in runs]), median([r["floor"] for r in runs])
    report.section("rsync -a")
    report.add("into a folder (same disk)", f"{base:.2f} s",
               f"fastest of {len(bases)} (median {median(bases):.2f}, slowest {max(bases):.2f}); "
               "warm source")  # fmt: skip
    report.add("into NullFS (pyfuse3 floor)", f"{floor:.2f} s",
               f"{floor / base:.1f}× the folder: do-nothing handlers in memory")  # fmt: skip
    report.add("into decant-mount", f"{copied:.2f} s", f"{n / copied:.0f} files/s")
    report.add("all published", f"{published:.2f} s",
               f"from rsync's start; includes the {args.settle:g} s settle")  # fmt: skip
    report.target("rsync into mount ÷ into folder", copied / base, SMALL_RSYNC_TARGET, "",
                  at_most=True)  # fmt: skip
    report.target("published ÷ rsync into folder", published / base, SMALL_PUBLISHED_TARGET, "",
                  at_most=True)  # fmt: skip
    # What no pyfuse3 daemon can beat here: NullFS's rsync, and for "published" its settle too.
    report.add("floor for published", f"{floor + args.settle:.2f} s",
               f"{(floor + args.settle) / base:.1f}× the folder: NullFS's rsync + the "
               f"{args.settle:g} s settle")  # fmt: skip
    during = median([r["cpu_rsync"] for r in runs])
    report.add("daemon CPU", f"{median([r['cpu'] for r in runs]):.1f} s",
               f"{during:.1f} s of it during the rsync")  # fmt: skip
    last = runs[-1]["memory"]
    report.add("daemon VmRSS / VmHWM", f"{last['VmRSS'] / MiB:.0f} / {last['VmHWM'] / MiB:.0f} MiB",
               "after everything published")  # fmt: skip
    report.add("second rsync -a", f"{runs[-1]['second']} files", "transferred (want 0)")
    problems = [p for r in runs for p in r["problems"]]
    report.add("check", "ok" if not problems else "FAILED", "; ".join(problems[:3]))
    if args.count_requests:
        counts = counted_round(args, tree, work, n)
        report.section("FUSE requests per file (rsync -a, one untimed round)")
        report.add("all", f"{sum(counts.values()) / n:.1f}", "")
        for name, count in sorted(counts.items(), key=lambda kv: -kv[1]):
            report.add(name, f"{count / n:.2f}", f"{count} in all")
    return report


if __name__ == "__main__":
    if sys.argv[1:2] == ["--counting-daemon"]:
        sys.exit(counting_daemon(Path(sys.argv[2]), sys.argv[3:]))
    if sys.argv[1:2] == ["--nullfs"]:
        NullFS.serve(Path(sys.argv[2]))
        sys.exit(0)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main("ingest", sys.argv[1:]))
