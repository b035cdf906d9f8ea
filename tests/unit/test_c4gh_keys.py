"""Secret key loading: permissions refused as ssh does, passphrase sources, never echoed."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from tests.toolbox import load_tool
from vfs.c4gh.keys import (
    decode_string,
    load_secret_key,
    load_secret_keys,
    passphrase_source,
    public_key,
)
from vfs.errors import DecryptError, UnsupportedFormatError

PASSPHRASE = "tr0ub4dor&3-secret"


corpus = load_tool("make_c4gh_corpus")
NO_SOURCE = passphrase_source(env={}, prompt=False)


def test_plain_key_loads_and_derives_its_public_key(tmp_path: Path) -> None:
    pair = corpus.make_keypair(tmp_path, "plain")
    secret = load_secret_key(pair.secret_path, NO_SOURCE)
    assert secret == pair.secret
    independent = X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw()
    assert public_key(secret) == independent == pair.public


def test_key_made_by_crypt4gh_keygen(tmp_path: Path) -> None:
    sk, pk = tmp_path / "k.sec", tmp_path / "k.pub"
    subprocess.run(
        ["crypt4gh-keygen", "--sk", str(sk), "--pk", str(pk), "--nocrypt"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    public = base64.b64decode(b"".join(pk.read_bytes().splitlines()[1:-1]))
    assert public_key(load_secret_key(sk, NO_SOURCE)) == public


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o610])
def test_key_accessible_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    pair = corpus.make_keypair(tmp_path, "loose")
    pair.secret_path.chmod(mode)
    with pytest.raises(DecryptError, match=rf"permissions {mode:04o} for '.*loose\.sec' are too"):
        load_secret_key(pair.secret_path, NO_SOURCE)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_modes_are_accepted(tmp_path: Path, mode: int) -> None:
    pair = corpus.make_keypair(tmp_path, "tight")
    pair.secret_path.chmod(mode)
    assert load_secret_key(pair.secret_path, NO_SOURCE) == pair.secret


def test_passphrase_from_env_file_and_refusals(tmp_path: Path) -> None:
    pair = corpus.make_keypair(tmp_path, "locked", passphrase=PASSPHRASE)
    env = passphrase_source(env={"C4GH_PASSPHRASE": PASSPHRASE}, prompt=False)
    assert load_secret_key(pair.secret_path, env) == pair.secret

    pass_file = tmp_path / "pass"
    pass_file.write_text(PASSPHRASE + "\n")
    pass_file.chmod(0o600)
    from_file = passphrase_source(pass_file, env={"C4GH_PASSPHRASE": "ignored"}, prompt=False)
    assert load_secret_key(pair.secret_path, from_file) == pair.secret
    pass_file.chmod(0o644)
    with pytest.raises(DecryptError, match="too open"):
        load_secret_key(pair.secret_path, from_file)

    wrong = passphrase_source(env={"C4GH_PASSPHRASE": "not-it-" + PASSPHRASE}, prompt=False)
    with pytest.raises(DecryptError, match="wrong passphrase") as info:
        load_secret_key(pair.secret_path, wrong)
    assert PASSPHRASE not in str(info.value)

    with pytest.raises(DecryptError, match="C4GH_PASSPHRASE"):
        load_secret_key(pair.secret_path, NO_SOURCE)


def test_load_secret_keys_uses_the_environment(tmp_path: Path, monkeypatch) -> None:
    locked = corpus.make_keypair(tmp_path, "locked", passphrase=PASSPHRASE)
    plain = corpus.make_keypair(tmp_path, "plain")
    monkeypatch.setenv("C4GH_PASSPHRASE", PASSPHRASE)
    assert load_secret_keys([locked.secret_path, plain.secret_path]) == [
        locked.secret,
        plain.secret,
    ]


def test_files_that_are_not_crypt4gh_keys(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sec"
    junk.write_text("hello\n")
    junk.chmod(0o600)
    with pytest.raises(DecryptError, match="not a PEM"):
        load_secret_key(junk, NO_SOURCE)
    ssh = tmp_path / "id_ed25519"
    body = base64.b64encode(b"openssh-key-v1\x00" + bytes(64)).decode()
    ssh.write_text(
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{body}\n-----END OPENSSH PRIVATE KEY-----\n"
    )
    ssh.chmod(0o600)
    with pytest.raises(UnsupportedFormatError, match="OpenSSH"):
        load_secret_key(ssh, NO_SOURCE)
    with pytest.raises(DecryptError, match="cannot read"):
        load_secret_key(tmp_path / "missing.sec", NO_SOURCE)


@given(data=st.binary(max_size=300), length=st.integers(0, 70_000))
def test_decode_string_reads_as_the_library_does(data: bytes, length: int) -> None:
    """The key format's length-prefixed strings, read here as crypt4gh reads them (short input
    included), so a key either library accepts reads the same."""
    from crypt4gh.keys.c4gh import decode_string as library

    for blob in (data, length.to_bytes(3, "big")[1:] + data):
        ours, theirs = io.BytesIO(blob), io.BytesIO(blob)
        try:
            expected: bytes | None = library(theirs)
        except ValueError:
            expected = None
        if expected is None:
            with pytest.raises(ValueError):
                decode_string(ours)
        else:
            assert decode_string(ours) == expected
            assert ours.tell() == theirs.tell()


def test_unencrypted_key_loads_without_importing_cryptography(tmp_path: Path) -> None:
    """A daemon's start with a plain key spares `cryptography` and crypt4gh's key modules."""
    pair = corpus.make_keypair(tmp_path, "plain")
    script = (
        "import sys\n"
        "from vfs.c4gh.keys import load_secret_key\n"
        f"assert load_secret_key({str(pair.secret_path)!r}) == {pair.secret!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith(('cryptography', 'crypt4gh.keys'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
