"""`decant-mount SRC MNT`: argument parsing, logging, daemonizing, signals, and trio.run."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

from vfs.beneath import open_beneath
from vfs.errors import DecantError
from vfs.logsafe import SafeFormatter, escape_controls
from vfs.mount.config import STATUS_NAME, BucketConfig, MountConfig, parse_fuse_options
from vfs.mount.described import DESCRIBED_ENTRIES
from vfs.mount.inodes import LISTED_ENTRIES
from vfs.mount.mountinfo import topmost
from vfs.owned import resolve_trusting_no_one, swappable_by_others, why_not_own
from vfs.version import VersionAction

log = logging.getLogger("decant-mount")


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512M or 2G)") from None


def positive_int(text: str) -> int:
    """A count of at least 1 (`--decode-threads 0` started a mount whose every read of an
    archive waited forever for a decode thread, without a word)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a count of at least 1: {text!r}")
    return value


def parse_duration(text: str) -> float:
    """Seconds from `90`, `90s`, `30m`, `24h`, `2d`; `never` is forever."""
    t = text.strip().lower()
    if t in ("never", "inf", "off"):
        return float("inf")
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 90s, 30m, 24h, never)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="decant-mount",
        description="Mount a folder of archives: decant archives appear as their original files.",
    )
    p.add_argument("source", nargs="?", type=str, metavar="SRC",
                   help="folder of archives, or s3://BUCKET/PREFIX")  # fmt: skip
    p.add_argument("mountpoint", nargs="?", type=Path, metavar="MNT", help="where to mount it")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    p.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="OPT[,OPT…]",
        help="FUSE mount options (allow_other, ro, default_permissions, …)",
    )
    p.add_argument(
        "--cache-size",
        type=parse_size,
        default=parse_size("512M"),
        metavar="SIZE",
        help="decoded page cache (default 512M)",
    )
    p.add_argument(
        "--index-dir",
        type=Path,
        metavar="DIR",
        help="persistent index folder (default ~/.cache/decant-mount)",
    )
    p.add_argument("--no-index", action="store_true", help="keep no persistent index")
    p.add_argument(
        "--no-watch",
        action="store_true",
        help="do not watch SRC with inotify (NFS, inotify limits): changes show within ~2 s "
        "through short kernel timeouts and folder mtime checks",
    )
    p.add_argument(
        "--described-entries",
        type=int,
        default=DESCRIBED_ENTRIES,
        metavar="N",
        help="entries (members, folders) of archive trees kept in memory across all archives; "
        f"others are read again from the index when listed (default {DESCRIBED_ENTRIES:,})",
    )
    p.add_argument(
        "--listed-entries",
        type=int,
        default=LISTED_ENTRIES,
        metavar="N",
        help="names of SRC's folders kept listed in memory across all folders, and files the "
        "kernel is let keep; past it the least recently used are let go and read again when "
        f"asked for (default {LISTED_ENTRIES:,})",
    )
    p.add_argument(
        "--decode-threads",
        type=positive_int,
        default=4,
        metavar="N",
        help="worker threads decoding reads at once (default 4)",
    )
    p.add_argument("--log-file", type=Path, metavar="F", help="log here (default: stderr/syslog)")
    p.add_argument("--log-level", default="INFO", metavar="L", help="DEBUG, INFO, WARNING, ERROR")
    p.add_argument("-u", "--unmount", type=Path, metavar="MNT", help="unmount MNT and exit")
    p.add_argument("-z", "--lazy", action="store_true",
                   help="with -u: detach MNT even when busy or stale (fusermount3 -z)")  # fmt: skip
    p.add_argument("--status", type=Path, metavar="MNT",
                   help="print MNT's pack queue and counters and exit")  # fmt: skip
    p.add_argument(
        "--metrics-file",
        type=Path,
        metavar="PATH",
        help="write counters here every 5 s in the Prometheus text format (textfile collector)",
    )
    p.add_argument(
        "--scrub-interval",
        type=parse_duration,
        metavar="T",
        help="re-verify every original in SRC this often (e.g. 7d, 12h; default: never)",
    )
    p.add_argument(
        "--verify-first",
        action="store_true",
        help="verify an original whole before its first byte is served: an open of one not "
        "verified yet waits for its sha256 (default: served at once, checked as it is read)",
    )
    p.add_argument("--version", action=VersionAction)
    w = p.add_argument_group("write side (files copied into the mount are packed)")
    w.add_argument("--read-only", action="store_true", help="refuse all writes (also: -o ro)")
    w.add_argument(
        "--spool",
        type=Path,
        metavar="DIR",
        help="where written files wait (default SRC/.decant-spool; same filesystem). Over "
        "s3://: required for writes (a local folder; files are uploaded from it)",
    )
    w.add_argument(
        "--settle",
        type=float,
        default=2.0,
        metavar="S",
        help="pack a file once closed and unchanged this long (default 2)",
    )
    w.add_argument(
        "--pack-all",
        action="store_true",
        help="pack every file (mode verbatim for non-TIFFs) instead of moving them",
    )
    w.add_argument(
        "--pack-workers", type=int, default=1, metavar="N", help="files packed at once (default 1)"
    )
    w.add_argument(
        "--inbox",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="also pack files dropped into DIR (at their path below it)",
    )
    w.add_argument(
        "--allow-delete", action="store_true", help="let unlink remove archives and files from SRC"
    )
    w.add_argument(
        "--min-free",
        type=parse_size,
        metavar="SIZE",
        help="refuse new data (ENOSPC) while the spool's filesystem has less free, a reserve "
        "for packing what is spooled (a file larger than it waits for space; default 256M or "
        "5%% of the filesystem, if smaller)",
    )
    w.add_argument(
        "--stale-temp",
        type=parse_duration,
        default=24 * 3600.0,
        metavar="TIME",
        help="delete an rsync temp file (.NAME.XXXXXX) left unchanged this long; such files "
        "are never published (default 24h; 30m, 90s, never)",
    )
    w.add_argument(
        "--retry-after",
        type=parse_duration,
        default=30.0,
        metavar="TIME",
        help="retry a failed publish (store down, folder taken) this long after it failed, "
        "doubling each time up to an hour (default 30s)",
    )
    _add_bucket_options(p)
    _add_backend_options(p)
    return p


