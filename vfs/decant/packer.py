"""Packing files into decant archives behind the reconstruct-and-verify gate; atomic publish."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import vfs
from vfs.decant import temp_name
from vfs.decant.layout import deserialize_page, page_coordinate
from vfs.decant.limits import MAX_CHUNK_BYTES, MAX_SEGMENTS
from vfs.decant.manifest import Manifest, PageRecord
from vfs.decant.regions import HUSK, RegionIndex
from vfs.decant.store import MANIFEST_KEY
from vfs.decant.tiffscan import NotByteExact, TiffLayout, scan_tiff
from vfs.decant.verify import reach, require_verified
from vfs.decant.writer import (
    HUSK_CHUNK,
    VERBATIM_CHUNK,
    ArchiveWriter,
    CodecChoice,
    Progress,
    fsync_dir,
    fsync_tree,
)
from vfs.errors import DecantError, PackError

log = logging.getLogger(__name__)
DEFAULT_CODEC = CodecChoice()
PACK_THREADS = os.cpu_count() or 2
# Planes compressed at once hold ~3x their size each (the bytes read, the array, zarr's
# compressed chunk): four 250 MiB planes a user copied in took the daemon to 1.8 GiB (red team
# 75, F3). Planes past half of this are compressed one at a time, on one core.
PLANES_IN_FLIGHT_BYTES = 256 << 20
_AXIS_TYPE = {"t": "time", "c": "channel", "z": "space"}


@dataclass(frozen=True)
class PackOptions:
    mode: str = "auto"  # auto | byte-exact | verbatim
    codec: CodecChoice = DEFAULT_CODEC
    pyramid: int = 0
    overwrite: bool = False
    max_plane: int = MAX_CHUNK_BYTES  # larger pages go verbatim (the daemon's is its cache's)
    max_segments: int = MAX_SEGMENTS  # more strips/tiles go verbatim (the daemon's: its cache's)


@dataclass(frozen=True)
class PackResult:
    source: Path
    archive: Path
    mode: str
    original_size: int
    archive_size: int
    reason: str = ""  # why mode V was chosen, when it was


def file_sha256(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(4 * 1024 * 1024):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


def default_archive_name(source: Path) -> str:
    return f"{source.name}.zarr.zip"


def pack_file(
    source: Path,
    out: Path,
    options: PackOptions = PackOptions(),
    progress: Progress | None = None,
    name: str | None = None,
) -> PackResult:
    """Pack one file. Publishes `out` only after it reconstructs byte-exact from disk. `name`:
    the original's name, where `source` is not it (a series member held open)."""
    if out.exists() and not options.overwrite:
        raise PackError(f"{out}: already exists (pass overwrite to replace it)")
    with held_open(source) as (held, st):
        return _pack_held(source, held, st, out, options, progress, name or source.name)


