"""`vfs/owned.py`: which folders and files the daemon may trust as its own state."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from vfs.errors import DecantError
from vfs.owned import not_own, own_folder


def test_a_private_folder_and_file_of_this_user_are_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    (folder / "db").write_bytes(b"")
    (folder / "db").chmod(0o644)
    assert not_own(folder) is None
    assert not_own(folder / "db", "file") is None
    assert not_own(folder / "missing", "file") is None  # nothing there to trust yet


def test_what_another_user_could_write_or_redirect_is_not(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not_own(shared) == "writable by others (mode 0777)"
    shared.chmod(0o775)
    assert not_own(shared) == "writable by others (mode 0775)"
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert not_own(link) == "a symlink"
    (tmp_path / "f").write_bytes(b"")
    assert not_own(tmp_path / "f") == "not a folder"
    assert not_own(tmp_path, "file") == "not a file"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_another_user_s_folder_is_not(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    assert not_own(theirs) == "owned by uid 65534, not this daemon's user"


def test_a_folder_another_user_could_swap_is_refused(tmp_path: Path) -> None:
    """The daemon opens what its folder holds by path, later: a folder above it that others may
    write (without the sticky bit /tmp has) would let them rename it away and put their own
    in its place after the check."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DecantError) as err:
        own_folder(shared / "state", "--index-dir", "why it matters")
    why = f"{shared} is writable by others (mode 0777): the folder could be swapped"
    assert str(err.value) == f"--index-dir {shared / 'state'}: {why}: why it matters"
    shared.chmod(0o1777)  # sticky, as /tmp: no one may rename what is not theirs
    own_folder(shared / "state", "--index-dir", "why it matters")
    assert not_own(shared / "state") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_trust_files_another_user_holds_or_may_write_are_refused(tmp_path: Path) -> None:
    """The allowed writers and a secret key are taken as the daemon's: one another user holds
    or may write would let them add a writer of their own, or have their key taken."""
    from vfs.backends.c4gh import load_allowed_writers
    from vfs.c4gh.keys import read_secret_file
    from vfs.errors import DecryptError

    writers = tmp_path / "writers"
    writers.write_text("sha256:" + "a" * 64 + "\n")
    assert load_allowed_writers(writers) == {"sha256:" + "a" * 64}
    writers.chmod(0o666)
    with pytest.raises(DecantError, match="writable by others"):
        load_allowed_writers(writers)
    writers.chmod(0o644)
    os.chown(writers, 65534, 65534)
    with pytest.raises(DecantError, match="owned by uid 65534"):
        load_allowed_writers(writers)
    key = tmp_path / "key.sec"
    key.write_bytes(b"secret")
    key.chmod(0o600)
    assert read_secret_file(key) == b"secret"
    os.chown(key, 65534, 65534)
    with pytest.raises(DecryptError, match="owned by uid 65534"):
        read_secret_file(key)


def test_status_of_a_folder_holding_a_fifo_does_not_hang(tmp_path: Path) -> None:
    """`decant-mount --status X` run by an admin on a user's folder: a FIFO (or a device) at
    the status name is refused at once, not waited on or read without end."""
    import subprocess
    import sys

    os.mkfifo(tmp_path / ".decant-status")
    run = subprocess.run([sys.executable, "-m", "vfs.cli", "--status", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert run.returncode == 1
    assert "no status to show (not a decant-mount status file)" in run.stderr


def _without_hanging(call: Callable[[], object], fifo: Path) -> BaseException | None:
    """Run `call` in a thread; if it still waits after 10 s (opening `fifo` blocks until a
    writer comes), be that writer and fail: the exception `call` raised otherwise."""
    box: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            box[0] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the blocked open return
        thread.join(10)
        pytest.fail(f"reading {fifo.name} waited for a writer to open the FIFO")
    return box[0]


@pytest.mark.parametrize("which", ["key", "passphrase", "writers", "aws"])
def test_a_fifo_where_a_trusted_file_should_be_refuses_without_hanging(
    tmp_path: Path, which: str
) -> None:
    """A key, passphrase, allowed-writers or AWS profile file swapped for a FIFO: opening it
    for reading would wait for a writer, and the daemon's start with it."""
    from vfs.backends.c4gh import load_allowed_writers
    from vfs.c4gh.keys import passphrase_source, read_secret_file
    from vfs.stores.s3 import profile_settings

    fifo = tmp_path / which
    os.mkfifo(fifo, 0o600)
    calls: dict[str, Callable[[], object]] = {
        "key": lambda: read_secret_file(fifo),
        "passphrase": lambda: passphrase_source(fifo, env={}, prompt=False)(tmp_path / "k"),
        "writers": lambda: load_allowed_writers(fifo),
        "aws": lambda: profile_settings("lab"),
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(fifo))
        mp.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        raised = _without_hanging(calls[which], fifo)
    assert isinstance(raised, DecantError), raised
    assert "not a regular file" in str(raised) and str(fifo) in str(raised)


@pytest.mark.parametrize("which", ["key", "writers"])
def test_a_trusted_file_too_long_is_refused_not_cut(tmp_path: Path, which: str) -> None:
    """Read to a bound, and refused past it: a writers list cut at the bound would drop the
    writers after it without a word."""
    from vfs.backends.c4gh import MAX_WRITERS_FILE, load_allowed_writers
    from vfs.c4gh.keys import MAX_SECRET_FILE, read_secret_file

    path = tmp_path / which
    line = "sha256:" + "a" * 64 + "\n"
    limit, shown = (MAX_SECRET_FILE, "64 KiB") if which == "key" else (MAX_WRITERS_FILE, "16 MiB")
    path.write_text(line * (limit // len(line) + 1))
    path.chmod(0o600)
    with pytest.raises(DecantError, match=f"'{path}' is larger than {shown}: refused"):
        (read_secret_file if which == "key" else load_allowed_writers)(path)