def _add_bucket_options(p: argparse.ArgumentParser) -> None:
    b = p.add_argument_group(
        "SRC in object storage (s3://BUCKET/PREFIX; credentials from AWS_ACCESS_KEY_ID/"
        "AWS_SECRET_ACCESS_KEY or a profile, never from the command line)"
    )
    b.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint (default AWS_ENDPOINT_URL)")
    b.add_argument("--s3-region", metavar="NAME", help="region (default AWS_REGION)")
    b.add_argument("--s3-profile", metavar="NAME",
                   help="AWS profile in ~/.aws/credentials and ~/.aws/config, used when "
                   "AWS_ACCESS_KEY_ID is unset (default AWS_PROFILE, else 'default')")  # fmt: skip
    b.add_argument("--s3-timeout", type=float, default=10.0, metavar="S",
                   help="one request, connect to last byte; while the store is down a read "
                   "gives EIO after at most ~3x this, retries included (~4x when it answers "
                   "too slowly: the kernel asks again) (default 10)")  # fmt: skip
    b.add_argument("--s3-retries", type=int, default=3, metavar="N",
                   help="retries of a failed request (default 3)")  # fmt: skip
    b.add_argument("--disk-cache", type=Path, metavar="DIR",
                   help="keep byte ranges fetched from the bucket in DIR (reused across "
                   "restarts; keyed by ETag and Last-Modified, so never stale; each range "
                   "checked by its xxh3; only its own entries are evicted). "
                   "DIR must be this user's own, writable by no one else")  # fmt: skip
    b.add_argument("--disk-cache-size", type=parse_size, default=parse_size("10G"),
                   metavar="SIZE", help="bound of --disk-cache (default 10G)")  # fmt: skip
    b.add_argument("--relist", type=parse_duration, default=30.0, metavar="T",
                   help="re-list the bucket this often, so archives other hosts add or remove "
                   "show (default 30s)")  # fmt: skip


