"""AcqStore benchmarks (issue 6, "Speed"): `python tools/bench.py acqstore`.

(1) Validating a generated collection of 1,000 members: the core call (`validate_collection`) in
this process, and `decant acqstore validate` as a fresh process (what a user waits for), each cold
(the collection's files evicted from the page cache, dentries and inodes dropped) and warm.
(2) A TIFF synthesized from an OME-Zarr image (uint16, one plane per blosc chunk) read
sequentially through decant-mount (`dd bs=1M`, fresh mount, the zarr chunks evicted first) ÷ the
in-memory pyfuse3 ceiling (tools/memfs.py serving the very same bytes), rounds interleaved in one
run. Diagnostics beside it: zarr-python decoding every plane without FUSE, numcodecs decoding
every chunk file without zarr-python, and decant-mount with every plane already in its cache (the
request path alone).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import (
    MB,
    TOOLS,
    MiB,
    Report,
    cpu_seconds,
    dd_read,
    drop_caches,
    log,
    machine_context,
    mbps,
    median,
    mounted,
    require,
    run_child,
    tool,
    vm_hwm,
    workdir,
)

from vfs.acqstore.validate import validate_collection, validator
from vfs.cli import parse_size

VALIDATE_TARGET_S = 2.0
READ_RATIO_TARGET = 0.5
MEMBER_NAME = "Big stack"
SYNTH_REL = Path("coll") / "members" / MEMBER_NAME / f"{MEMBER_NAME}.tif"  # within the mount
SCHEMA_KINDS = ("collection", "acqimage", "analyses", "reference-image")


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if not drop_caches():
        log("cannot drop dentries and inodes (not root?): 'cold' figures will be warm")
    with workdir(args.workdir) as work:
        report = Report(
            "acqstore bench", machine_context(workdir=work, cache=f"{args.cache_size >> 20} MiB")
        )
        if args.part in ("all", "validate"):
            report_validation(report, args, ensure_large(work, args.members))
        if args.part in ("all", "read"):
            report_read(report, args, work)
    report.context["load at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(report.render())
    return 0


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"bench.py {command}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--members", type=int, default=1000, help="members to validate (default 1000)")
    p.add_argument("--planes", type=int, default=64, help="z planes of the image (default 64)")
    p.add_argument("--size", type=int, default=2048, help="plane width and height (default 2048)")
    p.add_argument(
        "--cname",
        default="lz4",
        choices=("lz4", "lz4hc", "zstd", "zlib", "blosclz"),
        help="blosc codec of the image, level 5, byte shuffle (default lz4, zarr v2's default)",
    )
    p.add_argument(
        "--cache-size",
        type=parse_size,
        default=parse_size("512M"),
        metavar="SIZE",
        help="decant-mount --cache-size (default 512M, the daemon's default)",
    )
    p.add_argument("--repeat", type=int, default=3, help="timed rounds (default 3)")
    p.add_argument("--part", choices=("all", "validate", "read"), default="all")
    p.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="scratch folder; generated inputs found there are reused (default: a temp folder)",
    )
    return p


# -- inputs ----------------------------------------------------------------------------------


def _generator() -> Any:
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    import make_acqstore_corpus

    return make_acqstore_corpus


def ensure_large(work: Path, members: int) -> Path:
    """The generator's N-member collection (image stubs, two documents and a CSV per member)."""
    root = work / f"collection-{members}"
    if (root / "acqstore" / "collection.json").is_file():
        return root
    part = root.with_name(root.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    log(f"generating a {members}-member collection")
    _generator().make_large_collection(part, members)
    part.replace(root)
    return root


def ensure_image_collection(work: Path, planes: int, size: int, cname: str) -> Path:
    """SRC holding `coll/`: one member whose image is uint16 (1, 1, planes, size, size), tczyx,
    one plane per chunk, blosc-compressed, written with zarr (format 2, NGFF 0.4)."""
    src = work / f"tiff-src-{planes}x{size}-{cname}"
    if (src / "coll" / "acqstore" / "collection.json").is_file():
        return src
    import zarr
    from numcodecs import Blosc

    shutil.rmtree(src, ignore_errors=True)
    root = src / "coll"
    log(f"writing a {planes}x{size}x{size} uint16 OME-Zarr image ({cname})")
    group = zarr.open_group(str(root / "images" / "big.zarr"), mode="w", zarr_format=2)
    shape = (1, 1, planes, size, size)
    array = group.create_array(
        "0",
        shape=shape,
        dtype="uint16",
        chunks=(1, 1, 1, size, size),
        compressors=Blosc(cname=cname, clevel=5, shuffle=Blosc.SHUFFLE),
    )
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for z in range(planes):  # smooth structure plus shot noise: compresses like real data
        signal = 300 + 200 * np.sin(6 * xx + z / 8) * np.cos(5 * yy - z / 11)
        array[0, 0, z] = rng.poisson(signal).astype(np.uint16)
    axes = [{"name": "t", "type": "time", "unit": "second"}, {"name": "c", "type": "channel"}]
    axes += [{"name": n, "type": "space", "unit": "micrometer"} for n in "zyx"]
    scale = [1.0, 1.0, 2.0, 0.5, 0.5]
    group.attrs["multiscales"] = [
        {
            "version": "0.4",
            "axes": axes,
            "datasets": [
                {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": scale}]}
            ],
        }
    ]
    _write_documents(root)
    result = validate_collection(root)
    if not result.ok:
        lines = "\n".join(issue.line() for issue in result.issues)
        raise SystemExit(f"bench: the generated collection is invalid:\n{lines}")
    return src


def _write_documents(root: Path) -> None:
    acq = "acqstore/members/m1/acqimage.json"
    documents = {
        "acqstore/collection.json": {
            "format": "acqstore-ome-zarr-collection",
            "version": 1,
            "id": "bench",
            "name": "bench",
            "members": [
                {
                    "id": "m1",
                    "name": MEMBER_NAME,
                    "ome_zarr": "images/big.zarr",
                    "resources": {"acqimage": acq},
                }
            ],
        },
        acq: {
            "format": "acqstore-acqimage",
            "version": 1,
            "image_id": "m1",
            "accepted": True,
            "rois": [],
        },
    }
    for rel, doc in documents.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(doc, indent=2) + "\n")


# -- (1) validation --------------------------------------------------------------------------


def report_validation(report: Report, args: argparse.Namespace, root: Path) -> None:
    core, cli = _time_validation(args, root)
    files = sum(1 for p in root.rglob("*") if p.is_file())
    report.section(
        f"validation of {args.members} members, {files} files (medians of {args.repeat})"
    )
    for label, times in (
        ("core validate_collection", core),
        ("decant acqstore validate", cli),
    ):
        report.target(f"{label}, cold", median(times["cold"]), VALIDATE_TARGET_S, "s", at_most=True)
        report.add(f"{label}, warm", f"{median(times['warm']):.3f} s")
    report.add("core per member, warm", f"{median(core['warm']) / args.members * 1e3:.2f} ms")
    report.add("(the command is a fresh process: interpreter, imports and schema included)")


def _time_validation(
    args: argparse.Namespace, root: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds of the core call (in this process) and of the command, cold and warm, per round."""
    for kind in SCHEMA_KINDS:
        validator(kind)  # compiled once per process, outside the core timing
    core: dict[str, list[float]] = {"cold": [], "warm": []}
    cli: dict[str, list[float]] = {"cold": [], "warm": []}
    command = [*tool("decant"), "acqstore", "validate", str(root)]
    for r in range(args.repeat):
        log(f"validation round {r + 1}/{args.repeat}")
        for temperature in ("cold", "warm"):
            if temperature == "cold":
                drop_caches([root])
            start = time.perf_counter()
            result = validate_collection(root)
            core[temperature].append(time.perf_counter() - start)
            if not result.ok:
                raise SystemExit(f"bench: {root} is invalid: {result.errors[0].line()}")
        for temperature in ("cold", "warm"):
            if temperature == "cold":
                drop_caches([root])
            cli[temperature].append(require(run_child(command), "decant acqstore validate").seconds)
    return core, cli


# -- (2) synthesized TIFF through the mount --------------------------------------------------


def report_read(report: Report, args: argparse.Namespace, work: Path) -> None:
    src = ensure_image_collection(work, args.planes, args.size, args.cname)
    image = src / "coll" / "images" / "big.zarr"
    synth = _copy_out(args, src, work)
    size = synth.stat().st_size
    seq = _sequential(args, src, work, synth)
    log("diagnostics: zarr-python and numcodecs decoding without FUSE")
    seq["zarr"] = [_zarr_decode(image) for _ in range(args.repeat)]
    seq["codec"] = [_codec_decode(image) for _ in range(args.repeat)]
    seq["cached"] = _served_from_cache(args, src, work, size)
    on_disk = sum(p.stat().st_size for p in image.rglob("*") if p.is_file())
    report.section(
        f"sequential read of the synthesized TIFF: dd bs=1M, {size / MB:.1f} MB, "
        f"{args.planes} planes {args.size}x{args.size} uint16, blosc {args.cname} "
        f"({on_disk / MB:.1f} MB on disk, {size / on_disk:.2f}x)"
    )
    _report_sequential(report, seq, size)


def _sequential(args: argparse.Namespace, src: Path, work: Path, synth: Path) -> dict[str, Any]:
    """Rounds of: memfs cold dd; decant-mount cold dd on a fresh mount, zarr chunks evicted."""
    image = src / "coll" / "images" / "big.zarr"
    size, logs = synth.stat().st_size, work / "logs"
    out: dict[str, Any] = {k: [] for k in ("memfs", "decant", "cpu_memfs", "cpu_decant", "hwm")}
    memfs = [sys.executable, str(TOOLS / "memfs.py"), str(work / "mnt-memfs"), str(synth), "-f"]
    with mounted(memfs, work / "mnt-memfs", logs / "memfs.log") as mem:
        _dd(mem.mnt / synth.name, size)  # untimed: first touches are not the file system's
        for r in range(args.repeat):
            log(f"sequential round {r + 1}/{args.repeat}: memfs")
            drop_caches([mem.mnt / synth.name])
            cpu = cpu_seconds(mem.pid)
            out["memfs"].append(_dd(mem.mnt / synth.name, size))
            out["cpu_memfs"].append(cpu_seconds(mem.pid) - cpu)
            log(f"sequential round {r + 1}/{args.repeat}: decant-mount (fresh mount)")
            cmd = _decant(args, src, work, f"cold-{r}")
            with mounted(cmd, work / "mnt-decant", logs / f"decant-cold-{r}.err") as dec:
                os.stat(dec.mnt / SYNTH_REL)  # the view is built on lookup: not part of reading
                drop_caches([image])
                cpu = cpu_seconds(dec.pid)
                out["decant"].append(_dd(dec.mnt / SYNTH_REL, size))
                out["cpu_decant"].append(cpu_seconds(dec.pid) - cpu)
                out["hwm"].append(vm_hwm(dec.pid))
    return out


def _report_sequential(report: Report, seq: dict[str, Any], size: int) -> None:
    ceiling = median(seq["memfs"])
    _throughput(report, "(a) memfs ceiling, same bytes", size, seq["memfs"])
    _throughput(report, "(b) decant-mount cold", size, seq["decant"])
    ratios = [a / b for a, b in zip(seq["memfs"], seq["decant"], strict=True)]
    report.target("(b)/(a) median", median(ratios), READ_RATIO_TARGET, "", at_most=False)
    report.add("  per round", " ".join(f"{x:.2f}" for x in ratios))
    for key, label in (("memfs", "(a)"), ("decant", "(b)")):
        busy = median([c / w for c, w in zip(seq[f"cpu_{key}"], seq[key], strict=True)])
        report.add(f"{label} daemon CPU ÷ wall", f"{busy:.2f}", "(cores busy while dd ran)")
    report.add("(b) decant-mount peak RSS", f"{max(seq['hwm']) / MiB:.0f} MiB")
    for key, tag, label, note in (
        ("zarr", "(c)", "zarr-python decode, no FUSE", "decode alone, one thread"),
        ("codec", "(c')", "numcodecs per chunk file", "no zarr-python, one thread"),
        ("cached", "(d)", "decant-mount, planes cached", "the request path alone"),
    ):
        _throughput(report, f"{tag} {label}", size, seq[key])
        report.add(f"  {tag}/(a)", f"{ceiling / median(seq[key]):.2f}", f"({note}; no target)")


def _decant(
    args: argparse.Namespace, src: Path, work: Path, tag: str, cache: int | None = None
) -> list[str]:
    """A foreground decant-mount of `src` with a fresh index (so nothing is known in advance)."""
    index = work / "index" / f"{tag}-{time.monotonic_ns()}"
    index.mkdir(parents=True)
    cmd = [*tool("decant-mount"), str(src), str(work / "mnt-decant"), "-f"]
    cmd += ["--index-dir", str(index), "--log-file", str(work / "logs" / f"decant-{tag}.log")]
    return [*cmd, "--cache-size", str(cache or args.cache_size)]


def _copy_out(args: argparse.Namespace, src: Path, work: Path) -> Path:
    """The synthesized bytes, copied out through one mount (never reused: the code that makes
    them may have changed), for memfs to serve from memory."""
    out = work / f"synth-{args.planes}x{args.size}-{args.cname}.tif"
    log("copying the synthesized TIFF out of decant-mount (for memfs)")
    cmd = _decant(args, src, work, "copy")
    with mounted(cmd, work / "mnt-decant", work / "logs" / "decant-copy.err") as dec:
        shutil.copyfile(dec.mnt / SYNTH_REL, out)
    return out


def _zarr_decode(image: Path) -> float:
    """Seconds for zarr-python to read every full-resolution plane, chunk files evicted first."""
    import zarr

    array = zarr.open_array(str(image / "0"), mode="r")
    drop_caches([image])
    start = time.perf_counter()
    for z in range(array.shape[2]):
        np.asarray(array[0, 0, z])
    return time.perf_counter() - start


def _codec_decode(image: Path) -> float:
    """Seconds to read and blosc-decode every chunk file with numcodecs alone (no zarr-python):
    what a reader bypassing zarr's async machinery could reach on one thread."""
    import numcodecs

    meta = json.loads((image / "0" / ".zarray").read_text())
    codec = numcodecs.get_codec(meta["compressor"])
    files = sorted(p for p in (image / "0").iterdir() if not p.name.startswith("."))
    drop_caches([image])
    start = time.perf_counter()
    for path in files:
        codec.decode(path.read_bytes())
    return time.perf_counter() - start


def _served_from_cache(args: argparse.Namespace, src: Path, work: Path, size: int) -> list[float]:
    """dd with every plane already decoded in a cache big enough for the file (kernel's dropped)."""
    log("sequential: decant-mount serving from its own cache (diagnostic)")
    seconds = []
    cmd = _decant(args, src, work, "cached", cache=size + 256 * MiB)
    with mounted(cmd, work / "mnt-decant", work / "logs" / "decant-cached.err") as dec:
        _dd(dec.mnt / SYNTH_REL, size)
        for _ in range(args.repeat):
            drop_caches([dec.mnt / SYNTH_REL])
            seconds.append(_dd(dec.mnt / SYNTH_REL, size))
    return seconds


def _dd(path: Path, size: int) -> float:
    seconds, nbytes = dd_read(path)
    if nbytes != size:
        raise SystemExit(f"bench: dd read {nbytes} bytes of {path}, expected {size}")
    return seconds


def _throughput(report: Report, label: str, size: int, seconds: list[float]) -> None:
    best = median(seconds)
    report.add(label, f"{mbps(size, best):.0f} MB/s", f"{best:.2f} s (median of {len(seconds)})")
