"""The file store's group commit: writes and deletes that wait for the commit thread
together share each folder's fsync and are acknowledged only after it; one that
fails to commit fails alone, with its lock released.

The commit thread is held on its first write (a gate in ``_rename_temporary``)
until the writes under test are queued behind it, so that they make one group
whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from okq.errors import StorageError
from okq.store import FileStore
from okq.store import file as file_store


@pytest.fixture(autouse=True)
def nothing_made_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """No empty files made ahead (test_file_store_ahead.py): these tests count the
    temporary files a write leaves."""
    monkeypatch.setattr(file_store, "AHEAD_PER_FOLDER", 0)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Holds the commit thread in the first rename until ``open`` is set; records
    every folder fsync; a target whose name starts with "bad" fails its rename."""
    opened = threading.Event()
    held = threading.Event()
    synced: list[Path] = []  # the store names files by strings: made Paths here
    rename, fsync_dir = file_store._rename_temporary, file_store._fsync_dir

    def gated_rename(tmp: str, fd: int, target: str, **kw: Any) -> str | None:
        if not held.is_set():
            held.set()
            opened.wait(30)
        if Path(target).name.startswith("bad"):  # the rename fails
            target = str(Path(target).parent / "missing-folder" / Path(target).name)
        return rename(tmp, fd, target, **kw)

    def counted_fsync(folder: str) -> None:
        synced.append(Path(folder))
        fsync_dir(folder)

    monkeypatch.setattr(file_store, "_rename_temporary", gated_rename)
    monkeypatch.setattr(file_store, "_fsync_dir", counted_fsync)
    try:
        yield {"open": opened, "held": held, "synced": synced}
    finally:
        opened.set()


async def queued_behind_the_gate(store: FileStore, gate: dict[str, Any],
                                 writes: list[tuple[str, bytes]]) -> list[Any]:
    """A first write that holds the commit thread, then ``writes`` queued behind it;
    the gate opened once all of them wait; every outcome (an ETag or an error)."""
    first = asyncio.ensure_future(store.put("first/x", b"first"))
    while not gate["held"].is_set():
        await asyncio.sleep(0.005)
    rest = [asyncio.ensure_future(store.put(key, data)) for key, data in writes]
    while file_store._COMMITTER._jobs.qsize() < len(writes):
        await asyncio.sleep(0.005)
    gate["synced"].clear()
    gate["open"].set()
    await first
    return list(await asyncio.gather(*rest, return_exceptions=True))


async def test_writes_waiting_together_share_each_folders_fsync(
        tmp_path: Path, gate: dict[str, Any]) -> None:
    store = FileStore(tmp_path)
    writes = [(f"q{n % 4}/leases/s{n}", f"v{n}".encode()) for n in range(12)]
    outcomes = await queued_behind_the_gate(store, gate, writes)
    assert all(isinstance(o, str) for o in outcomes), outcomes
    for key, data in writes:
        assert (await store.get(key)).data == data
    # One group: each of the four folders fsynced once, not once per write (the
    # first write's folder, "first", is its own group's).
    folders = sorted(f for f in gate["synced"] if f.name != "first")
    assert folders == sorted((tmp_path / f"q{n}" / "leases").resolve() for n in range(4))
    assert not list(tmp_path.rglob(".tmp-*"))


async def test_a_write_that_fails_to_commit_fails_alone_and_lets_its_key_go(
        tmp_path: Path, gate: dict[str, Any]) -> None:
    store = FileStore(tmp_path)
    writes = [("q/leases/good1", b"one"), ("q/leases/bad", b"two"), ("q/leases/good2", b"three")]
    good1, bad, good2 = await queued_behind_the_gate(store, gate, writes)
    assert isinstance(good1, str) and isinstance(good2, str)
    assert isinstance(bad, StorageError) and "q/leases/bad" in str(bad)
    assert (await store.get("q/leases/good2")).data == b"three"
    assert not list(tmp_path.rglob(".tmp-*"))  # the failed write's temporary file is gone
    # Its lock was released: the key can be written (and the rename works this time).
    with pytest.raises(StorageError):
        await store.put("q/leases/bad", b"four")
    assert await store.put("q/leases/good1", b"five")


async def test_a_delete_commits_in_a_group_too(tmp_path: Path, gate: dict[str, Any]) -> None:
    store = FileStore(tmp_path)
    gate["open"].set()  # no holding: plain writes and a delete
    await store.put("q/a", b"a")
    await store.delete("q/a")
    with pytest.raises(Exception, match="no object"):
        await store.get("q/a")
    assert (tmp_path / "q").resolve() in gate["synced"]
