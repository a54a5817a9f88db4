"""Regression tests for promises docs/DESIGN.md makes and a review found broken
(issue 8): ambiguous writes overwritten before the re-read, sealed segments,
clock skew, outputs of a completion, stale settings and the idempotency map.

Each test names the defect it pins down. They run on the memory and file stores
with manual clocks; the real-process versions of the ambiguous-write tests are
in tests/acceptance/test_ambiguous_writes.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from compactor import Compactor, CompactorOptions
from okq import Engine, LeasedItem, ManualClock, NewItem, QueueConfig
from okq.clock import OffsetClock
from okq.errors import LeaseLost, Overloaded, QueueNotFound
from okq.keys import lease_key, manifest_key
from okq.leases import DEAD, decode_lease
from okq.manifests import read_manifest
from okq.store import CountingStore, FaultyStore, SimulatedCrash, Store, list_all
from tests.engines import make_engine

pytestmark = pytest.mark.parametrize("kind", ["memory", "file"])


def overtake(store: FaultyStore, match: str, then: Callable[[], Awaitable[object]]) -> None:
    """The next PUT to a key containing ``match`` lands, then another writer acts
    (``then``), then the caller sees an error: the reply was lost, and someone
    wrote on top before the caller could re-read."""
    store.inject("put", "overtaken", key=match, then=lambda key: then())


def fired(store: FaultyStore) -> int:
    return sum(1 for *_, mode in store.injected if mode == "overtaken")


async def drain(e: Engine, queue: str) -> list[bytes]:
    """Lease and complete everything ready; the payloads, in delivery order."""
    got: list[bytes] = []
    while items := await e.lease(queue, 100):
        await e.complete([i.token for i in items])
        got.extend(i.payload for i in items)
    return got


# -- defect 1: ambiguous manifest write, then overwritten ------------------------------


async def test_overwritten_ambiguous_publish_is_published_once(store: Store) -> None:
    clock = ManualClock()
    flaky = FaultyStore(store)
    a, b = make_engine(flaky, clock), make_engine(store, clock)
    await a.create_queue("q")
    await a.produce("q", [b"warm"])  # a's manifest cache is warm
    overtake(flaky, manifest_key("default", "q"), lambda: b.produce("q", [b"from-b"]))
    ids = await a.produce("q", [b"a1", b"a2", b"a3", b"a4"])
    assert fired(flaky) == 1 and len(ids) == 4
    m = await read_manifest(store, "default", "q")
    assert len({s.id for s in m.segments}) == len(m.segments) == 3
    assert m.produced == 6
    got = await drain(make_engine(store, clock), "q")
    assert Counter(got) == Counter([b"warm", b"from-b", b"a1", b"a2", b"a3", b"a4"])


async def test_publish_overwritten_by_a_compactor_merge_is_published_once(
        store: Store) -> None:
    """The campaign's variant: between the landed write and the re-read a
    compactor pass merges segments. A segment is never merged before every
    publisher's deadline for it has passed, so the re-apply finds it listed."""
    clock = ManualClock()
    flaky = FaultyStore(store)
    a, b = make_engine(flaky, clock), make_engine(store, clock)
    compactor = Compactor(make_engine(store, clock), clock=clock,
                          options=CompactorOptions(safety_age=3600, lease_grace=60))
    await a.create_queue("q")
    await b.produce("q", [b"older"])

    async def other_writers() -> None:
        await b.produce("q", [b"from-b"])
        await compactor.run_once()

    overtake(flaky, manifest_key("default", "q"), other_writers)
    await a.produce("q", [b"a1", b"a2", b"a3", b"a4"])
    for _ in range(3):  # later passes, long after every deadline
        clock.advance(600)
        await compactor.run_once()
    got = await drain(make_engine(store, clock), "q")
    assert Counter(got) == Counter([b"older", b"from-b", b"a1", b"a2", b"a3", b"a4"])


# -- defect 2: ambiguous lease write, then overwritten ---------------------------------


async def test_overwritten_ambiguous_lease_returns_its_items(store: Store) -> None:
    clock = ManualClock()
    flaky = FaultyStore(store)
    a, b = make_engine(flaky, clock), make_engine(store, clock)
    await a.create_queue("q", QueueConfig(max_attempts=1))
    await a.produce("q", [b"first", b"second"])
    taken: list[bytes] = []

    async def b_leases() -> None:
        taken.extend(i.payload for i in await b.lease("q", 1))

    overtake(flaky, "/leases/q/", b_leases)
    got = await a.lease("q", 1)
    assert fired(flaky) == 1
    assert [i.payload for i in got] == [b"first"]  # a's own lease, recognised
    assert taken == [b"second"]
    await a.complete([got[0].token])
    stats = await a.stats("q")
    assert (stats.completed, stats.in_flight, stats.dead_lettered) == (1, 1, 0)


