"""The file store's recycled files (okq/store/file.py, "Recycled files"): an
overwrite keeps the old version's file as a spare, a later write in the folder
writes into it once it has been retired for SPARE_AGE, and no read spans a
reuse.

These are the writes that replace a whole file (a temporary file renamed over
it): an overwrite of an object over SLOT_MAX, and every write here, as the
fixture below makes every object too big to be slotted (test_file_store_slots.py
covers overwrites in place)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path

import pytest

from okq.errors import CASConflict, StorageError
from okq.store import file as file_store
from okq.store.file import FileStore


@pytest.fixture(autouse=True)
def whole_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "SLOT_MAX", -1)
    monkeypatch.setattr(file_store, "SLOT_NEW_MAX", -1)
    # No empty files made ahead (test_file_store_ahead.py): every ``.tmp-`` file
    # here is a retired version's.
    monkeypatch.setattr(file_store, "AHEAD_PER_FOLDER", 0)


def spares(folder: Path) -> dict[int, bytes]:
    """The folder's spare files: inode -> bytes."""
    return {p.stat().st_ino: p.read_bytes() for p in folder.glob(".tmp-*")}


async def overwritten(store: FileStore, root: Path, key: str, old: bytes, new: bytes) -> int:
    """``key`` written as ``old``, then as ``new``: the inode of old's file, now a spare."""
    await store.put(key, old)
    inode = (root / key).stat().st_ino
    await store.put(key, new)
    return inode


async def test_an_overwrite_keeps_the_old_file_and_a_later_write_reuses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "SPARE_AGE", 0.05)
    store = FileStore(tmp_path)
    old_inode = await overwritten(store, tmp_path, "q/a", b"first version, the longer one",
                                  b"second")
    assert spares(tmp_path / "q") == {old_inode: b"first version, the longer one"}
    assert (await store.list("q/")).items[0].key == "q/a"  # a spare is no object
    await asyncio.sleep(0.1)
    await store.put("q/b", b"short")  # another key of the folder
    assert (tmp_path / "q" / "b").stat().st_ino == old_inode
    assert (await store.get("q/b")).data == b"short"  # the old tail cut off
    assert (await store.get("q/a")).data == b"second"
    assert (await store.get("q/b")).etag == (await store.head("q/b")).etag
    assert set(spares(tmp_path / "q")) == set()  # a's old file reused; b had none
    await store.close()


async def test_a_spare_moves_to_the_folder_of_the_key_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments are never overwritten: their folder gets the files of overwritten
    manifests and lease objects."""
    monkeypatch.setattr(file_store, "SPARE_AGE", 0.05)
    store = FileStore(tmp_path)
    old_inode = await overwritten(store, tmp_path, "q/manifest", b"version 1", b"version 2")
    await asyncio.sleep(0.1)
    await store.put("q/segments/s1", b"a segment", if_none_match=True, want_etag=False)
    assert (tmp_path / "q" / "segments" / "s1").stat().st_ino == old_inode
    assert (await store.get("q/segments/s1")).data == b"a segment"
    assert spares(tmp_path / "q") == {} and spares(tmp_path / "q" / "segments") == {}
    await store.put("q/manifest", b"version 3")
    await asyncio.sleep(0.1)
    (tmp_path / "q" / "manifest").rename(tmp_path / "q" / "kept")  # as if the folder
    monkeypatch.setattr(os, "rename", lambda *a: (_ for _ in ()).throw(  # were elsewhere
        OSError(18, "Invalid cross-device link")))
    await store.put("q/other/s2", b"another", if_none_match=True)
    assert (await store.get("q/other/s2")).data == b"another"
    assert spares(tmp_path / "q") == {}  # the spare that could not move was freed
    await store.close()


async def test_the_folder_a_spare_left_is_fsynced_before_it_becomes_an_object(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Moved from another folder, a spare's old name stays on disk until that folder
    is fsynced: the commit fsyncs it before the rename that makes the spare an
    object, so a crash cannot leave the object's file a second name in it."""
    monkeypatch.setattr(file_store, "SPARE_AGE", 0.05)
    store = FileStore(tmp_path)
    await overwritten(store, tmp_path, "q/manifest", b"version 1", b"version 2")
    await asyncio.sleep(0.1)
    events: list[tuple[str, str]] = []
    fsync_dir, replace = file_store._fsync_dir, os.replace
    monkeypatch.setattr(file_store, "_fsync_dir",
                        lambda path: (events.append(("fsync", str(path))), fsync_dir(path)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", str(b))),
                                                     replace(a, b)))
    await store.put("q/segments/s1", b"a segment", if_none_match=True, want_etag=False)
    assert events == [("fsync", str(tmp_path / "q")),
                      ("rename", str(tmp_path / "q" / "segments" / "s1")),
                      ("fsync", str(tmp_path / "q" / "segments"))]
    events.clear()
    await store.put("q/manifest", b"version 3")  # no spare old enough: a new file
    await asyncio.sleep(0.1)
    await store.put("q/other", b"x")  # a spare of its own folder: nothing else fsynced
    assert [e for e in events if e[0] == "fsync"] == [("fsync", str(tmp_path / "q"))] * 2
    await store.close()


