"""The file store's overwrites in place (okq/store/file.py, "Overwrites in place"):
a small object's file holds two slots, an overwrite writes the slot that does not
hold the current version and syncs only that file's data, and a slot a crash or
a failed write spoilt is passed over, so a reader finds the version before."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from okq.errors import CASConflict, StorageError
from okq.store import file as file_store
from okq.store.base import etag_of
from okq.store.file import SLOTS_MAGIC, FileStore

KEY = "default/leases/q/seg"
REPO = Path(__file__).resolve().parents[2]


class RingSpy:
    """A store's io_uring (okq/_native/uring.c), its syncs counted and, with ``fail``,
    each completing as a failed sync would (EIO)."""

    def __init__(self, ring: Any, calls: list[str]) -> None:
        self.ring, self.calls, self.fail = ring, calls, False

    def fdatasync(self, fd: int, tag: int) -> None:
        self.calls.append("sync")
        self.ring.fdatasync(fd, tag)

    def reap(self) -> list[tuple[int, int]]:
        return [(tag, -errno.EIO if self.fail else result) for tag, result in self.ring.reap()]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ring, name)


@pytest.fixture(params=["thread", "ring"])
def syncs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Overwrites in place synced by the commit thread or through io_uring ("Syncs
    without a thread"): ``calls`` records each data sync; ``fail()`` makes the next
    ones fail; ``on(store)`` readies a store (before its first overwrite)."""
    calls: list[str] = []
    state: dict[str, Any] = {"calls": calls, "path": request.param}
    if request.param == "thread":
        monkeypatch.setenv("OKQ_FILE_URING", "0")
        real_sync = file_store._fdatasync

        def sync(fd: int) -> None:
            calls.append("sync")
            if state.get("failing"):
                raise OSError(errno.EIO, "Input/output error")
            real_sync(fd)

        monkeypatch.setattr(file_store, "_fdatasync", sync)
        state["on"] = lambda store: None
        state["fail"] = lambda on: state.__setitem__("failing", on)
        return state
    monkeypatch.setenv("OKQ_FILE_URING", "1")
    monkeypatch.delenv("OKQ_PURE", raising=False)  # the ring runs with either hot path
    spies: list[RingSpy] = []

    def on(store: FileStore) -> None:
        ring = store._ring_for(asyncio.get_running_loop())
        if ring is None:
            pytest.skip("io_uring is not available here (okq.store._uring not built, or "
                        "the kernel refuses it)")
        spies.append(RingSpy(ring.ring, calls))
        ring.ring = spies[-1]

    def fail(on_: bool) -> None:
        for spy in spies:
            spy.fail = on_

    state["on"], state["fail"] = on, fail
    return state


def slot_header_at(path: Path, slot: int) -> int:
    raw = path.read_bytes()
    capacity = file_store._FILE_HEAD.unpack_from(raw)[1]
    return file_store._slot_offset(capacity, slot)


def current_slot(path: Path) -> int:
    found = file_store._read_slotted(path.read_bytes())
    assert found is not None and found.current >= 0
    return found.current


async def test_an_overwrite_writes_in_place_and_syncs_only_the_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: dict[str, Any]) -> None:
    store = FileStore(tmp_path)
    etag = await store.put(KEY, b"v1", if_none_match=True)
    path = tmp_path / KEY
    assert path.read_bytes().startswith(SLOTS_MAGIC)
    inode, size = path.stat().st_ino, path.stat().st_size
    syncs["on"](store)
    calls: list[str] = syncs["calls"]
    monkeypatch.setattr(file_store, "_fsync_dir", lambda p: calls.append("fsync folder"))
    monkeypatch.setattr(file_store, "_rename_temporary",
                        lambda *a, **k: calls.append("rename"))
    for n in range(2, 6):
        etag = await store.put(KEY, f"version {n}".encode(), if_match=etag)
        assert etag == etag_of(f"version {n}".encode())
    assert calls == ["sync"] * 4
    assert (path.stat().st_ino, path.stat().st_size) == (inode, size)
    blob = await FileStore(tmp_path).get(KEY)
    assert (blob.data, blob.etag) == (b"version 5", etag)
    info = await store.head(KEY)
    assert (info.size, info.etag) == (len(b"version 5"), etag)
    assert [(i.key, i.size) for i in (await store.list("default/")).items] == [(KEY, 9)]