async def test_overwritten_ambiguous_retry_reports_what_it_did(store: Store) -> None:
    clock = ManualClock()
    flaky = FaultyStore(store)
    a, b = make_engine(flaky, clock), make_engine(store, clock)
    await a.create_queue("q")
    await a.produce("q", [b"first", b"second"])
    (first,) = await a.lease("q", 1)
    (second,) = await b.lease("q", 1)
    overtake(flaky, "/leases/q/", lambda: b.complete([second.token]))
    await a.retry(first.token, error="try again")  # landed: no lease_lost
    again = await b.lease("q", 1)
    assert [i.payload for i in again] == [b"first"] and again[0].attempts == 2


# -- defect 3: sealed segments stall the queue -----------------------------------------


async def test_lease_skips_sealed_segments(store: Store) -> None:
    clock = ManualClock()
    e = make_engine(store, clock)
    await e.create_queue("q")
    first = await e.produce("q", [b"sealed-1", b"sealed-2"])
    clock.advance(0.01)
    await e.produce("q", [b"ready-1", b"ready-2"])
    sealed = first[0].split(".")[0]

    def seal(obj: object, now: int) -> None:  # as a compactor does before it merges
        obj.sealed = True  # type: ignore[attr-defined]

    await make_engine(store, clock).runtime.lease_cell("q", sealed).update(seal)
    fresh = make_engine(store, clock)
    got = [i.payload for i in await fresh.lease("q", 1)]
    assert got == [b"ready-1"]
    got += [i.payload for i in await e.lease("q", 5)]  # an engine with a cached copy
    assert sorted(got) == [b"ready-1", b"ready-2"]


# -- defects 4 and 5: clock skew -------------------------------------------------------


async def test_idempotency_window_holds_under_clock_skew(store: Store) -> None:
    """A key written by a clock 60 s behind is still honoured 300 s later (true
    time) by a node whose clock is 60 s ahead."""
    true = ManualClock()
    behind = make_engine(store, OffsetClock(true, -60))
    ahead = make_engine(store, OffsetClock(true, +60))
    await behind.create_queue("q")
    first = await behind.produce("q", [NewItem(b"x", key="order-1")])
    true.advance(299)
    again = await ahead.produce("q", [NewItem(b"x", key="order-1")])
    assert again == first
    assert [i.payload for i in await ahead.lease("q", 10)] == [b"x"]


async def test_fresh_items_are_leasable_at_once_whatever_the_clocks(store: Store) -> None:
    true = ManualClock()
    producer = make_engine(store, OffsetClock(true, +60))
    consumer = make_engine(store, OffsetClock(true, -60))
    await producer.create_queue("q")
    await producer.produce("q", [b"now", NewItem(b"later", enqueue_at_ms=true.now_ms() + 600_000)])
    stats = await consumer.stats("q")
    assert (stats.available, stats.scheduled) == (1, 1)
    (item,) = await consumer.lease("q", 10)
    assert item.payload == b"now"
    browsed, _ = await consumer.browse("q")
    assert {i.payload: i.state for i in browsed} == {b"now": "leased", b"later": "scheduled"}


# -- defect 7: outputs published twice after a late help -------------------------------


def _nth_put(match: str, n: int) -> Callable[[str], bool]:
    seen = [0]

    def hit(key: str) -> bool:
        if match not in key:
            return False
        seen[0] += 1
        return seen[0] == n

    return hit


async def _outputs_published_then_crash(store: Store) -> tuple[ManualClock, LeasedItem, Engine]:
    """A completion with outputs (``in`` -> ``out``) whose node dies after publishing
    them, before P -> D: the clock, the leased item, and another engine on the store."""
    clock = ManualClock()
    faulty = FaultyStore(store)
    e = make_engine(faulty, clock)
    await e.create_queue("in")
    await e.create_queue("out")
    await e.produce("in", [b"job"])
    (item,) = await e.lease("in", 1)
    # The completion (L -> P) lands, the outputs are published, then the node
    # dies before P -> D: the second PUT to the input's lease object.
    faulty.inject("put", "crash", key=_nth_put("/leases/in/", 2))
    with pytest.raises(SimulatedCrash):
        await e.complete_and_produce(item.token, "out", [b"result"])
    return clock, item, make_engine(store, clock)


