"""Mount options (`-o a,b=c`): parsed and checked before anything is mounted.

Besides shardfs's own options, the generic ones that mount(8), fstab and
systemd pass to every file system are accepted: `ro`/`rw` choose the mode,
the kernel's mount flags (`nosuid`, `nodev`, `noexec`, ...) go to the kernel,
and options meant only for mount(8) or systemd (`defaults`, `noauto`,
`nofail`, `_netdev`, `x-systemd.*`, ...) are ignored, so an fstab line never
fails on them.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardfs.primitives.errors import UsageError

if TYPE_CHECKING:
    from shardfs.storage.s3 import S3Config

_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

#: Mount flags the kernel takes (through libfuse), passed on as given.
_KERNEL_FLAGS = ("nosuid", "nodev", "noexec", "suid", "dev", "exec", "sync", "async", "dirsync",
                 "atime", "noatime")  # fmt: skip
KERNEL_FLAGS = frozenset(_KERNEL_FLAGS)
#: Options for mount(8), fstab and systemd, or atime variants FUSE mounts cannot take:
#: accepted and ignored. Options starting with `x-` (`x-systemd.automount`, ...) too.
_IGNORED = ("defaults", "auto", "noauto", "nofail", "_netdev", "user", "nouser", "users", "owner",
            "group", "relatime", "norelatime", "strictatime", "nostrictatime", "lazytime",
            "nolazytime", "diratime", "nodiratime", "symfollow", "nosymfollow", "iversion",
            "noiversion", "mand", "nomand", "loud", "silent")  # fmt: skip
IGNORED = frozenset(_IGNORED)


#: The options of `shardfs mount`, in the order the table of docs/configuration.md and
#: `shardfs mount --help` show them: (forms, meaning), both in Markdown, links relative to
#: docs/. Every option `parse_options` takes is named in a form (`name` or `name=VALUE`), and
#: nothing else is taken, so the help and docs/configuration.md (whose table
#: `markdown_table` renders; a test compares them) cannot leave an option out. The generic options of mount(8) follow them (`_generic`).
TABLE: tuple[tuple[str, str], ...] = (
    (
        "`ro`",
        "read-only mount; the kernel may then cache data, entries and attributes for 300 s",
    ),
    (
        "`rw`",
        (
            "the default: writes are buffered and committed into the shards (see [Writing through"
            " the mount](formats.md#writing-through-the-mount))"
        ),
    ),
    (
        "`write_buffer=SIZE`",
        "memory for written, not yet committed data before it spills to disk (default 256M)",
    ),
    (
        "`flush_interval=SECONDS`",
        "commit a shard at the latest this long after its first pending change (default 5)",
    ),
    (
        "`spool=DIR`",
        (
            "where written data spills beyond `write_buffer` (default: a temporary directory); "
            "refused if another user could change it (a symlink, another user's, or writable by "
            "others unless sticky as /tmp)"
        ),
    ),
    (
        "`shard_new=N`",
        "store arrays created through the mount sharded, N inner chunks per shard along each axis",
    ),
    (
        "`allow_other`",
        (
            "let other users see the mount, the kernel checking the modes shown (see "
            "[Permissions](semantics.md#permissions); needs `user_allow_other` in "
            "`/etc/fuse.conf` for non-root)"
        ),
    ),
    (
        "`uid=N`, `gid=N`",
        (
            "the owner and group every file shows (numbers; default: the stored file's, on S3 "
            "and for files not yet committed the mounting user's; see [Permissions]"
            "(semantics.md#permissions))"
        ),
    ),
    (
        "`file_mode=MODE`, `dir_mode=MODE`",
        (
            "the mode every file or directory shows, in octal (e.g. 0440; default: the stored "
            "file's permission bits, without execute bits for files and without write bits with"
            " `ro`; on S3 0444 and 0555, or 0644 and 0755 read-write). With `allow_other` the "
            "kernel checks these modes for other users"
        ),
    ),
    (
        "`nonempty`",
        (
            "mount over a mountpoint that is not empty, hiding what is in it (without it such a "
            "mountpoint is refused)"
        ),
    ),
    (
        "`index_cache=SIZE`",
        "budget of the decoded shard index cache, bytes with optional K/M/G suffix (default 64M)",
    ),
    (
        "`view=v3` or `view=v2`",
        "show the hierarchy as Zarr v3 (default) or as zarr v2, for readers that know only v2",
    ),
    (
        "`read_cache=SIZE`",
        "S3: budget for chunks fetched ahead of their reads (default 64M; 0 turns read-ahead off)",
    ),
    (
        "`cache_dir=DIR`, `cache_size=SIZE`",
        (
            "S3: keep fetched indexes and chunk bytes on local disk in DIR, shared by the mounts "
            "of the host and kept across restarts, at most SIZE (default 10G); DIR must be the "
            "daemon user's alone, or the mount goes on without it (see "
            "[Caches](configuration.md#caches))"
        ),
    ),
    (
        "`listing_cache=SIZE`",
        (
            "budget for the chunk files of directory listings, kept under the versions of the "
            "shards they come from (default 64M; about 70 bytes per chunk listed, 24 per chunk of "
            "the shards listed from)"
        ),
    ),
    (
        "`inodes=N`",
        (
            "inodes of directories, metadata and passed-through files the daemon keeps for the "
            "kernel before it asks the kernel to forget the oldest (default 100000; chunk files "
            "need none, see [docs/performance.md](performance.md))"
        ),
    ),
    (
        "`kernel_cache=yes` or `kernel_cache=no`",
        (
            "read-only mounts: let the kernel serve re-reads and listings without asking the "
            "daemon (default `yes` where pyfuse3 carries the patch in "
            "[patches/](../patches/README.md), which `scripts/setup` builds; see "
            "[docs/semantics.md](semantics.md#kernel-served-read-only-mounts))"
        ),
    ),
    (
        "`front=yes` or `front=no`",
        (
            "kernel-served mounts of local sources: answer the lookups, attributes and reads of "
            "chunk files in compiled code, Python deciding what it may answer (default `yes` "
            "where it was built; where it cannot run, the mount runs without it and the log "
            "says why; see "
            "[docs/design.md](design.md#the-native-front))"
        ),
    ),
    (
        "`cache_timeout=SECONDS`",
        (
            "read-only mounts: how long the kernel trusts the entries, attributes, pages and "
            "listings it keeps before it asks again, so the bound on seeing a changed source "
            "(default 300)"
        ),
    ),
    (
        "`manifest=FILE`",
        (
            "S3, read-only: the Zarr at the prefix as the DANDI Zarr manifest FILE (a path, an "
            "`s3://` or an `https://` URL) describes it: listings from the manifest, every object"
            " read at the version it names (see [Pinned mounts](semantics.md#pinned-mounts))"
        ),
    ),
    (
        "`as_of=TIMESTAMP`",
        (
            "S3 with versioning, read-only: every object as it was at TIMESTAMP (ISO 8601; "
            "without a zone, UTC), its newest version by then that is not a delete marker (see "
            "[Pinned mounts](semantics.md#pinned-mounts))"
        ),
    ),
    (
        "`endpoint_url=URL`",
        (
            "S3: the endpoint of an S3-compatible store (MinIO, Ceph, ...); default AWS, or "
            "`AWS_ENDPOINT_URL`"
        ),
    ),
    (
        "`region=NAME`, `profile=NAME`",
        (
            "S3: region, and a profile of `~/.aws/config` (credentials otherwise come from "
            "boto3's usual chain)"
        ),
    ),
    (
        "`anon`",
        "S3: unsigned requests, for public buckets",
    ),
    (
        "`metadata_ttl=SECONDS`",
        (
            "S3: how long listings and stats are cached (default 1; 300 with `ro`; `forever` for "
            "immutable data)"
        ),
    ),
    (
        "`timeout=SECONDS`",
        "S3: connect and read timeout of one request before it is retried (default 30)",
    ),
    (
        "`stats_interval=SECONDS`",
        "log a one-line summary of `shardfs stats` every SECONDS (default: never)",
    ),
    (
        "`metrics=HOST:PORT`",
        (
            "serve Prometheus metrics at `http://HOST:PORT/metrics` (default: none; `PORT` or "
            "`:PORT` alone listens on 127.0.0.1, `[::1]:PORT` on an IPv6 address); anyone who "
            "can reach the port can read them (see [Metrics](configuration.md#metrics))"
        ),
    ),
    (
        "`debug`",
        "log every request (one DEBUG line per FUSE request)",
    ),
    (
        "`log=FILE`",
        (
            "where the detached daemon logs (default: syslog if `/dev/log` exists; in the "
            "foreground and under systemd: stderr, which systemd sends to the journal)"
        ),
    ),
    (
        "`user`, `users`, `owner`",
        (
            "fstab: let ordinary users mount the line (mount(8) decides who may); the daemon then"
            " runs as that user, with its state below the home directory the passwd database "
            "gives that user, so it works as a user's own `shardfs mount` (see [Mounting as an "
            "ordinary user](install.md#mounting-as-an-ordinary-user))"
        ),
    ),
)


def _names(forms: str) -> list[str]:
    """The option names in a `forms` cell: `name`, `name=VALUE`."""
    return re.findall(r"`([a-z_]+)(?=[=`])", forms)


#: The options `parse_options` takes besides the generic ones: those of TABLE.
OWN = frozenset(name for forms, _ in TABLE for name in _names(forms)) - IGNORED


def _valued() -> dict[str, str]:
    """The options of TABLE that take a value, each with its forms (`view=v3 or view=v2`),
    so that one given without a value is told how to give it."""
    valued: dict[str, list[str]] = {}
    for forms, _ in TABLE:
        for form in re.findall(r"`([a-z_]+=[^`]*)`", forms):
            valued.setdefault(form.partition("=")[0], []).append(form)
    return {name: " or ".join(given) for name, given in valued.items()}


VALUED = _valued()


def _generic() -> str:
    """The meaning of the generic options' row, from KERNEL_FLAGS and IGNORED."""
    flags = ", ".join(f"`{flag}`" for flag in _KERNEL_FLAGS)
    tabled = {name for forms, _ in TABLE for name in _names(forms)}
    ignored = ", ".join(f"`{name}`" for name in _IGNORED if name not in tabled)
    return (
        f"what mount(8), fstab and systemd pass: {flags} go to the kernel (the last of a pair "
        f"wins); {ignored}, `comment=...` and `x-*` (`x-systemd.automount`, ...) are for "
        "mount(8) and systemd, or atime variants FUSE cannot take: accepted and ignored"
    )


