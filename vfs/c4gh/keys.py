"""Loading crypt4gh secret keys: permission check, passphrase sources, the c4gh-v1 key format.

The passphrase comes from a file, C4GH_PASSPHRASE or a terminal prompt, and appears in no
message or log line. The key format is parsed here rather than through
`crypt4gh.keys.get_private_key`, whose decorator calls sys.exit() on a bad passphrase: that
would take a daemon down instead of reporting which key failed. Its framing (length-prefixed
strings) is read here too: `crypt4gh.keys` imports `cryptography` and its SSH key support
(7-9 ms, then 6-8 ms for `cryptography`, measured here), which a daemon start with an
unencrypted key never needs; the library's key derivation and `cryptography` are imported only
for a passphrase-protected key.
"""

from __future__ import annotations

import base64
import binascii
import getpass
import io
import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from vfs.errors import DecryptError, UnsupportedFormatError
from vfs.owned import Untrusted, read_trusted

PASSPHRASE_ENV = "C4GH_PASSPHRASE"
C4GH_MAGIC = b"c4gh-v1"
SSH_MAGIC = b"openssh-key-v1\x00"

# Called with the key path when a key turns out to be passphrase-protected.
PassphraseSource = Callable[[Path], str]


MAX_SECRET_FILE = 1 << 16  # a key file is ~200 bytes, a passphrase a line


def check_permissions(path: Path, mode: int) -> None:
    """Refuse a secret file that group or others can access, as ssh does for private keys."""
    if stat.S_IMODE(mode) & 0o077:
        raise DecryptError(
            f"permissions {stat.S_IMODE(mode):04o} for '{path}' are too open: a crypt4gh secret "
            f"key must not be accessible by group or others (chmod 600 '{path}'); key refused"
        )


def read_secret_file(path: Path) -> bytes:
    """Contents of a key or passphrase file, after checking its permissions on the open file."""
    try:
        return read_trusted(path, MAX_SECRET_FILE, lambda st: check_permissions(path, st.st_mode))
    except Untrusted as why:
        raise DecryptError(f"secret file '{path}' is {why}: refused") from None
    except OSError as exc:
        raise DecryptError(f"cannot read secret file '{path}': {exc.strerror}") from None


def passphrase_source(
    passphrase_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    prompt: bool = True,
) -> PassphraseSource:
    """Where passphrases come from: an explicit file, then C4GH_PASSPHRASE, then a tty prompt."""
    environ = os.environ if env is None else env

    def ask(key_path: Path) -> str:
        if passphrase_file is not None:
            text = read_secret_file(passphrase_file).decode("utf-8", "surrogateescape")
            return text.rstrip("\r\n")
        if environ.get(PASSPHRASE_ENV):
            return environ[PASSPHRASE_ENV]
        if prompt and sys.stdin is not None and sys.stdin.isatty():
            return getpass.getpass(f"Passphrase for {key_path}: ")
        raise DecryptError(
            f"crypt4gh key '{key_path}' is passphrase-protected: set {PASSPHRASE_ENV}, "
            "pass a passphrase file, or run on a terminal to be prompted"
        )

    return ask


def _pem_body(data: bytes, path: Path) -> bytes:
    lines = [line.strip() for line in data.splitlines() if line.strip()]
    if (
        len(lines) < 3
        or not lines[0].startswith(b"-----BEGIN ")
        or not lines[-1].startswith(b"-----END ")
    ):
        raise DecryptError(f"'{path}' is not a PEM-encoded crypt4gh secret key")
    try:
        return base64.b64decode(b"".join(lines[1:-1]), validate=True)
    except binascii.Error:
        raise DecryptError(f"'{path}' is not a PEM-encoded crypt4gh secret key") from None


def decode_string(stream: io.BytesIO) -> bytes:
    """One string of the c4gh-v1 key format: a big-endian u16 length, then that many bytes,
    read exactly as `crypt4gh.keys.c4gh.decode_string` does; ValueError when the key ends
    first."""
    length = int.from_bytes(stream.read(2), "big")  # at most 65535: the bound is the format's
    data = stream.read(length)
    if len(data) != length:
        raise ValueError("Invalid format: No enough data")
    return data


def _decode_c4gh(blob: bytes, path: Path, ask: PassphraseSource) -> bytes:
    stream = io.BytesIO(blob[len(C4GH_MAGIC) :])
    try:
        kdf = decode_string(stream)
        rounds, salt = 0, b""
        if kdf != b"none":
            from crypt4gh.keys.kdf import KDFS

            if kdf not in KDFS:
                raise UnsupportedFormatError(f"'{path}': unsupported key derivation {kdf!r}")
            options = decode_string(stream)
            rounds, salt = int.from_bytes(options[:4], "big"), options[4:]
        cipher = decode_string(stream)
        material = decode_string(stream)
    except ValueError:
        raise DecryptError(f"'{path}' is a malformed crypt4gh secret key") from None
    if cipher == b"none":
        secret = material
    elif cipher == b"chacha20_poly1305":
        from crypt4gh.keys.kdf import derive_key
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        derived = derive_key(kdf, ask(path).encode("utf-8", "surrogateescape"), salt, rounds)
        try:
            secret = ChaCha20Poly1305(derived).decrypt(material[:12], material[12:], None)
        except InvalidTag:
            raise DecryptError(f"wrong passphrase for crypt4gh key '{path}'") from None
    else:
        raise UnsupportedFormatError(f"'{path}': unsupported key cipher {cipher!r}")
    if len(secret) != 32:
        raise DecryptError(f"'{path}' does not hold a 32-byte X25519 secret key")
    return bytes(secret)


def load_secret_key(path: Path | str, ask: PassphraseSource | None = None) -> bytes:
    """The raw 32-byte X25519 secret key in a crypt4gh (c4gh-v1) secret key file."""
    path = Path(path)
    blob = _pem_body(read_secret_file(path), path)
    if blob.startswith(SSH_MAGIC):
        raise UnsupportedFormatError(
            f"'{path}' is an OpenSSH key; only crypt4gh (c4gh-v1) secret keys are supported"
        )
    if not blob.startswith(C4GH_MAGIC):
        raise DecryptError(f"'{path}' is not a crypt4gh secret key")
    return _decode_c4gh(blob, path, ask or passphrase_source())


def load_secret_keys(
    paths: Sequence[Path | str], passphrase_file: Path | None = None
) -> list[bytes]:
    """Every key in `paths`, sharing one passphrase source."""
    ask = passphrase_source(passphrase_file)
    return [load_secret_key(p, ask) for p in paths]


def public_key(secret_key: bytes) -> bytes:
    """The X25519 public key of a secret key (what a writer's fingerprint is computed over)."""
    from crypt4gh import sodium

    return bytes(sodium.derive_pk(secret_key))
