"""Red team, round 36b, without a mount: the daemon's options (an operator's mistakes).

Each test failed before the fix its docstring names.
"""

from __future__ import annotations

import os
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


def test_the_index_is_readable_by_its_owner_alone_in_a_folder_others_may_enter(
    tmp_path: Path,
) -> None:
    """`--index-dir` an existing 0755 folder (`mkdir -p /var/cache/decant-mount/x`, an fstab
    mount's umask 022): SQLite made index.sqlite, -wal and -shm 0644, so any local user could
    read every archive's path and its members' names, sizes and sha256, from folders they may
    not list. Fixed: the database and its files are made (and set) 0600 (index._private)."""
    from vfs.backends.base import Description, Entry
    from vfs.mount.index import DescriptionIndex

    folder = tmp_path / "ix"
    folder.mkdir(mode=0o755)
    old = os.umask(0o022)
    try:
        index = DescriptionIndex(folder / "index.sqlite")
        index.put(Path("/src/private/secret.zarr.zip"), "decant", 1, 2,
                  Description("secret.tif", Entry(is_dir=False, size=1)), 3, 4)  # fmt: skip
        made = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
        index.close()
    finally:
        os.umask(old)
    assert made == {n: 0o600 for n in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm")}


@pytest.mark.parametrize("value", ["0", "0.5s"])
def test_a_scrub_interval_below_a_second_is_refused(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--scrub-interval 0`, meant as "off", started a scrub that never paused: every archive
    of SRC read again and again, and a log line a pass (~500 a second with one archive).
    Fixed: refused as a usage error, as --retry-after below a second is."""
    with pytest.raises(SystemExit) as done:
        cli.main([str(tmp_path), str(tmp_path / "mnt"), "--scrub-interval", value])
    assert done.value.code == 2 and "--scrub-interval: at least 1s" in capsys.readouterr().err


def _open_index(path: str, go: object) -> None:
    from vfs.mount.index import DescriptionIndex

    go.wait()  # type: ignore[attr-defined]
    index = DescriptionIndex(Path(path))
    for i in range(20):  # a mount's first verdicts
        index.mark_verified(Path(f"/src/{os.getpid()}/{i}"), "", (1, 2, 3, 4), "ab" * 32)
    index.close()


def test_mounts_starting_together_on_one_new_index_keep_it(tmp_path: Path) -> None:
    """Two mounts of one user start at once (fstab at boot) with the default --index-dir,
    one index for both: one made the tables, the other saw them before their version was set
    ("schema version 0"), set the live index aside as index.old and deleted its -wal; the
    first then failed ("no such table: verified"). In ~1 of 4 starts. Fixed: the version is
    checked and the schema made in one transaction; a locked index is never set aside."""
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    for trial in range(16):
        folder = tmp_path / str(trial)
        folder.mkdir()
        go = fork.Event()
        procs = [fork.Process(target=_open_index, args=(str(folder / "index.sqlite"), go))
                 for _ in range(3)]  # fmt: skip
        for proc in procs:
            proc.start()
        go.set()
        for proc in procs:
            proc.join(timeout=30)
        assert [proc.exitcode for proc in procs] == [0, 0, 0]
        assert (
            sorted(p.name for p in folder.iterdir() if not p.name.startswith("index.sqlite")) == []
        )


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_unmount_leaves_a_filesystem_that_is_not_a_decant_mount_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`decant-mount -u /data` (a typo of /data/orig) as root: fusermount3 -u, and umount
    after it, unmount any filesystem, so the data disk went from under everyone. Fixed: only
    a mount of type fuse.decant-mount (stale ones included) is unmounted (cli.unmount)."""
    import subprocess

    disk = tmp_path / "data"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        (disk / "in-use.txt").write_bytes(b"x")
        assert cli.main(["-u", str(disk)]) == 1
        assert "a tmpfs mount, not decant-mount's" in capsys.readouterr().err
        # Nor lazily, as the systemd unit clears a stale mount before it mounts.
        assert cli.main(["-u", str(disk), "--lazy"]) == 1
        assert "a tmpfs mount, not decant-mount's" in capsys.readouterr().err
        assert os.path.ismount(disk) and (disk / "in-use.txt").exists()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_status_of_a_user_s_folder_writes_no_terminal_escape_of_theirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An admin runs `decant-mount --status /home/alice/mnt`, where alice put a
    `.decant-status` of her own: names were escaped, but the numbers were printed as they
    were, and a string in their place (an error counter's name, bytes_served) reached the
    admin's terminal with its escape sequences (here: set the window title, then clear the
    screen). Fixed: every line printed is escaped whole (cli._print_status)."""
    import json

    esc = "\x1b]0;owned\x07\x1b[2J"
    daemon = {"bytes_served": esc, "reads": 1, "read_seconds": 0, "verified": 0,
              "failed_verification": 0, "pending_verification": 0, "errors": {esc: 1}}  # fmt: skip
    (tmp_path / ".decant-status").write_text(json.dumps({"daemon": daemon}))
    assert cli.main(["--status", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;owned" in shown


def test_credentials_in_an_s3_url_are_refused_without_being_echoed(tmp_path: Path) -> None:
    """An operator writes `decant-mount s3://KEY:SECRET@bucket/p MNT` (the form other tools
    take): the start failed with a message naming the whole URL, secret included, on stderr,
    which under systemd is the journal (kept, readable by the adm group). Fixed: such a URL is
    refused as a usage error that does not repeat it (cli._main_bucket)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    cmd = [sys.executable, "-m", "vfs.cli", "s3://AKIAEXAMPLE:s3cr3tKEY@bucket/p",
           str(tmp_path), "-f", "--s3-endpoint", "http://127.0.0.1:9", "--s3-timeout", "1",
           "--s3-retries", "0", "--log-file", str(tmp_path / "log")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode != 0
    log = tmp_path / "log"
    shown = done.stdout + done.stderr + (log.read_text(errors="replace") if log.exists() else "")
    assert "s3cr3tKEY" not in shown and "credentials" in shown, shown