@contextmanager
def held_open(source: Path, opened: int | None = None) -> Iterator[tuple[Path, os.stat_result]]:
    """The file at `source` opened once (or the descriptor `opened` the caller made of it,
    closed here): a path naming that very file (its descriptor's, in /proc: whatever `source`
    names later), and its stat; a FIFO or a folder is refused, not waited on. Each step opened
    `source` by name (the stat for the archive's mode, the hash, the scan, the write): root
    packing a user's file archived whatever the user swapped in between, a link to root's 0600
    secret, with the mode of the 0644 file it had stat'ed (red team 62, F2)."""
    fd = opened
    if fd is None:
        try:
            fd = reach(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise PackError(f"{source}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PackError(f"{source}: not a regular file")
        yield fd_path(fd, source), st
    finally:
        os.close(fd)


def fd_path(fd: int, fallback: Path) -> Path:
    """A path naming the file open on `fd` itself (/proc/self/fd/N), or `fallback` where
    there is no /proc."""
    held = Path(f"/proc/self/fd/{fd}")
    return held if os.path.exists(held) else fallback


def _pack_held(
    source: Path,
    held: Path,
    st: os.stat_result,
    out: Path,
    options: PackOptions,
    progress: Progress | None,
    name: str,
) -> PackResult:
    """`pack_file` of the file open at `held`, named `source`, its original named `name`."""
    sha = file_sha256(held)
    layout, reason = None, ""
    if options.mode != "verbatim":
        try:
            layout = scan_tiff(held, st.st_size, options.max_plane, options.max_segments)
        except NotByteExact as exc:
            reason = str(exc).replace(str(held), str(source))
            if options.mode == "byte-exact":
                raise PackError(f"{source}: cannot pack byte-exact: {reason}") from None
    if layout is not None:
        try:
            _publish(
                out,
                st,
                lambda tmp: _write_byte_exact(held, tmp, layout, sha, options, progress, name),
                {name: sha},
            )
            return _result(source, out, "byte-exact", st.st_size)
        except DecantError as exc:
            if options.mode == "byte-exact":
                raise
            reason = f"byte-exact reconstruction failed verification ({exc})"
            log.warning("%s: %s; packing verbatim", source, reason)
    _publish(
        out,
        st,
        lambda tmp: _write_verbatim(held, tmp, sha, options, progress, name),
        {name: sha},
    )
    return _result(source, out, "verbatim", st.st_size, reason)


def _result(source: Path, out: Path, mode: str, size: int, reason: str = "") -> PackResult:
    return PackResult(source, out, mode, size, _tree_size(out), reason)


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _publish(
    out: Path, st: os.stat_result, write: Any, expected: dict[str, str], mode: int | None = None
) -> None:
    """temp name → write → fsync → verify from disk → mtime → rename → fsync folder. The
    archive takes `st`'s mode bits, or `mode` where given (a folder archive: see `_own_bits`)."""
    # The temp name keeps the archive's suffix (it decides zip or folder) behind a hidden prefix
    # that the mount and the spool recovery recognise.
    tmp = out.parent / temp_name(out.name)
    try:
        if out.name.endswith(".zip"):
            # Nobody else reads the archive of a 0600 original while it is being written: the
            # file exists 0600 from the start; its final mode is set once it verified.
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        else:
            os.mkdir(tmp, 0o700)  # the same for a folder archive's files, whatever the umask
        write(tmp)
        fsync_tree(tmp)
        require_verified(tmp, expected)
        # The mount shows an original's mode bits.
        bits = stat.S_IMODE(st.st_mode) if mode is None else mode
        if tmp.is_file():
            os.chmod(tmp, bits)
        else:
            _own_bits(tmp, bits)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        if out.is_dir() and not out.is_symlink():
            refuse_unless_archive(out)
            shutil.rmtree(out)
        os.replace(tmp, out)
        fsync_dir(out.parent)
    finally:
        remove_tree(tmp)


def _own_bits(folder: Path, bits: int) -> None:
    """A folder archive's files take the original's read and write bits, its folders those
    bits with search added where read is given (0600 → files 0600, folders 0700): written with
    the umask's (0644, 0755), the pixels and the manifest of a 0600 original were readable
    by every user on the machine, and so was the original through a mount of it (red team 61,
    F1). The folder itself last: until then it is 0700, as it was written."""
    files = bits & 0o666
    folders = files | (files & 0o444) >> 2
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), files, follow_symlinks=False)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), folders, follow_symlinks=False)
    os.chmod(folder, folders)


def refuse_unless_archive(folder: Path) -> None:
    """PackError unless `folder` is a decant folder archive: replacing one removes it whole,
    and `-o archive/` of one input (as for several) named a folder of other archives. Its
    manifest and the folder holding it must be its own, not links: a link to another archive's
    `.decant` made any folder pass."""
    marker = folder
    for part in Path(MANIFEST_KEY).parts:
        marker = marker / part
        try:
            st = os.lstat(marker)
        except OSError:
            st = None
        want = stat.S_ISREG if marker.name == Path(MANIFEST_KEY).name else stat.S_ISDIR
        if st is None or not want(st.st_mode):
            raise PackError(f"{folder}: a folder that is not a decant archive (not replaced)")


def remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def ngff_attrs(
    name: str, axes: tuple[str, ...], page_shape: tuple[int, ...], levels: int
) -> dict[str, Any]:
    """OME-NGFF 0.4 multiscales for `0` (and pyramid levels), plus the decant marker."""
    ax: list[dict[str, str]] = [{"name": a, "type": _AXIS_TYPE.get(a, "custom")} for a in axes]
    ax += [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}]
    if len(page_shape) == 3:
        # Samples stay last (spec §3); NGFF 0.4 wants channels before space — see the README.
        ax.append({"name": "s", "type": "channel"})
    datasets = []
    for level in range(levels + 1):
        scale = [1.0] * len(axes) + [2.0**level, 2.0**level] + [1.0] * (len(page_shape) - 2)
        datasets.append(
            {"path": str(level), "coordinateTransformations": [{"type": "scale", "scale": scale}]}
        )
    return {
        "multiscales": [{"version": "0.4", "name": name, "axes": ax, "datasets": datasets}],
        "decant": {"pixels": "0", "manifest": MANIFEST_KEY, "format": 1},
    }


