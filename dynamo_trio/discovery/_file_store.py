"""The on-disk format of the ``file`` backend (blocking code: run it in a worker thread).

Theory of operation
===================

Several processes on one machine share a directory and no server, so every
rule below is about what a reader can conclude from the files alone, while
writers come and go and may be SIGKILLed at any instruction::

    {root}/leases/{lease_id:016x}.lease   {"ttl": 10.0, "pid": 1234}; its mtime is the heartbeat
    {root}/kv/{escaped key}               {"key": ..., "lease": ..., "value": <base64>}
    {root}/kv/.tmp-*  {root}/leases/.tmp-*  writes in flight (or left by a crash)
    {root}/kv/.gc-*                         entries being garbage-collected

1. **Atomic files.**  Every file is written to a ``.tmp-*`` name in the same
   directory and renamed over its final name (``os.replace``), so a reader
   sees the old content or the new one, never half of one.  A reader that
   still finds something unparsable skips it and logs once per file version.
2. **Liveness.**  An owner touches its lease file every ``ttl/3`` seconds.  An
   entry is live only if the lease it names has a file whose mtime is at most
   that lease's own ``ttl`` old (the ttl is read from the lease file, so
   processes with different settings agree).  A SIGKILLed owner's entries
   therefore disappear for every reader within about ``ttl``; closing an owner
   deletes its lease file first, so all its entries vanish at once.
3. **Garbage collection by whoever notices.**  A reader that finds a stale
   lease file, or an entry naming a dead lease, removes it.  It never deletes
   a file it has not judged: it renames the file aside, checks that the file
   it moved is the version it judged (same inode, mtime and size), and puts it
   back (without overwriting anything newer) if a writer replaced it in the
   meantime.
4. **Order of reading.**  A scan reads the entries *before* it lists the
   leases.  An owner creates its lease file before writing entries for it, so
   every entry a scan read has its lease visible to the listing that follows,
   and a recovering owner's fresh entries are never collected by mistake.
5. **Recovery.**  An owner whose lease file vanished (collected while the
   owner was paused longer than ttl) recreates it and rewrites its entries,
   as the etcd backend re-grants a lost lease.
6. **Names.**  Keys are mapped to one flat directory by percent-encoding every
   UTF-8 byte outside ``[A-Za-z0-9._-]`` (``/`` becomes ``%2F``, ``~`` becomes
   ``%7E``, a leading ``.`` becomes ``%2E``), so no key can name a path
   outside ``kv/`` or collide with the dot-files above or the hashed names
   below.  The encoding preserves prefixes, so a prefix scan
   filters on file names.  A key whose name would be too long for the file
   system is stored under ``~`` plus its SHA-256; such files are always read
   and matched on the key stored inside.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final
from urllib.parse import quote

import msgspec

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["FileLayout", "Scanner", "key_to_name"]

logger = logging.getLogger(__name__)

_MAX_NAME: Final = 200
"""Longest escaped key kept readable; longer ones are hashed (file names stop at 255 bytes)."""

_ABANDONED_AFTER: Final = 60.0
"""Seconds after which a leftover ``.tmp-*``/``.gc-*`` file is assumed abandoned by a crash."""

_LEASE_SUFFIX: Final = ".lease"

Signature = tuple[int, int, int]
"""``(inode, mtime_ns, size)``: identifies one version of a file."""


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
    """The file name (inside ``kv/``) of ``key``; also valid for prefixes (see rule 6)."""
    name = quote(key, safe="-_.").replace("~", "%7E")  # quote() never escapes "~"
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name


def _name_of(key: str) -> str:
    name = key_to_name(key)
    if len(name) > _MAX_NAME:
        return "~" + hashlib.sha256(key.encode()).hexdigest()
    return name


def _signature(st: os.stat_result) -> Signature:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _write_atomically(directory: Path, name: str, data: bytes) -> None:
    """Write ``directory/name`` through a temporary file (rule 1); recreate a removed directory."""
    tmp = directory / f".tmp-{secrets.token_hex(8)}"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileNotFoundError:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, flags, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, directory / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _discard_if_unchanged(path: Path, judged: Signature) -> bool:
    """Remove ``path`` only if it is still the version that was judged (rule 3).

    Returns:
        Whether the judged version was removed.
    """
    grave = path.with_name(f".gc-{secrets.token_hex(8)}")
    try:
        os.rename(path, grave)
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("discovery: cannot collect %s: %s", path, exc)
        return False
    try:
        if _signature(os.stat(grave)) == judged:
            return True
        # A writer replaced the file after it was judged: restore it, unless
        # something even newer has been written since.
        with contextlib.suppress(FileExistsError):
            os.link(grave, path)
        return False
    except OSError as exc:
        logger.warning("discovery: while collecting %s: %s", path, exc)
        return False
    finally:
        grave.unlink(missing_ok=True)


@dataclass(frozen=True)
class FileLayout:
    """Paths and owner-side operations of one shared directory.

    Args:
        root: The shared directory (``DiscoveryConfig.file_kv``).
    """

    root: Path

    @property
    def kv_dir(self) -> Path:
        """Where the entries live."""
        return self.root / "kv"

    @property
    def lease_dir(self) -> Path:
        """Where the lease heartbeat files live."""
        return self.root / "leases"

    def ensure(self) -> None:
        """Create the directories if missing."""
        self.kv_dir.mkdir(parents=True, exist_ok=True)
        self.lease_dir.mkdir(parents=True, exist_ok=True)

    def lease_path(self, lease_id: int) -> Path:
        """The heartbeat file of ``lease_id``."""
        return self.lease_dir / f"{lease_id:016x}{_LEASE_SUFFIX}"

    def create_lease(self, lease_id: int, ttl: float) -> None:
        """Write (or rewrite) the heartbeat file of ``lease_id``."""
        self.ensure()
        info = _LeaseInfo(ttl=ttl, pid=os.getpid())
        _write_atomically(self.lease_dir, self.lease_path(lease_id).name, _encoder.encode(info))

    def touch_lease(self, lease_id: int) -> bool:
        """Refresh the heartbeat; ``False`` if the lease file is gone (the lease was lost)."""
        try:
            os.utime(self.lease_path(lease_id))
        except FileNotFoundError:
            return False
        return True

    def remove_lease(self, lease_id: int) -> None:
        """Delete the heartbeat: every entry of the lease is dead from now on."""
        self.lease_path(lease_id).unlink(missing_ok=True)

    def write_entry(self, key: str, value: bytes, lease_id: int) -> None:
        """Store ``key`` atomically, attached to ``lease_id``."""
        data = _encoder.encode(_Entry(key=key, lease=lease_id, value=value))
        _write_atomically(self.kv_dir, _name_of(key), data)

    def delete_entry(self, key: str) -> None:
        """Delete ``key`` whoever owns it (absent is fine)."""
        (self.kv_dir / _name_of(key)).unlink(missing_ok=True)

    def remove_entries_of(self, keys: list[str], lease_id: int) -> None:
        """Delete those of ``keys`` still attached to ``lease_id`` (after the lease is gone)."""
        for key in keys:
            path = self.kv_dir / _name_of(key)
            try:
                with open(path, "rb") as f:
                    judged = _signature(os.fstat(f.fileno()))
                    entry = _entry_decoder.decode(f.read())
            except (OSError, msgspec.DecodeError):
                continue
            if entry.lease == lease_id:
                _discard_if_unchanged(path, judged)


@final
class Scanner:
    """Reads the live entries under a prefix, collecting dead ones on the way.

    Keeps a cache of parsed files keyed by their :data:`Signature`, so a
    watcher polling many times a second re-reads only files that changed, and
    logs a corrupt file once per version rather than once per poll.  One
    scanner must not scan from two threads at once (each watch owns one).

    Args:
        layout: The shared directory.
        default_ttl: The ttl assumed for a lease file that cannot be parsed.
    """

    def __init__(self, layout: FileLayout, default_ttl: float) -> None:
        self._layout = layout
        self._default_ttl = default_ttl
        self._entries: dict[str, tuple[Signature, _Entry | None]] = {}
        self._leases: dict[str, tuple[int, float]] = {}
        self._missing_logged = False

    def scan(self, prefix: str) -> dict[str, bytes]:
        """Every live key starting with ``prefix`` (one blocking pass over the directory)."""
        name_prefix = key_to_name(prefix)
        found = self._read_entries(prefix, name_prefix)
        alive = self._live_leases()
        state: dict[str, bytes] = {}
        for name, (sig, entry) in found.items():
            if entry.lease in alive:
                state[entry.key] = entry.value
            elif _discard_if_unchanged(self._layout.kv_dir / name, sig):
                logger.info("discovery: collected %r of dead lease %016x", entry.key, entry.lease)
        return state

    def _read_entries(self, prefix: str, name_prefix: str) -> dict[str, tuple[Signature, _Entry]]:
        found: dict[str, tuple[Signature, _Entry]] = {}
        seen: set[str] = set()
        now = time.time()
        for dirent in self._scandir(self._layout.kv_dir):
            name = dirent.name
            if name.startswith("."):
                _remove_if_abandoned(dirent, now)
                continue
            if not name.startswith((name_prefix, "~")):
                continue
            seen.add(name)
            parsed = self._read_entry(dirent)
            if parsed is not None and parsed[1].key.startswith(prefix):
                found[name] = parsed
        for name in self._entries.keys() - seen:
            del self._entries[name]
        return found

    def _read_entry(self, dirent: os.DirEntry[str]) -> tuple[Signature, _Entry] | None:
        name = dirent.name
        try:
            sig = _signature(dirent.stat())
            cached = self._entries.get(name)
            if cached is not None and cached[0] == sig:
                entry = cached[1]
                return None if entry is None else (sig, entry)
            with open(dirent.path, "rb") as f:
                sig = _signature(os.fstat(f.fileno()))
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("discovery: cannot read %s: %s", dirent.path, exc)
            return None
        entry = _parse_entry(name, data, dirent.path)
        self._entries[name] = (sig, entry)
        return None if entry is None else (sig, entry)

    def _live_leases(self) -> set[int]:
        alive: set[int] = set()
        seen: set[str] = set()
        now = time.time()
        for dirent in self._scandir(self._layout.lease_dir):
            name = dirent.name
            if name.startswith("."):
                _remove_if_abandoned(dirent, now)
                continue
            if not name.endswith(_LEASE_SUFFIX):
                continue
            try:
                lease_id = int(name.removesuffix(_LEASE_SUFFIX), 16)
                st = dirent.stat()
                ttl = self._lease_ttl(dirent, st.st_ino)
            except (ValueError, FileNotFoundError):
                continue
            except OSError as exc:
                logger.warning("discovery: cannot read %s: %s", dirent.path, exc)
                continue
            seen.add(name)
            if now - st.st_mtime <= ttl:
                alive.add(lease_id)
            elif _discard_if_unchanged(self._layout.lease_dir / name, _signature(st)):
                logger.info("discovery: collected expired lease %s", name)
        for name in self._leases.keys() - seen:
            del self._leases[name]
        return alive

    def _lease_ttl(self, dirent: os.DirEntry[str], inode: int) -> float:
        cached = self._leases.get(dirent.name)
        if cached is not None and cached[0] == inode:
            return cached[1]
        with open(dirent.path, "rb") as f:
            data = f.read()
        try:
            ttl = _lease_decoder.decode(data).ttl
            if not ttl > 0:
                raise ValueError(f"ttl must be positive, not {ttl}")
        except (msgspec.DecodeError, ValueError) as exc:
            logger.warning(
                "discovery: corrupt lease file %s (%s); assuming ttl=%s",
                dirent.path,
                exc,
                self._default_ttl,
            )
            ttl = self._default_ttl
        self._leases[dirent.name] = (inode, ttl)
        return ttl

    def _scandir(self, directory: Path) -> list[os.DirEntry[str]]:
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


def _parse_entry(name: str, data: bytes, path: str) -> _Entry | None:
    try:
        entry = _entry_decoder.decode(data)
    except msgspec.DecodeError as exc:
        logger.warning("discovery: skipping corrupt entry %s: %s", path, exc)
        return None
    if _name_of(entry.key) != name:
        logger.warning("discovery: skipping %s: it holds key %r", path, entry.key)
        return None
    return entry


def _remove_if_abandoned(dirent: os.DirEntry[str], now: float) -> None:
    try:
        if now - dirent.stat().st_mtime > _ABANDONED_AFTER:
            os.unlink(dirent.path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.debug("discovery: cannot remove %s: %s", dirent.path, exc)
