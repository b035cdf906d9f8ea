"""`decant c4gh ls|verify PACKAGE --key K`: look inside a GDI .tar.c4gh package without a mount.

PACKAGE is a path or an s3://BUCKET/KEY URL (read with ranged GETs; --s3-* options)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfs.commands.remote import add_s3_options, location, open_remote_source, remote_name
from vfs.commands.status import (
    EXIT_STATUS,
    FAILED,
    OK,
    UsageError,
    add_command,
    quiet,
    require_readable,
    say,
)
from vfs.errors import DecryptError, NotAnArchiveError, StoreError

if TYPE_CHECKING:
    from vfs.c4gh.header import OpenedHeader
    from vfs.c4gh.segments import SegmentReader
    from vfs.stores import ByteSource

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
        command.add_argument(
            "package", type=location, metavar="PACKAGE", help="a path or s3://BUCKET/KEY"
        )
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
        add_s3_options(command)
    ls.set_defaults(func=run_ls)
    verify.set_defaults(func=run_verify)


def _keys(args: argparse.Namespace) -> list[bytes]:
    """The secret keys; a missing, malformed or locked key is a usage error (exit 2)."""
    from vfs.c4gh.keys import load_secret_keys

    try:
        return load_secret_keys(args.key, args.passphrase_file)
    except DecryptError as exc:  # unsupported key formats are already exit 2
        raise UsageError(str(exc)) from None


def _package(package: Path | str, args: argparse.Namespace) -> Path | ByteSource:
    """A local package checked readable, or the object at an s3:// URL opened (exit 2 if not)."""
    if isinstance(package, str):
        return open_remote_source(package, args)
    require_readable(package)
    return package


def open_checked(
    package: Path | str, keys: list[bytes], args: argparse.Namespace | None = None
) -> tuple[OpenedHeader, SegmentReader]:
    """Open a package's header; UsageError (exit 2) when it is not one our keys open, or (in a
    bucket) cannot be reached."""
    from vfs.c4gh.header import open_package
    from vfs.c4gh.segments import SEGMENT_SIZE
    from vfs.cache import PageCache

    target = _package(package, args or argparse.Namespace())
    try:
        return open_package(target, keys, PageCache(16 * SEGMENT_SIZE))
    except (*_REFUSALS, StoreError) as exc:
        raise UsageError(str(exc)) from None


def _name(package: Path | str) -> str:
    return remote_name(package) if isinstance(package, str) else package.name


def run_ls(args: argparse.Namespace) -> int:
    """Members with their sizes, in archive order; dropped members and a walk's problems are
    reported on stderr, and a problem (damage) exits 1."""
    from vfs.c4gh.tarindex import build_index
    from vfs.c4gh.verify import (
        MANIFEST,
        MAX_MANIFEST,
        check_manifest,
        read_manifest,
        served_digests,
    )

    package = args.package
    header, reader = open_checked(package, _keys(args), args)
    with reader as rd:
        index = build_index(rd, _name(package))
        doc, unread = read_manifest(rd, index) if index.first == MANIFEST else (None, [])
        declared = check_manifest(doc)[0] if args.long and doc is not None else {}
    if args.long:
        say(f"# writer {header.writer_fingerprint}, {header.packet_count} header packet(s)")
    for m in index.members:
        digest = declared.get(m.name, ("-",))[0] if args.long else None
        say(f"{m.size:>14}  {digest + '  ' if digest else ''}{m.name}")
    problems = list(index.problems)
    if index.first != MANIFEST:  # a mount shows it raw (vfs.backends.c4gh)
        first = "no member" if index.first is None else f"first member {index.first!r}"
        problems.append(f"{_name(package)}: {first}, not {MANIFEST}: a mount shows it raw")
    elif unread and (manifest := index.get(MANIFEST)) and manifest.size <= MAX_MANIFEST:
        # (one larger costs the members their digests in a mount, not the package)
        problems.append(f"{_name(package)}: {unread[0]}: a mount shows it raw")
    elif doc is not None:
        try:
            served_digests(doc)
        except ValueError as exc:
            problems.append(f"{_name(package)}: {exc}: a mount shows it raw")
    for problem in problems:
        say(f"decant: {problem}", sys.stderr)
    for name, reason in index.dropped:
        say(f"decant: {_name(package)}: not listed {name!r}: {reason}", sys.stderr)
    # A walk that stopped (a segment failing authentication, a truncated TAR) is damage, as
    # `verify` says (it exited 0 here, after its error lines); a name not listed is a refusal.
    return FAILED if problems else OK


def run_verify(args: argparse.Namespace) -> int:
    """Print the writer and every problem; exit 1 if there is any (only problems when quiet)."""
    from vfs.c4gh.verify import verify_package

    keys = _keys(args)
    # Opened once here only to refuse a non-package or a wrong key with exit 2, as `ls` does;
    # verify_package would fold that into its problems (exit 1).
    open_checked(args.package, keys, args)[1].close()
    report = verify_package(_package(args.package, args), keys)
    silent = quiet(args)
    if not silent:
        say(f"package: {report.package}")
        say(f"writer: {report.writer_fingerprint or 'unknown'}")
        for other in report.writers[1:]:
            say(f"also wrapped by: {other}")
        if report.packets is not None:
            say(f"header packets: {report.packets}")
        say(f"members: {len(report.members)}")
    for problem in report.problems:
        say(f"problem: {problem}")
    if not silent or not report.ok:
        say("ok" if report.ok else f"FAILED: {len(report.problems)} problem(s)")
    return OK if report.ok else FAILED


__all__ = ["register", "run_ls", "run_verify"]