def _write_byte_exact(
    source: Path,
    tmp: Path,
    layout: TiffLayout,
    sha: str,
    options: PackOptions,
    progress: Progress | None,
    name: str | None = None,
) -> None:
    name = name or source.name
    size = source.stat().st_size
    husk_size = size - layout.pixel_bytes
    attrs = ngff_attrs(name, layout.canonical_axes, layout.page_shape, options.pyramid)
    attrs["decant"]["husk"] = "husk"
    writer = ArchiveWriter(tmp, attrs)
    try:
        with open(source, "rb") as fh:
            leading = layout.canonical_leading
            coords = [page_coordinate(p.index, leading, layout.plane_order) for p in layout.pages]
            arrays = create_pixel_arrays(writer, leading, layout, options)
            write_planes(arrays, fh.fileno(), layout, layout.pages, coords, progress)
            regions = RegionIndex.build(layout.pages, size, husk_size, str(source))
            writer.byte_array("husk", husk_blocks(fh.fileno(), regions), husk_size, HUSK_CHUNK)
        writer.finish(
            Manifest(
                format=1,
                mode="byte-exact",
                original_name=name,
                original_size=size,
                original_sha256=sha,
                byteorder=layout.byteorder,
                decant_version=vfs.__version__,
                pixel_codec=options.codec.describe(),
                pages=layout.pages,
                plane_order=layout.plane_order,
                husk_raw_size=husk_size,
                all_chunks_stored=True,
            )
        )
    except BaseException:
        writer.abort()
        raise


