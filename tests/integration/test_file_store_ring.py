"""The file store's overwrites in place synced through io_uring (okq/store/file.py,
"Syncs without a thread"; okq/_native/uring.c): the event loop submits each data
sync and finishes the write when the kernel reports it, with the commit thread's
guarantees: acknowledged only once synced, the key locked until then (whatever
happens to the caller), a failure leaving the version before; more than the ring
holds, and a ring the kernel refuses, go to the commit thread."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest

from okq.errors import StorageError
from okq.store import file as file_store
from okq.store.file import FileStore

_uring = pytest.importorskip("okq.store._uring", reason="okq/_native/uring.c was not built")


@pytest.fixture(autouse=True)
def ring_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OKQ_FILE_URING", "1")
    monkeypatch.delenv("OKQ_PURE", raising=False)  # the ring runs with either hot path
    try:
        _uring.Ring(4).close()
    except OSError as exc:
        pytest.skip(f"the kernel refuses io_uring here: {exc}")


@pytest.fixture
def thread_jobs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The jobs handed to the commit thread (it still runs them)."""
    jobs: list[Any] = []
    submit = file_store._COMMITTER.submit

    def recorded(job: Any) -> None:
        jobs.append(job)
        submit(job)

    monkeypatch.setattr(file_store._COMMITTER, "submit", recorded)
    return jobs


class Held:
    """A ring whose completions the test releases: ``reap`` answers nothing until
    ``go`` is set (the eventfd stays readable, so the loop asks again)."""

    def __init__(self, ring: Any) -> None:
        self.ring, self.go, self.fail = ring, False, False

    def reap(self) -> list[tuple[int, int]]:
        if not self.go:
            return []
        return [(t, -errno.EIO if self.fail else r) for t, r in self.ring.reap()]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ring, name)


async def slotted(store: FileStore, key: str, data: bytes = b"v0") -> str:
    return await store.put(key, data, if_none_match=True)


def holding(store: FileStore) -> tuple[Any, Held]:
    """The store's ring on this loop, its completions held back until ``go``."""
    ring = store._ring_for(asyncio.get_running_loop())
    assert ring is not None
    held = Held(ring.ring)
    ring.ring = held
    return ring, held


async def in_the_ring(ring: Any, write: Any) -> asyncio.Future[str]:
    """``write`` started, once its sync is in ``ring``."""
    started = asyncio.ensure_future(write)
    while not ring.waiting:
        await asyncio.sleep(0.005)
    return started


async def test_overwrites_in_place_go_through_the_ring_not_the_commit_thread(
        tmp_path: Path, thread_jobs: list[Any]) -> None:
    store = FileStore(tmp_path)
    etags = {f"q/leases/s{n}": await slotted(store, f"q/leases/s{n}") for n in range(8)}
    thread_jobs.clear()  # the creates: whole files, by the thread
    for round_ in range(3):
        new = await asyncio.gather(*(store.put(k, f"{k} {round_}".encode(), if_match=e)
                                     for k, e in etags.items()))
        etags = dict(zip(etags, new, strict=True))
    assert thread_jobs == []
    ring = store._ring
    assert ring is not None and ring.waiting == {} and ring.ring.pending == 0
    fresh = FileStore(tmp_path)
    for key in etags:
        assert (await fresh.get(key)).data == f"{key} 2".encode()
    await store.close()
    assert ring.ring.closed


async def test_more_overwrites_than_the_ring_holds_go_to_the_commit_thread(
        tmp_path: Path, thread_jobs: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "RING_ENTRIES", 4)
    store = FileStore(tmp_path)
    keys = [f"q/leases/s{n}" for n in range(24)]
    etags = [await slotted(store, k) for k in keys]
    thread_jobs.clear()
    ring, held = holding(store)
    writes = [asyncio.ensure_future(store.put(k, b"new " + k.encode(), if_match=e))
              for k, e in zip(keys, etags, strict=True)]
    while len(ring.waiting) + len(thread_jobs) < len(keys):
        await asyncio.sleep(0.005)
    assert len(ring.waiting) == 4 and len(thread_jobs) == 20
    assert all(job.sync is not None for job in thread_jobs)
    await asyncio.sleep(0.05)
    assert sum(w.done() for w in writes) == 20  # the thread's; the ring's wait
    held.go = True
    ring.reap()
    await asyncio.gather(*writes)
    fresh = FileStore(tmp_path)
    assert [(await fresh.get(k)).data for k in keys] == [b"new " + k.encode() for k in keys]