async def test_a_spoilt_slot_is_passed_over_and_the_version_before_is_read(
        tmp_path: Path) -> None:
    """A crash during an overwrite leaves its slot torn: a header whose data does not
    match its MD5, or a header torn itself. Either way the version before stays the
    object, for readers and for a conditional write."""
    store = FileStore(tmp_path)
    path = tmp_path / KEY
    etag_a = await store.put(KEY, b"version A", if_none_match=True)
    await store.put(KEY, b"version B", if_match=etag_a)
    etag_b = etag_of(b"version B")
    spoilt = 1 - current_slot(path)  # the slot the next overwrite would write
    for damage in ("data", "header"):
        fh = path.open("r+b")
        try:
            at = slot_header_at(path, spoilt)
            if damage == "data":  # a newer, valid header over bytes that never landed
                fh.seek(at)
                fh.write(file_store._slot_bytes(spoilt, 99, b"version C", bytes.fromhex(
                    etag_of(b"version C")))[:-4] + b"junk")
            else:
                fh.seek(at + 3)
                fh.write(b"\xff\xfe")
        finally:
            fh.close()
        blob = await FileStore(tmp_path).get(KEY)
        assert (blob.data, blob.etag) == (b"version B", etag_b), damage
        assert (await FileStore(tmp_path).head(KEY)).etag == etag_b
        with pytest.raises(CASConflict):
            await FileStore(tmp_path).put(KEY, b"x", if_match=etag_a)
    etag_d = await FileStore(tmp_path).put(KEY, b"version D", if_match=etag_b)
    assert current_slot(path) == spoilt
    assert (await store.get(KEY)).data == b"version D"
    assert (await store.get(KEY)).etag == etag_d


