"""The upload secret in a bucket mount's spool: what marks an object as this host's upload."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from vfs.errors import DecantError
from vfs.stores.s3uploads import SECRET_BYTES, UploadTokens


def test_a_secret_is_made_once_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "upload-secret"
    first = UploadTokens.kept_in(path)
    assert len(path.read_bytes()) == SECRET_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = first.new("d/f.bin")
    again = UploadTokens.kept_in(path)  # a restart
    assert again.signed("d/f.bin", token) and not again.signed("d/g.bin", token)


@pytest.mark.parametrize("held", [b"", b"short", bytes(SECRET_BYTES + 8)])
def test_a_damaged_secret_is_refused_not_replaced(tmp_path: Path, held: bytes) -> None:
    """Red team 92, F5: one of another length was silently made anew, and every upload a
    kill had cut short was then taken for another host's."""
    path = tmp_path / "upload-secret"
    path.write_bytes(held)
    with pytest.raises(DecantError, match=rf"upload-secret: {len(held)} bytes, not the 32"):
        UploadTokens.kept_in(path)
    assert path.read_bytes() == held


def test_the_same_secret_on_another_host_signs_nothing_of_this_one_s() -> None:
    """Red team 92, F4: a spool copied to another host (a cloned image) holds the same secret;
    each host took the other's uploads for its own."""
    secret = b"s" * SECRET_BYTES
    here, clone = UploadTokens(secret, "host-a"), UploadTokens(secret, "host-b")
    token = here.new("d/f.bin")
    assert here.signed("d/f.bin", token)
    assert not clone.signed("d/f.bin", token)
