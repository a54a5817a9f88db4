"""queue.stats on its quick path: segments never leased are counted from the
manifest when their entry says every item is due, the others are read.

Each test counts with a second engine (an empty segment cache, as on another
node) over a CountingStore, so that the requests show which objects were read.
Most tests first pad the queue past ``STATS_LIST_ABOVE`` segments with newer
never-leased ones, so that stats LIST the lease objects; the pads cost no
request. Stores: memory and file (S3 stores run the stats checks of
test_engine.py, on queues of a few segments, and test_node.py's).
"""

from __future__ import annotations

import pytest

from compactor import Compactor, CompactorOptions
from okq import Engine, ManualClock, NewItem, QueueConfig
from okq.keys import manifest_key
from okq.model import SegmentMeta, decode_manifest, encode_manifest
from okq.store import CountingStore, Store
from okq.views import STATS_LIST_ABOVE, QueueStats
from tests.engines import make_engine
from tests.stores import StoreFactory

NS = "default"
PAD = STATS_LIST_ABOVE  # with a segment of the test's own, stats LIST


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, store_factory: StoreFactory) -> Store:
    return await store_factory(request.param)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def engine(store: Store, clock: ManualClock) -> Engine:
    # Whole manifests (no chunks): these tests count the requests stats makes of
    # segments and lease objects; a cold engine's chunk reads are test_engine.py's.
    e = make_engine(store, clock, manifest_chunk=0)
    await e.create_queue("q", QueueConfig(lease_timeout=10))
    return e


async def pad(engine: Engine) -> None:
    """PAD single-item segments, produced now and never leased."""
    for _ in range(PAD):
        await engine.produce("q", [b"pad"])


async def counted(store: Store, clock: ManualClock) -> tuple[QueueStats, dict[str, int]]:
    """Stats of queue q read by a fresh engine, and the requests that took."""
    counting = CountingStore(store)
    stats = await make_engine(counting, clock, manifest_chunk=0).stats("q")
    return stats, dict(counting.requests)


def counts(s: QueueStats, items: int = PAD, segments: int | None = None) -> dict[str, int]:
    """The non-zero counts, the pads taken off (``items`` in ``segments``)."""
    segments = items if segments is None else segments
    got = {"available": s.available - items, "segments": s.segments - segments}
    for name in ("in_flight", "scheduled", "waiting_retry", "completed", "dead_lettered",
                 "redriven"):
        got[name] = getattr(s, name)
    return {k: v for k, v in got.items() if v}


async def test_never_leased_due_segments_are_counted_unread(
        engine: Engine, store: Store, clock: ManualClock) -> None:
    for n in range(3):
        await engine.produce("q", [b"x"] * (n + 2))
        clock.advance(1)
    await pad(engine)
    s, requests = await counted(store, clock)
    assert counts(s) == {"available": 9, "segments": 3}
    assert s.oldest_age_s == 3.0
    assert requests == {"get": 1, "list": 1}  # the manifest and the lease objects' LIST


async def test_scheduled_items_in_a_segment_without_lease_object(
        engine: Engine, store: Store, clock: ManualClock) -> None:
    now = clock.now_ms()
    await engine.produce("q", [NewItem(b"later", enqueue_at_ms=now + 5_000), NewItem(b"now")])
    clock.advance(1)
    await engine.produce("q", [b"plain"])
    await pad(engine)
    s, requests = await counted(store, clock)
    assert counts(s) == {"available": 2, "scheduled": 1, "segments": 2}
    assert s.oldest_age_s == 1.0
    assert requests == {"get": 2, "list": 1}  # the scheduled item's segment is read
    clock.advance(5)
    s, requests = await counted(store, clock)
    assert counts(s) == {"available": 3, "segments": 2}
    assert s.oldest_age_s == 6.0
    assert requests == {"get": 1, "list": 1}  # all due now: the manifest tells


async def test_mix_of_fresh_and_leased_segments(
        engine: Engine, store: Store, clock: ManualClock) -> None:
    now = clock.now_ms()
    await engine.produce("q", [b"a0", b"a1", b"a2"])
    clock.advance(1)
    await engine.produce("q", [b"b0", b"b1", b"b2"])
    clock.advance(1)
    await engine.produce("q", [NewItem(b"c0", enqueue_at_ms=now + 5_000), NewItem(b"c1")])
    await pad(engine)
    a0, a1, a2 = await engine.lease("q", 3)
    assert [a0.payload, a1.payload, a2.payload] == [b"a0", b"a1", b"a2"]
    await engine.complete([a0.token])
    await engine.retry(a1.token, retry_at_ms=now + 8_000)
    s, requests = await counted(store, clock)
    assert counts(s) == {"available": 4, "in_flight": 1, "scheduled": 1, "waiting_retry": 1,
                         "completed": 1, "segments": 3}
    assert s.oldest_age_s == 1.0  # b0: segment a holds nothing available
    # the manifest, a's lease object (its entries tell everything), c's items (c0 is
    # scheduled); b is counted from the manifest
    assert requests == {"get": 3, "list": 1}
    clock.advance(4)  # c0 due
    s, requests = await counted(store, clock)
    assert counts(s) == {"available": 5, "in_flight": 1, "waiting_retry": 1, "completed": 1,
                         "segments": 3}
    assert requests == {"get": 2, "list": 1}
    clock.advance(6)  # a1's retry due, a2's lease expired: available again, and oldest
    s, _ = await counted(store, clock)
    assert counts(s) == {"available": 7, "completed": 1, "segments": 3}
    assert s.oldest_age_s == 12.0


