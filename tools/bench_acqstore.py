"""AcqStore benchmarks (issue 6, "Speed"; "Reading through the mount at disk speed"):
`python tools/bench.py acqstore`.

(1) Validating a generated collection of 1,000 members: the core call (`validate_collection`) in
this process, and `decant acqstore validate` as a fresh process (what a user waits for), each cold
(the collection's files evicted from the page cache, dentries and inodes dropped) and warm.
(2) A TIFF synthesized from an OME-Zarr image (uint16, one plane per blosc chunk) read
sequentially with `dd bs=1M`, rounds interleaved in one run:
  plain  the same pixels written by tifffile as an ordinary uncompressed TIFF on the same disk,
         read cold (its pages evicted): the disk-speed baseline of the target
  memfs  the in-memory pyfuse3 ceiling (tools/memfs.py serving the synthesized bytes)
  cold   decant-mount, a fresh daemon, the zarr chunks and the mount's pages evicted
  warm   the same daemon again, the mount's pages evicted (zarr chunks in the page cache, the
         daemon's own cache holding what it kept)
with the daemon's CPU per core (/proc/PID/stat utime+stime sampled every 0.1 s) and its peak RSS
against --cache-size. `--diagnostics` adds zarr-python and numcodecs decoding without FUSE.
The daemons run this checkout's code (`python -m vfs.cli`, PYTHONPATH set to it).
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

# This checkout's vfs, for the benchmark and every daemon it starts: an editable install of
# another checkout (a console script, or a script run from tools/) would otherwise win.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import numpy as np  # noqa: E402
from benchlib import (  # noqa: E402
    MB,
    TOOLS,
    CpuProfile,
    CpuSampler,
    MiB,
    Report,
    dd_read,
    drop_caches,
    evict_file,
    log,
    machine_context,
    mbps,
    median,
    mounted,
    note_end,
    require,
    run_child,
    vm_hwm,
    workdir,
)

import vfs  # noqa: E402
from vfs.acqstore.validate import validate_collection, validator  # noqa: E402
from vfs.cli import parse_size  # noqa: E402

VALIDATE_TARGET_S = 2.0
READ_RATIO_TARGET = 0.5  # synthesized TIFF cold ÷ plain TIFF of the same pixels from disk
RSS_SLACK = 150 * MiB  # peak RSS target: the cache plus this
MEMBER_NAME = "Big stack"
SYNTH_REL = Path("coll") / "members" / MEMBER_NAME / f"{MEMBER_NAME}.tif"  # within the mount
SCHEMA_KINDS = ("collection", "acqimage", "analyses", "reference-image")


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if not drop_caches():
        log("cannot drop dentries and inodes (not root?): 'cold' figures will be warm")
    with workdir(args.workdir) as work:
        report = Report(
            "acqstore bench",
            machine_context(
                workdir=work, cache=f"{args.cache_size >> 20} MiB", code=Path(vfs.__file__).parent
            ),
        )
        if args.part in ("all", "validate"):
            report_validation(report, args, ensure_large(work, args.members))
        if args.part in ("all", "read"):
            report_read(report, args, work)
    note_end(report)
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
        default="zstd",
        choices=("lz4", "lz4hc", "zstd", "zlib", "blosclz"),
        help="blosc codec of the image, level 5, byte shuffle (default zstd)",
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
        "--diagnostics",
        action="store_true",
        help="also time zarr-python and numcodecs decoding every plane without FUSE",
    )
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
    command = [sys.executable, "-m", "vfs.commands", "acqstore", "validate", str(root)]
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
    plain = ensure_plain_tiff(work, image)
    synth = _copy_out(args, src, work)
    size = synth.stat().st_size
    seq = _sequential(args, src, work, synth, plain)
    if args.diagnostics:
        log("diagnostics: zarr-python and numcodecs decoding without FUSE")
        seq["zarr"] = [_zarr_decode(image) for _ in range(args.repeat)]
        seq["codec"] = [_codec_decode(image) for _ in range(args.repeat)]
    on_disk = sum(p.stat().st_size for p in image.rglob("*") if p.is_file())
    report.section(
        f"sequential read, dd bs=1M: synthesized TIFF {size / MB:.1f} MB, {args.planes} planes "
        f"{args.size}x{args.size} uint16, blosc {args.cname} ({on_disk / MB:.1f} MB on disk, "
        f"{size / on_disk:.2f}x); plain TIFF {plain.stat().st_size / MB:.1f} MB"
    )
    _report_sequential(report, args, seq, size, plain.stat().st_size)


def ensure_plain_tiff(work: Path, image: Path) -> Path:
    """The image's pixels as an ordinary uncompressed ImageJ TIFF on the same disk (tifffile)."""
    import tifffile
    import zarr

    out = work / f"plain-{image.parent.parent.parent.name}.tif"
    if out.is_file():
        return out
    log(f"writing {out.name} with tifffile (the disk-speed baseline)")
    array = zarr.open_array(str(image / "0"), mode="r")
    part = out.with_name(out.name + ".part")
    planes = (np.asarray(array[0, 0, z]) for z in range(array.shape[2]))
    tifffile.imwrite(
        part, planes, shape=array.shape[2:], dtype=array.dtype, imagej=True, metadata={}
    )
    part.replace(out)
    return out


