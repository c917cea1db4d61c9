"""The on-disk format of the ``file`` backend (blocking code: run it in a worker thread), where
writers may be SIGKILLed at any instruction and readers trust no file they find: the numbered
rules cited here are docs/discovery.md's ("The file backend")."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import math
import os
import re
import secrets
import stat
import time
from typing import TYPE_CHECKING, Final, final
from urllib.parse import quote

import msgspec

from ._base import BadRecordReport, check_key

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MAX_RECORD_SIZE: Final = 1024 * 1024
"""Largest entry file read or written unless configured (``DiscoveryConfig.max_record_size``)."""

_MAX_NAME: Final = 200
"""Longest escaped key kept readable; longer ones are hashed (file names stop at 255 bytes)."""

_MAX_LEASE_FILE: Final = 4096
"""Largest lease file read (they hold a few dozen bytes)."""

_ABANDONED_AFTER: Final = 60.0
"""Seconds after which a leftover ``.tmp-*``/``.gc-*`` file is assumed abandoned by a crash."""

_MTIME_TRUSTED_AFTER_NS: Final = 1_000_000_000
"""A directory mtime this close to the moment it was read may still move within the
same timestamp tick (coarse clocks, one-second file systems): list again next time."""

_LEASE_NAME: Final = re.compile(r"[0-9a-fA-F]+\.lease")

_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC

Signature = tuple[int, int, int]
"""``(inode, mtime_ns, size)``: identifies one version of a file."""


class Unreadable(Exception):
    """A file in the store that cannot be used: not a regular file, too big, or unopenable."""


class _Entry(msgspec.Struct, frozen=True):
    key: str
    lease: int
    value: bytes


class _LeaseInfo(msgspec.Struct, frozen=True):
    ttl: float
    pid: int = 0


_entry_decoder = msgspec.json.Decoder(_Entry)
_lease_decoder = msgspec.json.Decoder(_LeaseInfo)
_encoder = msgspec.json.Encoder()


def key_to_name(key: str) -> str:
    """The file name (inside ``kv/``) of ``key`` (rule 6)."""
    name = quote(key, safe="-_.").replace("~", "%7E")  # quote() never escapes "~"
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name


def _name_of(key: str) -> str:
    """``key``'s file name in ``kv/``: :func:`key_to_name`, hashed if too long (rule 6)."""
    name = key_to_name(key)
    return name if len(name) <= _MAX_NAME else "~" + hashlib.sha256(key.encode()).hexdigest()


