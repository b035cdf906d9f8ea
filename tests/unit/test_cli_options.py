"""decant-mount's options that are checked before anything is mounted."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfs import cli


@pytest.mark.parametrize("value", ["0", "0.5s"])
def test_a_retry_after_below_a_second_is_refused(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0 would retry a publish that keeps failing in a tight loop."""
    with pytest.raises(SystemExit) as done:
        cli.main([str(tmp_path), str(tmp_path / "mnt"), "--retry-after", value])
    assert done.value.code == 2 and "--retry-after: at least 1s" in capsys.readouterr().err


def test_retry_after_reaches_the_mount_config(tmp_path: Path) -> None:
    args = cli.build_parser().parse_args([str(tmp_path), str(tmp_path), "--retry-after", "2m"])
    assert cli.config_from_args(args, tmp_path, tmp_path).retry_after == 120.0
    default = cli.build_parser().parse_args([str(tmp_path), str(tmp_path)])
    assert cli.config_from_args(default, tmp_path, tmp_path).retry_after == 30.0
