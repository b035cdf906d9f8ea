"""A folder of TIFFs as one series: consolidated (shared `0`) when pages allow, else nested."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import vfs
from vfs.beneath import open_beneath
from vfs.decant.limits import MAX_MEMBERS, MAX_PAGES, MAX_SEGMENTS
from vfs.decant.manifest import MAX_DEPTH, Manifest, MemberRecord
from vfs.decant.packer import (
    PackOptions,
    PackResult,
    _publish,
    create_pixel_arrays,
    fd_path,
    held_open,
    husk_blocks,
    ngff_attrs,
    pack_file,
    write_planes,
)
from vfs.decant.regions import RegionIndex
from vfs.decant.store import MANIFEST_KEY
from vfs.decant.tiffscan import NotByteExact, TiffLayout, scan_tiff
from vfs.decant.verify import reach
from vfs.decant.writer import HUSK_CHUNK, ArchiveWriter, Progress
from vfs.errors import PackError


def series_members(folder: Path) -> list[Path]:
    """Every regular file below `folder`, hidden ones excepted, in a stable order. A symlink
    among them is refused, not followed: packing a user's folder (root, say) must not pack a
    file outside it that a link of theirs names, into an archive with the folder's mode.

    Walked with a stack (Path.rglob recursed once a level: a user's chain of 1,500 folders
    was a RecursionError), and a folder deeper than a member's path may be is refused."""
    files = []
    stack = [(folder, 1)]  # a folder and the names a member's path inside it would have
    while stack:
        at, names = stack.pop()
        try:
            with os.scandir(at) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except FileNotFoundError:
            continue  # gone since listed
        except OSError as exc:  # rglob skipped it: a series missing members, silently
            raise PackError(f"{at}: cannot list it ({exc.strerror}) (not packed)") from None
        for entry in entries:
            p = Path(entry.path)
            if entry.name.startswith("."):
                continue
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue  # gone since listed
            if stat.S_ISLNK(st.st_mode):
                raise PackError(
                    f"{p}: a symlink; a series packs the folder's own files (not packed)"
                )
            if stat.S_ISDIR(st.st_mode):
                if names >= MAX_DEPTH:
                    raise PackError(
                        f"{p}: a folder {names} deep; a series member's path holds at most "
                        f"{MAX_DEPTH} names (not packed)"
                    )
                stack.append((p, names + 1))
            elif stat.S_ISREG(st.st_mode):
                files.append(p)
    if not files:
        raise PackError(f"{folder}: no files to pack as a series")
    if len(files) > MAX_MEMBERS:  # the readers refuse a manifest of more
        raise PackError(
            f"{folder}: {len(files)} files; a series holds at most {MAX_MEMBERS} members "
            "(pack its folders apart)"
        )
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def member_digest(folder: Path, path: Path) -> tuple[str, int]:
    """The sha256 and mode bits of the member at `path`, read from one descriptor reached from
    `folder` with no link followed (a file swapped for a link after `series_members` looked
    is refused here). The archive must reconstruct to these digests, so a file swapped in
    later fails the pack's verification instead of being packed, and the archive's mode is
    that of the files these bytes came from."""
    with held_member(folder, path) as (held, st):
        digest = hashlib.sha256()
        with open(held, "rb") as fh:
            while block := fh.read(4 * 1024 * 1024):
                digest.update(block)
    return digest.hexdigest(), stat.S_IMODE(st.st_mode)