def _add_backend_options(p: argparse.ArgumentParser) -> None:
    try:
        from vfs.backends.c4gh import add_mount_options
    except ImportError:
        return
    add_mount_options(p)


def check_mountpoint(mnt: Path) -> str | None:
    """A clear reason the mountpoint cannot be used, or None."""
    try:
        st = os.stat(mnt)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            return (
                f"{mnt}: stale FUSE mount (its daemon is gone); clear it with "
                f"`decant-mount -u {mnt}` (fusermount3 -u) and mount again"
            )
        return f"{mnt}: {exc.strerror}"
    if not os.path.isdir(mnt) or not (st.st_mode & 0o040000):
        return f"{mnt}: not a directory"
    if os.path.ismount(mnt):
        return (
            f"{mnt}: already a mount point (another decant-mount?); unmount it first "
            f"with `decant-mount -u {mnt}`"
        )
    return None


FSTYPE = "fuse.decant-mount"  # what the kernel calls a mount of ours (subtype=decant-mount)


def mount_type(mnt: Path) -> str | None:
    """The type of the topmost filesystem mounted at `mnt` (a stale mount, its daemon gone, is
    still listed), or None when nothing is mounted there."""
    found = topmost(os.path.realpath(mnt))
    return found[1] if found is not None else None


def unmount(mnt: Path, lazy: bool = False) -> int:
    """Unmount MNT if a decant-mount is mounted there. fusermount3 (as root) and umount
    unmount any filesystem: `decant-mount -u /data` (a typo of /data/orig) unmounted the
    data disk under everyone's feet. `lazy` detaches a busy or stale mount (the systemd unit
    clears a stale one before it mounts, and must not clear whatever else is mounted there)."""
    kind = mount_type(mnt)
    if kind != FSTYPE:
        what = f"a {kind} mount, not decant-mount's" if kind else "nothing is mounted there"
        print(f"decant-mount: {mnt}: {what}; not unmounted (umount unmounts others)",
              file=sys.stderr)  # fmt: skip
        return 1
    flags = (["-z"], ["-l"]) if lazy else ([], [])
    for cmd in (["fusermount3", "-u", *flags[0], str(mnt)], ["umount", *flags[1], str(mnt)]):
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            continue
        if result.returncode == 0:
            return 0
        err = result.stderr.strip()
    print(f"decant-mount: cannot unmount {mnt}: {err}", file=sys.stderr)
    return 1


MAX_STATUS = 4 << 20  # the daemon's status is bounded well below this (vfs/mount/status.py)