def markdown_table() -> str:
    """The table of mount options in docs/configuration.md (a test checks that it is there)."""
    rows = [*TABLE, ("generic options", _generic())]
    return "\n".join(
        [
            "| option | meaning |",
            "|---|---|",
            *(f"| {forms} | {meaning} |" for forms, meaning in rows),
        ]
    )


def _plain(markdown: str) -> str:
    """Markdown of the table as plain text: no backticks; a link (relative to docs/, where
    the table is) as its text, followed by its path in the repository unless the text is
    that path already."""

    def link(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2).partition("#")[0]
        path = target.removeprefix("../") if target.startswith("../") else f"docs/{target}"
        return text if path in (text, text + "README.md") else f"{text} ({path})"

    return re.sub(r"\[([^\]]+)\]\(([^)]+)\)", link, markdown).replace("`", "")


def help_text(width: int = 100) -> str:
    """The mount options as `shardfs mount --help` lists them: every row of TABLE and the
    generic options, each form then its meaning wrapped below it."""
    import textwrap

    out = ["mount options (-o OPT[,OPT...]):"]
    for forms, meaning in [*TABLE, ("generic options", _generic())]:
        out.append("  " + _plain(forms))
        out += textwrap.wrap(
            _plain(meaning), width, initial_indent=" " * 6, subsequent_indent=" " * 6
        )
    return "\n".join(out)


