"""The file store's files made ahead (okq/store/file.py, "Files made ahead"): a
write that would make a new file on the event loop opens an empty one the loop
made earlier, while the store was quiet; and so does a lock stripe's first use."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from okq.store import file as file_store
from okq.store.file import FileStore


@pytest.fixture(autouse=True)
def whole_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """New objects as whole files, a short quiet period."""
    monkeypatch.setattr(file_store, "SLOT_NEW_MAX", -1)
    monkeypatch.setattr(file_store, "AHEAD_QUIET", 0.02)


def made_ahead(folder: Path) -> dict[int, int]:
    """The folder's temporary files: inode -> size."""
    return {p.stat().st_ino: p.stat().st_size for p in folder.glob(".tmp-*")}


async def quiet(store: FileStore) -> None:
    """Long enough with no write for the store to make its files ahead."""
    await asyncio.sleep(file_store.AHEAD_QUIET * 5)


async def test_a_quiet_store_makes_files_ahead_and_the_next_write_uses_one(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put("q/seg/a", b"first", if_none_match=True)
    assert made_ahead(tmp_path / "q" / "seg") == {}  # none yet: the store was busy
    await quiet(store)
    ahead = made_ahead(tmp_path / "q" / "seg")
    assert len(ahead) == file_store.AHEAD_PER_FOLDER and set(ahead.values()) == {0}
    await store.put("q/seg/b", b"second", if_none_match=True)
    inode = (tmp_path / "q" / "seg" / "b").stat().st_ino
    assert inode in ahead  # the object's file is one made ahead
    assert (await store.get("q/seg/b")).data == b"second"
    assert len(made_ahead(tmp_path / "q" / "seg")) == file_store.AHEAD_PER_FOLDER - 1
    assert [i.key for i in (await store.list("q/")).items] == ["q/seg/a", "q/seg/b"]
    await store.close()
    assert made_ahead(tmp_path / "q" / "seg") == {}  # close removes them


async def test_no_file_is_made_ahead_while_writes_keep_coming(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "AHEAD_QUIET", 0.2)
    store = FileStore(tmp_path)
    for n in range(40):  # a write every few ms for longer than the quiet period
        await store.put(f"q/seg/{n}", b"x", if_none_match=True)
        await asyncio.sleep(0.005)
    assert made_ahead(tmp_path / "q" / "seg") == {}
    await quiet(store)
    assert len(made_ahead(tmp_path / "q" / "seg")) == file_store.AHEAD_PER_FOLDER
    await store.close()


async def test_a_new_lock_stripe_is_a_file_made_ahead(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    locks = tmp_path / file_store.LOCK_DIR
    await store.put("q/a", b"1")
    await quiet(store)
    ahead = made_ahead(locks)
    assert len(ahead) == file_store.AHEAD_PER_FOLDER
    stripes = set(os.listdir(locks))
    key = next(f"q/k{n}" for n in range(10_000)
               if Path(store._lock_path(f"q/k{n}")).name not in stripes)
    await store.put(key, b"2")
    stripe = Path(store._lock_path(key))
    assert stripe.stat().st_ino in ahead
    assert len(made_ahead(locks)) == file_store.AHEAD_PER_FOLDER - 1  # its other name gone
    await store.close()


async def test_a_stripe_another_process_made_meanwhile_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    locks = tmp_path / file_store.LOCK_DIR
    await store.put("q/a", b"1")
    await quiet(store)
    ahead = made_ahead(locks)
    stripes = set(os.listdir(locks))
    key = next(f"q/k{n}" for n in range(10_000)
               if Path(store._lock_path(f"q/k{n}")).name not in stripes)
    stripe = Path(store._lock_path(key))
    link = os.link

    def late(src: str, dst: str) -> None:  # another process makes the stripe first
        if dst == str(stripe):
            stripe.touch()
        link(src, dst)

    monkeypatch.setattr(file_store.os, "link", late)
    await store.put(key, b"2")
    assert stripe.stat().st_ino not in ahead  # the other process's file stays the stripe
    assert made_ahead(locks) == ahead  # the one taken went back, unused
    assert (await store.get(key)).data == b"2"
    await store.close()
