"""Manifests in chunks through engines and the compactor: what a publish writes stays
small at any backlog, a reader whose head's chunks were collected reads the head
again, and nodes told to cut no chunks (a rolling upgrade) write format 1 and keep
the chunks they find."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from compactor import Compactor, CompactorOptions
from okq import ManualClock
from okq.keys import chunks_prefix, manifest_key
from okq.manifests import read_manifest
from okq.store import FaultyStore, MemoryStore, Store, list_all
from okq.store.base import Blob
from tests.engines import make_engine
from tests.stores import StoreFactory

NS = "default"


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, store_factory: StoreFactory) -> Store:
    return await store_factory(request.param)


class ManifestWrites(FaultyStore):
    """Records the size of every manifest head written."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.heads: list[int] = []

    async def put(self, key: str, data: bytes, **kw: Any) -> str:
        if "/manifests/" in key:
            self.heads.append(len(data))
        return await super().put(key, data, **kw)


async def head(store: Store, queue: str = "q") -> dict[str, Any]:
    raw: dict[str, Any] = msgpack.unpackb((await store.get(manifest_key(NS, queue))).data,
                                          strict_map_key=False)
    return raw


async def chunk_keys(store: Store, queue: str = "q") -> list[str]:
    return [i.key async for i in list_all(store, chunks_prefix(NS, queue))]


async def test_a_publish_writes_a_small_head_at_any_backlog() -> None:
    """600 produces of one item each, default chunks (128 segments): every head
    written holds at most 127 segments and a reference per chunk; the whole list
    is more than 4 times the largest (and grows with the backlog; the head does not)."""
    store = ManifestWrites(MemoryStore())
    clock = ManualClock()
    e = make_engine(store, clock, manifest_chunk=128)
    await e.create_queue("q")
    for n in range(600):
        await e.produce("q", [f"m{n}".encode()])
        clock.advance(0.001)
    raw = await head(store)
    assert raw["v"] == 2 and [c[1] for c in raw["chunks"]] == [128] * 4
    assert len(raw["segments"]) == 600 - 4 * 128
    m = await read_manifest(store, NS, "q")
    whole = len(msgpack.packb([s.pack() for s in m.segments]))
    assert max(store.heads) < 127 * 64 + 4 * 40 + 400, max(store.heads)
    assert whole > 4 * max(store.heads), (whole, max(store.heads))
    assert len(await chunk_keys(store)) == 4
    got = await make_engine(store, clock).lease("q", 1000)
    assert sorted(g.payload for g in got) == sorted(f"m{n}".encode() for n in range(600))


class StaleFirstRead(FaultyStore):
    """Answers the first GET of the manifest with the bytes it held earlier: a reader
    that read the head just before a compaction changed it."""

    def __init__(self, inner: Store, old: bytes) -> None:
        super().__init__(inner)
        self.old: bytes | None = old

    async def get(self, key: str) -> Blob:
        blob = await super().get(key)
        if "/manifests/" in key and self.old is not None:
            blob, self.old = Blob(self.old, "stale-etag"), None
        return blob


async def test_a_reader_whose_chunks_were_collected_reads_the_head_again(
        store: Store) -> None:
    clock = ManualClock()
    e = make_engine(store, clock)  # chunks of 3
    await e.create_queue("q")
    for n in range(9):
        await e.produce("q", [f"m{n}".encode()])
        clock.advance(1)
    old = (await store.get(manifest_key(NS, "q"))).data
    first = await chunk_keys(store)
    got = await e.lease("q", 4)
    await e.complete([g.token for g in got])  # the first chunk's 3 and one more
    c = Compactor(make_engine(store, clock), clock=clock,
                  options=CompactorOptions(safety_age=0, lease_grace=0, min_age=0))
    report = await c.run_once()
    assert report.segments_folded == 4
    assert not set(first) & set(await chunk_keys(store)), "the old chunks were collected"
    stale = StaleFirstRead(store, old)
    reader = make_engine(stale, clock)
    got = await reader.lease("q", 10)
    assert sorted(g.payload for g in got) == [f"m{n}".encode() for n in range(4, 9)]


async def test_nodes_cutting_no_chunks_write_format_1_and_keep_chunks_they_find(
        store: Store) -> None:
    clock = ManualClock()
    old = make_engine(store, clock, manifest_chunk=0)  # a fleet being upgraded
    await old.create_queue("q")
    for n in range(7):
        await old.produce("q", [f"a{n}".encode()])
    raw = await head(store)
    assert raw["v"] == 1 and "chunks" not in raw and len(raw["segments"]) == 7

    new = make_engine(store, clock)  # cuts chunks of 3
    await new.produce("q", [b"b0"])
    raw = await head(store)
    assert raw["v"] == 2 and [c[1] for c in raw["chunks"]] == [3, 3]

    for n in range(5):  # the old setting again: the chunks stay, the tail grows
        await old.produce("q", [f"c{n}".encode()])
    raw = await head(store)
    assert [c[1] for c in raw["chunks"]] == [3, 3] and len(raw["segments"]) == 7
    got = await make_engine(store, clock).lease("q", 100)
    want = [f"a{n}" for n in range(7)] + ["b0"] + [f"c{n}" for n in range(5)]
    assert sorted(g.payload.decode() for g in got) == sorted(want)

    purged = make_engine(store, clock, manifest_chunk=0)
    await purged.purge("q")
    raw = await head(store)
    assert raw["v"] == 1 and raw["segments"] == []