async def test_outputs_published_once_however_late_the_help(store: Store) -> None:
    clock, item, other = await _outputs_published_then_crash(store)
    await other.produce("out", [b"unrelated"])
    clock.advance(1000)  # past the idempotency window: the marker is gone
    compactor = Compactor(make_engine(store, clock), clock=clock,
                          options=CompactorOptions(safety_age=3600, lease_grace=60))
    await compactor.compact_queue("out")  # merges the outputs segment away
    clock.advance(1)
    await compactor.compact_queue("in")  # the late help
    await compactor.compact_queue("out")
    got = await drain(make_engine(store, clock), "out")
    assert Counter(got) == Counter([b"result", b"unrelated"])
    st = decode_lease((await store.get(lease_key("default", "in", item.id.split(".")[0]))).data)
    assert st.items[0].s == "D"


# -- defect 8: outputs acknowledged but never published --------------------------------


async def test_outputs_to_a_deleted_queue_are_refused_and_the_item_dead_lettered(
        store: Store) -> None:
    clock = ManualClock()
    a, b = make_engine(store, clock), make_engine(store, clock)
    await a.create_queue("dlq")
    await a.create_queue("in", QueueConfig(dead_queue="dlq"))
    await a.create_queue("out")
    await a.produce("in", [b"job"])
    await a.produce("out", [b"warm"])  # a's copy of out's manifest is cached
    (item,) = await a.lease("in", 1)
    await b.delete_queue("out")
    with pytest.raises(QueueNotFound, match="did not take"):
        await a.complete_and_produce(item.token, "out", [b"result"])
    (dead,) = await b.lease("dlq", 1)
    assert dead.payload == b"job"
    assert dead.meta is not None and "outputs" in dead.meta["error"]
    st = decode_lease((await store.get(lease_key("default", "in", item.id.split(".")[0]))).data)
    assert st.items[0].s == DEAD
    assert (await a.stats("in")).available == 0


# -- defect 10: the idempotency map ----------------------------------------------------


async def test_keyed_publish_is_linear_in_the_batch(store: Store) -> None:
    """Publishing 1,000 keyed items next to 15,000 live keys costs about what it
    costs next to none (today's code rebuilt the whole map for every key)."""
    clock = ManualClock()
    e = make_engine(store, clock, max_idem_keys=20_000)
    await e.create_queue("small")
    await e.create_queue("big")
    for n in range(15):
        await e.produce("big", [NewItem(b"x", key=f"old-{n}-{k}") for k in range(1000)])

    async def timed(queue: str, tag: str) -> float:
        began = time.process_time()
        await e.produce(queue, [NewItem(b"y", key=f"{tag}-{k}") for k in range(1000)])
        return time.process_time() - began

    small = min([await timed("small", f"s{n}") for n in range(3)])
    big = min([await timed("big", f"b{n}") for n in range(3)])
    assert big < 20 * max(small, 0.005), (small, big)


async def test_the_idempotency_map_is_bounded(store: Store) -> None:
    clock = ManualClock()
    e = make_engine(store, clock, max_idem_keys=50)
    await e.create_queue("q")
    await e.produce("q", [NewItem(b"x", key=f"k{n}") for n in range(50)])
    with pytest.raises(Overloaded, match="idempotency keys"):
        await e.produce("q", [NewItem(b"x", key="one-more")])
    await e.produce("q", [b"unkeyed is fine"])
    clock.advance(e.opts.idem_window + 2 * e.opts.max_clock_skew + 1)
    await e.produce("q", [NewItem(b"x", key="one-more")])  # the old keys expired
    m = await read_manifest(store, "default", "q")
    assert len(m.idem) <= 50


# -- defect 12: stale settings drop items ----------------------------------------------


async def test_retry_dead_letters_by_the_settings_of_now(store: Store) -> None:
    clock = ManualClock()
    a, b = make_engine(store, clock), make_engine(store, clock)
    await a.create_queue("dlq")
    await a.create_queue("q", QueueConfig(max_attempts=1))
    await a.produce("q", [b"job"])
    await b.get_queue("q")
    await b.stats("q")  # b holds the settings: no dead queue
    await a.update_queue("q", dead_queue="dlq")
    (item,) = await a.lease("q", 1)
    await b.retry(item.token, error="boom")
    (dead,) = await a.lease("dlq", 1)
    assert dead.payload == b"job"