@contextmanager
def held_member(folder: Path, path: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """The member at `path` opened below `folder` with no link followed, as a path naming that
    very file (/proc/self/fd/N), and its stat. Each step of a series pack opened its members by
    name: one swapped for a FIFO after the listing held root's pack for good (red team 63,
    F2), one reached through a swapped link was read as root."""
    try:
        fd = open_beneath(folder, path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise PackError(f"{path}: cannot read it as a file of {folder} ({exc.strerror})") from None
    with held_open(path, fd) as held:
        yield held


def pack_series(
    folder: Path, out: Path | None, options: PackOptions, progress: Progress | None = None
) -> PackResult:
    """Pack the folder as one series. The folder is opened once and every member reached
    below that descriptor, no link followed: opened by name at each step, a user swapping
    their series folder for a link to root's between the steps had root's 0600 file packed
    into an archive with the user's folder's mode 0644 (red team 63, F1)."""
    try:
        fd = reach(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise PackError(f"{folder}: {exc.strerror or exc}") from None
    root = fd_path(fd, folder)
    try:
        return _pack_series(folder, root, os.fstat(fd), out, options, progress)
    except PackError as exc:  # named as the caller named the folder
        raise PackError(str(exc).replace(str(root), str(folder))) from None
    finally:
        os.close(fd)


def _pack_series(
    folder: Path,
    root: Path,
    st: os.stat_result,
    out: Path | None,
    options: PackOptions,
    progress: Progress | None,
) -> PackResult:
    """`pack_series` of the folder open at `root` (a /proc path), named `folder`."""
    members = series_members(root)
    layouts: list[TiffLayout] = []
    if options.mode != "verbatim":
        try:
            for p in members:
                with held_member(root, p) as (held, mst):
                    layouts.append(scan_tiff(held, mst.st_size))
        except NotByteExact:
            layouts = []
    consolidated = (
        bool(layouts)
        and all(
            lay.dtype == layouts[0].dtype and lay.page_shape == layouts[0].page_shape
            for lay in layouts
        )
        # One manifest lists every member's pages: it must stay within the reader's bounds.
        and sum(len(lay.pages) for lay in layouts) <= MAX_PAGES
        and sum(len(p.dataoffsets) for lay in layouts for p in lay.pages) <= MAX_SEGMENTS
    )
    suffix = ".zarr.zip" if consolidated else ".zarr"
    if out is None:
        out = folder.parent / f"{folder.name}{suffix}"
    elif consolidated != out.name.endswith(".zip"):
        raise PackError(
            f"{out}: this series packs {'consolidated (.zarr.zip)' if consolidated else 'nested'}"
            f" — name the output NAME{suffix}"
        )
    if out.exists() and not options.overwrite:
        raise PackError(f"{out}: already exists (pass overwrite to replace it)")
    # The archive is no more open than the most private member (it took the folder's mode
    # alone, so a 0600 TIFF of a 0755 folder was published 0755), each member's bits taken
    # from the descriptor its digest was read from.
    bits = stat.S_IMODE(st.st_mode)
    shas = {}
    for p in members:
        shas[p.relative_to(root).as_posix()], member_bits = member_digest(root, p)
        bits &= member_bits
    if consolidated:

        def write(tmp: Path) -> None:
            _write_consolidated(root, folder.name, members, layouts, shas, tmp, options, progress)

    else:

        def write(tmp: Path) -> None:
            _write_nested(root, folder.name, members, shas, tmp, options)

    _publish(out, st, write, shas, bits)
    mode = "series" if consolidated else "series-nested"
    size = sum(p.lstat().st_size for p in members)
    from vfs.decant.packer import _tree_size

    return PackResult(folder, out, mode, size, _tree_size(out))


def _write_consolidated(
    folder: Path,
    name: str,
    members: list[Path],
    layouts: list[TiffLayout],
    shas: dict[str, str],
    tmp: Path,
    options: PackOptions,
    progress: Progress | None,
) -> None:
    first = layouts[0]
    total = sum(len(lay.pages) for lay in layouts)
    attrs = ngff_attrs(name, ("z",), first.page_shape, options.pyramid)
    writer = ArchiveWriter(tmp, attrs)
    records = []
    try:
        arrays = create_pixel_arrays(writer, (total,), first, options)
        base = 0
        for i, (path, lay) in enumerate(zip(members, layouts, strict=True)):
            pages = tuple(replace(p, index=p.index + base) for p in lay.pages)
            with held_member(folder, path) as (held, st), open(held, "rb") as fh:
                size = st.st_size
                husk = size - lay.pixel_bytes
                write_planes(arrays, fh.fileno(), lay, pages, [(p.index,) for p in pages], progress)
                regions = RegionIndex.build(lay.pages, size, husk, str(path))
                writer.byte_array(f"husk_{i}", husk_blocks(fh.fileno(), regions), husk, HUSK_CHUNK)
            relpath = path.relative_to(folder).as_posix()
            records.append(
                MemberRecord(relpath, size, shas[relpath], lay.byteorder, f"husk_{i}", husk, pages)
            )
            base += len(pages)
        writer.finish(_series_manifest(name, records, True, options, first.byteorder))
    except BaseException:
        writer.abort()
        raise


def _write_nested(
    folder: Path,
    name: str,
    members: list[Path],
    shas: dict[str, str],
    tmp: Path,
    options: PackOptions,
) -> None:
    tmp.mkdir(exist_ok=True)
    records = []
    for i, path in enumerate(members):
        with held_member(folder, path) as (held, _st):
            out = tmp / f"m{i}.zarr.zip"
            result = pack_file(held, out, replace(options, overwrite=False), name=path.name)
        relpath = path.relative_to(folder).as_posix()
        records.append(
            MemberRecord(
                relpath, result.original_size, shas[relpath], "<", subarchive=result.archive.name
            )
        )
    (tmp / ".decant").mkdir()
    manifest = _series_manifest(name, records, False, options, "<")
    (tmp / MANIFEST_KEY).write_bytes(manifest.dumps())
    os.utime(tmp / MANIFEST_KEY)


def _series_manifest(
    name: str,
    records: list[MemberRecord],
    consolidated: bool,
    options: PackOptions,
    byteorder: str,
) -> Manifest:
    return Manifest(
        format=1,
        mode="series",
        original_name=name,
        original_size=0,
        original_sha256="",
        byteorder=byteorder,
        decant_version=vfs.__version__,
        pixel_codec=options.codec.describe() if consolidated else "",
        plane_order=("z",) if consolidated else (),
        members=tuple(records),
        series_consolidated=consolidated,
        all_chunks_stored=True,
    )