async def test_a_write_whose_spare_left_a_folder_that_fails_its_fsync_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "SPARE_AGE", 0.05)
    store = FileStore(tmp_path)
    await overwritten(store, tmp_path, "q/manifest", b"version 1", b"version 2")
    await asyncio.sleep(0.1)
    fsync_dir = file_store._fsync_dir

    def failing(path: str | Path) -> None:
        if str(path) == str(tmp_path / "q"):
            raise OSError(5, "Input/output error")
        fsync_dir(path)

    monkeypatch.setattr(file_store, "_fsync_dir", failing)
    with pytest.raises(StorageError, match="Input/output error"):
        await store.put("q/segments/s1", b"a segment", if_none_match=True)
    assert not (tmp_path / "q" / "segments" / "s1").exists()
    assert spares(tmp_path / "q" / "segments") == {}  # the moved spare was removed
    monkeypatch.setattr(file_store, "_fsync_dir", fsync_dir)
    await store.put("q/segments/s1", b"a segment", if_none_match=True)  # the lock is free
    assert (await store.get("q/segments/s1")).data == b"a segment"
    await store.close()


async def test_a_spare_waits_its_age_and_close_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "SPARE_AGE", 60.0)
    store = FileStore(tmp_path)
    old_inode = await overwritten(store, tmp_path, "q/a", b"1", b"2")
    await store.put("q/b", b"3")
    assert (tmp_path / "q" / "b").stat().st_ino != old_inode
    assert set(spares(tmp_path / "q")) == {old_inode}
    await store.close()
    assert spares(tmp_path / "q") == {}
    assert (await store.get("q/a")).data == b"2" and (await store.get("q/b")).data == b"3"


def test_a_read_is_one_version_or_none(tmp_path: Path) -> None:
    """What a reader checks (``_read_version``): a first fstat too long after the
    clock started before the open, or a file changed in place while it was read
    (a retired file reused: its ctime set afresh), is no answer."""
    path = tmp_path / "f"
    path.write_bytes(b"one version")
    fd = os.open(path, os.O_RDONLY)
    try:
        before = os.fstat(fd)
        assert file_store._read_version(fd, time.monotonic(), before) == b"one version"
        os.lseek(fd, 0, os.SEEK_SET)
        late = time.monotonic() - file_store.SPARE_AGE
        assert file_store._read_version(fd, late, before) is None
        os.lseek(fd, 0, os.SEEK_SET)
        time.sleep(0.02)  # past the clock tick of the file's ctime
        writer = os.open(path, os.O_WRONLY)
        os.pwrite(writer, b"same size!!", 0)  # reused in place: same size, new bytes
        os.close(writer)
        assert file_store._read_version(fd, time.monotonic(), before) is None
    finally:
        os.close(fd)


async def test_a_read_that_spanned_a_reuse_is_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    await store.put("q/a", b"content")
    reads = []
    read_fd = file_store._read_fd

    def reused_during_the_first(fd: int) -> bytes:
        data = read_fd(fd)
        reads.append(data)
        if len(reads) == 1:
            time.sleep(0.02)
            writer = os.open(tmp_path / "q" / "a", os.O_WRONLY)
            os.pwrite(writer, b"CONTENT", 0)
            os.close(writer)
        return data

    monkeypatch.setattr(file_store, "_read_fd", reused_during_the_first)
    assert (await store.get("q/a")).data == b"CONTENT"
    assert reads == [b"content", b"CONTENT"]


async def test_writers_and_readers_racing_on_reused_files_see_only_whole_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With files reused as soon as they may be: every read is one whole version
    of its own key, and no acknowledged write is overwritten."""
    monkeypatch.setattr(file_store, "SPARE_AGE", 0.01)
    into_spares = []
    write_temporary = file_store._write_temporary

    def counted(path: Path, data: bytes, spare: Path | None = None) -> tuple[Path, int]:
        into_spares.append(spare is not None)
        return write_temporary(path, data, spare)

    monkeypatch.setattr(file_store, "_write_temporary", counted)
    store = FileStore(tmp_path)
    keys = [f"hot/k{n}" for n in range(4)]
    for key in keys:
        await store.put(key, json.dumps({"key": key, "log": []}).encode())
    acknowledged: dict[str, list[int]] = {key: [] for key in keys}
    rng = random.Random(3)

    async def writer(w: int) -> None:
        for i in range(60):
            key = rng.choice(keys)
            blob = await store.get(key)
            state = json.loads(blob.data)  # a torn or foreign read fails here
            assert state["key"] == key
            state["log"].append(w * 1000 + i)
            state["pad"] = "x" * rng.randrange(0, 3000)  # versions of every size
            try:
                await store.put(key, json.dumps(state).encode(), if_match=blob.etag)
            except CASConflict:
                continue
            acknowledged[key].append(w * 1000 + i)
            if rng.random() < 0.2:
                await asyncio.sleep(0.015)  # let spares come of age

    await asyncio.gather(*(writer(w) for w in range(6)))
    assert sum(into_spares) > 20, "few writes reused a file: the test proved little"
    for key in keys:
        final = json.loads((await store.get(key)).data)
        assert final["key"] == key and sorted(final["log"]) == sorted(acknowledged[key])
    inodes = {(tmp_path / key).stat().st_ino for key in keys}
    reused = len(inodes & set(spares(tmp_path / "hot")))
    assert reused == 0, "a live object's file is also a spare"
    await store.close()
    assert not list((tmp_path / "hot").glob(".tmp-*"))


async def test_a_file_system_without_hard_links_writes_without_spares(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    store = FileStore(tmp_path)
    await store.put("q/a", b"1")
    await store.put("q/a", b"2")
    assert (await store.get("q/a")).data == b"2"
    assert spares(tmp_path / "q") == {}