async def test_raised_max_attempts_counts_at_once(store: Store) -> None:
    clock = ManualClock()
    a, b = make_engine(store, clock), make_engine(store, clock)
    await a.create_queue("dlq")
    await a.create_queue("q", QueueConfig(max_attempts=1, dead_queue="dlq", lease_timeout=5))
    await a.produce("q", [b"job"])
    await a.lease("q", 1)
    clock.advance(6)  # the lease expired
    await b.get_queue("q")  # b caches the settings: one attempt
    await a.update_queue("q", max_attempts=5)
    again = await b.lease("q", 1)
    assert [i.payload for i in again] == [b"job"] and again[0].attempts == 2
    await b.retry(again[0].token)
    third = await a.lease("q", 1)
    assert [i.attempts for i in third] == [3]
    assert await a.lease("dlq", 1) == []


# -- purge, the other non-idempotent manifest change -----------------------------------


async def test_overwritten_ambiguous_purge_spares_later_produces(store: Store) -> None:
    clock = ManualClock()
    flaky = FaultyStore(store)
    a, b = make_engine(flaky, clock), make_engine(store, clock)
    await a.create_queue("q")
    await a.produce("q", [b"old"])
    overtake(flaky, manifest_key("default", "q"), lambda: b.produce("q", [b"after the purge"]))
    await a.purge("q")
    assert await drain(make_engine(store, clock), "q") == [b"after the purge"]


async def test_publish_purged_before_its_re_read_is_not_published_again(
        store: Store) -> None:
    clock = ManualClock()
    flaky = FaultyStore(store)
    a, b = make_engine(flaky, clock), make_engine(store, clock)
    await a.create_queue("q")
    await a.produce("q", [b"warm"])
    overtake(flaky, manifest_key("default", "q"), lambda: b.purge("q"))
    await a.produce("q", [b"purged"])  # landed, then purged: a success, and gone
    await b.produce("q", [b"new"])
    assert await drain(make_engine(store, clock), "q") == [b"new"]


async def _keys(store: Store, prefix: str) -> AsyncIterator[str]:
    async for info in list_all(store, prefix):
        yield info.key


# -- decisions the review asked for --------------------------------------------------


async def test_completion_after_compaction_says_what_happened(store: Store) -> None:
    clock = ManualClock()
    e = make_engine(store, clock)
    await e.create_queue("q")
    await e.produce("q", [b"job"])
    (item,) = await e.lease("q", 1)
    await e.complete([item.token])
    await e.complete([item.token])  # a retried completion succeeds again
    options = CompactorOptions(safety_age=0, lease_grace=0)
    options.min_age = 0  # fold what was just completed
    compactor = Compactor(make_engine(store, clock), clock=clock, options=options)
    clock.advance(100)  # past the publish timeout: the GC floor passes the segment
    await compactor.run_once()
    clock.advance(1)
    await compactor.run_once()  # folded, and the segment and lease objects collected
    assert [k async for k in _keys(store, "default/leases/")] == []
    with pytest.raises(LeaseLost) as err:
        await e.complete([item.token])
    assert "compacted away" in err.value.details["failed"][0]["reason"]


async def test_a_dead_letter_move_does_not_hold_the_queue(store: Store) -> None:
    """Moving an item to the dead-letter queue (a produce there, with its linger
    and CAS) happens after the lease walk lets go of the queue's lock."""
    clock = ManualClock()
    flaky = FaultyStore(store)
    e = make_engine(flaky, clock)
    await e.create_queue("dlq")
    await e.create_queue("q", QueueConfig(max_attempts=1, lease_timeout=5, dead_queue="dlq"))
    await e.produce("q", [b"poison"])
    await e.lease("q", 1)
    clock.advance(6)  # expired, out of attempts: the next walk dead-letters it
    await e.produce("q", [b"fine-1", b"fine-2"])
    other: list[bytes] = []

    async def another_lease_meanwhile() -> None:
        got = await asyncio.wait_for(e.lease("q", 1), 5)
        other.extend(i.payload for i in got)

    overtake(flaky, manifest_key("default", "dlq"), another_lease_meanwhile)
    assert [i.payload for i in await e.lease("q", 1)] == [b"fine-1"]
    assert other == [b"fine-2"]
    (dead,) = await e.lease("dlq", 1)
    assert dead.payload == b"poison"


