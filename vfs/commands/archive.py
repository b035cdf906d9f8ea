"""`decant pack | restore | verify | info`: the archive core from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vfs.commands.progress import ProgressBar
from vfs.errors import DecantError


def register(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack TIFFs (or any file) into decant archives")
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT")
    p.add_argument("-o", "--output", type=Path, help="archive (one input) or folder (several)")
    p.add_argument("--mode", choices=("auto", "byte-exact", "verbatim"), default="auto")
    p.add_argument(
        "--codec",
        default="zstd:byteshuffle:5",
        help="blosc pixel codec as CNAME[:SHUFFLE][:LEVEL] (default %(default)s)",
    )
    p.add_argument("--pyramid", type=int, default=0, metavar="N", help="XY pyramid levels to add")
    p.add_argument("--series", action="store_true", help="pack a folder of TIFFs as one series")
    p.add_argument("--force", action="store_true", help="replace an existing archive")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("restore", help="write the original(s) back, checking sha256")
    p.add_argument("archive", type=Path)
    p.add_argument("-o", "--output", type=Path, help="file (or folder, for a series)")
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser("verify", help="reconstruct in memory and check every sha256")
    p.add_argument("archives", nargs="+", type=Path, metavar="ARCHIVE")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("info", help="print the manifest summary")
    p.add_argument("archive", type=Path)
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    p.set_defaults(func=cmd_info)


def cmd_pack(args: argparse.Namespace) -> int:
    from vfs.decant.packer import PackOptions, default_archive_name, pack_file
    from vfs.decant.series import pack_series
    from vfs.decant.writer import CodecChoice

    try:
        codec = CodecChoice.parse(args.codec)
    except ValueError as exc:
        raise DecantError(f"--codec {args.codec}: {exc}") from None
    options = PackOptions(args.mode, codec, args.pyramid, overwrite=args.force)
    if args.series:
        if len(args.inputs) != 1 or not args.inputs[0].is_dir():
            raise DecantError("--series takes exactly one folder")
        src = args.inputs[0]
        result = pack_series(src, args.output, options, ProgressBar(f"packing {src.name}"))
        _report(result)
        return 0
    failures = 0
    for src in args.inputs:
        if len(args.inputs) == 1 and args.output:
            out = args.output
        else:
            folder = args.output or src.parent
            folder.mkdir(parents=True, exist_ok=True)
            out = folder / default_archive_name(src)
        try:
            size = src.stat().st_size if src.is_file() else 0
            with ProgressBar(f"packing {src.name}", 2 * size) as bar:
                result = pack_file(src, out, options, bar)
            _report(result)
        except DecantError as exc:
            print(f"decant: error: {exc}", file=sys.stderr)
            failures += 1
        except OSError as exc:
            print(f"decant: error: {src}: {exc.strerror or exc}", file=sys.stderr)
            failures += 1
    return 1 if failures else 0


def _report(result: Any) -> None:
    ratio = result.archive_size / result.original_size if result.original_size else 0.0
    why = f" ({result.reason})" if result.reason else ""
    print(f"{result.source} -> {result.archive}: {result.mode}, ratio {ratio:.3f}{why}")


def cmd_restore(args: argparse.Namespace) -> int:
    from vfs.decant.verify import restore_archive

    try:
        written = restore_archive(args.archive, args.output, Path.cwd())
    except OSError as exc:  # e.g. -o names a folder: one error line, not a traceback
        where = exc.filename2 or exc.filename or args.output
        raise DecantError(
            f"{args.archive}: cannot restore to {where}: {exc.strerror or exc}"
        ) from None
    for path in written:
        print(path)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from vfs.decant.verify import verify_archive

    bad = 0
    for archive in args.archives:
        try:
            for v in verify_archive(archive):
                print(f"{'OK  ' if v.ok else 'FAIL'} {archive}: {v.relpath}")
                if not v.ok:
                    print(f"     expected {v.expected}\n     got      {v.actual}")
                    bad += 1
        except DecantError as exc:
            print(f"decant: error: {exc}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


def cmd_info(args: argparse.Namespace) -> int:
    from vfs.decant.reader import DecantArchive

    with DecantArchive.open(args.archive) as archive:
        m = archive.manifest
        if args.json:
            print(json.dumps(m.to_json(), indent=1))
            return 0
        disk = (
            args.archive.stat().st_size
            if args.archive.is_file()
            else sum(p.stat().st_size for p in args.archive.rglob("*") if p.is_file())
        )
        total = sum(o.size for o in archive.originals())
        print(f"archive:     {args.archive}")
        print(f"mode:        {m.mode}{' (consolidated)' if m.series_consolidated else ''}")
        print(f"name:        {m.original_name}")
        print(f"size:        {total}")
        print(f"pages:       {len(m.pages) or sum(len(x.pages) for x in m.members)}")
        print(f"plane_order: {list(m.plane_order)}")
        print(f"codec:       {m.pixel_codec}")
        print(f"ratio:       {disk / total:.3f}" if total else "ratio:       -")
        for info in archive.originals() if m.mode == "series" else []:
            print(f"member:      {info.relpath} ({info.size} bytes)")
    return 0
