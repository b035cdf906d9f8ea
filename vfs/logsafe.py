"""Log lines that names cannot forge: the one place control characters are escaped.

Names of files, archive members, S3 keys reach the log from attacker input. A newline in one
would start a line that looks like the daemon's own (journald keeps it as a record of its
own too); a carriage return or an escape sequence can hide text on a terminal; a lone
surrogate (an undecodable byte) makes the handler fail to write the record at all. Escaping in
the formatter covers every log call, including ones written later, instead of trusting each
call site to escape its names.
"""

from __future__ import annotations

import logging
from typing import Any

# C0 controls, DEL, C1 controls, the Unicode line/paragraph separators, bidi controls, the lone
# surrogates of undecodable bytes (U+DC80..U+DCFF, shown as the byte they stand for).
_ESCAPES: dict[int, str] = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}
_ESCAPES.update({0x2028: "\\u2028", 0x2029: "\\u2029"})
# The bidirectional formatting characters: a U+202E in a name shows the rest of the line
# reversed on a terminal ("report\u202efit.exe" reads "reportexe.tif"), so a line can say
# another name than the one it holds.
_ESCAPES.update({c: f"\\u{c:04x}" for c in [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                            *range(0x2066, 0x206A)]})  # fmt: skip
_ESCAPES.update({c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)})
_ESCAPES[ord("\\")] = "\\\\"  # so an escape seen in the log is never a name's own text


def escape_controls(text: str) -> str:
    """`text` on one line, with every control character written as a visible escape."""
    return text.translate(_ESCAPES)


class SafeFormatter(logging.Formatter):
    """Escapes the rendered message. A traceback (exc_info) keeps its line breaks, but each of
    its lines is escaped and starts with "| ": an exception's text may hold a name as it came
    (`ValueError(f"... {name}")`), and a line break in it could not be told from the
    traceback's own, so no line of a traceback can pass for a record of its own."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        text = super().formatException(ei)
        return "\n".join("| " + escape_controls(line) for line in text.split("\n"))