async def test_lease_rereads_of_busy_segments_are_bounded(store: Store) -> None:
    """Long-running jobs in many segments: a lease call re-reads at most
    ``lease_state_reads`` lease objects that hold leases, not one per segment."""
    clock = ManualClock()
    counting = CountingStore(store)
    e = make_engine(counting, clock)
    await e.create_queue("q", QueueConfig(lease_timeout=3600))
    for n in range(20):
        await e.produce("q", [f"long-{n}".encode()])
        clock.advance(0.01)
    assert len(await e.lease("q", 20)) == 20  # every segment now holds a lease
    assert await e.lease("q", 1) == []
    await e.produce("q", [b"new"])
    clock.advance(2)  # every cached lease object is older than lease_state_max_age
    before = counting.requests["get"]
    assert [i.payload for i in await e.lease("q", 1)] == [b"new"]
    gets = counting.requests["get"] - before
    assert gets <= 4 + 3, gets  # lease_state_reads (4), the manifest, the new segment


async def test_redrive_to_a_queue_deleted_meanwhile_keeps_the_dead_letter(
        store: Store) -> None:
    """The source queue goes away between the redrive's check and its publish:
    the dead letter waits in the dead queue again, it is not dropped."""
    clock = ManualClock()
    flaky = FaultyStore(store)
    e, other = make_engine(flaky, clock), make_engine(store, clock)
    await e.create_queue("dlq")
    await e.create_queue("q", QueueConfig(dead_queue="dlq"))
    await e.produce("q", [b"job"])
    (item,) = await e.lease("q", 1)
    await e.retry(item.token, dead=True, error="boom")
    overtake(flaky, "/leases/dlq/", lambda: other.delete_queue("q"))
    with pytest.raises(QueueNotFound):
        await e.redrive("dlq")
    clock.advance(61)
    (back,) = await other.lease("dlq", 1)
    assert back.payload == b"job" and back.meta is not None
    assert back.meta["source_queue"] == "q"


# -- issue 19: a purge and a late help; a queue deleted and made again -------------


async def test_a_purge_stops_a_late_help_from_publishing_outputs_again(store: Store) -> None:
    """Outputs published, the node dead before P -> D, the outputs segment purged
    when it is older than the purge's young window and was never leased, and the
    compactor down until the marker expired: the late help must not bring the
    purged outputs back."""
    clock, item, other = await _outputs_published_then_crash(store)
    clock.advance(301)  # publish timeout + 4 x skew bound: no longer "young"
    await other.purge("out")
    clock.advance(600)  # past the idempotency window: the marker is gone
    assert await other.lease("in", 10) == []  # the late help, on a lease walk
    assert await drain(make_engine(store, clock), "out") == []
    st = decode_lease((await store.get(lease_key("default", "in", item.id.split(".")[0]))).data)
    assert st.items[0].s == "D"  # the completion stands: its outputs were published


async def test_a_purge_forgets_what_it_dropped_once_the_floor_passes_it(store: Store) -> None:
    """What a purge remembers is bounded: the compactor's floor ends it."""
    clock = ManualClock()
    e = make_engine(store, clock)
    await e.create_queue("q")
    await e.produce("q", [b"a"])
    await e.purge("q")
    m = await read_manifest(store, "default", "q")
    assert len(m.purged) == 1
    clock.advance(3601)
    compactor = Compactor(make_engine(store, clock), clock=clock,
                          options=CompactorOptions(safety_age=3600, lease_grace=60))
    await compactor.compact_queue("q")
    m = await read_manifest(store, "default", "q")
    assert m.purged == {} and m.gc_floor_ms > 0


async def test_a_keyed_produce_after_the_queue_was_made_again_lands_in_the_new_queue(
        store: Store) -> None:
    """A key this engine saw in the old queue's manifest (still cached) must not
    answer a produce into the queue made again under the same name."""
    clock = ManualClock()
    producer, admin = make_engine(store, clock), make_engine(store, clock)
    await admin.create_queue("q")
    (first,) = await producer.produce("q", [NewItem(b"old", key="k")])
    await admin.delete_queue("q")
    await admin.create_queue("q")
    (again,) = await producer.produce("q", [NewItem(b"new", key="k")])
    assert again != first
    assert await drain(make_engine(store, clock), "q") == [b"new"]
    # and a key of the new queue still deduplicates
    assert await producer.produce("q", [NewItem(b"dup", key="k")]) == [again]
