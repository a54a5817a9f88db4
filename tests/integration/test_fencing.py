"""Fencing: what keeps okq correct under stale leases, wrong clocks, crashes and
ambiguous writes. Atomicity is only proven on stores that have it: memory, file
and SeaweedFS (moto's server is not atomic under concurrency; see tests/stores.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from okq import Engine, ManualClock, QueueConfig
from okq.clock import OffsetClock, SystemClock
from okq.errors import LeaseLost, PublishAborted
from okq.keys import lease_key, new_segment_id, segment_key
from okq.leases import LEASED, decode_lease
from okq.manifests import read_manifest
from okq.model import Segment, SegmentItem, encode_segment
from okq.store import FaultyStore, SimulatedCrash, Store, list_all
from tests.engines import make_engine
from tests.stores import ATOMIC_STORES, S3_STORES

pytestmark = pytest.mark.parametrize(
    "kind",
    [pytest.param(k, marks=[pytest.mark.s3] if k in S3_STORES else []) for k in ATOMIC_STORES],
)


async def _queue(e: Engine, **config: object) -> None:
    await e.create_queue("q", QueueConfig.model_validate({"lease_timeout": 10, **config}))


async def test_stale_completion_is_refused_and_leaves_new_lease_alone(store: Store) -> None:
    clock = ManualClock()
    a, b = make_engine(store, clock), make_engine(store, clock)
    await _queue(a)
    await a.produce("q", [b"job"])
    (first,) = await a.lease("q", 1)
    clock.advance(11)  # the lease expired ...
    (second,) = await b.lease("q", 1)  # ... and another node leased the item again
    seg = first.id.split(".")[0]
    before = (await store.get(lease_key("default", "q", seg))).data

    with pytest.raises(LeaseLost, match="lease was lost") as err:
        await a.complete([first.token])
    assert "leased again" in err.value.details["failed"][0]["reason"]
    for stale in (a.renew(first.token), a.retry(first.token, dead=True)):
        with pytest.raises(LeaseLost):
            await stale
    assert (await store.get(lease_key("default", "q", seg))).data == before  # untouched
    state = decode_lease(before).items[0]
    assert (state.s, state.v, state.t) == (LEASED, 2, second.lease_deadline_ms)
    await b.complete([second.token])
    assert await a.lease("q", 1) == []


async def test_two_engines_with_clocks_30s_apart(store: Store, kind: str) -> None:
    """Engine B's clock runs 30 s ahead: it sees A's leases as long expired and
    takes items from under A. Redeliveries happen; losses and double
    completions never do."""
    items = 40 if kind == "seaweed" else 150
    real = SystemClock()
    a = make_engine(store, real)
    b = make_engine(store, OffsetClock(real, 30))
    await _queue(a, lease_timeout=5)
    ids = await a.produce("q", [f"item-{n}".encode() for n in range(items)])
    completed: Counter[str] = Counter()
    refused = 0

    async def worker(e: Engine) -> None:
        nonlocal refused
        idle = 0
        while idle < 3 and sum(completed.values()) < items:
            got = await e.lease("q", 7, wait=0.2)
            idle = 0 if got else idle + 1
            await asyncio.sleep(0.01)  # "work"; gives the other engine time to steal
            results = await asyncio.gather(
                *(e.complete([i.token]) for i in got), return_exceptions=True
            )
            for item, r in zip(got, results, strict=True):
                if r is None:
                    completed[item.id] += 1
                elif isinstance(r, LeaseLost):
                    refused += 1
                else:
                    raise r

    await asyncio.wait_for(
        asyncio.gather(worker(a), worker(a), worker(b), worker(b)), timeout=240
    )
    assert set(completed) == set(ids), "an item was lost"
    assert max(completed.values()) == 1, "a delivery was completed twice"
    assert (await a.stats("q")).completed == items
    print(f"\n{kind}: {items} items, {refused} stale completions refused, none lost or doubled")


async def test_crash_between_segment_write_and_manifest_cas(store: Store) -> None:
    faulty = FaultyStore(store)
    clock = ManualClock()
    e = make_engine(faulty, clock, linger=0.02)
    await _queue(e)
    faulty.inject("put", "crash", key="/manifests/")
    results = await asyncio.gather(
        *(e.produce("q", [f"{n}".encode(), b"x"]) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, SimulatedCrash) for r in results), results  # never reported done
    orphans = [o async for o in list_all(store, "default/segments/q/")]
    assert len(orphans) == 1  # the segment was written, then the "process" died
    survivor = make_engine(store, clock)
    assert await survivor.lease("q", 10) == []
    stats = await survivor.stats("q")
    assert (stats.available, stats.segments) == (0, 0)


@pytest.mark.parametrize("target", ["/manifests/", "/segments/", "/leases/"])
async def test_ambiguous_writes_are_resolved_by_rereading(store: Store, target: str) -> None:
    faulty = FaultyStore(store)
    clock = ManualClock()
    e = make_engine(faulty, clock)
    await _queue(e)
    faulty.inject("put", "ambiguous", key=target, times=2)  # landed, but we saw an error
    faulty.inject("put", "error", key=target, times=1)  # did not land
    ids = await e.produce("q", [b"a", b"b"])
    got = await e.lease("q", 10)
    await e.complete([got[0].token])
    await e.retry(got[1].token)
    assert [m for _, _, m in faulty.injected].count("ambiguous") >= 1
    manifest = await read_manifest(store, "default", "q")
    assert len(manifest.segments) == 1 and manifest.produced == 2  # published once
    assert sorted(i.id for i in got) == sorted(ids)
    other = make_engine(store, clock)
    again = await other.lease("q", 10)
    assert [i.payload for i in again] == [b"b"]  # completed once, retried once
    assert again[0].attempts == 2


async def test_unpublished_segment_is_never_visible(store: Store) -> None:
    clock = ManualClock()
    e = make_engine(store, clock)
    await _queue(e)
    now = clock.now_ms()
    sid = new_segment_id(now)
    stray = Segment(sid, "q", now, now + 60_000, [SegmentItem(b"ghost")])
    await store.put(segment_key("default", "q", sid), encode_segment(stray), if_none_match=True)
    assert await e.lease("q", 10) == []
    assert (await e.stats("q")).available == 0


async def test_writer_past_its_publish_deadline_does_not_publish(store: Store) -> None:
    faulty = FaultyStore(store)
    clock = ManualClock()
    e = make_engine(faulty, clock, publish_timeout=60)
    await _queue(e)
    faulty.inject("put", "latency", key="/segments/", delay=0.3)  # a stalled writer

    async def time_passes() -> None:
        await asyncio.sleep(0.1)
        clock.advance(61)

    results = await asyncio.gather(e.produce("q", [b"late"]), time_passes(),
                                   return_exceptions=True)
    assert isinstance(results[0], PublishAborted), results
    assert len([o async for o in list_all(store, "default/segments/q/")]) == 1  # an orphan
    assert await make_engine(store, clock).lease("q", 10) == []
    await e.produce("q", [b"retried"])  # retrying the produce is safe
    assert [i.payload for i in await e.lease("q", 10)] == [b"retried"]


async def test_writer_behind_the_gc_floor_does_not_publish(store: Store) -> None:
    """The writer's segment write stalls until the collector has raised the floor
    past it (an event, not a race of sleeps: a collector's CAS on a busy
    SeaweedFS can take longer than a fixed head start)."""
    stalled, floor_raised = asyncio.Event(), asyncio.Event()

    class StalledSegments(FaultyStore):
        async def put(self, key: str, data: bytes, **kw: Any) -> str:
            if "/segments/" in key and not floor_raised.is_set():
                stalled.set()
                await floor_raised.wait()
            return await super().put(key, data, **kw)

    faulty = StalledSegments(store)
    clock = ManualClock()
    e = make_engine(faulty, clock)
    await _queue(e)
    collector = make_engine(store, clock)

    async def collector_raises_floor() -> None:
        await stalled.wait()
        clock.advance(1)
        cell = collector.runtime.manifest_cell("q")

        def raise_floor(m: object, now: int) -> None:
            m.gc_floor_ms = now - 500  # type: ignore[attr-defined]

        await cell.update(raise_floor)
        floor_raised.set()

    results = await asyncio.gather(e.produce("q", [b"stalled"]), collector_raises_floor(),
                                   return_exceptions=True)
    assert isinstance(results[0], PublishAborted), results
    assert await collector.lease("q", 10) == []
    await e.produce("q", [b"after"])
    clock.advance(1)  # past the collector's manifest cache age
    assert [i.payload for i in await collector.lease("q", 10)] == [b"after"]