def print_status(mnt: Path) -> int:
    """Print MNT's status. MNT may be any folder: a FIFO or device put at its status name is
    not waited on or read without end (an admin's `--status` of a user's folder hung)."""
    try:
        fd = os.open(mnt / STATUS_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("not a decant-mount status file")
            data = b""
            while len(data) < MAX_STATUS and (more := os.read(fd, MAX_STATUS - len(data))):
                data += more
            doc = json.loads(data)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        print(f"decant-mount: {mnt}: no status to show ({exc})", file=sys.stderr)
        return 1
    try:
        _print_status(doc)
        sys.stdout.flush()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # not the daemon's file
        print(f"decant-mount: {mnt}: not a decant-mount status ({exc!r})", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `--status MNT | head -1`: the reader has all it wants
        # Python flushes stdout again at exit and would complain of the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _print_status(doc: dict[str, Any]) -> None:
    """Every line escaped whole, values and names alike: `--status` of a folder a user may
    write reads the file they put there, whose numbers may be strings of terminal escapes
    (an error counter's name, `bytes_served`) written raw to the admin's terminal."""

    def out(line: str) -> None:
        print(escape_controls(line))

    if "queued" in doc:
        failed = doc.get("failed_total", len(doc["failed"]))
        out(f"queued {doc['queued']}, packing {doc['packing']}, failed {failed}, "
            f"done {doc['done']}")  # fmt: skip
        for key, what in (("failed", "failed"), ("waiting_for_space", "waiting for space")):
            listed = doc.get(key, [])
            for entry in listed:  # names are a user's: one line each, printable
                out(f"{what}: {entry['path']}: {entry['reason']}")
            unlisted = doc.get(f"{key}_total", len(listed)) - len(listed)
            if unlisted > 0:
                out(f"{what}: {unlisted} more not listed")
        if doc.get("temp"):
            out(f"rsync temp files waiting for their rename: {doc['temp']}")
        space = doc.get("space")
        if space and space.get("refusing_writes"):
            out(f"refusing new data: {space['free'] >> 20} MiB free, below --min-free "
                f"{space['min_free'] >> 20} MiB")  # fmt: skip
    d = doc.get("daemon", {})
    if d:
        cache = d.get("cache", {})
        errors = ", ".join(f"{k} {v}" for k, v in sorted(d.get("errors", {}).items())) or "none"
        out(
            f"served {d['bytes_served']} bytes in {d['reads']} reads "
            f"({d['read_seconds']} s in backends); cache {cache.get('bytes', 0)} "
            f"(+ {cache.get('idle_bytes', 0)} of buffers kept for reuse) of "
            f"{cache.get('limit_bytes', 0)} bytes, {cache.get('hits', 0)} hits, "
            f"{cache.get('misses', 0)} misses, {cache.get('evictions', 0)} evictions"
        )
        out(f"files verified {d['verified']}, failed verification "
            f"{d['failed_verification']}, pending {d['pending_verification']}; "
            f"errors: {errors}")  # fmt: skip


def bucket_config(args: argparse.Namespace, url: str) -> BucketConfig:
    return BucketConfig(url=url.rstrip("/"), endpoint=args.s3_endpoint, region=args.s3_region,
                        profile=args.s3_profile, disk_cache=args.disk_cache,
                        disk_cache_size=args.disk_cache_size,
                        timeout=args.s3_timeout, retries=args.s3_retries,
                        relist=args.relist)  # fmt: skip


def config_from_args(
    args: argparse.Namespace, src: Path, mnt: Path, bucket: BucketConfig | None = None
) -> MountConfig:
    return MountConfig(
        bucket=bucket,
        src=src,
        mnt=mnt,
        options=parse_fuse_options(args.options),
        cache_size=args.cache_size,
        index_dir=args.index_dir,
        use_index=not args.no_index,
        decode_threads=args.decode_threads,
        described_entries=max(1, args.described_entries),
        listed_entries=max(1, args.listed_entries),
        watch=not args.no_watch,
        read_only=args.read_only,
        spool=args.spool,  # resolved by real_paths: opened exactly, see open_exact
        settle=args.settle,
        pack_all=args.pack_all,
        pack_workers=args.pack_workers,
        inbox=args.inbox,
        allow_delete=args.allow_delete,
        metrics_file=args.metrics_file,
        scrub_interval=args.scrub_interval,
        verify_first=args.verify_first,
        min_free=args.min_free,
        stale_temp=args.stale_temp,
        retry_after=args.retry_after,
        backend_args=args,
    )


def real_paths(args: argparse.Namespace) -> str | None:
    """Resolve the folders the daemon works in (SRC unless a bucket's, --spool, each --inbox)
    through no link another user could make or re-point (see `resolve_trusting_no_one`), in
    place, and check the mountpoint's way likewise: a reason to refuse the start, or None.
    As root, `Path.resolve` followed a user's link put at `--spool /var/tmp/decant-spool`
    before the first start: the folder it named (/etc) was made 0700 and what its `files/`
    held was published into SRC. A mountpoint reached through such a link puts the mount
    over the folder of the user's choice."""
    option = "MNT"
    try:
        mnt = resolve_trusting_no_one(args.mountpoint)  # mounted as given: the way is checked
        why = swappable_by_others(mnt)
        if why is not None:  # the folder could be a link by the time it is mounted on
            return (f"MNT {args.mountpoint}: {why}, so it could be swapped for a link before the "
                    "mount is made, and the mount would cover the folder the link names; mount "
                    "in a folder of root's or this user's")  # fmt: skip
        if not args.source.startswith("s3://"):
            option = "SRC"
            args.source = str(resolve_trusting_no_one(Path(args.source)))
        if args.spool is not None:
            option = "--spool"
            args.spool = resolve_trusting_no_one(args.spool)
        option = "--inbox"
        args.inbox = [resolve_trusting_no_one(p) for p in args.inbox]
        # Files root writes: a user's link at --log-file /var/tmp/decant/mnt.log's folder had
        # root create, append to or replace that name in the folder of their choice. Their
        # folders only: a link at the name itself is never followed (_open_log, metrics).
        option = "--log-file"
        if args.log_file is not None:
            args.log_file = resolve_trusting_no_one(args.log_file.parent) / args.log_file.name
        option = "--metrics-file"
        if args.metrics_file is not None:
            folder = resolve_trusting_no_one(args.metrics_file.parent)
            args.metrics_file = folder / args.metrics_file.name
    except (OSError, ValueError) as exc:
        return f"{option}: {exc}"
    return None


def _open_log(path: str) -> TextIO:
    """The log file, appended to. It names every user's files: created 0600 (an operator may
    widen it, as for the journal), never with the umask's 0644 beside other users. Opened
    without following a link, and only if it is the daemon's user's own and no one else may
    write it: as root, a link or a file another user put at that name (in a folder they may
    write) would have had the daemon append to whatever it names, or keep its log in their
    file."""
    # O_NONBLOCK: a FIFO put at the name (where the folder lets others write) would block the
    # open until someone reads it, holding the start, or SIGHUP's reopen and with it SIGTERM
    # (red team 80 F2); refused below, as anything but a regular file is.
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK
    try:
        # No link followed on the way either (resolved by real_paths): one swapped in for a
        # folder since, by SIGHUP's reopen, is refused too (ELOOP).
        fd = open_beneath(Path("/"), Path(path).absolute(), flags, 0o600)
    except OSError as exc:
        why = {errno.ELOOP: "a symlink", errno.ENXIO: "not a regular file (a FIFO)"}.get(
            exc.errno or 0, exc.strerror
        )
        raise SystemExit(f"decant-mount: --log-file {path}: {why}") from None
    os.set_blocking(fd, True)
    st = os.fstat(fd)
    why = (
        ("not a regular file" if not stat.S_ISREG(st.st_mode) else None)
        or why_not_own(st)
        or (f"a hard link ({st.st_nlink} names)" if st.st_nlink != 1 else None)
    )
    if why is not None:
        os.close(fd)
        raise SystemExit(f"decant-mount: --log-file {path}: {why}: the log names every user's "
                         "files, so no other user may hold or write it")  # fmt: skip
    return os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="backslashreplace")


class ReopenableLog(logging.StreamHandler):  # type: ignore[type-arg]
    """The --log-file, opened again on SIGHUP (see vfs.mount.daemon._signals): logrotate's
    usual `postrotate kill -HUP` otherwise unmounted the mount for everyone at every rotation
    (SIGHUP meant "unmount"), and without it the daemon logged on into the rotated file."""

    def __init__(self, path: str) -> None:
        super().__init__(_open_log(path))
        self.path = path

    def reopen(self) -> None:
        """Blocking (an open): a worker thread's. The same checks as at start; a refused
        file keeps the log where it was, saying why."""
        try:
            stream = _open_log(self.path)
        except SystemExit as exc:
            log.error("log not reopened: %s", str(exc).removeprefix("decant-mount: "))
            return
        old = self.setStream(stream)
        if old is not None:
            old.close()
        log.info("log reopened (SIGHUP)")


def setup_logging(args: argparse.Namespace, detached: bool) -> None:
    level = getattr(logging, str(args.log_level).upper(), None)
    if not isinstance(level, int):
        raise SystemExit(f"decant-mount: unknown --log-level {args.log_level!r}")
    handler: logging.Handler
    if args.log_file:
        handler = ReopenableLog(args.log_file)
        handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    elif detached and os.path.exists("/dev/log"):
        # socket, pickle and more: ~10 ms of every start, for syslog alone
        from logging.handlers import SysLogHandler

        handler = SysLogHandler("/dev/log")
        handler.setFormatter(SafeFormatter("decant-mount[%(process)d]: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(SafeFormatter("decant-mount: %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def main(argv: list[str] | None = None) -> int:
    # No linear algebra here: without this, numpy's OpenBLAS starts a thread per further core
    # when the first archive is opened, and it spins ~0.1 s of a core (perf: blas_thread_server,
    # 205-215 samples at 2 kHz in a 1.5 s first read) just as the first reads need that core.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)
    if args.unmount:
        return unmount(args.unmount, args.lazy)
    if args.status:
        return print_status(args.status)
    if args.source is None or args.mountpoint is None:
        build_parser().error("SRC and MNT are required")
    if args.retry_after < 1:  # 0 would retry a failing publish in a tight loop
        build_parser().error("--retry-after: at least 1s")
    if args.scrub_interval is not None and args.scrub_interval < 1:
        # 0 (meant as "off") re-read every archive of SRC without a pause, logging a line a
        # pass: ~500 lines a second with one archive, and SRC's disks never idle.
        build_parser().error("--scrub-interval: at least 1s (leave it out for no scrubbing)")
    _absolute_paths(args)
    problem = real_paths(args)
    if problem:
        print(f"decant-mount: {problem}", file=sys.stderr)
        return 1
    if args.source.startswith("s3://"):
        return _main_bucket(args)
    src, mnt = Path(args.source), args.mountpoint.absolute()
    if not src.is_dir():
        print(f"decant-mount: {src}: not a folder", file=sys.stderr)
        return 1
    if mnt == src or src.is_relative_to(mnt):
        print(f"decant-mount: {src} is inside {mnt}: the mount would hide its own source",
              file=sys.stderr)  # fmt: skip
        return 1
    problem = check_mountpoint(mnt)
    if problem:
        print(f"decant-mount: {problem}", file=sys.stderr)
        return 1
    ready_fd = None if args.foreground else _daemonize()
    setup_logging(args, detached=ready_fd is not None)
    try:
        from vfs.mount.daemon import serve

        return serve(config_from_args(args, src, mnt), lambda: _ready(ready_fd))
    except DecantError as exc:  # a refusal its message explains (key permissions, bad option)
        log.error("%s", exc)
        print(f"decant-mount: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        log.exception("%s", exc)
        print(f"decant-mount: {exc}", file=sys.stderr)  # still the caller's terminal until ready
        return 1


def check_bucket(bucket: BucketConfig) -> str | None:
    """One LIST of the prefix, before anything is mounted: a clear reason it fails, or None.
    The --disk-cache folder is checked first (no other user may write it)."""
    from vfs.stores.diskcache import check_folder
    from vfs.stores.s3 import S3Folder, S3Options

    if bucket.disk_cache is not None:
        try:
            check_folder(bucket.disk_cache)
        except DecantError as exc:
            return str(exc)

    options = S3Options(endpoint=bucket.endpoint, region=bucket.region, timeout=bucket.timeout,
                        retries=min(bucket.retries, 1), retry_timeout=bucket.timeout,
                        profile=bucket.profile)  # fmt: skip
    try:
        folder = S3Folder(bucket.url, options)
        try:
            folder.check()
        finally:
            folder.close()
    except DecantError as exc:
        return str(exc)
    return None


def _main_bucket(args: argparse.Namespace) -> int:
    """`decant-mount s3://BUCKET/PREFIX MNT`: the bucket is checked (one LIST) before mounting."""
    from vfs.stores.base import ObjectPath
    from vfs.stores.s3 import split_url

    try:
        bucket_name, _prefix = split_url(args.source)
    except ValueError as exc:
        print(f"decant-mount: {exc}", file=sys.stderr)
        return 2
    if "@" in bucket_name:  # no bucket name holds one: s3://KEY:SECRET@BUCKET/...
        # Never echoed: the error naming the URL went to stderr, which under systemd is the
        # journal, kept and readable by the adm group.
        print("decant-mount: the s3:// URL holds credentials (…@BUCKET): they are never "
              "taken from the command line; use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a "
              "profile (--s3-profile)", file=sys.stderr)  # fmt: skip
        return 2
    if args.relist <= 0 or args.s3_timeout <= 0 or args.s3_retries < 0:
        print("decant-mount: --relist and --s3-timeout must be > 0, --s3-retries >= 0",
              file=sys.stderr)  # fmt: skip
        return 2
    mnt = args.mountpoint.absolute()
    problem = check_mountpoint(mnt)
    if problem:
        print(f"decant-mount: {problem}", file=sys.stderr)
        return 1
    bucket = bucket_config(args, args.source)
    src = ObjectPath.of_url(bucket.url)
    # After the fork: obstore's runtime threads would not survive it (its calls in the child
    # would hang). Until ready, the child's stderr is still the caller's terminal.
    ready_fd = None if args.foreground else _daemonize()
    # Before the check: its listing may log keys it leaves out, and a line logged before this
    # would go out through logging's last-resort handler, unescaped (a key can forge lines).
    setup_logging(args, detached=ready_fd is not None)
    problem = check_bucket(bucket)
    if problem:
        print(f"decant-mount: {problem}", file=sys.stderr)
        return 1
    try:
        from vfs.mount.daemon import serve

        return serve(config_from_args(args, src, mnt, bucket), lambda: _ready(ready_fd))  # type: ignore[arg-type]
    except DecantError as exc:  # wrong credentials, endpoint down: StoreError says which
        log.error("%s", exc)
        print(f"decant-mount: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        log.exception("%s", exc)
        print(f"decant-mount: {exc}", file=sys.stderr)
        return 1


def _daemonize() -> int:
    """Fork; the parent exits only once the child says the mount is ready (or failed)."""
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        status = os.read(read_end, 1)
        os._exit(0 if status == b"1" else 1)
    os.close(read_end)
    os.setsid()
    # Not the folder it was started in: that kept its filesystem busy (`umount /media/usb`:
    # target is busy) as long as the daemon ran. Relative paths were made absolute before.
    os.chdir("/")
    return write_end


def _absolute_paths(args: argparse.Namespace) -> None:
    """Every path argument made absolute against the folder the command was started in, in
    place: a detached daemon works from / (`_daemonize`), and opens some (keys, the index, the
    log at SIGHUP) later."""
    for key, value in vars(args).items():
        if isinstance(value, Path):
            setattr(args, key, value.absolute())
        elif isinstance(value, list) and any(isinstance(v, Path) for v in value):
            setattr(args, key, [v.absolute() if isinstance(v, Path) else v for v in value])


def _ready(fd: int | None) -> None:
    notify = os.environ.get("NOTIFY_SOCKET")
    if notify:  # systemd Type=notify
        addr = "\0" + notify[1:] if notify.startswith("@") else notify
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"READY=1", addr)
    if fd is not None:
        os.write(fd, b"1")
        os.close(fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(devnull, std)


if __name__ == "__main__":
    sys.exit(main())
