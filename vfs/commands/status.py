"""Exit statuses shared by every `decant` subcommand, and the one place an error becomes one."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from vfs.errors import DecantError, PackError, StoreError, UnsupportedFormatError
from vfs.logsafe import escape_controls

OK = 0
FAILED = 1  # the data failed its check: digest mismatch, damaged archive, invalid collection
BAD_INPUT = 2  # usage error (argparse's own status), or an input that is not what was asked for
IO_ERROR = 3  # an output could not be written (disk full, permission denied, read-only fs)
INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

EXIT_STATUS = """\
exit status:
  0    success
  1    verification failed: a digest mismatch, a damaged archive or package, an
       invalid collection
  2    usage error, or an input that is missing, unreadable, or not an archive of
       the kind asked for (one line on stderr: "decant: FILE: reason")
  3    I/O error writing output: disk full, permission denied, read-only filesystem
  130  interrupted
with several inputs, every input is tried and the highest status is returned"""


class UsageError(DecantError):
    """An input or option the command does not take: exit 2, like argparse's own errors.

    Commands raise it where they open an input, so "not an archive" there is 2 while the same
    core error deeper down (a series member bundle gone missing) is damage, 1.
    """


class OutputError(DecantError):
    """An output could not be written: exit 3."""


def status_of(exc: DecantError | OSError) -> int:
    """Refusals are 2, other core errors are damaged data (1), a bare OSError is I/O (3).

    Commands check that their inputs open before calling a core, so an OSError that still
    reaches here happened while writing (or while reading an input that vanished part way).
    """
    # PackError: the core refused the input; Unsupported: a format or feature we do not read.
    # StoreError: an input in object storage could not be read (unreachable, refused, replaced).
    if isinstance(exc, UsageError | PackError | UnsupportedFormatError | StoreError):
        return BAD_INPUT
    if isinstance(exc, OutputError) or not isinstance(exc, DecantError):
        return IO_ERROR
    return FAILED


def report(exc: DecantError | OSError) -> int:
    """Print the one stderr line, `decant: FILE: reason`, and return the status it means."""
    say(f"decant: {message(exc)}", sys.stderr)
    return status_of(exc)


def say(line: str, file: TextIO | None = None) -> None:
    """Print `line` with its control characters escaped. Names in it come from inputs (a file
    in a shared folder, an original's or a member's name in an archive): one holding terminal
    escapes would drive the terminal of whoever runs `decant`, and a line break would forge a
    line of ours."""
    try:
        print(escape_controls(line), file=file)
    except BrokenPipeError:
        mute(file or sys.stdout)
        raise ReaderGone from None


class ReaderGone(Exception):
    """Our output's reader went away (`decant verify * | head -1`). Not an OSError: a loop over
    inputs must stop here, not report it as the next input's error and go on for nobody."""


def mute(stream: TextIO) -> None:
    """Point `stream`, whose reader went away, at /dev/null: Python flushes it again at exit
    and would complain of the closed pipe."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, stream.fileno())
    os.close(null)


def message(exc: BaseException) -> str:
    """`FILE: reason` for the one stderr line; core messages already start with the file."""
    if isinstance(exc, OSError) and exc.strerror:
        name = exc.filename2 or exc.filename
        return f"{name}: {exc.strerror}" if name else exc.strerror
    return str(exc)


def require_readable(path: Path) -> None:
    """UsageError (exit 2) unless `path` opens for reading; folders must be listable."""
    try:
        if path.is_dir():
            os.listdir(path)
        else:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # a FIFO must not hang us
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None


def add_command(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A leaf subcommand: the shared -q/-v options and the exit statuses in its --help."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        parents=[_output_options()],
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )
    return parser


def _output_options() -> argparse.ArgumentParser:
    # SUPPRESS: a subcommand's own default must not undo `decant -q COMMAND`.
    parent = argparse.ArgumentParser(add_help=False)
    add_output_options(parent, argparse.SUPPRESS)
    return parent


def add_output_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """-q/--quiet and -v/--verbose, accepted before or after the subcommand."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="no progress bar and no informational lines; errors and failures still print",
    )
    group.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="log at INFO level"
    )


def quiet(args: argparse.Namespace) -> bool:
    """--quiet given anywhere (parsers built without the global options lack the attribute)."""
    return bool(getattr(args, "quiet", False))