def _sequential(
    args: argparse.Namespace, src: Path, work: Path, synth: Path, plain: Path
) -> dict[str, Any]:
    """Rounds of: the plain TIFF cold from disk; memfs; decant-mount cold on a fresh daemon
    (zarr chunks evicted), then warm on the same daemon (its mount pages evicted)."""
    image = src / "coll" / "images" / "big.zarr"
    size, logs = synth.stat().st_size, work / "logs"
    out: dict[str, Any] = {k: [] for k in ("plain", "memfs", "cold", "warm", "hwm")}
    out.update(cpu_cold=[], cpu_warm=[])
    memfs = [sys.executable, str(TOOLS / "memfs.py"), str(work / "mnt-memfs"), str(synth), "-f"]
    with mounted(memfs, work / "mnt-memfs", logs / "memfs.log") as mem:
        _dd(mem.mnt / synth.name, size)  # untimed: first touches are not the file system's
        for r in range(args.repeat):
            log(f"sequential round {r + 1}/{args.repeat}: plain TIFF from disk, cold")
            evict_file(plain)
            out["plain"].append(_dd(plain, plain.stat().st_size))
            log(f"sequential round {r + 1}/{args.repeat}: memfs")
            drop_caches([mem.mnt / synth.name])
            out["memfs"].append(_dd(mem.mnt / synth.name, size))
            log(f"sequential round {r + 1}/{args.repeat}: decant-mount cold (fresh daemon), warm")
            cmd = _decant(args, src, work, f"cold-{r}")
            with mounted(cmd, work / "mnt-decant", logs / f"decant-cold-{r}.err") as dec:
                target = dec.mnt / SYNTH_REL
                os.stat(target)  # the view is built on lookup: not part of reading
                for temperature in ("cold", "warm"):
                    drop_caches([image, target] if temperature == "cold" else [target])
                    with CpuSampler(dec.pid) as cpu:
                        out[temperature].append(_dd(target, size))
                    out[f"cpu_{temperature}"].append(cpu.profile)
                out["hwm"].append(vm_hwm(dec.pid))
    return out


def _report_sequential(
    report: Report, args: argparse.Namespace, seq: dict[str, Any], size: int, plain_size: int
) -> None:
    # Throughputs, so files of slightly different sizes (headers) compare by rate.
    rates = {
        key: [mbps(size if key != "plain" else plain_size, s) for s in seq[key]]
        for key in ("plain", "memfs", "cold", "warm")
    }
    labels = {
        "plain": "(a) plain TIFF, same disk, cold",
        "memfs": "(b) memfs ceiling, same bytes",
        "cold": "(c) decant-mount cold, fresh daemon",
        "warm": "(d) decant-mount warm, same daemon",
    }
    for key, label in labels.items():
        _rate_row(report, label, rates[key], seq[key])
    ratio = [c / p for c, p in zip(rates["cold"], rates["plain"], strict=True)]
    report.target("(c)/(a) cold ÷ plain disk", median(ratio), READ_RATIO_TARGET, "", at_most=False)
    report.add("  per round", " ".join(f"{x:.2f}" for x in ratio))
    for num, den in (("cold", "memfs"), ("warm", "memfs"), ("warm", "plain")):
        each = [n / d for n, d in zip(rates[num], rates[den], strict=True)]
        report.add(
            f"{_tag(num)}/{_tag(den)} {num} ÷ {den}",
            f"{median(each):.2f}",
            "per round " + " ".join(f"{x:.2f}" for x in each),
        )
    for temperature in ("cold", "warm"):
        profiles: list[CpuProfile] = seq[f"cpu_{temperature}"]
        best = sorted(profiles, key=lambda p: p.busy)[len(profiles) // 2]
        report.add(f"{_tag(temperature)} daemon CPU", f"{best.busy:.2f} cores", best.text())
    peak = max(seq["hwm"])
    report.target(
        "peak RSS - cache", (peak - args.cache_size) / MiB, RSS_SLACK / MiB, "MiB", at_most=True
    )
    report.add("  peak RSS", f"{peak / MiB:.0f} MiB", f"cache {args.cache_size / MiB:.0f} MiB")
    for key, label, note in (
        ("zarr", "zarr-python decode, no FUSE", "one thread"),
        ("codec", "numcodecs per chunk file", "no zarr-python, one thread"),
    ):
        if key in seq:
            _rate_row(report, f"    {label}", [mbps(size, s) for s in seq[key]], seq[key], note)


def _tag(key: str) -> str:
    return {"plain": "(a)", "memfs": "(b)", "cold": "(c)", "warm": "(d)"}[key]


def _rate_row(
    report: Report, label: str, rates: list[float], seconds: list[float], note: str = ""
) -> None:
    shown = " ".join(f"{r:.0f}" for r in rates)
    report.add(
        label,
        f"{median(rates):.0f} MB/s",
        f"{median(seconds):.2f} s; rounds {shown} MB/s {note}".rstrip(),
    )


def _decant(
    args: argparse.Namespace, src: Path, work: Path, tag: str, cache: int | None = None
) -> list[str]:
    """A foreground decant-mount of `src` running this checkout's code, with a fresh index."""
    index = work / "index" / f"{tag}-{time.monotonic_ns()}"
    index.mkdir(parents=True)
    cmd = [sys.executable, "-m", "vfs.cli", str(src), str(work / "mnt-decant"), "-f"]
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


def _dd(path: Path, size: int) -> float:
    seconds, nbytes = dd_read(path)
    if nbytes != size:
        raise SystemExit(f"bench: dd read {nbytes} bytes of {path}, expected {size}")
    return seconds
