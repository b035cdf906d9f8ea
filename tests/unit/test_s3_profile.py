"""AWS profile files (vfs.stores.s3.profile_settings): read as the AWS CLI reads them, and
refused, with the file and the reason, when another user holds or may write them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vfs.errors import StoreAccessError
from vfs.stores.s3 import profile_settings

CREDENTIALS = "[lab]\naws_access_key_id = AKIDLAB\naws_secret_access_key = s3cr3t-lab\n"


@pytest.fixture
def creds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "credentials"
    path.write_text(CREDENTIALS)
    path.chmod(0o600)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    return path


def test_a_profile_of_ones_own_file_is_read(creds: Path) -> None:
    got = profile_settings("lab")
    assert got["access_key_id"] == "AKIDLAB" and got["secret_access_key"] == "s3cr3t-lab"
    assert profile_settings("other") == {}


def test_a_link_to_ones_own_file_is_followed(creds: Path, monkeypatch) -> None:
    link = creds.parent / "link"
    link.symlink_to(creds)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(link))
    assert profile_settings("lab")["access_key_id"] == "AKIDLAB"


def test_a_file_others_may_write_is_refused(creds: Path) -> None:
    creds.chmod(0o666)
    with pytest.raises(StoreAccessError, match=f"{creds} is writable by others.*refused"):
        profile_settings("lab")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_another_users_file_is_refused(creds: Path) -> None:
    os.chown(creds, 1001, 1001)
    with pytest.raises(StoreAccessError, match="owned by uid 1001"):
        profile_settings("lab")


def test_a_fifo_does_not_hang_the_start(creds: Path) -> None:
    creds.unlink()
    os.mkfifo(creds)
    with pytest.raises(StoreAccessError, match="not a regular file"):
        profile_settings("lab")


def test_a_huge_file_is_refused(creds: Path) -> None:
    creds.write_text(CREDENTIALS + "#" * (1 << 20))
    with pytest.raises(StoreAccessError, match="larger than 1 MiB"):
        profile_settings("lab")


def test_the_daemon_refuses_to_start_on_it_in_one_line(creds: Path, tmp_path: Path) -> None:
    creds.chmod(0o666)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ACCESS_KEY")}
    env.pop("AWS_SECRET_ACCESS_KEY", None)
    (tmp_path / "mnt").mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "vfs.cli", "s3://bucket/p", str(tmp_path / "mnt"), "-f",
         "--s3-endpoint", "http://127.0.0.1:9", "--index-dir", str(tmp_path / "index")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and "writable by others" in run.stderr, run.stderr
    assert "s3cr3t-lab" not in run.stderr + run.stdout