def parse_size(text: str, what: str | None = None) -> int:
    """Bytes from "4096", "64K", "256M", "1G" (binary units, optional "iB"/"B"). `what`
    names the option the size was given to, so that a bad size says whose it is."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        whose = f"{what}: " if what else ""
        raise UsageError(f"{whose}bad size {text!r} (use bytes or a K/M/G suffix, e.g. 256M)")
    return int(match.group(1)) * _SUFFIXES[match.group(2).upper()]


@dataclass
class MountOptions:
    read_only: bool = False
    allow_other: bool = False
    #: mount over a mountpoint that is not empty (checked by shardfs; libfuse 3 has no such option)
    nonempty: bool = False
    debug: bool = False
    index_cache: int = 64 << 20
    view: str = "v3"
    log_file: str | None = None
    write_buffer: int = 256 << 20
    flush_interval: float = 5.0
    spool: str | None = None
    shard_new: int | None = None
    #: S3 sources: keyword arguments of `shardfs.storage.s3.S3Config`
    s3: dict[str, Any] = field(default_factory=dict)
    read_cache: int = 64 << 20
    listing_cache: int = 64 << 20
    #: S3 sources: where fetched bytes are kept across mounts (see storage.disk_cache)
    cache_dir: str | None = None
    cache_size: int = 10 << 30
    #: seconds between the daemon's one-line summaries of `shardfs stats` in its log (0: none)
    stats_interval: float = 0.0
    #: where the daemon serves Prometheus metrics, (host, port); None: nowhere
    metrics: tuple[str, int] | None = None
    #: inodes of directories and other files (not chunks) the daemon keeps for the kernel
    inodes: int = 100_000
    #: read-only mounts: let the kernel serve re-reads and listings itself (needs the
    #: patched pyfuse3; `kernel_cache=no` keeps open and opendir requests)
    kernel_cache: bool = True
    #: kernel-served mounts: answer hot requests in the native front (`front=no`: never)
    front: bool = True
    #: read-only mounts: how long the kernel trusts what it caches (entries, attributes,
    #: and with `kernel_cache` pages and listings) before it asks again
    cache_timeout: float = 300.0
    #: the owner, group and modes every file shows instead of the stored ones
    uid: int | None = None
    gid: int | None = None
    file_mode: int | None = None
    dir_mode: int | None = None
    #: S3 sources: the DANDI Zarr manifest that pins every object's version (a path or URL)
    manifest: str | None = None
    #: S3 sources: every object as it was at this time (seconds since the epoch)
    as_of: int | None = None
    #: kernel mount flags (KERNEL_FLAGS), the last given of each pair (`exec`/`noexec`, ...)
    flags: dict[str, str] = field(default_factory=dict)
    given: list[str] = field(default_factory=list)

    def s3_config(self) -> S3Config:
        """How to reach an S3 source. Read-only mounts keep listings for long by default:
        nothing of theirs changes the bucket, and reads are pinned to ETags anyway."""
        from shardfs.storage.s3 import S3Config  # boto3 is imported for S3 sources only

        settings = dict(self.s3)
        settings.setdefault("metadata_ttl", 300.0 if self.read_only else 1.0)
        return S3Config(**settings)

    def fuse_options(self, fsname: str) -> set[str]:
        """The options passed to the kernel through libfuse. Every file is the mounting
        user's, so without `allow_other`, which lets no one else in, the kernel need not
        check mode bits: it then asks for no directory attributes to check them (two
        requests fewer per file a writer creates and renames into place)."""
        opts = {"subtype=shardfs", f"fsname={fsname}"}
        if self.read_only:
            opts.add("ro")
        if self.allow_other:
            opts |= {"allow_other", "default_permissions"}
        return opts | set(self.flags.values())

    def leftover_dir(self, source_id: str) -> str:
        """Where chunks that could not be committed at unmount are kept for the next mount
        of the source `source_id`: below `spool=DIR` if given, else in a state directory
        that outlives reboots: /var/lib/shardfs for root, else $XDG_STATE_HOME/shardfs if
        that is a directory of the user's, else ~/.local/state/shardfs below the home
        directory of the passwd database, never $HOME as given (mount.fuse3 gives a
        user's fstab mount HOME=/root)."""
        from shardfs.primitives.private import home_dir, own_directory

        if self.spool:
            base = self.spool
        elif os.geteuid() == 0:
            base = "/var/lib/shardfs"
        else:
            state = os.environ.get("XDG_STATE_HOME")
            if not own_directory(state):
                state = os.path.join(home_dir(os.geteuid()), ".local", "state")
            base = os.path.join(state, "shardfs")
        name = hashlib.sha256(source_id.encode()).hexdigest()[:24]
        return os.path.join(base, "pending", name)

    def argument(self) -> str:
        """The options again, as one `-o` argument (for the detached daemon)."""
        return ",".join(self.given)


def _positive(name: str, value: str, kind: type[int] | type[float]) -> float:
    try:
        number = kind(value)
    except ValueError:
        number = 0
    if not number > 0:
        raise UsageError(f"option {name} needs a positive number, got {value!r}")
    return number


def _id(name: str, value: str) -> int:
    """A user or group id: a decimal number below 2**32 - 1 (which means "none")."""
    if not re.fullmatch(r"[0-9]{1,10}", value) or int(value) >= 0xFFFFFFFF:
        raise UsageError(f"option {name} needs a numeric id (0 to 4294967294), got {value!r}")
    return int(value)


def _mode(name: str, value: str) -> int:
    """A file mode in octal: permission bits, with the set-id and sticky bits (at most 7777)."""
    if not re.fullmatch(r"0*[0-7]{1,4}", value):
        raise UsageError(f"option {name} needs an octal mode from 0 to 7777, got {value!r}")
    return int(value, 8)


#: The host `metrics=PORT` and `metrics=:PORT` listen on: this machine's only.
METRICS_HOST = "127.0.0.1"


def parse_address(value: str, name: str = "metrics") -> tuple[str, int]:
    """(host, port) of `HOST:PORT`, `[IPV6]:PORT`, `:PORT` or `PORT`; with no host,
    127.0.0.1, so that a listening socket opens only where asked. A host name is resolved
    when the daemon binds."""
    host, _, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        good_host = re.fullmatch(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*", host) is not None
    else:
        good_host = re.fullmatch(r"[A-Za-z0-9.-]*", host) is not None
    if not good_host or re.fullmatch(r"[0-9]{1,5}", port) is None:
        raise UsageError(
            f"option {name} needs HOST:PORT, :PORT or PORT (an IPv6 host in brackets: "
            f"[::1]:PORT), got {value!r}"
        )
    if not 0 < int(port) < 65536:
        raise UsageError(f"option {name}: port {int(port)} is not from 1 to 65535")
    return host or METRICS_HOST, int(port)


def _flag_pair(flag: str) -> str:
    """The flag a kernel flag switches: `nosuid` and `suid` both switch `suid`."""
    if flag == "async":
        return "sync"
    return flag[2:] if flag.startswith("no") else flag


def parse_options(groups: Iterable[str]) -> MountOptions:
    """Parse every `-o` argument; unknown or malformed options raise UsageError."""
    options = MountOptions()
    for group in groups:
        for item in filter(None, (part.strip() for part in group.split(","))):
            name, has_value, value = item.partition("=")
            if name in IGNORED or name == "comment" or name.startswith("x-"):
                continue
            if name not in OWN and name not in KERNEL_FLAGS:
                raise UsageError(f"unknown mount option {item!r}")
            if (
                name in ("ro", "rw", "allow_other", "nonempty", "debug", "anon", *KERNEL_FLAGS)
                and has_value
            ):
                raise UsageError(f"option {name!r} takes no value")
            if name in VALUED and not value:
                raise UsageError(f"option {name} needs a value: {VALUED[name]}")
            if name == "ro":
                options.read_only = True
            elif name == "rw":
                options.read_only = False
            elif name == "allow_other":
                options.allow_other = True
            elif name == "nonempty":
                options.nonempty = True
            elif name == "debug":
                options.debug = True
            elif name == "index_cache":
                options.index_cache = parse_size(value, f"option {name}")
            elif name == "view":
                if value not in ("v2", "v3"):
                    raise UsageError(f"option view takes v3 or v2, got {value!r}")
                options.view = value
            elif name == "write_buffer":
                options.write_buffer = parse_size(value, f"option {name}")
            elif name == "flush_interval":
                options.flush_interval = _positive(name, value, float)
            elif name == "shard_new":
                options.shard_new = int(_positive(name, value, int))
            elif name in ("endpoint_url", "region", "profile") and value:
                options.s3[name] = value
            elif name == "anon":
                options.s3["anon"] = True
            elif name == "metadata_ttl":
                forever = value in ("forever", "inf")
                options.s3[name] = float("inf") if forever else _positive(name, value, float)
            elif name == "timeout":
                options.s3[name] = _positive(name, value, float)
            elif name in KERNEL_FLAGS:
                options.flags[_flag_pair(name)] = name
            elif name == "read_cache":
                options.read_cache = parse_size(value, f"option {name}")
            elif name == "listing_cache":
                options.listing_cache = parse_size(value, f"option {name}")
            elif name == "cache_dir" and value:
                options.cache_dir = os.path.abspath(value)
                item = f"cache_dir={options.cache_dir}"
            elif name == "cache_size":
                options.cache_size = parse_size(value, f"option {name}")
            elif name == "stats_interval":
                options.stats_interval = _positive(name, value, float)
            elif name == "metrics":
                options.metrics = parse_address(value, name)
            elif name == "inodes":
                options.inodes = int(_positive(name, value, int))
            elif name == "cache_timeout":
                options.cache_timeout = _positive(name, value, float)
            elif name in ("uid", "gid"):
                setattr(options, name, _id(name, value))
            elif name in ("file_mode", "dir_mode"):
                setattr(options, name, _mode(name, value))
            elif name in ("kernel_cache", "front"):
                if value not in ("yes", "no"):
                    raise UsageError(f"option {name} takes yes or no, got {value!r}")
                setattr(options, name, value == "yes")
            elif name == "spool" and value:
                options.spool = os.path.abspath(value)
                item = f"spool={options.spool}"
            elif name == "manifest" and value:
                is_url = value.startswith(("s3://", "https://", "http://"))
                options.manifest = value if is_url else os.path.abspath(value)
                item = f"manifest={options.manifest}"
            elif name == "as_of":
                options.as_of = _timestamp(value)
            elif name == "log" and value:
                # Absolute, because a detached daemon runs in "/".
                options.log_file = os.path.abspath(value)
                item = f"log={options.log_file}"
            else:
                raise UsageError(f"unknown mount option {item!r}")
            options.given.append(item)
    if any(item.startswith("cache_size=") for item in options.given) and not options.cache_dir:
        raise UsageError("option cache_size needs cache_dir=DIR")
    if options.manifest is not None or options.as_of is not None:
        _pinned(options)
    return options


def _timestamp(value: str) -> int:
    """Seconds since the epoch of an ISO 8601 time (without a zone: UTC), for `as_of`."""
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"option as_of needs an ISO 8601 time (2024-05-01T12:00:00Z), got {value!r}"
        ) from None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp())


def _pinned(options: MountOptions) -> None:
    """A mount pinned to versions (`manifest`, `as_of`) is read-only: refuse `rw`."""
    if options.manifest is not None and options.as_of is not None:
        raise UsageError("options manifest and as_of each pin the versions: give one of them")
    name = "manifest" if options.manifest is not None else "as_of"
    if "rw" in options.given:
        raise UsageError(f"option {name} pins old versions, which cannot be written: mount ro")
    options.read_only = True
