"""`decant c4gh ls|verify PACKAGE --key K`: look inside a GDI .tar.c4gh package without a mount."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfs.commands.status import (
    EXIT_STATUS,
    FAILED,
    OK,
    UsageError,
    add_command,
    quiet,
    require_readable,
)
from vfs.errors import DecryptError, NotAnArchiveError

if TYPE_CHECKING:
    from vfs.c4gh.header import OpenedHeader
    from vfs.c4gh.segments import SegmentReader

# At the header these mean the wrong input or key (exit 2). A damaged header stays damage (1),
# and so does a DecryptError from a body segment that fails authentication later.
_REFUSALS = (NotAnArchiveError, DecryptError)


def register(sub: Any) -> None:
    """Add the `c4gh` subcommand group to the `decant` parser."""
    parser = sub.add_parser(
        "c4gh",
        help="inspect GDI .tar.c4gh packages",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="c4gh_command", required=True, metavar="COMMAND")
    ls = add_command(commands, "ls", help="list the members a package would show in a mount")
    ls.add_argument("-l", "--long", action="store_true", help="also show declared sha256 digests")
    verify = add_command(
        commands, "verify", help="check members against the manifest and the spec's layout"
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
    """The secret keys; a missing, malformed or locked key is a usage error (exit 2)."""
    from vfs.c4gh.keys import load_secret_keys

    try:
        return load_secret_keys(args.key, args.passphrase_file)
    except DecryptError as exc:  # unsupported key formats are already exit 2
        raise UsageError(str(exc)) from None


def open_checked(path: Path, keys: list[bytes]) -> tuple[OpenedHeader, SegmentReader]:
    """Open a package's header; UsageError (exit 2) when it is not one our keys open."""
    from vfs.c4gh.header import open_package
    from vfs.c4gh.segments import SEGMENT_SIZE
    from vfs.cache import PageCache

    require_readable(path)
    try:
        return open_package(path, keys, PageCache(16 * SEGMENT_SIZE))
    except _REFUSALS as exc:
        raise UsageError(str(exc)) from None


def run_ls(args: argparse.Namespace) -> int:
    """Members with their sizes, in archive order; dropped members are reported on stderr."""
    from vfs.c4gh.tarindex import build_index
    from vfs.c4gh.verify import check_manifest, read_manifest

    path = args.package
    header, reader = open_checked(path, _keys(args))
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
    return OK


def run_verify(args: argparse.Namespace) -> int:
    """Print the writer and every problem; exit 1 if there is any (only problems when quiet)."""
    from vfs.c4gh.verify import verify_package

    keys = _keys(args)
    # Opened once here only to refuse a non-package or a wrong key with exit 2, as `ls` does;
    # verify_package would fold that into its problems (exit 1).
    open_checked(args.package, keys)[1].close()
    report = verify_package(args.package, keys)
    silent = quiet(args)
    if not silent:
        print(f"package: {report.package}")
        print(f"writer: {report.writer_fingerprint or 'unknown'}")
        for other in report.writers[1:]:
            print(f"also wrapped by: {other}")
        if report.packets is not None:
            print(f"header packets: {report.packets}")
        print(f"members: {len(report.members)}")
    for problem in report.problems:
        print(f"problem: {problem}")
    if not silent or not report.ok:
        print("ok" if report.ok else f"FAILED: {len(report.problems)} problem(s)")
    return OK if report.ok else FAILED


__all__ = ["register", "run_ls", "run_verify"]
