"""``file://DIR`` — the embedded default store.

Each object is a file under DIR. Durability: a write goes to a temporary file
in the same directory, is fsynced, renamed over the target and the directory is
fsynced, so a crash leaves the old or the new version, never a torn one.
Conditional writes are atomic across processes on one machine: the check and
the rename happen under an exclusive ``flock`` on a per-key lock file kept in
``DIR/.locks``. ETags are the MD5 of the content, as on S3.

A conditional write compares the ETag of the bytes on disk, read and hashed
under the lock, never a cached one: a file's (inode, mtime, size) does not name
its version, since inode numbers are reused (two writes of one key alternate
between two inodes on ext4) and two writes within one timestamp tick share an
mtime, so A -> B -> C by another process can give C the triple of A. (Bytes on
disk equal to those this store last wrote there are not hashed again: the same
bytes have the same ETag.)

What runs where: on this VM class a hand-off to a thread and back costs about
200 us of CPU, and every system call a thread makes while the event loop runs
is a fight for the GIL, so the work that only touches the page cache runs on
the event loop (the lock, the CAS check, writing the temporary file, reading
and hashing an object up to ``INLINE_BYTES``), and what waits for the disk (the
fsyncs and the rename between them) goes to one commit thread, which commits in
groups: it takes every write and delete waiting, fsyncs each temporary file and
renames it, fsyncs each folder once for all the group's changes in it, releases
their locks, and wakes each event loop once for the group. A write is
acknowledged only after its group's folder fsync, as before: a group shares
fsyncs and wake-ups, never durability. The lock is taken without blocking; when
another process or write holds it, the wait moves to a thread. The commit thread
also releases each write's lock, so a cancelled caller can never let another
writer in before its rename. Listing, and reading larger objects, run in the
default thread pool.

Recycled files. Each write makes a new file and each overwrite frees the old
one; on ext4 without a journal (the disks here) making a file scans every inode
freed in the last 30 s, which cost a fifth to a third of a busy node's CPU. So
an overwrite keeps the old version's file under a spare name (a hard link made,
under the key's lock, just before the rename), and a later write of any key
writes its bytes into that file (renamed into the key's folder first) instead
of a new one, once the version has been gone ``SPARE_AGE`` (a monotonic clock:
the machine's, shared by every process). A spare moved from another folder keeps
its old name there until that folder is fsynced: the commit fsyncs it before the
rename that makes the spare an object. A reader may hold the old version open
when it is retired, so every read here checks that it read one version: it
starts its clock before it opens the file and gives up (and opens it again) if
its first ``fstat`` comes ``SPARE_AGE`` or more after that (a reuse could have
come between), and again if the file's ctime or size differ between that
``fstat`` and one after the read (the retirement and the reuse each set the
ctime, the reuse at least ``SPARE_AGE`` after the retirement: more than the
clock's tick). A spare is reused only by the process that retired it (its pool
is in memory), after its folder's fsync made the retirement durable; the spares
of a process that stops are removed by ``close``, those of one that crashed stay
behind as ``.tmp-`` files, which listing skips.

Files made ahead. Spares come only from whole-file overwrites, and a slotted
object is overwritten in place, so most new files (a segment, a segment's first
lease object, a lock stripe's first use) would still be made by the write that
needs them, on the event loop, at a few hundred microseconds of kernel work each
here. So a write that finds no spare takes an empty file made ahead in its
folder (``AHEAD_PER_FOLDER``, at most ``AHEAD_MAX`` in all), and a stripe used
for the first time is one of ``.locks``' made-ahead files, hard-linked under the
stripe's name (a stripe another process made meanwhile is kept). A folder left
short is topped up by the event loop once the store has had no write for
``AHEAD_QUIET``: the kernel's work moves out of the writes' way, not off the
loop, and a store that is never quiet makes its files as before. Files made
ahead are ``.tmp-`` files like spares: never objects until renamed, removed by
``close``, left behind by a crash. A node starting on a store makes every
stripe it lacks first (:meth:`FileStore.make_lock_stripes`), so that its writes
make none.

Overwrites in place. Replacing a file whole costs two fsyncs and a rename
(about 200 us of CPU here, and 0.4 ms); writing into a file's existing blocks
and syncing its data costs a quarter of that. So an object up to ``SLOT_MAX``
that is overwritten (a manifest, a lease object), or created up to
``SLOT_NEW_MAX`` by a writer that wants its ETag (not a segment's), is kept in
a slotted file: ``SLOTS_MAGIC`` and the capacity of each of two slots, then the
two slots, each a header (version number, length, MD5, and a CRC-32 of those
and the slot's index) followed by room for the bytes; the whole file, both
slots' room included, is written when the file is made (by a temporary file and
rename, as above). An overwrite under the key's lock writes the next version's
header and bytes into the slot that does not hold the current version, then
only syncs the file's data (``fdatasync``: its size and blocks are unchanged,
so no metadata is needed to read the data back), and no folder changes. A
version is the newest slot whose header's CRC holds and whose bytes have the
header's MD5: a crash during an overwrite spoils at most the slot being
written, and readers find the version before; a reader that raced two
overwrites and found neither slot whole reads again; a failed sync zeroes the
slot's header before the write fails. A new slotted object's slots have room
for ``SLOT_ROOM_NEW`` times its size, and an object that outgrows its slots
gets a new slotted file with room for twice its size; larger objects, and new
ones larger or written without wanting their ETag (segments), are whole files.
No whole file begins with ``SLOTS_MAGIC``: bytes that do are always slotted. A
store made before slotted files holds whole files only, read as they are; each
is slotted by its first overwrite (okq before this one cannot read a slotted
file).

Syncs without a thread. An overwrite in place needs one ``fdatasync`` and no
rename, so where io_uring works (Linux; okq/_native/uring.c, built with the
compiled hot path) its sync goes to the kernel from the event loop instead of to
the commit thread: the loop submits it (``IORING_OP_FSYNC`` with
``IORING_FSYNC_DATASYNC``), the kernel's own worker waits for the disk, and the
ring's eventfd wakes the loop, which finishes the write as the commit thread
would (the slot's header zeroed if the sync failed, the file closed, the flock
released, the caller answered). Nothing is acknowledged before its sync, and the
key stays locked until then whatever happens to the caller. No hand-off to a
thread, and no fight for the GIL on the way back: a third fewer context switches
and a sync answered in half the time here. One ring per store, event loop and
process, holding at most ``RING_ENTRIES`` syncs (more go to the commit thread);
``OKQ_FILE_URING=0``, ``OKQ_PURE``, a kernel or sandbox that refuses io_uring,
or a loop that cannot watch a descriptor leave every sync to the commit thread.
Writes that make or replace a file (a rename and folder fsyncs in order) always
go to the commit thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import importlib
import os
import queue
import stat
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from okq.errors import CASConflict, ObjectNotFound, StorageError
from okq.store.base import Blob, ListPage, ObjectInfo, etag_of, validate_key

LOCK_DIR = ".locks"
LOCK_STRIPES = 1024
#: A file modified less than this long ago may still share its mtime with a later
#: write (2 s: FAT's timestamp granularity, the coarsest in use).
RACY_NS = 2_000_000_000
#: Objects up to this size are read and hashed on the event loop (page-cache
#: work of a few tens of microseconds); larger ones in a thread.
INLINE_BYTES = 256 * 1024
#: The last bytes this store wrote at a path, with their ETag, kept for objects up
#: to WRITTEN_BYTES and for up to WRITTEN_KEEP paths (at most 32 MiB): a
#: conditional write that finds the same bytes on disk knows their ETag without
#: hashing them (equal bytes, equal MD5), and hashes only bytes it has not seen.
WRITTEN_BYTES = 16 * 1024
WRITTEN_KEEP = 2048
#: What reading a key's path raises when no object has that key: nothing there,
#: a parent that is an object ("a" when reading "a/b"), or a directory that only
#: holds deeper keys ("a" when "a/b" exists).
_ABSENT = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
#: The most writes and deletes one commit group takes.
GROUP_MAX = 64
#: Overwrites in place a store's io_uring holds in flight at most (more go to the
#: commit thread).
RING_ENTRIES = 64
#: Seconds a retired version's file waits before a write reuses it, and the
#: longest a read may take from its open to its first fstat (module docstring).
SPARE_AGE = 0.2
#: The most spare files a store keeps; an overwrite beyond them frees its old file.
#: Every write takes one that is old enough, so a store holds about as many as it
#: makes writes in SPARE_AGE; this bounds what a burst leaves behind until ``close``.
SPARES_MAX = 256
#: Empty files made ahead in each folder a write made a new file in, and in all
#: (module docstring, "Files made ahead"); and how long the store must have had
#: no write before the event loop makes one.
AHEAD_PER_FOLDER = 2
AHEAD_MAX = 64
AHEAD_QUIET = 0.01
#: The first bytes of a slotted file (module docstring, "Overwrites in place"), then
#: the capacity of each of its two slots. No other file of the store begins with
#: them: an object whose bytes do is written slotted, whatever the write.
SLOTS_MAGIC = b"\x00okq-slots-v1\x00\r\n"
_FILE_HEAD = struct.Struct("<16sQ")
#: A slot's header: its version's sequence number (0: empty), length and MD5, and a
#: CRC-32 of those and the slot's index; the version's bytes follow it.
_SLOT_HEAD = struct.Struct("<QQ16sI")
#: An overwrite of an object up to this size makes it slotted; larger objects are
#: replaced whole (temporary file and rename).
SLOT_MAX = 64 * 1024
#: A new object up to this size is written slotted too (a lease object is created by
#: the first lease of its segment and overwritten by every later lease and
#: completion), when its writer wants its ETag; a larger new object, and one whose
#: ETag nobody wants (a segment, never overwritten: ``want_etag=False`` spares it an
#: MD5 of every produced byte), is written whole.
SLOT_NEW_MAX = 16 * 1024
#: A new slotted object's slots have room for this many times its size (a grown
#: one's for twice its size): the lease object a segment's first lease of 100
#: makes grows to four times that once 400 are leased, and each time an object
#: outgrows its slots costs a new file (about 200 us of CPU on ext4 without a journal).
SLOT_ROOM_NEW = 4
#: A slotted file's slots hold at least this, and are a multiple of it.
SLOT_UNIT = 4096


class _Spares:
    """A store's spare files, oldest first (module docstring, "Recycled files").
    Given by the commit thread, taken on the event loop: a deque's append and
    popleft are atomic."""

    def __init__(self) -> None:
        self._spares: deque[tuple[float, str]] = deque()

    def take(self, folder: str) -> tuple[str, str | None] | None:
        """A spare retired at least SPARE_AGE ago, in ``folder``, or None; and the
        folder it was moved from, if another (a segment's folder gets the files of
        overwritten manifests and lease objects). That folder must be fsynced before
        the spare is renamed over a key (see ``_commit_group``)."""
        spares = self._spares
        if not spares or spares[0][0] > time.monotonic() - SPARE_AGE:
            return None
        spare = spares.popleft()[1]
        source = _parent(spare)
        if source == folder:
            return spare, None
        moved = _temporary_name(folder)
        try:
            try:
                os.rename(spare, moved)
            except FileNotFoundError:  # the key's folder is new
                os.makedirs(folder, exist_ok=True)
                os.rename(spare, moved)
        except OSError:  # another file system below the root
            _unlink_quietly(spare)
            return None
        return moved, source

    def give(self, spare: str) -> None:
        if len(self._spares) < SPARES_MAX:
            self._spares.append((time.monotonic(), spare))
        else:
            _unlink_quietly(spare)

    def remove_all(self) -> None:
        while self._spares:
            _unlink_quietly(self._spares.popleft()[1])


class _MadeAhead:
    """A store's empty files made ahead (module docstring, "Files made ahead"),
    by folder. Used on the event loop only."""

    def __init__(self) -> None:
        self._made: dict[str, list[str]] = {}
        self._wanted: dict[str, None] = {}  # folders short of files, in the order found short
        self._last_write = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def touch(self) -> None:
        """A write or a delete begins: the store is not quiet."""
        self._last_write = time.monotonic()

    def take(self, folder: str, loop: asyncio.AbstractEventLoop) -> str | None:
        """An empty file made ahead in ``folder``, or None; the folder is topped up
        later, once the store is quiet."""
        made = self._made.get(folder)
        path = made.pop() if made else None
        if not self._closed and len(made or ()) < AHEAD_PER_FOLDER:
            self._wanted[folder] = None
            if self._timer is None or self._timer_loop is not loop:  # (a closed loop's is lost)
                self._timer_loop = loop
                self._timer = loop.call_later(AHEAD_QUIET, self._make, loop)
        return path

    def give_back(self, folder: str, path: str) -> None:
        """A file taken and not used after all."""
        self._made.setdefault(folder, []).append(path)

    def _make(self, loop: asyncio.AbstractEventLoop) -> None:
        """One file for the first folder short of them, if the store has been quiet
        for AHEAD_QUIET; then again (at once, or once it has been)."""
        self._timer = None
        if self._closed or not self._wanted:
            return
        quiet = time.monotonic() - self._last_write
        if quiet < AHEAD_QUIET:
            self._timer = loop.call_later(AHEAD_QUIET - quiet, self._make, loop)
            return
        folder = next(iter(self._wanted))
        made = self._made.setdefault(folder, [])
        done = len(made) >= AHEAD_PER_FOLDER or sum(map(len, self._made.values())) >= AHEAD_MAX
        if not done:
            path = _temporary_name(folder)
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except OSError:  # the folder is gone: a write there makes its own
                done = True
            else:
                made.append(path)
                done = len(made) >= AHEAD_PER_FOLDER
        if done:
            del self._wanted[folder]
        if self._wanted:
            self._timer = loop.call_later(0, self._make, loop)

    def remove_all(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for made in self._made.values():
            while made:
                _unlink_quietly(made.pop())


@dataclass
class _Held:
    """A key's stripe, locked: the flock's fd and this store's asyncio lock."""

    fd: int
    mine: asyncio.Lock

    def release(self) -> None:
        os.close(self.fd)
        self.mine.release()


class FileStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.url = f"file://{self.root}"
        (self.root / LOCK_DIR).mkdir(parents=True, exist_ok=True)
        # Paths are strings from here on: a pathlib join costs more than the
        # system call it names (``Path / str`` parses its argument).
        self._root = str(self.root)
        self._etags: dict[str, tuple[tuple[int, int, int], str, int]] = {}
        self._written: dict[str, tuple[bytes, str]] = {}  # path: last bytes written, ETag
        self._stripes: dict[str, asyncio.Lock] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spares = _Spares()
        self._ahead = _MadeAhead()
        self._ring: _Ring | None = None
        self._ring_failed = False  # io_uring unavailable here: the commit thread syncs

    # -- paths and locks -------------------------------------------------
    def _path(self, key: str) -> str:
        return f"{self._root}/{validate_key(key)}"

    def _lock_path(self, key: str) -> str:
        # A fixed set of lock stripes: the folder stays small whatever the number of
        # keys, and keys that share a stripe merely take turns.
        digest = hashlib.sha1(key.encode(), usedforsecurity=False).digest()
        stripe = _stripe_name(int.from_bytes(digest[:2], 'big') % LOCK_STRIPES)
        return f"{self._root}/{LOCK_DIR}/{stripe}"

    async def _lock(self, key: str) -> _Held:
        """The key's stripe locked, without blocking the event loop: first among this
        store's own writes (an asyncio lock), then against other processes (flock on
        a newly opened fd; a lock another process holds is waited for in a thread)."""
        path = self._lock_path(key)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # asyncio locks belong to one loop
            self._loop, self._stripes = loop, {}
        mine = self._stripes.get(path)
        if mine is None:
            mine = self._stripes[path] = asyncio.Lock()
        await mine.acquire()
        try:
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                fd = self._new_stripe(path, loop)
        except BaseException:
            mine.release()
            raise
        held = _Held(fd, mine)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return held
        except BlockingIOError:
            pass
        except BaseException:
            held.release()
            raise
        waiting = loop.run_in_executor(None, fcntl.flock, fd, fcntl.LOCK_EX)
        try:
            await asyncio.shield(waiting)
        except BaseException:
            # Cancelled (or failed): release the lock whenever the thread gets it.
            waiting.add_done_callback(lambda _: held.release())
            raise
        return held

    def make_lock_stripes(self) -> int:
        """Every lock stripe's file that is missing, made now; how many were. A node
        calls it as it starts (``okq serve``): on a new store nearly every key's
        first write would otherwise make its stripe, on the event loop, in the
        write's path (making a file costs from 40 to several hundred microseconds
        of kernel work on the disks here), until all 1,024 exist. Never replaces a
        stripe another process made meanwhile; a stripe needs no fsync (one lost in
        a crash is made again by the write that next needs it)."""
        folder = f"{self._root}/{LOCK_DIR}"
        have = set(os.listdir(folder))
        made = 0
        for n in range(LOCK_STRIPES):
            name = _stripe_name(n)
            if name not in have:
                os.close(os.open(f"{folder}/{name}", os.O_RDWR | os.O_CREAT, 0o644))
                made += 1
        return made

    def _new_stripe(self, path: str, loop: asyncio.AbstractEventLoop) -> int:
        """A lock stripe's file, used for the first time: a file made ahead, linked
        under its name (never over one another process made meanwhile), else a new
        file."""
        folder = _parent(path)
        made = self._ahead.take(folder, loop)
        if made is not None:
            try:
                os.link(made, path)
            except FileExistsError:
                self._ahead.give_back(folder, made)
            except OSError:
                _unlink_quietly(made)
            else:
                _unlink_quietly(made)  # its second name: no inode is freed
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    # -- blocking implementations ---------------------------------------
    def _read(self, key: str) -> Blob:
        try:
            data, etag = _read_object(self._path(key))
        except _ABSENT:
            raise ObjectNotFound(f"no object {key!r}", key=key) from None
        except OSError as exc:
            raise StorageError(f"reading {key!r}: {exc}", key=key) from exc
        return Blob(data, etag)  # a whole file's ETag hashed when asked for

    def _etag(self, path: str) -> tuple[str, int, os.stat_result]:
        """The file's ETag for ``head`` and ``list``, hashed once per version.

        The cache may answer stale (see the module docstring) and is used only where
        that cannot cause a wrong CAS: ``head`` and ``list`` report, ``_put`` and
        ``_delete`` re-hash under the lock, and okq makes no decision from a listed
        or headed ETag. A version is cached only once its mtime is ``RACY_NS``
        older than the clock, so no later write can land in its tick without a
        clock step or ``utime`` (the "racily clean" rule of git's index).
        """
        st = os.stat(path)
        version = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._etags.get(path)
        if cached is not None and cached[0] == version:
            return cached[1], cached[2], st
        data, etag = _read_object(path)
        if etag is None:
            etag = etag_of(data)
        if time.time_ns() - st.st_mtime_ns > RACY_NS:
            if len(self._etags) > 100_000:
                self._etags.clear()
            self._etags[path] = (version, etag, len(data))
        return etag, len(data), st

    def _head(self, key: str) -> ObjectInfo:
        try:
            etag, size, st = self._etag(self._path(key))
        except _ABSENT:
            raise ObjectNotFound(f"no object {key!r}", key=key) from None
        except OSError as exc:
            raise StorageError(f"reading {key!r}: {exc}", key=key) from exc
        return ObjectInfo(key, etag, size, st.st_mtime)

    def _current(self, key: str, path: str) -> tuple[str | None, _Slotted | None]:
        """The ETag of the object on disk now (None: no object), for a CAS check made
        under the key's lock: from the content read now, never from a cached ETag
        (bytes equal to those this store last wrote there have that write's ETag,
        unhashed); and, for a slotted file, what its slots hold. Under the lock no
        overwrite is under way, so a slotted file without a whole version is damaged."""
        try:
            raw = _read_path(path)
        except _ABSENT:
            return None, None
        except OSError as exc:
            raise StorageError(f"reading {key!r}: {exc}", key=key) from exc
        written = self._written.get(path)
        slotted = _read_slotted(raw, written)
        if slotted is None:
            if written is not None and written[0] == raw:
                return written[1], None
            return etag_of(raw), None
        if slotted.current < 0:
            raise StorageError(f"reading {key!r}: neither slot of its file holds a whole "
                               "version", key=key)
        return slotted.etag, slotted

    def _remember(self, path: str, data: bytes, etag: str | None = None) -> str:
        """``data``'s ETag, kept with it for the next conditional write of ``path``."""
        if etag is None:
            etag = etag_of(data)
        if len(data) <= WRITTEN_BYTES:
            if len(self._written) >= WRITTEN_KEEP and path not in self._written:
                self._written.clear()
            self._written[path] = (data, etag)
        return etag

    def _exists(self, key: str, path: str) -> bool:
        """Whether an object has this key: a regular file (a directory only holds
        deeper keys)."""
        try:
            return stat.S_ISREG(os.stat(path).st_mode)
        except _ABSENT:
            return False
        except OSError as exc:
            raise StorageError(f"reading {key!r}: {exc}", key=key) from exc

    def _list(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        keys = sorted(k for k in self._walk(prefix) if k.startswith(prefix))
        if start_after is not None:
            keys = [k for k in keys if k > start_after]
        items: list[ObjectInfo] = []
        for key in keys:
            if len(items) == limit:
                return ListPage(items, items[-1].key)
            try:
                items.append(self._head(key))
            except ObjectNotFound:
                continue  # deleted while listing
        return ListPage(items, None)

    def _walk(self, prefix: str) -> Iterator[str]:
        # Start at the deepest directory the prefix names, to keep listings cheap.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / base if base else self.root
        for dirpath, dirnames, filenames in os.walk(top):
            rel = os.path.relpath(dirpath, self.root)
            if rel == ".":
                dirnames[:] = [d for d in dirnames if d != LOCK_DIR]
                rel = ""
            for name in filenames:
                if not name.startswith(".tmp-"):
                    yield f"{rel}/{name}" if rel else name

    # -- the protocol ----------------------------------------------------
    async def get(self, key: str) -> Blob:
        path = self._path(key)
        for _ in range(_WHOLE_TRIES):
            began = time.monotonic()  # before the open: see "Recycled files"
            try:
                fd = os.open(path, os.O_RDONLY)
            except _ABSENT:
                raise ObjectNotFound(f"no object {key!r}", key=key) from None
            except OSError as exc:
                raise StorageError(f"reading {key!r}: {exc}", key=key) from exc
            try:
                before = os.fstat(fd)
                if before.st_size > INLINE_BYTES:
                    return await asyncio.to_thread(self._read, key)
                raw = _read_version(fd, began, before)
            except IsADirectoryError:
                raise ObjectNotFound(f"no object {key!r}", key=key) from None
            except OSError as exc:
                raise StorageError(f"reading {key!r}: {exc}", key=key) from exc
            finally:
                os.close(fd)
            found = None if raw is None else _object(raw)
            if found is not None:
                return Blob(*found)  # a whole file's ETag hashed when asked for
        raise StorageError(f"reading {key!r}: neither slot of its file held a whole version "
                           f"in {_WHOLE_TRIES} reads", key=key)

    async def head(self, key: str) -> ObjectInfo:
        return self._head(key)

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        path = self._path(key)
        folder = _parent(path)
        data = bytes(data)
        self._ahead.touch()
        held = await self._lock(key)
        try:
            if if_none_match and self._exists(key, path):
                raise CASConflict(f"{key!r} already exists", key=key)
            slotted = None
            if if_match is not None or (not if_none_match and len(data) <= SLOT_MAX):
                etag_now, slotted = self._current(key, path)
                if if_match is not None and etag_now != if_match:
                    raise CASConflict(f"{key!r} changed", key=key)
            if slotted is not None and len(data) <= slotted.capacity:
                try:
                    place, etag = _write_slot(path, slotted, data)
                except OSError as exc:
                    raise StorageError(f"writing {key!r}: {exc}", key=key) from exc
            else:
                place, etag, body = None, None, data
                if (len(data) <= (SLOT_NEW_MAX if if_none_match else SLOT_MAX)
                        and want_etag) or data.startswith(SLOTS_MAGIC):
                    etag = etag_of(data)  # in the slot's header, and the write's answer
                    body = _new_slotted(data, etag, SLOT_ROOM_NEW if if_none_match else 2)
                taken = self._spares.take(folder)
                spare = taken[0] if taken is not None else \
                    self._ahead.take(folder, asyncio.get_running_loop())
                try:
                    tmp, fd = _write_temporary(path, body, spare)
                except OSError as exc:
                    raise StorageError(f"writing {key!r}: {exc}", key=key) from exc
        except BaseException:
            held.release()
            raise
        if place is not None:  # overwritten in place: only that file's data to sync
            await _hand_off(held, f"writing {key!r}", key, folder, sync=place,
                            ring=self._ring_for(asyncio.get_running_loop()))
            return self._remember(path, data, etag)
        # A create-only write has no old version to keep as a spare (no failed link).
        await _hand_off(held, f"writing {key!r}", key, folder, (tmp, fd, path),
                        None if if_none_match else self._spares,
                        None if taken is None or tmp != taken[0] else taken[1])
        return self._remember(path, data, etag) if want_etag or etag else ""

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        path = self._path(key)
        self._ahead.touch()
        held = await self._lock(key)
        try:
            if if_match is not None and self._current(key, path)[0] != if_match:
                raise CASConflict(f"{key!r} changed", key=key)
            try:
                os.unlink(path)
            except _ABSENT:
                held.release()
                return
            except OSError as exc:
                raise StorageError(f"deleting {key!r}: {exc}", key=key) from exc
        except BaseException:
            held.release()
            raise
        await _hand_off(held, f"deleting {key!r}", key, _parent(path))

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> ListPage:
        return await asyncio.to_thread(self._list, prefix, start_after, limit)

    async def close(self) -> None:
        """Remove this store's spare files and those made ahead (a write still in
        flight may leave one); its io_uring closes once its syncs in flight land."""
        self._spares.remove_all()
        self._ahead.remove_all()
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    def _ring_for(self, loop: asyncio.AbstractEventLoop) -> _Ring | None:
        """This store's io_uring on ``loop``, made on first use; None where there is
        none (the commit thread syncs)."""
        ring = self._ring
        if ring is not None and ring.usable(loop):
            return ring
        if ring is not None:  # another loop, or a forked child: a ring of its own
            if ring.pid == os.getpid():
                ring.close()
            else:  # the parent's: only this process's copies of its descriptors go
                ring.ring.close()
            self._ring = None
        if self._ring_failed:
            return None
        module = _ring_module()
        try:
            self._ring = _Ring(module, loop) if module is not None else None
        except (OSError, NotImplementedError):  # no io_uring here, or a sandbox forbids
            self._ring = None  # it, or a loop that cannot watch its eventfd
        self._ring_failed = self._ring is None
        return self._ring


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a crash at any point leaves the old content or
    the new, never a torn one (a temporary file in the same folder, fsynced, renamed
    over ``path``, then the folder fsynced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(_temporary_name(str(path.parent)))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


async def _hand_off(held: _Held, what: str, key: str, folder: str,
                    write: tuple[str, int, str] | None = None,
                    spares: _Spares | None = None, moved_from: str | None = None,
                    sync: tuple[int, int] | None = None, ring: _Ring | None = None) -> None:
    """What waits for the disk, to the commit thread: a write's ``(temporary file,
    its fd, target)`` then ``folder``'s fsync (a delete: the fsync alone), or an
    overwrite in place's ``(fd, slot offset)``, its data's sync alone, which goes
    to ``ring`` instead when there is one with room. The thread (or the ring's
    reaper) releases the flock; this store's asyncio lock is released when it is
    done. Shielded: a cancelled caller must not mark it done (and let the next
    write in) while the thread renames or the sync is in flight."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    try:
        if ring is None or sync is None or not ring.submit(*sync, held.fd, done):
            _COMMITTER.submit(_Job(loop, done, folder, held.fd, write, spares, moved_from,
                                   sync=sync))
    except BaseException:
        if sync is not None:
            os.close(sync[0])
        held.release()
        raise
    done.add_done_callback(lambda _: held.mine.release())
    try:
        await asyncio.shield(done)
    except OSError as exc:
        raise StorageError(f"{what}: {exc}", key=key) from exc


@dataclass(slots=True)
class _Job:
    """What waits for the disk after a write or delete of an object in ``folder``
    has taken its lock (the flock's fd ``lock``): a write's temporary file (open as
    fd) to fsync and rename over its target; then the folder's fsync, and the lock
    released. ``done`` settles on ``loop`` when it is over."""

    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[None]
    folder: str
    lock: int
    write: tuple[str, int, str] | None  # (temporary file, its fd, target)
    spares: _Spares | None = None  # where the target's old file goes, once retired
    moved_from: str | None = None  # the folder the temporary file (a spare) left
    retired: str | None = None  # the target's old file, under a spare name
    sync: tuple[int, int] | None = None  # an overwrite in place: (fd, its slot's offset)


class _Committer:
    """The thread that finishes the writes and deletes of every file store in the
    process, in groups (see the module docstring). Never the default pool: waits
    for another process's lock run there, and a write holding a lock must always
    be able to finish and release it. Started on first use, and again in a forked
    child (a thread does not survive a fork)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._pid = -1
        self._starting = threading.Lock()

    def submit(self, job: _Job) -> None:
        if self._pid != os.getpid():
            with self._starting:
                if self._pid != os.getpid():
                    self._jobs = queue.SimpleQueue()
                    threading.Thread(target=self._run, args=(self._jobs,), daemon=True,
                                     name="okq-file-commit").start()
                    self._pid = os.getpid()
        self._jobs.put(job)

    @staticmethod
    def _run(jobs: queue.SimpleQueue[_Job]) -> None:
        while True:
            group = [jobs.get()]
            while len(group) < GROUP_MAX:
                try:
                    group.append(jobs.get_nowait())
                except queue.Empty:
                    break
            _commit_group(group)


_COMMITTER = _Committer()


def _ring_module() -> Any:
    """okq/_native/uring.c's module, when syncs may go through io_uring: built with
    the compiled path, loadable, and neither ``OKQ_FILE_URING=0`` nor ``OKQ_PURE``
    set (the pure path's run keeps the commit thread's syncs tested)."""
    if os.environ.get("OKQ_FILE_URING", "1").strip().lower() in ("0", "false", "no", "off") \
            or os.environ.get("OKQ_PURE", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("okq.store._uring")
    except ImportError:
        return None


class _Ring:
    """Overwrites in place synced through io_uring (module docstring, "Syncs without a
    thread"): the event loop submits each one's data sync and, woken by the ring's
    eventfd, finishes it as the commit thread would (the slot's header zeroed if the
    sync failed, the file closed, the flock released, the caller answered). One per
    store, event loop and process."""

    def __init__(self, module: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.ring = module.Ring(RING_ENTRIES)
        self.loop = loop
        self.pid = os.getpid()
        #: tag -> (the file's fd, its slot's offset, the flock's fd, the caller's future)
        self.waiting: dict[int, tuple[int, int, int, asyncio.Future[None]]] = {}
        self.tags = 0
        self.closing = False
        try:
            loop.add_reader(self.ring.fileno(), self.reap)
        except BaseException:  # a loop that cannot watch a descriptor
            self.ring.close()
            raise

    def usable(self, loop: asyncio.AbstractEventLoop) -> bool:
        return loop is self.loop and not self.closing and self.pid == os.getpid()

    def submit(self, fd: int, at: int, lock: int, done: asyncio.Future[None]) -> bool:
        """The sync of ``fd`` submitted; False when the ring takes no more (full, or
        the kernel refused it): the caller hands the sync to the commit thread."""
        if len(self.waiting) >= RING_ENTRIES:
            return False
        self.tags += 1
        try:
            self.ring.fdatasync(fd, self.tags)
        except OSError:
            return False
        self.waiting[self.tags] = (fd, at, lock, done)
        return True

    def reap(self) -> None:
        for tag, result in self.ring.reap():
            entry = self.waiting.pop(tag, None)
            if entry is None:
                continue
            fd, at, lock, done = entry
            failure = None
            if result < 0:
                failure = OSError(-result, os.strerror(-result))
                _void_slot(fd, at)
            for opened in (fd, lock):
                with contextlib.suppress(OSError):
                    os.close(opened)
            if not done.done():
                if failure is None:
                    done.set_result(None)
                else:
                    done.set_exception(failure)
        if self.closing and not self.waiting:
            self._shut()

    def close(self) -> None:
        """Closed once the syncs in flight are reaped."""
        self.closing = True
        if not self.waiting:
            self._shut()

    def _shut(self) -> None:
        if not self.ring.closed:
            with contextlib.suppress(Exception):  # the loop may be closed already
                self.loop.remove_reader(self.ring.fileno())
            self.ring.close()


def _commit_group(group: list[_Job]) -> None:
    """Each write's temporary file fsynced and renamed; each folder fsynced once,
    after every rename and unlink in it; every lock released, whatever happened;
    then each job's outcome settled on its loop, one wake-up per loop."""
    failed = _fsync_left(group)
    folders: dict[str, list[int]] = {}
    for n, job in enumerate(group):
        if n in failed:
            continue
        if job.sync is not None:  # nothing in its folder changed: no folder fsync
            try:
                _sync_slot(*job.sync)
            except Exception as exc:
                failed[n] = exc
            continue
        if job.write is not None:
            try:
                job.retired = _rename_temporary(*job.write, keep_old=job.spares is not None)
            except Exception as exc:
                failed[n] = exc
                continue
        folders.setdefault(job.folder, []).append(n)
    _fsync_folders(folders, failed)
    _keep_spares(group, failed)
    _release_and_settle(group, failed)


def _fsync_left(group: list[_Job]) -> dict[int, BaseException]:
    """The folders the group's spares were moved from, fsynced before any rename: a
    moved spare's old entry stays on disk until its folder is fsynced, and a crash
    after the spare became an object must not leave the object's file a second,
    temporary name there. The writes whose folder failed, abandoned."""
    failed: dict[int, BaseException] = {}
    left: dict[str, list[int]] = {}
    for n, job in enumerate(group):
        if job.moved_from is not None:
            left.setdefault(job.moved_from, []).append(n)
    for n in _fsync_folders(left, failed):
        _abandon(group[n])
    return failed


def _fsync_folders(folders: dict[str, list[int]], failed: dict[int, BaseException]
                   ) -> list[int]:
    """Each folder fsynced once; the jobs of one that failed (its members) recorded
    in ``failed`` with the error, and returned."""
    lost: list[int] = []
    for folder, members in folders.items():
        try:
            _fsync_dir(folder)
        except Exception as exc:
            for n in members:
                failed[n] = exc
            lost.extend(members)
    return lost


def _release_and_settle(group: list[_Job], failed: dict[int, BaseException]) -> None:
    """Every lock released, then each job's outcome settled on its loop, one wake-up
    per loop."""
    outcomes: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None],
                                                         BaseException | None]]] = {}
    for n, job in enumerate(group):
        try:
            os.close(job.lock)
        except OSError:
            pass
        outcomes.setdefault(job.loop, []).append((job.done, failed.get(n)))
    for loop, settled in outcomes.items():
        try:
            loop.call_soon_threadsafe(_settle, settled)
        except RuntimeError:
            pass  # that loop is closed: nothing waits for these any more


def _abandon(job: _Job) -> None:
    """A write that will not be renamed: its temporary file closed and removed."""
    if job.write is not None:
        tmp, fd, _ = job.write
        with contextlib.suppress(OSError):
            os.close(fd)
        _unlink_quietly(tmp)


def _keep_spares(group: list[_Job], failed: dict[int, BaseException]) -> None:
    """The old files the group's writes retired, to their stores' spares once their
    folders' fsyncs made the retirement durable; removed otherwise."""
    for n, job in enumerate(group):
        if job.retired is not None and job.spares is not None:
            if n in failed:
                _unlink_quietly(job.retired)
            else:
                job.spares.give(job.retired)


def _settle(settled: list[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    for done, exc in settled:
        if done.done():
            continue
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)


def _read_path(path: str) -> bytes:
    """A file's bytes, one version of them (module docstring, "Recycled files")."""
    while True:
        began = time.monotonic()
        fd = os.open(path, os.O_RDONLY)
        try:
            data = _read_version(fd, began, os.fstat(fd))
        finally:
            os.close(fd)
        if data is not None:
            return data


def _read_version(fd: int, began: float, before: os.stat_result) -> bytes | None:
    """The bytes of the file open as ``fd`` (opened after ``began``; ``before`` its
    first fstat), or None when they may not be one version of one object: the
    caller opens the file again."""
    if time.monotonic() - began >= SPARE_AGE:
        return None
    data = _read_fd(fd)
    after = os.fstat(fd)
    if len(data) != before.st_size or after.st_size != before.st_size \
            or after.st_ctime_ns != before.st_ctime_ns:
        return None
    return data


def _read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


# -- slotted files (module docstring, "Overwrites in place") -------------------------

#: What a slot's CRC-32 covers: its header's first three fields and the slot's index.
_CRC_OF = struct.Struct("<QQ16sB")
#: Reads of a slotted file that may find neither slot whole (each overwrite that
#: went by during the read can spoil one) before the file is taken to be damaged.
_WHOLE_TRIES = 100
_fdatasync = getattr(os, "fdatasync", os.fsync)


@dataclass(slots=True)
class _Slotted:
    """What a slotted file holds: each slot's capacity, the slot of its newest whole
    version (-1: neither slot was whole as read), and that version's number, bytes
    and ETag."""

    capacity: int
    current: int
    seq: int
    data: bytes
    etag: str


def _slot_offset(capacity: int, slot: int) -> int:
    return _FILE_HEAD.size + slot * (_SLOT_HEAD.size + capacity)


def _slot_bytes(slot: int, seq: int, data: bytes, md5: bytes) -> bytes:
    """Slot ``slot``'s header for version ``seq`` of ``data`` (MD5 ``md5``), then ``data``."""
    crc = zlib.crc32(_CRC_OF.pack(seq, len(data), md5, slot))
    return _SLOT_HEAD.pack(seq, len(data), md5, crc) + data


def _new_slotted(data: bytes, etag: str, room: int) -> bytes:
    """A slotted file holding ``data`` (ETag ``etag``) as version 1 in slot 0, slot 1
    empty, each slot with room for ``room`` times its size (rounded up to SLOT_UNIT),
    every byte of both slots written (zeros past the data), so that an overwrite in
    place writes into blocks the file already has and changes no metadata its data
    needs."""
    capacity = -(-max(room * len(data), 1) // SLOT_UNIT) * SLOT_UNIT
    first = _slot_bytes(0, 1, data, bytes.fromhex(etag))
    rest = 2 * (_SLOT_HEAD.size + capacity) - len(first)
    return b"".join((_FILE_HEAD.pack(SLOTS_MAGIC, capacity), first, bytes(rest)))


def _read_slotted(raw: bytes, known: tuple[bytes, str] | None = None) -> _Slotted | None:
    """What a file's bytes ``raw`` hold if the file is slotted, else None (the bytes
    are the object). The newest slot whose header's CRC holds and whose bytes have
    the header's MD5 is current (``known``: bytes and their ETag, compared instead of
    hashed); a slot spoilt by a crash or by an overwrite under way is passed over."""
    if not raw.startswith(SLOTS_MAGIC):
        return None
    capacity = _FILE_HEAD.unpack_from(raw)[1]
    found: list[tuple[int, int, int, int, bytes]] = []
    for slot in (0, 1):
        at = _slot_offset(capacity, slot)
        if at + _SLOT_HEAD.size > len(raw):
            continue
        seq, length, md5, crc = _SLOT_HEAD.unpack_from(raw, at)
        start = at + _SLOT_HEAD.size
        if seq == 0 or length > capacity or start + length > len(raw) \
                or crc != zlib.crc32(_CRC_OF.pack(seq, length, md5, slot)):
            continue
        found.append((seq, slot, start, length, md5))
    for seq, slot, start, length, md5 in sorted(found, reverse=True):
        data = raw[start:start + length]
        etag = md5.hex()
        if (known is not None and known[1] == etag and known[0] == data) \
                or etag_of(data) == etag:
            return _Slotted(capacity, slot, seq, data, etag)
    return _Slotted(capacity, -1, 0, b"", "")


def _object(raw: bytes) -> tuple[bytes, str | None] | None:
    """The object a file's bytes hold, with its ETag when the file says it (None: a
    whole file, hashed when asked for); None when neither slot of a slotted file was
    whole as read (read it again)."""
    slotted = _read_slotted(raw)
    if slotted is None:
        return raw, None
    if slotted.current < 0:
        return None
    return slotted.data, slotted.etag


def _read_object(path: str) -> tuple[bytes, str | None]:
    """``_object`` of the file at ``path``, read again while it has no whole version."""
    for _ in range(_WHOLE_TRIES):
        found = _object(_read_path(path))
        if found is not None:
            return found
    raise OSError(errno.EIO, f"neither slot held a whole version in {_WHOLE_TRIES} reads", path)


def _write_slot(path: str, slotted: _Slotted, data: bytes) -> tuple[tuple[int, int], str]:
    """``data`` written as the next version into the slot of ``path`` that does not
    hold the current one, not yet synced: ``(fd, the slot's offset)`` and its ETag.
    A failed write leaves that slot spoilt, which readers pass over."""
    slot = 1 - slotted.current
    etag = etag_of(data)
    at = _slot_offset(slotted.capacity, slot)
    body = memoryview(_slot_bytes(slot, slotted.seq + 1, data, bytes.fromhex(etag)))
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(body):
            done += os.pwrite(fd, body[done:], at + done)
    except BaseException:
        os.close(fd)
        raise
    return (fd, at), etag


def _sync_slot(fd: int, at: int) -> None:
    """An overwrite in place made durable: the file's data synced (its size and
    blocks did not change), then closed. When the sync fails, the slot's header is
    zeroed first, so that readers go on reading the version before."""
    try:
        _fdatasync(fd)
    except BaseException:
        _void_slot(fd, at)
        raise
    finally:
        os.close(fd)


def _void_slot(fd: int, at: int) -> None:
    """The header of the slot at ``at`` zeroed after its sync failed (best effort),
    so that readers go on reading the version before."""
    with contextlib.suppress(OSError):
        os.pwrite(fd, bytes(_SLOT_HEAD.size), at)


def _write_temporary(path: str, data: bytes, spare: str | None = None) -> tuple[str, int]:
    """A temporary file beside ``path`` holding ``data``, not yet fsynced, and its
    open fd (the page-cache half of :func:`atomic_write`): ``spare``, a retired
    version's file, written over in place, or a new file when there is none (or
    it has gone)."""
    fd = -1
    if spare is not None:
        try:
            fd = os.open(spare, os.O_WRONLY)
            tmp = spare
        except OSError:  # gone, or no longer ours to write: a new file instead
            pass
    if fd < 0:
        folder = _parent(path)
        tmp = _temporary_name(folder)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view, offset = memoryview(data), 0
        while offset < len(data):
            offset += os.pwrite(fd, view[offset:], offset)
        if tmp is spare:
            os.ftruncate(fd, len(data))  # overwritten in place: its old tail cut off
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    return tmp, fd


def _rename_temporary(tmp: str, fd: int, target: str, *, keep_old: bool = False
                      ) -> str | None:
    """The temporary file fsynced and closed, then renamed over ``target`` (the
    folder's fsync comes after, for the whole group). With ``keep_old``, the
    target's old file is kept under a spare name first; returns that name (None
    when there was no old file)."""
    retired: str | None = None
    try:
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if keep_old:
            retired = _temporary_name(_parent(target))
            try:
                os.link(target, retired)
            except OSError:  # no old file, or no hard links here: nothing to keep
                retired = None
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        if retired is not None:
            _unlink_quietly(retired)
        raise
    return retired


def _stripe_name(n: int) -> str:
    """Lock stripe ``n``'s file name in ``LOCK_DIR``."""
    return f"{n:04d}"


def _parent(path: str) -> str:
    """The folder of an object's file (paths here are absolute, normalised strings)."""
    return path.rpartition("/")[0]


def _temporary_name(folder: str) -> str:
    """A fresh temporary (or spare) file name in ``folder``: listing skips them."""
    return f"{folder}/.tmp-{os.urandom(16).hex()}"


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