def _signature(st: os.stat_result) -> Signature:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def _kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def read_regular_file(
    path: str | Path, max_size: int, st: os.stat_result | None = None
) -> tuple[Signature, bytes]:
    """The signature and bytes of the regular file (``lstat`` ``st``) of at most ``max_size``
    bytes, never blocking (rule 7); :class:`Unreadable` says why not, FileNotFoundError if gone."""
    st = os.lstat(path) if st is None else st
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable(f"it is {_kind(st.st_mode)}")
    if st.st_size > max_size:
        raise Unreadable(f"it is {st.st_size} bytes, more than the limit of {max_size}")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable("it became a symbolic link") from None
        raise Unreadable(f"cannot open it: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"it became {_kind(st.st_mode)}")
        with open(fd, "rb", closefd=False) as file:
            data = file.read(max_size + 1)
    except OSError as exc:
        raise Unreadable(f"cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_size:
        raise Unreadable(f"it grew past the limit of {max_size} bytes")
    return _signature(st), data


def parse_entry(data: bytes, name: str | None = None) -> _Entry:
    """Decode an entry file; ValueError with the reason if it is not one or not ``name``'s."""
    entry = _entry_decoder.decode(data)
    try:
        check_key(entry.key)
    except ValueError as exc:
        raise ValueError(f"it holds an invalid key ({exc})") from None
    if name is not None and _name_of(entry.key) != name:
        raise ValueError(f"it holds key {entry.key!r}")
    return entry


def parse_lease(data: bytes) -> float:
    """The ttl a lease file declares; ValueError unless it is one with a finite positive ttl."""
    ttl = _lease_decoder.decode(data).ttl
    if not (math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"ttl must be a finite positive number, not {ttl}")
    return ttl


def _write_atomically(path: Path, data: bytes) -> Signature:
    """Write ``path`` through a temporary file (rule 1); return its signature."""
    tmp = path.with_name(f".tmp-{secrets.token_hex(8)}")
    path.parent.mkdir(parents=True, exist_ok=True)  # someone may have removed it
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as f:
            f.write(data)
            f.flush()
            signature = _signature(os.fstat(f.fileno()))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return signature


def _discard_if_unchanged(path: Path, judged: Signature) -> bool:
    """Remove ``path`` if it is still the version judged (rule 3); whether it was."""
    grave = path.with_name(f".gc-{secrets.token_hex(8)}")
    try:
        os.rename(path, grave)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            logger.warning("discovery: cannot collect %s: %s", path, exc)
        return False
    try:
        if _signature(os.lstat(grave)) == judged:
            return True
        # A writer replaced it after it was judged: put it back, unless something newer came.
        with contextlib.suppress(FileExistsError):
            os.link(grave, path)
        return False
    except OSError as exc:
        logger.warning("discovery: while collecting %s: %s", path, exc)
        return False
    finally:
        grave.unlink(missing_ok=True)


@final
class FileLayout:
    """Paths and owner-side operations of one shared directory (``DiscoveryConfig.file_kv``)."""

    def __init__(self, root: Path, max_record_size: int = DEFAULT_MAX_RECORD_SIZE) -> None:
        self.root, self.max_record_size = root, max_record_size
        self.kv_dir, self.lease_dir = root / "kv", root / "leases"

    def ensure(self) -> None:
        self.kv_dir.mkdir(parents=True, exist_ok=True)
        self.lease_dir.mkdir(parents=True, exist_ok=True)

    def lease_path(self, lease_id: int) -> Path:
        return self.lease_dir / f"{lease_id:016x}.lease"

    def entry_path(self, key: str) -> Path:
        return self.kv_dir / _name_of(key)

    def create_lease(self, lease_id: int, ttl: float) -> None:
        self.ensure()
        info = _LeaseInfo(ttl=ttl, pid=os.getpid())
        _write_atomically(self.lease_path(lease_id), _encoder.encode(info))

    def touch_lease(self, lease_id: int) -> bool:
        """Refresh the heartbeat; ``False`` if the lease file is gone (the lease was lost)."""
        path = self.lease_path(lease_id)
        try:  # something else that took its name is no lease: recovery replaces it
            if regular := stat.S_ISREG(os.lstat(path).st_mode):
                os.utime(path)
        except FileNotFoundError:
            return False
        return regular

    def remove_lease(self, lease_id: int) -> None:
        """Delete the heartbeat: every entry of the lease is dead from now on."""
        self.lease_path(lease_id).unlink(missing_ok=True)

    def encode_entry(self, key: str, value: bytes, lease_id: int) -> bytes:
        """The bytes of ``key``'s entry file; ValueError if over ``max_record_size``."""
        data = _encoder.encode(_Entry(key=key, lease=lease_id, value=value))
        if len(data) > self.max_record_size:
            raise ValueError(
                f"the discovery record for {key!r} is {len(data)} bytes stored, more than "
                f"DYN_DISCOVERY_MAX_RECORD_SIZE ({self.max_record_size})"
            )
        return data

    def write_entry(self, key: str, value: bytes, lease_id: int) -> Signature:
        """Store ``key`` atomically, attached to ``lease_id``; return the file's signature."""
        return _write_atomically(self.entry_path(key), self.encode_entry(key, value, lease_id))

    def delete_entry(self, key: str) -> None:
        self.entry_path(key).unlink(missing_ok=True)

    def read_entry(self, key: str) -> tuple[Signature, _Entry] | None:
        """``key``'s entry as stored, or ``None`` if it is absent or unusable."""
        path = self.entry_path(key)
        try:  # parse_entry checks the key: names are unique (rule 6)
            signature, data = read_regular_file(path, self.max_record_size)
            return signature, parse_entry(data, path.name)
        except (OSError, Unreadable, ValueError):
            return None

    def revoke(self, lease_id: int, keys: list[str]) -> None:
        """Delete the heartbeat, then those of ``keys`` still attached to ``lease_id``."""
        self.remove_lease(lease_id)
        for key in keys:
            if (stored := self.read_entry(key)) and stored[1].lease == lease_id:
                _discard_if_unchanged(self.entry_path(key), stored[0])


_Verdict = tuple[Signature, "_Entry | None"]


@final
class Scanner:
    """Reads the live entries, collecting dead ones on the way (one thread at a time; rule 8).

    ``default_ttl`` is assumed for an unparsable lease file; ``full_rescan`` seconds force a
    full pass even if no mtime moved.
    """

    def __init__(
        self, layout: FileLayout, default_ttl: float, *, full_rescan: float | None = None
    ) -> None:
        self._layout = layout
        self._default_ttl = default_ttl
        self._full_rescan = max(1.0, default_ttl / 2) if full_rescan is None else full_rescan
        self._entries: dict[str, _Verdict] = {}
        self._listed_at: tuple[int, int] | None = None  # kv/'s (inode, mtime_ns), if trusted
        self._listed_when = self._lease_swept_when = -math.inf
        self._lease_ttls: dict[str, tuple[int, float]] = {}
        self._wanted: frozenset[int] = frozenset()  # the leases the entries name
        self._alive: frozenset[int] | None = None
        self._state: dict[str, bytes] = {}
        self._reporter = BadRecordReport(logger, f"unusable files under {layout.root}")
        self._lease_reporter = BadRecordReport(logger, f"unusable lease files under {layout.root}")
        self._missing_logged = False

    def scan(self) -> dict[str, bytes]:
        """Every live key: the same (read-only) object until something changes."""
        now = time.monotonic()
        changed = self._list_entries(now)
        alive = self._live_leases(now)
        if changed or alive != self._alive:
            self._alive = alive
            self._state = self._collect(alive)
        self._reporter.end_batch()
        self._lease_reporter.end_batch()
        return self._state

    def _list_entries(self, now: float) -> bool:
        """List ``kv/`` again if it may have changed and refresh the verdicts; whether any did."""
        kv_dir = self._layout.kv_dir
        before_ns = time.time_ns()
        stamp: tuple[int, int] | None = None
        with contextlib.suppress(OSError):
            st = os.lstat(kv_dir)
            stamp = (st.st_ino, st.st_mtime_ns)
        if stamp == self._listed_at is not None and now - self._listed_when < self._full_rescan:
            return False  # unchanged since a trusted listing
        listing = self._scandir(kv_dir)
        trusted = stamp is not None and stamp[1] < before_ns - _MTIME_TRUSTED_AFTER_NS
        self._listed_at, self._listed_when = (stamp if trusted else None), now
        wall = time.time()
        old = self._entries
        new: dict[str, _Verdict] = {}
        for dirent in listing:
            if dirent.name.startswith("."):
                _remove_if_abandoned(dirent, wall)
            elif (verdict := self._judge(dirent, old.get(dirent.name))) is not None:  # not vanished
                new[dirent.name] = verdict
        self._entries = new
        if changed := new != old:
            self._wanted = frozenset(e.lease for _, e in new.values() if e is not None)
        return changed

    def _judge(self, dirent: os.DirEntry[str], cached: _Verdict | None) -> _Verdict | None:
        """The verdict on one file: from the cache if its signature did not move."""
        try:
            st = dirent.stat(follow_symlinks=False)
        except OSError as exc:  # vanished, or the directory is unreadable: listed again later
            logger.debug("discovery: cannot stat %s: %s", dirent.path, exc)
            return None
        signature = _signature(st)
        if cached is not None and cached[0] == signature:
            return cached
        try:
            signature, data = read_regular_file(dirent.path, self._layout.max_record_size, st)
            return (signature, parse_entry(data, dirent.name))
        except FileNotFoundError:
            return None
        except Unreadable as exc:
            reason = str(exc)
        except ValueError as exc:  # from parse_entry
            reason = f"not a discovery entry ({exc})"
        self._reporter.bad(dirent.path, reason)
        return (signature, None)

    def _collect(self, alive: frozenset[int]) -> dict[str, bytes]:
        """The live state, collecting entries of dead leases (rules 3 and 4)."""
        state: dict[str, bytes] = {}
        collected: list[str] = []
        for name, (signature, entry) in list(self._entries.items()):
            if entry is None:
                continue
            if entry.lease in alive:
                state[entry.key] = entry.value
            elif _discard_if_unchanged(self._layout.kv_dir / name, signature):
                collected.append(entry.key)
                del self._entries[name]
        if collected:  # one line however many
            more = f" and {len(collected) - 3} more" if len(collected) > 3 else ""
            names = ", ".join(map(repr, collected[:3])) + more
            logger.info("discovery: collected %d entries of dead leases: %s", len(collected), names)
        return state

    def _live_leases(self, now: float) -> frozenset[int]:
        """Which of the leases the entries name are alive (one ``lstat`` each)."""
        if now - self._lease_swept_when >= self._full_rescan:
            self._lease_swept_when = now
            self._sweep_leases()
        return frozenset(lease_id for lease_id in self._wanted if self.lease_alive(lease_id))

    def lease_alive(self, lease_id: int) -> bool:
        """Whether ``lease_id`` has a lease file fresh for its own ttl (rule 2)."""
        path = self._layout.lease_path(lease_id)
        return 0 < lease_id < 2**64 and self._lease_is_alive(path, time.time())

    def _lease_is_alive(self, path: Path, wall: float) -> bool:
        """Whether the lease file ``path`` is fresh for the ttl it declares (collected if not)."""
        name = path.name
        try:
            st = os.lstat(path)
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError):
                logger.debug("discovery: cannot stat %s: %s", path, exc)
            return False
        known = self._lease_ttls.get(name)  # (inode, ttl); ttl -1 for what is not a lease file
        if not stat.S_ISREG(st.st_mode):
            if known != (st.st_ino, -1.0):
                self._lease_ttls[name] = (st.st_ino, -1.0)
                self._lease_reporter.bad(str(path), f"it is {_kind(st.st_mode)}, not a lease file")
            return False
        if known is None or known[0] != st.st_ino or known[1] <= 0:
            try:
                ttl = parse_lease(read_regular_file(path, _MAX_LEASE_FILE, st)[1])
            except FileNotFoundError:
                return False
            except (Unreadable, ValueError) as exc:  # msgspec.DecodeError is a ValueError
                ttl = self._default_ttl
                logger.warning(
                    "discovery: corrupt lease file %s (%s); assuming ttl=%s", path, exc, ttl
                )
            known = self._lease_ttls[name] = (st.st_ino, ttl)
        if wall - st.st_mtime <= known[1]:
            return True
        if _discard_if_unchanged(path, _signature(st)):
            logger.info("discovery: collected expired lease %s", name)
            self._lease_ttls.pop(name, None)
        return False

    def _sweep_leases(self) -> None:
        """Collect stale lease files nobody's entries name, and abandoned temporaries."""
        wall = time.time()
        seen: set[str] = set()
        for dirent in self._scandir(self._layout.lease_dir):
            if dirent.name.startswith("."):
                _remove_if_abandoned(dirent, wall)
            elif _LEASE_NAME.fullmatch(dirent.name):
                seen.add(dirent.name)
                self._lease_is_alive(self._layout.lease_dir / dirent.name, wall)
        self._lease_ttls = {name: ttl for name, ttl in self._lease_ttls.items() if name in seen}

    def audit(
        self, owned: Mapping[str, bytes], written: Mapping[str, Signature], lease_id: int
    ) -> tuple[dict[str, tuple[bytes, int]], dict[str, Signature], set[int]]:
        """What the store holds for each owned key (rule 5): ``{key: (value, lease)}``, the
        signatures to remember, and which other leases named are alive.  A file still at its
        ``written`` signature is not read."""
        found: dict[str, tuple[bytes, int]] = {}
        signatures: dict[str, Signature] = {}
        for key in owned:
            try:
                st = os.lstat(self._layout.entry_path(key))
            except OSError as exc:
                if not isinstance(exc, FileNotFoundError):
                    logger.debug("discovery: cannot check %r: %s", key, exc)
                continue
            if written.get(key) == (signature := _signature(st)) and stat.S_ISREG(st.st_mode):
                found[key], signatures[key] = (owned[key], lease_id), signature
            elif (stored := self._layout.read_entry(key)) is not None:
                found[key], signatures[key] = (stored[1].value, stored[1].lease), stored[0]
        others = {lease for _, lease in found.values() if lease != lease_id}
        return found, signatures, {lease for lease in others if self.lease_alive(lease)}

    def _scandir(self, directory: Path) -> list[os.DirEntry[str]]:
        """The directory's entries; a missing one is empty (said once), other OSErrors raise."""
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except FileNotFoundError:
            if not self._missing_logged:
                logger.warning("discovery: %s is missing; treating it as empty", directory)
                self._missing_logged = True
            return []
        self._missing_logged = False
        return entries


def _remove_if_abandoned(dirent: os.DirEntry[str], now: float) -> None:
    try:
        if now - dirent.stat(follow_symlinks=False).st_mtime > _ABANDONED_AFTER:
            os.unlink(dirent.path)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            logger.debug("discovery: cannot remove %s: %s", dirent.path, exc)