async def test_a_write_is_acknowledged_and_its_key_unlocked_only_once_synced(
        tmp_path: Path) -> None:
    """The caller waits for the sync, and so does the next writer of the key, even
    when the first caller is cancelled meanwhile."""
    store = FileStore(tmp_path)
    etag = await slotted(store, "q/leases/s")
    ring, held = holding(store)
    first = await in_the_ring(ring, store.put("q/leases/s", b"first", if_match=etag))
    await asyncio.sleep(0.05)
    assert not first.done()
    first.cancel()
    second = asyncio.ensure_future(store.put("q/leases/s", b"second"))
    await asyncio.sleep(0.05)
    assert not second.done() and len(ring.waiting) == 1  # the key is still locked
    held.go = True
    ring.reap()
    assert await second
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (await FileStore(tmp_path).get("q/leases/s")).data == b"second"


async def test_a_failed_sync_through_the_ring_fails_the_write_and_unlocks_the_key(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    etag = await slotted(store, "q/leases/s", b"before")
    _, held = holding(store)
    held.go, held.fail = True, True
    with pytest.raises(StorageError, match="Input/output error"):
        await store.put("q/leases/s", b"never acknowledged", if_match=etag)
    assert (await FileStore(tmp_path).get("q/leases/s")).data == b"before"
    held.fail = False
    assert await asyncio.wait_for(store.put("q/leases/s", b"after", if_match=etag), 5)
    assert (await FileStore(tmp_path).get("q/leases/s")).data == b"after"


async def test_a_store_closed_with_syncs_in_flight_closes_its_ring_once_they_land(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    etag = await slotted(store, "q/leases/s")
    ring, held = holding(store)
    write = await in_the_ring(ring, store.put("q/leases/s", b"late", if_match=etag))
    await store.close()
    assert not held.ring.closed and not write.done()
    held.go = True
    ring.reap()
    assert await write
    assert held.ring.closed


def test_each_event_loop_gets_a_ring_of_its_own(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    rings: list[Any] = []

    async def one_loop(data: bytes) -> None:
        etag = (await store.head("q/leases/s")).etag if rings else await slotted(
            store, "q/leases/s")
        await store.put("q/leases/s", data, if_match=etag)
        rings.append(store._ring)

    asyncio.run(one_loop(b"one"))
    asyncio.run(one_loop(b"two"))
    first, second = rings
    assert first is not None and second is not None and first is not second
    assert first.ring.closed and not second.ring.closed
    assert asyncio.run(FileStore(tmp_path).get("q/leases/s")).data == b"two"


@pytest.mark.parametrize("env", [{"OKQ_FILE_URING": "0"}, {"OKQ_PURE": "1"}])
async def test_without_the_ring_the_commit_thread_syncs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread_jobs: list[Any],
        env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = FileStore(tmp_path)
    etag = await slotted(store, "q/leases/s")
    thread_jobs.clear()
    await store.put("q/leases/s", b"v1", if_match=etag)
    assert store._ring is None
    assert [job.sync is not None for job in thread_jobs] == [True]


async def test_a_ring_the_kernel_refuses_leaves_the_syncs_to_the_commit_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread_jobs: list[Any]) -> None:
    class Refused:
        @staticmethod
        def Ring(entries: int) -> None:
            raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(file_store, "_ring_module", lambda: Refused)
    store = FileStore(tmp_path)
    etag = await slotted(store, "q/leases/s")
    thread_jobs.clear()
    etag = await store.put("q/leases/s", b"v1", if_match=etag)
    await store.put("q/leases/s", b"v2", if_match=etag)
    assert store._ring is None and len(thread_jobs) == 2


def test_the_ring_reports_each_sync_by_its_tag(tmp_path: Path) -> None:
    """okq/_native/uring.c alone: a sync's result is 0, or -errno as fdatasync(2)
    fails (a closed descriptor: EBADF)."""
    ring = _uring.Ring(8)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"data", 0)
        ring.fdatasync(fd, 7)
        ring.fdatasync(1 << 20, 8)  # no such descriptor
        assert ring.pending == 2
        got: list[tuple[int, int]] = []
        for _ in range(500):
            got += ring.reap()
            if len(got) == 2:
                break
            time.sleep(0.01)
        assert sorted(got) == [(7, 0), (8, -errno.EBADF)] and ring.pending == 0
        assert ring.reap() == []
    finally:
        os.close(fd)
        ring.close()
    assert ring.closed
    with pytest.raises(ValueError):
        ring.fdatasync(0, 1)
    with pytest.raises(ValueError):
        ring.fileno()


def test_a_ring_never_opened_closes_no_descriptor_of_anyone_else() -> None:
    """A Ring whose __init__ never ran, or failed on its arguments, holds no
    descriptor: freeing it closes nothing (not standard input, descriptor 0)."""
    ours = None
    try:
        os.fstat(0)
    except OSError:  # closed here: opened by the test, so that closing it shows
        ours = os.open(os.devnull, os.O_RDONLY)
        assert ours == 0
    try:
        before = os.fstat(0)
        never = _uring.Ring.__new__(_uring.Ring)
        assert never.closed
        del never
        with pytest.raises(TypeError):
            _uring.Ring("many")
        assert os.fstat(0).st_ino == before.st_ino
    finally:
        if ours is not None:
            os.close(ours)
