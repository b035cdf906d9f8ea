"""`decant c4gh ls|verify PACKAGE --key K`: look inside a GDI .tar.c4gh package without a mount."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add the `c4gh` subcommand group to the `decant` parser."""
    parser = sub.add_parser("c4gh", help="inspect GDI .tar.c4gh packages", description=__doc__)
    commands = parser.add_subparsers(dest="c4gh_command", required=True, metavar="COMMAND")
    ls = commands.add_parser("ls", help="list the members a package would show in a mount")
    ls.add_argument("-l", "--long", action="store_true", help="also show declared sha256 digests")
    verify = commands.add_parser(
        "verify", help="check members against the manifest and the spec's layout"
    )
    for command in (ls, verify):
        command.add_argument("package", type=Path, metavar="PACKAGE")
        command.add_argument(
            "--key",
            action="append",
            required=True,
            type=Path,
            metavar="KEYFILE",
            help="crypt4gh secret key (repeatable); passphrase from C4GH_PASSPHRASE, "
            "--passphrase-file or a terminal prompt",
        )
        command.add_argument("--passphrase-file", type=Path, metavar="FILE")
    ls.set_defaults(func=run_ls)
    verify.set_defaults(func=run_verify)


def _keys(args: argparse.Namespace) -> list[bytes]:
    from vfs.c4gh.keys import load_secret_keys

    return load_secret_keys(args.key, args.passphrase_file)


def run_ls(args: argparse.Namespace) -> int:
    """Members with their sizes, in archive order; dropped members are reported on stderr."""
    from vfs.c4gh.header import open_package
    from vfs.c4gh.segments import SEGMENT_SIZE
    from vfs.c4gh.tarindex import build_index
    from vfs.c4gh.verify import check_manifest, read_manifest
    from vfs.cache import PageCache

    keys, path = _keys(args), args.package
    try:
        header, reader = open_package(path, keys, PageCache(16 * SEGMENT_SIZE))
    except OSError as exc:
        print(f"decant: error: {path}: {exc.strerror}", file=sys.stderr)
        return 1
    with reader as rd:
        index = build_index(rd, path.name)
        declared = check_manifest(read_manifest(rd, index)[0])[0] if args.long else {}
    if args.long:
        print(f"# writer {header.writer_fingerprint}, {header.packet_count} header packet(s)")
    for m in index.members:
        digest = declared.get(m.name, ("-",))[0] if args.long else None
        print(f"{m.size:>14}  {digest + '  ' if digest else ''}{m.name}")
    for problem in index.problems:
        print(f"decant: {problem}", file=sys.stderr)
    for name, reason in index.dropped:
        print(f"decant: {path.name}: not listed {name!r}: {reason}", file=sys.stderr)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Print the writer and every problem; exit 1 if there is any."""
    from vfs.c4gh.verify import verify_package

    report = verify_package(args.package, _keys(args))
    print(f"package: {report.package}")
    print(f"writer: {report.writer_fingerprint or 'unknown'}")
    for other in report.writers[1:]:
        print(f"also wrapped by: {other}")
    if report.packets is not None:
        print(f"header packets: {report.packets}")
    print(f"members: {len(report.members)}")
    for problem in report.problems:
        print(f"problem: {problem}")
    print("ok" if report.ok else f"FAILED: {len(report.problems)} problem(s)")
    return 0 if report.ok else 1


__all__ = ["register", "run_ls", "run_verify"]
