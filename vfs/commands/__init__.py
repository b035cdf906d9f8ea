"""The `decant` command: one subcommand module per format, each exposing `register(subparsers)`."""

from __future__ import annotations

import os

# numpy loads OpenBLAS, whose worker threads spin for a while once started: 0.03-0.07 s of CPU
# per `decant` run here, and 11% of a 512 MiB restore's perf samples (blas_thread_server) on a
# 2-core machine where sha256 and decode want both cores. decant does no linear algebra. Set
# before anything imports numpy; a setting of the caller's own wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import importlib
import logging
import sys

from vfs.commands.status import (
    EXIT_STATUS,
    INTERRUPTED,
    IO_ERROR,
    ReaderGone,
    add_output_options,
    mute,
    report,
)
from vfs.errors import DecantError
from vfs.logsafe import SafeFormatter
from vfs.version import VersionAction, installed_version

# Each module adds its own subcommands; a subcommand sets `func(args) -> int` as its default.
SUBCOMMAND_MODULES = ("vfs.commands.archive", "vfs.commands.c4gh", "vfs.commands.acqstore")
DESCRIPTION = (  # wrapped by hand: RawDescriptionHelpFormatter keeps the exit-status table as is
    "Pack TIFFs (or any file) into decant archives, verify and restore them;\n"
    "look inside GDI crypt4gh packages and AcqStore collections."
)


decant_version = installed_version  # the name the tests and callers know


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decant",
        description=DESCRIPTION,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=VersionAction)
    add_output_options(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quiet and args.verbose:  # one given before the subcommand, one after it
        parser.error("--quiet and --verbose exclude each other")
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("decant: %(message)s"))  # records name input files
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    if not args.verbose:
        # tifffile logs each flaw of a malformed TIFF; `pack` says why one went verbatim, and
        # its line, "decant: <tifffile.TiffPages @16> invalid offset…", read as a failure.
        logging.getLogger("tifffile").setLevel(logging.CRITICAL)
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # here, where a reader gone is caught, not at exit
        return status
    except BrokenPipeError:  # a print of JSON, or the flush above: nobody to tell
        mute(sys.stdout)
        return IO_ERROR
    except ReaderGone:
        return IO_ERROR
    except (DecantError, OSError) as exc:
        return report(exc)
    except KeyboardInterrupt:
        return INTERRUPTED
