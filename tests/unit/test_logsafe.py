"""Log lines that names cannot forge (vfs/logsafe.py)."""

from __future__ import annotations

import logging
import os
import sys

from vfs.logsafe import SafeFormatter, escape_controls


def _render(msg: str, *args: object) -> str:
    record = logging.LogRecord("decant-mount", logging.WARNING, __file__, 1, msg, args, None)
    return SafeFormatter("%(levelname)s %(message)s").format(record)


def test_a_name_with_a_newline_stays_on_its_line() -> None:
    forged = "x\n2026-01-01 00:00:00,000 ERROR decant-mount: FORGED\r\x1b[2K"
    line = _render("not shown: %s", forged)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    tail = r"ERROR decant-mount: FORGED\x0d\x1b[2K"
    assert line == r"WARNING not shown: x\x0a2026-01-01 00:00:00,000 " + tail


def test_undecodable_bytes_show_as_the_byte_and_backslashes_stay_distinct() -> None:
    name = os.fsdecode(b"a\xff\\x0a")
    assert escape_controls(name) == "a\\xff\\\\x0a"
    assert escape_controls("caf\u00e9 \u2028") == "caf\u00e9 \\u2028"


def test_a_traceback_keeps_its_lines() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("d", logging.ERROR, __file__, 1, "bad\nname", (), None)
        record.exc_info = sys.exc_info()
    text = SafeFormatter("%(message)s").format(record)
    assert text.startswith("bad\\x0aname\n| Traceback")
    assert text.endswith("\n| ValueError: boom")


def test_an_exception_s_text_cannot_forge_a_record_or_hide_one() -> None:
    """The message was escaped but the traceback was not: a name in an exception's text
    (`ValueError(f"... {name}")`) started a line of its own, or rewrote one on a terminal."""
    forged = "x\n2026-01-01 00:00:00,000 ERROR decant-mount: FORGED\r\x1b[2K"
    try:
        try:
            raise OSError(f"cannot read {forged}")
        except OSError as exc:
            raise ValueError(f"bad name {forged}") from exc
    except ValueError:
        record = logging.LogRecord("d", logging.ERROR, __file__, 1, "failed", (), None)
        record.exc_info = sys.exc_info()
    text = SafeFormatter("%(asctime)s %(levelname)s %(message)s").format(record)
    first, *rest = text.split("\n")
    assert first.endswith("ERROR failed")
    assert rest and all(line.startswith("| ") for line in rest)
    assert "\r" not in text and "\x1b" not in text
    assert sum("FORGED" in line for line in rest) == 2  # both exceptions, cause included


def test_bidi_controls_cannot_reverse_a_name_on_the_terminal() -> None:
    """ "report\u202efit.exe" shows as "reportexe.tif": each bidi control shows as its escape,
    and an ordinary right-to-left name keeps its letters."""
    assert escape_controls("report\u202efit.exe") == "report\\u202efit.exe"
    marks = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069"
    assert escape_controls(marks) == "".join(f"\\u{ord(c):04x}" for c in marks)
    assert escape_controls("שלום.tif") == "שלום.tif"