def create_pixel_arrays(
    writer: ArchiveWriter, leading: tuple[int, ...], layout: TiffLayout, options: PackOptions
) -> list[Any]:
    """`0` and its optional XY pyramid levels (nearest-neighbour: for viewing only, never read)."""
    ndim = len(layout.page_shape)
    arrays = []
    for level in range(options.pyramid + 1):
        shape = list(layout.page_shape)
        shape[0], shape[1] = -(-shape[0] // 2**level), -(-shape[1] // 2**level)
        arrays.append(
            writer.pixel_array(str(level), (*leading, *shape), ndim, layout.dtype, options.codec)
        )
    return arrays


def write_planes(
    arrays: list[Any],
    fd: int,
    layout: TiffLayout,
    pages: tuple[PageRecord, ...],
    coords: list[tuple[int, ...]],
    progress: Progress | None,
) -> None:
    """Write each page's pixels, read straight from the file's segments, at its coordinate.

    Planes are compressed on every core: zarr turns blosc's own threads off when imported
    (numcodecs.blosc.use_threads = False), so one plane at a time kept packing on one core.
    A few planes (or runs of small ones) in flight bound the memory to those planes.
    """
    itemsize = int(np.dtype(layout.dtype).itemsize)
    plane_bytes = itemsize * int(np.prod(layout.page_shape))

    def write(run: list[int]) -> int:
        bufs = [_page_bytes(fd, pages[i]) for i in run]
        planes = [
            deserialize_page(b, pages[i], layout.dtype) for b, i in zip(bufs, run, strict=True)
        ]
        if len(run) == 1:
            where: tuple[Any, ...] = coords[run[0]]
            block = planes[0]
        else:  # consecutive along one axis: one zarr assignment for the whole run
            where, block = run_selection([coords[i] for i in run]), np.stack(planes)
        for level, arr in enumerate(arrays):
            step = 2**level
            if not level:
                arr[where] = block
            elif len(run) == 1:
                arr[where] = block[::step, ::step]
            else:
                arr[where] = block[:, ::step, ::step]
        return sum(len(b) for b in bufs)

    runs = plane_runs(coords, plane_bytes)
    workers = max(1, min(PACK_THREADS, len(runs), PLANES_IN_FLIGHT_BYTES // max(1, plane_bytes)))
    with ThreadPoolExecutor(workers, thread_name_prefix="decant-pack") as pool:
        pending: deque[Future[int]] = deque()
        for run in runs:
            pending.append(pool.submit(write, run))
            if len(pending) > workers:
                done = pending.popleft().result()
                if progress:
                    progress(done)
        for future in pending:
            done = future.result()
            if progress:
                progress(done)


# Planes smaller than this are written to zarr in runs of consecutive coordinates: each zarr
# assignment costs ~1.9 ms of its own (a round trip through zarr's event-loop thread), which was
# 13 of the 18 s that packing a stack of 8,192 4x4 pages took, one assignment a plane.
SMALL_PLANE = 256 << 10
RUN_BYTES = 4 << 20  # decoded bytes of one run at most
# Pages of one run at most: zarr holds a few KiB of tasks and buffers per chunk of an assignment
# until it completes, so a run of 30,000 one-pixel pages peaked at ~75 MiB; 512 cost ~1.3 MiB.
RUN_PAGES = 512


def plane_runs(coords: list[tuple[int, ...]], plane_bytes: int) -> list[list[int]]:
    """Page indices in order, grouped into runs whose coordinates step by one along a single
    axis (so a run is one slice of the array); every page alone when planes are not small."""
    if plane_bytes >= SMALL_PLANE or not coords or not coords[0]:
        return [[i] for i in range(len(coords))]
    most = max(1, min(RUN_PAGES, RUN_BYTES // max(1, plane_bytes)))
    runs: list[list[int]] = []
    axis = -1
    for i, c in enumerate(coords):
        run = runs[-1] if runs else None
        if run is not None and len(run) < most:
            step = _unit_step(coords[run[-1]], c)
            if step is not None and (len(run) == 1 or step == axis):
                axis = step
                run.append(i)
                continue
        runs.append([i])
    return runs


def _unit_step(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """The axis along which `b` is `a` plus one, all else equal; else None."""
    diff = [k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    return diff[0] if len(diff) == 1 and b[diff[0]] == a[diff[0]] + 1 else None


def run_selection(run: list[tuple[int, ...]]) -> tuple[Any, ...]:
    """The array selection of a run's coordinates (consecutive along one axis): that axis a
    slice, the others fixed, so the selection's shape is (len(run), *page_shape)."""
    first, last = run[0], run[-1]
    axis = next(k for k, (x, y) in enumerate(zip(first, last, strict=True)) if x != y)
    return (*first[:axis], slice(first[axis], last[axis] + 1), *first[axis + 1 :])


def _page_bytes(fd: int, page: PageRecord) -> bytes:
    return b"".join(
        _pread(fd, c, o) for o, c in zip(page.dataoffsets, page.databytecounts, strict=True)
    )


def _pread(fd: int, count: int, offset: int) -> bytes:
    data = os.pread(fd, count, offset)
    if len(data) != count:
        raise PackError(f"short read at offset {offset}: the file changed while packing")
    return data


def husk_blocks(fd: int, regions: RegionIndex) -> Iterator[bytes]:
    for r in regions:
        if r.page == HUSK:
            for off in range(r.start, r.start + r.length, HUSK_CHUNK):
                yield _pread(fd, min(HUSK_CHUNK, r.start + r.length - off), off)


def _write_verbatim(
    source: Path,
    tmp: Path,
    sha: str,
    options: PackOptions,
    progress: Progress | None,
    name: str | None = None,
) -> None:
    del options
    name = name or source.name
    size = source.stat().st_size
    writer = ArchiveWriter(
        tmp, {"decant": {"original": "original", "manifest": MANIFEST_KEY, "format": 1}}
    )

    def blocks() -> Iterator[bytes]:
        with open(source, "rb") as fh:
            while block := fh.read(VERBATIM_CHUNK):
                if progress:
                    progress(len(block))
                yield block

    try:
        writer.byte_array("original", blocks(), size, VERBATIM_CHUNK)
        writer.finish(
            Manifest(
                format=1,
                mode="verbatim",
                original_name=name,
                original_size=size,
                original_sha256=sha,
                decant_version=vfs.__version__,
                pixel_codec="blosc:zstd:noshuffle:clevel=5",
                all_chunks_stored=True,
            )
        )
    except BaseException:
        writer.abort()
        raise
