"""`decant pack | restore | verify | info`: the archive core from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import stat
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfs.commands.progress import byte_progress
from vfs.commands.remote import (
    add_s3_options,
    location,
    open_remote_archive,
    remote_name,
    stored_bytes,
)
from vfs.commands.status import (
    FAILED,
    OK,
    OutputError,
    UsageError,
    add_command,
    quiet,
    report,
    require_readable,
    say,
)
from vfs.errors import DecantError, NotAnArchiveError, PackError

if TYPE_CHECKING:  # the cores load zarr: imported when a command runs, not to build the parser
    from vfs.decant.packer import PackOptions, PackResult
    from vfs.decant.reader import DecantArchive
    from vfs.decant.writer import CodecChoice

# A decant archive file is a zip: a local file header first (an empty zip: the end record).
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def register(sub: Any) -> None:
    p = add_command(sub, "pack", help="pack TIFFs (or any file) into decant archives")
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT")
    p.add_argument(
        "-o",
        "--output",
        type=output_location,
        help="archive (one input) or folder (several, or one ending in /); "
        "s3://BUCKET/KEY.zarr.zip or s3://BUCKET/PREFIX/ uploads (packed to a temp file, "
        "uploaded, read back and checked)",
    )
    p.add_argument("--mode", choices=("auto", "byte-exact", "verbatim"), default="auto")
    p.add_argument(
        "--codec",
        type=_codec,
        default="zstd:byteshuffle:5",
        help="blosc pixel codec as CNAME[:SHUFFLE][:LEVEL] (default %(default)s)",
    )
    p.add_argument("--pyramid", type=int, default=0, metavar="N", help="XY pyramid levels to add")
    p.add_argument("--series", action="store_true", help="pack a folder of TIFFs as one series")
    p.add_argument("--force", action="store_true", help="replace an existing archive")
    add_s3_options(p)
    p.set_defaults(func=cmd_pack)

    p = add_command(sub, "restore", help="write the original(s) back, checking sha256")
    p.add_argument("archive", type=location, help="a path or s3://BUCKET/KEY")
    p.add_argument("-o", "--output", type=Path, help="file (or folder, for a series)")
    add_s3_options(p)
    p.set_defaults(func=cmd_restore)

    p = add_command(sub, "verify", help="reconstruct in memory and check every sha256")
    p.add_argument("archives", nargs="+", type=location, metavar="ARCHIVE")
    add_s3_options(p)
    p.set_defaults(func=cmd_verify)

    p = add_command(sub, "info", help="print the manifest summary")
    p.add_argument("archive", type=location, help="a path or s3://BUCKET/KEY")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    add_s3_options(p)
    p.set_defaults(func=cmd_info)


def _codec(text: str) -> CodecChoice:
    """argparse type: a bad --codec is a usage error (exit 2) before anything is read."""
    from vfs.decant.writer import CodecChoice

    try:
        return CodecChoice.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@contextmanager
def open_archive(
    path: Path | str, args: argparse.Namespace | None = None
) -> Iterator[DecantArchive]:
    """Open `path` (or an s3:// URL) as a decant archive, for the block; UsageError (exit 2)
    when it is not one at all.

    Only the top level is judged here: what goes wrong once it opened is damage (exit 1). A
    local archive is reached as an input of `decant pack` is (`verify.reach`: another user's
    link on the way refused) and opened once, without blocking: the core reads the very file
    or folder opened. Opened by name after a check, a user's archive swapped for a FIFO in
    between held root's `decant info` for good (red team 64, F3)."""
    from vfs.decant.packer import fd_path
    from vfs.decant.reader import DecantArchive
    from vfs.decant.verify import reach

    if isinstance(path, str):
        with open_remote_archive(path, args or argparse.Namespace()) as remote:
            yield remote
        return
    try:
        fd = reach(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    held = fd_path(fd, path)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            if os.pread(fd, 4, 0) not in ZIP_MAGIC and not _zip_with_prefix(fd):
                raise UsageError(f"{path}: not a decant archive (not a zip file)")
        elif not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{path}: not a decant archive (not a file or a folder)")
        try:
            archive = DecantArchive.open(held)
        except NotAnArchiveError as exc:  # deeper down (a series bundle gone) it is damage: 1
            raise UsageError(str(exc).replace(str(held), str(path))) from None
        with archive:
            yield archive
    except (DecantError, OSError) as exc:  # named as the caller named the archive
        exc.args = tuple(
            a.replace(str(held), str(path)) if isinstance(a, str) else a for a in exc.args
        )
        if isinstance(exc, OSError) and isinstance(exc.filename, str):
            exc.filename = exc.filename.replace(str(held), str(path))
        raise
    finally:
        os.close(fd)


def _zip_with_prefix(fd: int) -> bool:
    """A zip with bytes before its first entry (a self-extractor's stub, a header of some
    tool's): what Python's zipfile reads, and the mount serves (docs/format.md), so the
    commands take it too (red team 79 F1: `decant verify` refused what the mount verified)."""
    with os.fdopen(os.dup(fd), "rb") as fh:
        return zipfile.is_zipfile(fh)


def _name(path: Path | str) -> str:
    return remote_name(path) if isinstance(path, str) else path.name


@contextmanager
def writing(src: Path, out: Path) -> Iterator[None]:
    """An OSError while writing names the input and the output, not the core's temp file."""
    try:
        yield
    except OSError as exc:
        raise OutputError(f"{src}: cannot write {out}: {exc.strerror or exc}") from None


def cmd_pack(args: argparse.Namespace) -> int:
    from vfs.decant.packer import PackOptions

    options = PackOptions(args.mode, args.codec, args.pyramid, overwrite=args.force)
    if isinstance(args.output, str):
        from vfs.commands.upload import pack_to_bucket

        return pack_to_bucket(args, options)
    if args.series:
        if len(args.inputs) != 1 or not args.inputs[0].is_dir():
            raise UsageError("--series takes exactly one folder")
        return _pack_series(args.inputs[0], args.output, options, quiet(args))
    status = OK
    packed: dict[Path, Path] = {}  # archive → the input this run packed into it
    for src in args.inputs:
        try:
            out = _pack_target(src, args)
            if out in packed:  # two inputs of one name: --force would replace the first's
                raise UsageError(
                    f"{src}: its archive {out} is {packed[out]}'s, packed by this run (not packed)"
                )
            _pack_one(src, out, options, quiet(args))
            packed[out] = src
        except (DecantError, OSError) as exc:
            status = max(status, report(exc))
    return status


def _pack_target(src: Path, args: argparse.Namespace) -> Path:
    from vfs.decant.packer import default_archive_name

    if len(args.inputs) == 1 and args.output and not _a_folder(args.output):
        return args.output
    folder: Path = args.output or src.parent
    return folder / default_archive_name(src)


def _a_folder(out: Path) -> bool:
    """Whether `-o` of one input names a folder to pack into, as for several: written with a
    trailing slash (`-o out/` made a folder archive named `out`; red team 61). Not a folder
    found there: one another user planted at root's `-o /tmp/scan.zarr.zip` took the archive
    (red team 62, F1); it is refused, as a folder that is not an archive."""
    return isinstance(out, FolderPath)


class FolderPath(type(Path())):  # type: ignore[misc]
    """An `-o` given with a trailing slash (which a Path drops)."""


def output_location(text: str) -> Path | str:
    """argparse type of `pack -o`: `location`, remembering a trailing slash."""
    found = location(text)
    return FolderPath(found) if isinstance(found, Path) and text.endswith("/") else found


@contextmanager
def reached(out: Path) -> Iterator[Path]:
    """`out` as a name in the working folder, made its folder for the block and reached one
    component at a time (vfs.decant.verify.output_folder, missing folders made): a symlink of
    another user's on the way is refused, not followed. `decant pack v.tif -o /tmp/x/v.zarr`
    wrote into the folder that another user's link `/tmp/x` pointed at, where they could swap
    or read what was packed (red team 61, F2), as `decant restore` had refused. The core then
    names its output by that name alone: a link put on the way after the walk is never met."""
    from vfs.decant.verify import output_folder, swappable

    if not out.name:
        raise UsageError(f"{out}: not a name an archive can have")
    here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        folder = output_folder(out.parent)
        try:
            why = swappable(os.fstat(folder))
            if why is not None:
                raise OSError(errno.EPERM, f"{out.parent} {why}: not written there")
            os.fchdir(folder)
        finally:
            os.close(folder)
        try:
            yield Path(out.name)
        finally:
            os.fchdir(here)
    finally:
        os.close(here)


def _named(exc: Exception, name: Path, out: Path) -> str:
    """The core's message, which names the output as `name` (in the working folder it was
    given), naming it `out` instead."""
    text = str(exc)
    return f"{out}{text[len(str(name)) :]}" if text.startswith(f"{name}:") else text


def _pack_one(src: Path, out: Path, options: PackOptions, silent: bool) -> None:
    from vfs.decant.packer import pack_file, refuse_unless_archive

    require_readable(src)
    if not src.is_file():
        raise UsageError(f"{src}: not a regular file (a folder packs with --series)")
    source = src.absolute()  # read from where it is: the working folder moves to the output's
    with writing(src, out), reached(out) as name:
        if name.exists() and os.path.samefile(source, name):  # was "Not a directory", exit 3
            raise UsageError(f"{src}: -o names the input itself (or a link of it); not packed")
        if name.exists() and not options.overwrite:
            raise UsageError(f"{out}: already exists (--force replaces it)")
        if name.is_dir() and not name.is_symlink():  # checked before packing; the core too
            try:
                refuse_unless_archive(name)
            except PackError as exc:
                why = _named(exc, name, out)
                raise UsageError(f"{why}; -o names the archive of one input") from None
        # The core reports the bytes it packs; hashing and the verify gate run unreported.
        with byte_progress(f"packing {src.name}", source.stat().st_size, silent) as bar:
            result = pack_file(source, name, options, bar)
    _print_result(dataclasses.replace(result, source=src, archive=out), silent)


def _pack_series(src: Path, out: Path | None, options: PackOptions, silent: bool) -> int:
    from vfs.decant.series import pack_series, series_members

    require_readable(src)
    total = sum(p.stat().st_size for p in series_members(src))
    # Only a consolidated series reports bytes; a nested one packs without a moving bar.
    # Without -o the archive goes beside the folder: reached as the folder's own is.
    source = Path(os.path.abspath(src))  # `.` too: the folder's name names its archive
    with (
        writing(src, out or src.parent),
        reached(out or source) as name,
        byte_progress(f"packing {src.name}", total, silent) as bar,
    ):
        try:
            result = pack_series(source if out else name, name if out else None, options, bar)
        except PackError as exc:  # the output named as the caller named it
            raise PackError(_named(exc, name, out or src.parent / name.name)) from None
    archive = (out or (src if src.name else source)).parent / result.archive.name
    _print_result(dataclasses.replace(result, source=src, archive=archive), silent)
    return OK


def _print_result(result: PackResult, silent: bool) -> None:
    if silent:
        return
    ratio = result.archive_size / result.original_size if result.original_size else 0.0
    why = f" ({result.reason})" if result.reason else ""
    say(f"{result.source} -> {result.archive}: {result.mode}, ratio {ratio:.3f}{why}")


def cmd_restore(args: argparse.Namespace) -> int:

    with open_archive(args.archive, args) as archive:
        series = archive.manifest.mode == "series"
        if args.output and args.output.is_dir() and not series:
            raise UsageError(
                f"{args.archive}: cannot restore to {args.output}: a folder (-o names the file)"
            )
        if series and not args.output and default_folder(_name(args.archive)) is None:
            raise UsageError(
                f"{args.archive}: its name gives no folder to restore the series into (use -o)"
            )
        written = _restore(archive, args)
    if not quiet(args):
        for path in written:
            say(str(path))
    return OK


def default_folder(name: str) -> str | None:
    """The folder a series restores into without -o: the archive's name less its suffix, or
    None when that is no folder name of its own (`...zarr.zip` would give `..`, the parent)."""
    from vfs.decant.store import archive_stem
    from vfs.names import name_problem

    stem = archive_stem(name)
    return None if name_problem(stem) else stem


def _restore(archive: DecantArchive, args: argparse.Namespace) -> list[Path]:
    from vfs.decant.verify import restore_opened

    total = sum(info.size for info in archive.originals())
    try:
        with byte_progress(f"restoring {_name(args.archive)}", total, quiet(args)) as bar:
            return restore_opened(archive, _name(args.archive), args.output, Path.cwd(), bar)
    except OSError as exc:  # disk full, no write permission: one error line, not a traceback
        where = exc.filename2 or exc.filename or args.output or Path.cwd()
        raise OutputError(
            f"{args.archive}: cannot restore to {where}: {exc.strerror or exc}"
        ) from None


def cmd_verify(args: argparse.Namespace) -> int:
    status = OK
    for archive in args.archives:
        try:
            status = max(status, _verify_one(archive, args))
        except (DecantError, OSError) as exc:
            status = max(status, report(exc))
    return status


def _verify_one(archive: Path | str, args: argparse.Namespace) -> int:
    """Print a line per original (only FAIL lines when quiet); 1 if any does not match."""
    from vfs.decant.verify import verify_opened

    silent = quiet(args)
    with open_archive(archive, args) as opened:
        total = sum(info.size for info in opened.originals())
        with byte_progress(f"verifying {_name(archive)}", total, silent) as bar:
            verdicts = verify_opened(opened, bar)
    bad = 0
    for v in verdicts:
        if not v.ok:
            bad += 1
            say(f"FAIL {archive}: {v.relpath}")
            say(f"     expected {v.expected}")
            say(f"     got      {v.actual}")
        elif not silent:
            say(f"OK   {archive}: {v.relpath}")
    return FAILED if bad else OK


# Folders below a folder archive that `info` counts the bytes of: a nested series' members
# lie up to MAX_DEPTH deep, each a bundle a few levels deep; nothing the reader reads is deeper.
COUNTED_DEPTH = 80


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files below `folder`, walked by vfs.walk (no recursion, no link
    followed, COUNTED_DEPTH deep at most): a hostile archive may nest folders thousands deep,
    which Path.rglob walked by recursion until RecursionError. The figure only feeds the
    ratio: what cannot be listed or stat'ed is not counted."""
    from vfs.walk import walk

    total = 0
    for at, _dirs, names in walk(folder, COUNTED_DEPTH):
        for name in names:
            with suppress(OSError):
                st = os.lstat(at / name)
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def cmd_info(args: argparse.Namespace) -> int:
    with open_archive(args.archive, args) as archive:
        m = archive.manifest
        if args.json:
            print(json.dumps(m.to_json(), indent=1))  # json.dumps escapes controls
            return OK
        if isinstance(args.archive, str):
            disk = stored_bytes(args.archive, args)
        elif args.archive.is_file():
            disk = args.archive.stat().st_size
        else:
            disk = folder_bytes(args.archive)
        total = sum(o.size for o in archive.originals())
        say(f"archive:     {args.archive}")
        say(f"mode:        {m.mode}{' (consolidated)' if m.series_consolidated else ''}")
        say(f"name:        {m.original_name}")
        say(f"size:        {total}")
        say(f"pages:       {len(m.pages) or sum(len(x.pages) for x in m.members)}")
        say(f"plane_order: {list(m.plane_order)}")
        say(f"codec:       {m.pixel_codec}")
        say(f"ratio:       {disk / total:.3f}" if total else "ratio:       -")
        for info in archive.originals() if m.mode == "series" else []:
            say(f"member:      {info.relpath} ({info.size} bytes)")
    return OK
