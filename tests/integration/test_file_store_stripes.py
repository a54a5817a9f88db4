"""A file store's lock stripes made before the writes that need them
(``FileStore.make_lock_stripes``, called by ``okq serve`` as it starts): every
stripe exists afterwards, one another process made is kept as it is, and the
node's writes then make none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from okq.client import Client
from okq.store import file as file_store
from okq.store.file import LOCK_DIR, LOCK_STRIPES, FileStore
from tests.nodes import okq_node


def stripes(root: Path) -> dict[str, int]:
    """Each stripe file's inode, by name."""
    return {e.name: e.inode() for e in os.scandir(root / LOCK_DIR)
            if not e.name.startswith(".tmp-")}


async def test_every_missing_stripe_is_made_and_those_there_are_kept(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put("q/leases/s", b"v0")  # its stripe made by the write, as before
    before = stripes(tmp_path)
    assert len(before) == 1
    assert store.make_lock_stripes() == LOCK_STRIPES - 1
    after = stripes(tmp_path)
    assert sorted(after) == [f"{n:04d}" for n in range(LOCK_STRIPES)]
    assert all(after[name] == inode for name, inode in before.items())
    assert store.make_lock_stripes() == 0
    assert stripes(tmp_path) == after
    assert store._lock_path("q/leases/s").rsplit("/", 1)[1] in after


async def test_a_store_whose_stripes_exist_makes_none_in_its_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    store.make_lock_stripes()
    made: list[str] = []
    new_stripe = FileStore._new_stripe

    def counted(self: FileStore, path: str, loop: object) -> int:
        made.append(path)
        return new_stripe(self, path, loop)  # type: ignore[arg-type]

    monkeypatch.setattr(FileStore, "_new_stripe", counted)
    for n in range(200):
        await store.put(f"q/segments/s{n}", b"x", if_none_match=True)
    assert made == []
    assert file_store.LOCK_STRIPES == len(stripes(tmp_path))


async def test_a_node_starting_on_a_file_store_makes_its_stripes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with okq_node(f"file://{data}", tmp_path) as n:
        assert len(stripes(data)) == LOCK_STRIPES
        async with Client(n.url) as c:
            await c.create_queue("s")
            await c.produce("s", ["a"])
        assert n.stop() == 0
    assert len(stripes(data)) == LOCK_STRIPES