async def test_a_queue_of_few_segments_reads_each_lease_object_and_no_list(
        engine: Engine, store: Store, clock: ManualClock) -> None:
    now = clock.now_ms()
    await engine.produce("q", [b"a0", b"a1"])
    clock.advance(1)
    await engine.produce("q", [NewItem(b"b0", enqueue_at_ms=now + 5_000), NewItem(b"b1")])
    (got,) = await engine.lease("q", 1)
    assert got.payload == b"a0"
    s, requests = await counted(store, clock)
    assert counts(s, 0) == {"available": 2, "in_flight": 1, "scheduled": 1,
                                   "segments": 2}
    assert s.oldest_age_s == 1.0
    # the manifest, both lease objects (b has none: a GET that finds nothing), b's items
    assert requests == {"get": 4}


async def old_format(store: Store) -> None:
    """Rewrite q's manifest as an okq without ``last_due_ms`` would have written it."""
    blob = await store.get(manifest_key(NS, "q"))
    m = decode_manifest(blob.data)
    for sm in m.segments:
        sm.last_due_ms = sm.seq = None  # seq came later still
        assert len(sm.pack()) == 4
    await store.put(manifest_key(NS, "q"), encode_manifest(m), if_match=blob.etag)


async def test_segments_listed_without_last_due_are_read(
        engine: Engine, store: Store, clock: ManualClock) -> None:
    now = clock.now_ms()
    await engine.produce("q", [NewItem(b"later", enqueue_at_ms=now + 5_000), NewItem(b"now")])
    clock.advance(1)
    await engine.produce("q", [b"b0", b"b1"])
    await pad(engine)
    (got,) = await engine.lease("q", 1)
    assert got.payload == b"now"
    await old_format(store)
    clock.advance(2)
    s, requests = await counted(store, clock)
    assert counts(s) == {"available": 2, "in_flight": 1, "scheduled": 1, "segments": 2}
    assert s.oldest_age_s == 2.0
    # the manifest, the first segment's lease object, and every segment (pads too)
    assert requests == {"get": 2 + 2 + PAD, "list": 1}


def test_segment_meta_last_due_is_an_optional_trailing_field() -> None:
    old = ["s", 3, 1_000, 99]
    assert SegmentMeta.unpack(old).last_due_ms is None
    assert SegmentMeta.unpack(old).pack() == old
    merged_old = [*old, 400]
    assert SegmentMeta.unpack(merged_old).pack() == merged_old
    new = SegmentMeta("s", 3, 1_000, 99, None, 0)
    assert new.pack() == ["s", 3, 1_000, 99, None, 0]
    assert SegmentMeta.unpack(new.pack()) == new
    # a reader that knows four or five fields finds them where they always were
    assert new.pack()[:5] == ["s", 3, 1_000, 99, None]


async def merge_all(store: Store, clock: ManualClock) -> None:
    """One compactor pass that merges the queue's narrow segments into one."""
    opts = CompactorOptions(safety_age=0.0, lease_grace=0.0, min_age=0.0)
    report = await Compactor(make_engine(store, clock), clock=clock, options=opts).run_once()
    assert report.segments_merged == 3 + PAD


async def test_merged_segment_with_scheduled_items_is_read(
        engine: Engine, store: Store, clock: ManualClock) -> None:
    now = clock.now_ms()
    await engine.produce("q", [b"a0", b"a1"])
    clock.advance(1)
    await engine.produce("q", [b"b0"])
    clock.advance(1)
    await engine.produce("q", [NewItem(b"c0", enqueue_at_ms=now + 60_000)])
    await pad(engine)
    await merge_all(store, clock)
    await pad(engine)  # past the LIST threshold again
    clock.advance(10)
    s, requests = await counted(store, clock)
    assert counts(s, 2 * PAD, PAD) == {"available": 3, "scheduled": 1, "segments": 1}
    assert s.oldest_age_s == 12.0
    assert requests == {"get": 2, "list": 1}  # c0 is scheduled: the merged segment is read
    (got,) = await engine.lease("q", 1)
    await engine.complete([got.token])
    clock.advance(60)  # c0 due
    s, _ = await counted(store, clock)
    assert counts(s, 2 * PAD, PAD) == {"available": 3, "completed": 1, "segments": 1}
    assert s.oldest_age_s == 72.0  # a1, carried over with its produce time


async def test_merged_segment_with_nothing_scheduled_is_counted_unread(
        engine: Engine, store: Store, clock: ManualClock) -> None:
    for n in range(3):
        await engine.produce("q", [f"{n}".encode()] * 2)
        clock.advance(1)
    await pad(engine)
    await merge_all(store, clock)
    await pad(engine)
    clock.advance(10)
    s, requests = await counted(store, clock)
    assert counts(s, 2 * PAD, PAD) == {"available": 6, "segments": 1}
    assert s.oldest_age_s == 13.0  # the first item's produce time, kept by the merge
    assert requests == {"get": 1, "list": 1}


async def test_merged_segment_whose_oldest_item_was_scheduled_is_read(
        engine: Engine, store: Store, clock: ManualClock) -> None:
    now = clock.now_ms()
    await engine.produce("q", [NewItem(b"x", enqueue_at_ms=now + 5_000)])
    clock.advance(1)
    await engine.produce("q", [b"y"])
    clock.advance(1)
    await engine.produce("q", [b"z"])
    await pad(engine)
    await merge_all(store, clock)
    await pad(engine)
    clock.advance(10)  # x due: every item is, but the merge's bound is y's produce time
    s, requests = await counted(store, clock)
    assert counts(s, 2 * PAD, PAD) == {"available": 3, "segments": 1}
    assert s.oldest_age_s == 12.0  # x's produce time, which only its item tells
    assert requests == {"get": 2, "list": 1}
