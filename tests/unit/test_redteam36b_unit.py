"""Red team, round 36b, without a mount: the daemon's options (an operator's mistakes).

Each test failed before the fix its docstring names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vfs import cli


@pytest.mark.parametrize("value", ["0", "-1"])
def test_decode_threads_below_one_are_refused(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--decode-threads 0` started a mount whose every read of an archive waited forever for
    a decode thread (the kernel's read hung for every user, nothing logged); -1 failed deep in
    trio ("total_tokens must be >= 0"). Fixed: refused as a usage error (cli.positive_int)."""
    with pytest.raises(SystemExit) as done:
        cli.build_parser().parse_args([str(tmp_path), str(tmp_path / "m"), "--decode-threads",
                                       value])  # fmt: skip
    assert done.value.code == 2 and "--decode-threads" in capsys.readouterr().err