async def test_a_file_with_neither_slot_whole_is_an_error_not_an_object(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    etag = await store.put(KEY, b"only", if_none_match=True)
    path = tmp_path / KEY
    with path.open("r+b") as fh:
        fh.seek(slot_header_at(path, 0))
        fh.write(b"\x00" * 8)  # version 0: no version
    with pytest.raises(StorageError):
        await FileStore(tmp_path).get(KEY)
    with pytest.raises(StorageError):
        await FileStore(tmp_path).put(KEY, b"x", if_match=etag)


async def test_a_failed_sync_fails_the_write_and_readers_keep_the_version_before(
        tmp_path: Path, syncs: dict[str, Any]) -> None:
    store = FileStore(tmp_path)
    etag = await store.put(KEY, b"before", if_none_match=True)
    syncs["on"](store)
    syncs["fail"](True)
    with pytest.raises(StorageError):
        await store.put(KEY, b"never acknowledged", if_match=etag)
    syncs["fail"](False)
    assert syncs["calls"] == ["sync"]
    blob = await FileStore(tmp_path).get(KEY)
    assert (blob.data, blob.etag) == (b"before", etag)
    assert await store.put(KEY, b"after", if_match=etag) == etag_of(b"after")
    assert (await FileStore(tmp_path).get(KEY)).data == b"after"


async def test_an_object_that_outgrows_its_slot_gets_a_bigger_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    path = tmp_path / KEY
    etag = await store.put(KEY, b"small", if_none_match=True)
    inode = path.stat().st_ino
    big = os.urandom(file_store.SLOT_UNIT * 3)
    etag = await store.put(KEY, big, if_match=etag)
    assert path.stat().st_ino != inode  # replaced whole
    found = file_store._read_slotted(path.read_bytes())
    assert found is not None and found.capacity >= 2 * len(big) and found.data == big
    inode = path.stat().st_ino
    etag = await store.put(KEY, big[::-1], if_match=etag)  # fits: in place again
    assert path.stat().st_ino == inode
    assert (await FileStore(tmp_path).get(KEY)).data == big[::-1]


async def test_a_new_object_grows_to_four_times_its_size_in_place(tmp_path: Path) -> None:
    """A segment's lease object is made by its first lease of 100 and grows to
    four times that: no new file on the way."""
    store = FileStore(tmp_path)
    path = tmp_path / KEY
    first = os.urandom(3600)
    etag = await store.put(KEY, first, if_none_match=True)
    inode = path.stat().st_ino
    for n in (2, 3, 4):
        etag = await store.put(KEY, first * n, if_match=etag)
        assert path.stat().st_ino == inode, n
    assert (await FileStore(tmp_path).get(KEY)).data == first * 4


async def test_large_and_new_large_objects_are_whole_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    segment = os.urandom(file_store.SLOT_NEW_MAX + 1)
    await store.put("default/segments/q/s", segment, if_none_match=True)
    assert (tmp_path / "default/segments/q/s").read_bytes() == segment
    large = os.urandom(file_store.SLOT_MAX + 1)
    etag = await store.put("default/manifests/q", large)
    etag = await store.put("default/manifests/q", large[::-1], if_match=etag)
    assert (tmp_path / "default/manifests/q").read_bytes() == large[::-1]
    assert (await store.head("default/manifests/q")).etag == etag


async def test_a_small_segment_is_a_whole_file_and_its_bytes_are_not_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment's writer wants no ETag (``want_etag=False``): its bytes are never
    overwritten, so they need no slots, and the store makes no MD5 of them."""
    hashed: list[bytes] = []
    real = file_store.etag_of
    monkeypatch.setattr(file_store, "etag_of", lambda d: (hashed.append(bytes(d)), real(d))[1])
    store = FileStore(tmp_path)
    segment = b"\x87one small segment"
    assert await store.put("default/segments/q/s", segment, if_none_match=True,
                           want_etag=False) == ""
    assert (tmp_path / "default/segments/q/s").read_bytes() == segment
    assert hashed == []
    assert (await store.get("default/segments/q/s")).data == segment


async def test_objects_that_begin_like_a_slotted_file_are_kept_apart(tmp_path: Path) -> None:
    """Bytes that begin with the slotted files' mark are always written slotted, so
    no whole file begins with it, even a large new object."""
    store = FileStore(tmp_path)
    for key, data in (("a/small", SLOTS_MAGIC), ("a/large", SLOTS_MAGIC + bytes(
            file_store.SLOT_MAX + 10))):
        await store.put(key, data, if_none_match=True)
        blob = await FileStore(tmp_path).get(key)
        assert (blob.data, blob.etag) == (data, etag_of(data))
        assert (await store.head(key)).size == len(data)


async def test_a_whole_file_from_before_is_read_and_its_first_overwrite_slots_it(
        tmp_path: Path) -> None:
    """A store written by a version of okq before slotted files holds each object
    as its bytes: read as they are, and slotted by the first overwrite."""
    path = tmp_path / KEY
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x82written before")
    store = FileStore(tmp_path)
    blob = await store.get(KEY)
    assert (blob.data, blob.etag) == (b"\x82written before", etag_of(b"\x82written before"))
    await store.put(KEY, b"\x82now", if_match=blob.etag)
    assert path.read_bytes().startswith(SLOTS_MAGIC)
    assert (await FileStore(tmp_path).get(KEY)).data == b"\x82now"


async def test_the_bytes_it_wrote_are_compared_not_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As for whole files: a conditional overwrite finds the current slot holding the
    bytes this store wrote there last and does not hash them; it hashes bytes
    another writer put there."""
    hashed: list[bytes] = []
    real = file_store.etag_of
    monkeypatch.setattr(file_store, "etag_of", lambda d: (hashed.append(bytes(d)), real(d))[1])
    mine, other = FileStore(tmp_path), FileStore(tmp_path)
    a = await mine.put(KEY, b"A", if_none_match=True)
    assert hashed == [b"A"]  # once, for the slot's header and the answer
    hashed.clear()
    b = await mine.put(KEY, b"B", if_match=a)
    assert hashed == [b"B"]
    await other.put(KEY, b"C", if_match=b)
    hashed.clear()
    with pytest.raises(CASConflict):
        await mine.put(KEY, b"D", if_match=b)
    assert hashed == [b"C"]


WRITER = """
import asyncio, sys
from okq.store import FileStore
async def main(root, key, n):
    store = FileStore(root)
    etag = (await store.get(key)).etag
    for k in range(n):  # versions of changing sizes, each naming itself
        etag = await store.put(key, (b"%06d:" % k) * (1 + k % 50), if_match=etag)
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_readers_racing_an_overwriting_process_see_only_whole_versions(
        tmp_path: Path) -> None:
    """Another process overwrites one key in place as fast as it can; every read
    here meanwhile returns one whole version, its bytes matching its ETag."""
    store = FileStore(tmp_path)
    await store.put(KEY, b"start", if_none_match=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, str(tmp_path), KEY, "1500", cwd=REPO,
        stderr=subprocess.PIPE)
    reads = 0
    seen: set[bytes] = set()
    while proc.returncode is None:
        blob = await FileStore(tmp_path).get(KEY)
        assert blob.etag == etag_of(blob.data)
        head = blob.data[:7]
        assert blob.data == b"start" or blob.data == head * (len(blob.data) // 7), head
        seen.add(head)
        reads += 1
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), 0.0005)
        except TimeoutError:
            pass
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert reads > 50 and len(seen) > 10, (reads, len(seen))
    assert (await store.get(KEY)).data == b"001499:" * (1 + 1499 % 50)


COUNTER = """
import asyncio, sys
from okq.errors import CASConflict
from okq.store import FileStore
async def main(root, key, n):
    store = FileStore(root)
    done = 0
    while done < n:  # read, add one, write if nobody wrote between: a lost update shows
        blob = await store.get(key)
        try:
            await store.put(key, b"%d" % (int(blob.data) + 1), if_match=blob.etag)
            done += 1
        except CASConflict:
            pass
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_conditional_overwrites_in_place_from_two_processes_lose_no_update(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put(KEY, b"0", if_none_match=True)
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", COUNTER, str(tmp_path), KEY, "150", cwd=REPO,
        stderr=subprocess.PIPE) for _ in range(2)]
    for proc in procs:
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
    assert (await FileStore(tmp_path).get(KEY)).data == b"300"
    assert (tmp_path / KEY).read_bytes().startswith(SLOTS_MAGIC)
