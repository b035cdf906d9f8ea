"""What one mount was asked to do: built by the CLI (or a test), read by the daemon and handlers.

Plain data, no FUSE: the CLI parses arguments into a `MountConfig`; nothing below the CLI reads
argparse namespaces, except a backend's own options kept in `backend_args`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from vfs.mount.described import DESCRIBED_ENTRIES
from vfs.mount.inodes import LISTED_ENTRIES

SPOOL_NAME = ".decant-spool"
STATUS_NAME = ".decant-status"

# -o options that mount(8) / mount.fuse3 pass but libfuse does not take.
MOUNT_ONLY_OPTIONS = frozenset({
    "rw", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "auto", "noauto", "user", "users",
    "nouser", "_netdev", "nofail", "defaults", "nonempty",
})  # fmt: skip


def parse_fuse_options(raw: list[str]) -> set[str]:
    """`-o a,b -o c` → {"a", "b", "c"}, without the options only mount(8) understands."""
    opts: set[str] = set()
    for group in raw:
        opts.update(o.strip() for o in group.split(",") if o.strip())
    return opts - MOUNT_ONLY_OPTIONS


@dataclass
class BucketConfig:
    """SRC in object storage: where, how to reach it, how often to re-list it."""

    url: str  # s3://BUCKET/PREFIX
    endpoint: str | None = None  # None: AWS_ENDPOINT_URL
    region: str | None = None  # None: AWS_REGION / AWS_DEFAULT_REGION
    profile: str | None = None  # used when AWS_ACCESS_KEY_ID is unset; None: AWS_PROFILE/default
    timeout: float = 10.0  # one request, seconds
    retries: int = 3  # after the first try
    relist: float = 30.0  # seconds a folder's listing is trusted
    disk_cache: Path | None = None  # fetched ranges kept on disk, reused across restarts
    disk_cache_size: int = 10 << 30


@dataclass
class MountConfig:
    src: Path
    mnt: Path
    options: set[str] = field(default_factory=set)  # FUSE -o options as given
    cache_size: int = 512 << 20
    index_dir: Path | None = None  # None: ~/.cache/decant-mount
    use_index: bool = True
    decode_threads: int = 4
    watch: bool = True  # inotify on SRC; off: short kernel timeouts and mtime checks only
    read_only: bool = False
    spool: Path | None = None  # None: SRC/.decant-spool
    settle: float = 2.0
    pack_all: bool = False
    pack_workers: int = 1
    inbox: list[Path] = field(default_factory=list)
    allow_delete: bool = False
    scrub_interval: float | None = None  # seconds between re-verifications of every original
    verify_first: bool = False  # an original not verified yet is verified before it opens
    metrics_file: Path | None = None  # Prometheus text, rewritten every few seconds
    min_free: int | None = None  # bytes kept free on the spool's fs; None: min(256M, 5 %)
    stale_temp: float = 24 * 3600.0  # an rsync temp file left this long (s) is deleted
    retry_after: float = 30.0  # a failed publish's first retry (s), doubling up to an hour
    described_entries: int = DESCRIBED_ENTRIES  # archive tree entries kept, all archives
    listed_entries: int = LISTED_ENTRIES  # names of SRC's listings and kernel entries kept
    backend_args: argparse.Namespace = field(default_factory=argparse.Namespace)
    bucket: BucketConfig | None = None  # SRC is s3://BUCKET/PREFIX (then `src` is its ObjectPath)

    def __post_init__(self) -> None:
        if "ro" in self.options or (self.bucket is not None and self.spool is None):
            self.read_only = True  # over a bucket, writes need a local --spool: else EROFS
        if self.bucket is not None:
            self.watch = False  # no inotify on a bucket: it is re-listed instead

    @property
    def spool_root(self) -> Path:
        return self.spool or self.src / SPOOL_NAME

    @property
    def allow_other(self) -> bool:
        return "allow_other" in self.options

    def fuse_options(self) -> set[str]:
        """What libfuse is given: the kernel always checks permissions (default_permissions)."""
        fsname = "fsname=decant:" + str(self.src).replace(",", "_")
        return {fsname, "subtype=decant-mount", "default_permissions", *self.options}
