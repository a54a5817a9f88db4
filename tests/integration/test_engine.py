"""The queue engine's behaviour, on every store.

Functional tests: each runs on memory, file, SeaweedFS and moto (moto is fine
here: these tests have no concurrent writers to one key across processes).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from okq import Engine, ManualClock, NewItem, QueueConfig
from okq.clock import MAX_CLOCK_SKEW_MS, OffsetClock, SystemClock
from okq.errors import (
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    QueueExists,
    QueueNotFound,
    TooLarge,
)
from okq.model import with_group
from okq.store import CountingStore, Store
from tests.engines import CHUNK, make_engine
from tests.stores import ALL_STORES, S3_STORES

pytestmark = pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=[pytest.mark.s3] if k in S3_STORES else []) for k in ALL_STORES]
)


@pytest.fixture
async def engine(store: Store, clock: ManualClock) -> Engine:
    e = make_engine(store, clock)
    await e.start()
    await e.create_queue("dlq")
    await e.create_queue("q", QueueConfig(lease_timeout=10, max_attempts=3, dead_queue="dlq"))
    return e


async def test_produce_lease_complete(engine: Engine) -> None:
    ids = await engine.produce("q", [b"one", b"two", b"three"])
    assert len(set(ids)) == 3
    got = await engine.lease("q", 2)
    assert [i.payload for i in got] == [b"one", b"two"]
    assert [i.id for i in got] == ids[:2]
    assert all(i.attempts == 1 for i in got)
    await engine.complete([i.token for i in got])
    rest = await engine.lease("q", 10)
    assert [i.payload for i in rest] == [b"three"]
    s = await engine.stats("q")
    assert (s.available, s.in_flight, s.completed) == (0, 1, 2)


@pytest.mark.parametrize("walk", ["standard", "fair", "ordered"])
async def test_a_walk_passes_over_segments_whose_items_are_all_finished(
        engine: Engine, clock: ManualClock, walk: str) -> None:
    name = "q" if walk == "standard" else walk
    if walk != "standard":  # items with groups: a fair walk, or a fifo queue's ordered one
        await engine.create_queue(name, QueueConfig(fifo=walk == "ordered", dead_queue="dlq"))
    for batch in ("a", "b", "c"):  # one segment each, and one group each
        group = None if walk == "standard" else f"g{batch}"
        await engine.produce(name, [NewItem(f"{batch}{n}".encode(), meta=with_group(None, group))
                                    for n in (1, 2)])
    q = engine.runtime.queue(name)
    seg_a, seg_b, seg_c = [sm.id for sm in (await engine.runtime.manifest(q, 0)).segments]
    by_payload = {i.payload: i.token for i in await engine.lease(name, 6)}
    assert len(by_payload) == 6
    await engine.complete([by_payload[p] for p in (b"a1", b"a2", b"b2", b"c2")])
    await engine.retry(by_payload[b"b1"], dead=True)  # dead-lettered: finished too
    await engine.retry(by_payload[b"c1"])  # waiting: leasable again
    again = await engine.lease(name, 6)
    assert [i.payload for i in again] == [b"c1"]
    assert q.finished == {seg_a, seg_b}
    # Passed over unread: the walk no longer looks at their lease objects.
    q.leases.pop(seg_a)
    q.summaries.pop(seg_a)
    await engine.complete([again[0].token])
    clock.advance(2)  # past FAIR_EMPTY_MS: a fair walk goes to the end again
    assert await engine.lease(name, 6) == []
    assert seg_a not in q.leases
    assert q.finished == {seg_a, seg_b, seg_c}


async def test_a_standard_walk_starts_past_the_finished_segments_at_its_front(
        engine: Engine) -> None:
    """A drained queue waiting for its compactor: later walks of the same scan order
    start past its finished segments, and a new segment is walked to all the same."""
    for n in range(5):  # five segments
        await engine.produce("q", [f"m{n}".encode()])
    q = engine.runtime.queue("q")
    while got := await engine.lease("q", 2):
        await engine.complete([i.token for i in got])
    assert await engine.lease("q", 2) == []  # a walk that finds the five finished
    assert len(q.finished) == 5
    assert q.walk_start is not None and q.walk_start[1] == 5
    assert await engine.lease("q", 2) == []  # starts at the end: passes none
    await engine.produce("q", [b"new"])  # a new scan order: counted again from its front
    assert [i.payload for i in await engine.lease("q", 2)] == [b"new"]
    assert q.walk_start is not None and q.walk_start[1] == 5


async def test_a_walk_stops_at_the_first_item_in_flight_and_says_when_one_comes_due(
        engine: Engine, clock: ManualClock) -> None:
    """Items in flight are candidates at the end of their leases, in order: the walk
    stops at the first (nothing after it can be due sooner) and reports its time."""
    await engine.produce("q", [b"a", b"b"])
    await engine.lease("q", 1)
    clock.advance(3)
    await engine.lease("q", 1)  # b's lease ends 3 s after a's
    await engine.produce("q", [b"c"])  # a second segment, behind the first
    q = engine.runtime.queue("q")
    m = await engine.runtime.manifest(q, 0)
    picks, next_ready = await engine.scheduler._pick(q, m, 10)
    assert [p[2] for p in picks] == [0]  # c, index 0 of its segment
    assert next_ready == clock.now_ms() - 3000 + 10_000  # when a's lease ends
    assert [i.payload for i in await engine.lease("q", 10)] == [b"c"]
    clock.advance(7)  # a's lease is over, b's is not
    assert [i.payload for i in await engine.lease("q", 10)] == [b"a"]


async def test_a_fresh_item_from_a_clock_ahead_behind_items_in_flight_is_leased(
        store: Store, clock: ManualClock) -> None:
    """A segment whose producer's clock is ahead orders its fresh items after the
    items of it leased since (by the reader's clock): the walk does not stop at those
    in flight before it reaches the fresh ones."""
    ahead = make_engine(store, OffsetClock(clock, 30))
    reader = make_engine(store, clock)
    for e in (ahead, reader):
        await e.start()
    await reader.create_queue("q", QueueConfig(lease_timeout=10))
    await ahead.produce("q", [b"a", b"b", b"c"])  # born 30 s ahead of the reader
    assert [i.payload for i in await reader.lease("q", 1)] == [b"a"]  # in flight until +10 s
    assert [i.payload for i in await reader.lease("q", 5)] == [b"b", b"c"]


async def test_group_commit_one_segment_one_cas(store: Store, clock: ManualClock) -> None:
    counting = CountingStore(store)
    e = make_engine(counting, clock, linger=0.05)
    await e.create_queue("q")
    counting.reset()
    results = await asyncio.gather(*(e.produce("q", [f"m{n}".encode()]) for n in range(20)))
    assert len({r[0] for r in results}) == 20
    assert counting.requests["put"] == 2, counting.requests  # one segment, one manifest CAS
    info = await e.get_queue("q")
    assert (info.segments, info.produced) == (1, 20)


async def test_a_produce_does_not_linger_while_a_lease_waits(store: Store) -> None:
    """The linger gathers produces into one segment; while a consumer waits for the
    queue, nothing is busy enough to gather and the produce is published at once."""
    e = await make_engine(store, SystemClock(), linger=0.4).start()
    await e.create_queue("q")
    began = time.monotonic()
    await e.produce("q", [b"alone"])
    assert time.monotonic() - began >= 0.4, "no consumer waits: the produce lingers"
    await e.lease("q", 1)
    waiting = asyncio.ensure_future(e.lease("q", 1, wait=5))
    await asyncio.sleep(0.05)
    began = time.monotonic()
    await e.produce("q", [b"awaited"])
    took = time.monotonic() - began
    (got,) = await asyncio.wait_for(waiting, 5)
    assert got.payload == b"awaited" and took < 0.3, f"a waited-for produce took {took:.3f} s"


async def test_idempotency_key_does_not_duplicate(engine: Engine) -> None:
    first = await engine.produce("q", [NewItem(b"x", key="order-1"), NewItem(b"y", key="order-2")])
    again = await engine.produce("q", [NewItem(b"x", key="order-1"), NewItem(b"z")])
    twins = await engine.produce("q", [NewItem(b"w", key="k"), NewItem(b"w", key="k")])
    assert again[0] == first[0]
    assert twins[0] == twins[1]
    got = await engine.lease("q", 10)
    assert sorted(i.payload for i in got) == [b"w", b"x", b"y", b"z"]


async def test_idempotency_window_expires(engine: Engine, clock: ManualClock) -> None:
    """Keys are kept for the window plus twice the clock-skew bound (so that a
    reader whose clock is ahead still sees the whole window), then forgotten."""
    first = await engine.produce("q", [NewItem(b"x", key="k")])
    clock.advance(engine.opts.idem_window + 2 * MAX_CLOCK_SKEW_MS / 1000 - 1)
    assert await engine.produce("q", [NewItem(b"x", key="k")]) == first
    clock.advance(2)
    again = await engine.produce("q", [NewItem(b"x", key="k")])
    assert again != first


async def test_retried_items_go_to_the_back(engine: Engine, clock: ManualClock) -> None:
    await engine.produce("q", [b"a"])
    clock.advance(1)
    await engine.produce("q", [b"b", b"c"])
    clock.advance(1)
    (a,) = await engine.lease("q", 1)
    assert a.payload == b"a"
    await engine.retry(a.token, error="boom")
    clock.advance(1)
    await engine.produce("q", [b"d"])  # produced after the retry: after a
    got = await engine.lease("q", 10)
    assert [i.payload for i in got] == [b"b", b"c", b"a", b"d"]
    assert got[2].attempts == 2


async def test_expired_lease_goes_to_the_back(engine: Engine, clock: ManualClock) -> None:
    await engine.produce("q", [b"a"])
    clock.advance(1)
    assert len(await engine.lease("q", 1)) == 1
    await engine.produce("q", [b"b"])
    clock.advance(11)  # a's lease expired after b was produced
    got = await engine.lease("q", 10)
    assert [i.payload for i in got] == [b"b", b"a"]


async def test_retry_at_and_scheduled_delivery(engine: Engine, clock: ManualClock) -> None:
    now = clock.now_ms()
    await engine.produce("q", [NewItem(b"later", enqueue_at_ms=now + 5000), NewItem(b"now")])
    got = await engine.lease("q", 10)
    assert [i.payload for i in got] == [b"now"]
    await engine.retry(got[0].token, retry_at_ms=now + 8000)
    s = await engine.stats("q")
    assert (s.scheduled, s.waiting_retry, s.available) == (1, 1, 0)
    clock.advance(5)
    assert [i.payload for i in await engine.lease("q", 10)] == [b"later"]
    clock.advance(3)
    again = await engine.lease("q", 10)
    assert [(i.payload, i.attempts) for i in again] == [(b"now", 2)]


async def test_renew_extends_lease(engine: Engine, clock: ManualClock) -> None:
    await engine.produce("q", [b"a"])
    (a,) = await engine.lease("q", 1)
    clock.advance(8)
    deadline = await engine.renew(a.token)
    assert deadline == clock.now_ms() + 10_000
    clock.advance(8)  # past the first deadline, inside the renewed one
    assert await engine.lease("q", 1) == []
    await engine.complete([a.token])


async def test_dead_letters_keep_their_meta_and_origin_through_a_redrive(
        engine: Engine) -> None:
    """The item's own meta survives dead-lettering and the redrive back; ``origin``
    (first id and produce time) survives both, and a second death keeps the first."""
    (first,) = await engine.produce("q", [NewItem(b"x", meta={"trace": "t1"})])
    (a,) = await engine.lease("q", 1)
    await engine.retry(a.token, dead=True, error="e1")
    (d,) = await engine.lease("dlq", 1)
    assert d.meta is not None and d.meta["trace"] == "t1"
    assert d.meta["origin"] == [first, a.produced_ms]
    await engine.retry(d.token, count_attempt=False)
    assert await engine.redrive("dlq") == 1
    (back,) = await engine.lease("q", 1)
    assert back.meta == {"trace": "t1", "origin": [first, a.produced_ms],
                         "redriven_from": "dlq", "dead_id": d.id}
    await engine.retry(back.token, dead=True, error="e2")
    (again,) = await engine.lease("dlq", 1)
    assert again.meta is not None and again.meta["origin"] == [first, a.produced_ms]
    assert (again.meta["source_id"], again.meta["error"]) == (back.id, "e2")


async def test_dead_flag_moves_item_to_dead_letter_queue(engine: Engine) -> None:
    ids = await engine.produce("q", [b"poison"])
    (a,) = await engine.lease("q", 1)
    await engine.retry(a.token, dead=True, error="cannot parse")
    assert await engine.lease("q", 1) == []
    (d,) = await engine.lease("dlq", 1)
    assert d.payload == b"poison"
    assert d.meta == {"source_queue": "q", "source_id": ids[0], "attempts": 1,
                      "error": "cannot parse", "origin": [ids[0], a.produced_ms]}
    s = await engine.stats("q")
    assert (s.dead, s.dead_lettered) == (1, 1)  # the DLQ holds it (leased now)


async def test_max_attempts_dead_letters(engine: Engine, clock: ManualClock) -> None:
    await engine.produce("q", [b"flaky"])
    for attempt in (1, 2, 3):
        (a,) = await engine.lease("q", 1)
        assert a.attempts == attempt
        if attempt < 3:
            clock.advance(11)  # let the lease expire
    await engine.retry(a.token, error="third failure")  # attempts exhausted
    assert await engine.lease("q", 1) == []
    (d,) = await engine.lease("dlq", 1)
    assert d.meta is not None and d.meta["attempts"] == 3
    assert d.meta["error"] == "third failure"


async def test_stale_and_foreign_tokens(engine: Engine, store: Store, clock: ManualClock) -> None:
    await engine.produce("q", [b"a"])
    (a,) = await engine.lease("q", 1)
    clock.advance(11)
    (b,) = await engine.lease("q", 1)
    with pytest.raises(LeaseLost):
        await engine.complete([a.token])
    with pytest.raises(LeaseLost):
        await engine.renew(a.token)
    with pytest.raises(LeaseLost):
        await engine.retry(a.token)
    with pytest.raises(InvalidToken):
        await engine.complete([b.token[:-3] + "AAA"])
    other_ns = make_engine(store, clock, namespace="other")
    with pytest.raises(InvalidToken, match="namespace"):
        await other_ns.complete([b.token])
    other_key = make_engine(store, clock, keys=[b"another-key-of-32-bytes-long-xxxx"])
    with pytest.raises(InvalidToken, match="unknown key"):
        await other_key.complete([b.token])
    await engine.complete([b.token])


async def test_key_rotation(engine: Engine, store: Store, clock: ManualClock) -> None:
    await engine.produce("q", [b"a"])
    (a,) = await engine.lease("q", 1)
    new_key = b"the-next-key-0123456789abcdefghij"
    rotated = make_engine(store, clock, keys=[new_key, engine.signer.keys[0]])
    await rotated.complete([a.token])  # signed by the old key, verified by the new list


async def test_queue_lifecycle(engine: Engine) -> None:
    assert sorted(await engine.list_queues()) == ["dlq", "q"]
    with pytest.raises(QueueExists):
        await engine.create_queue("q")
    info = await engine.update_queue("q", lease_timeout=42)
    assert info.config.lease_timeout == 42
    assert info.config.max_attempts == 3  # omitted fields are kept
    with pytest.raises(InvalidRequest) as err:
        await engine.update_queue("q", lease_timeout=-1)
    assert err.value.field == "lease_timeout"
    with pytest.raises(InvalidRequest) as err:
        await engine.update_queue("q", dead_queue="q")
    assert err.value.field == "dead_queue"
    with pytest.raises(InvalidRequest) as err:
        await engine.create_queue("bad name!")
    assert err.value.field == "queue"
    await engine.delete_queue("q")
    with pytest.raises(QueueNotFound):
        await engine.get_queue("q")
    with pytest.raises(QueueNotFound):
        await engine.produce("q", [b"x"])
    with pytest.raises(QueueNotFound):
        await engine.lease("q", 1)
    assert await engine.list_queues() == ["dlq"]


async def test_each_item_of_a_produce_is_checked(engine: Engine) -> None:
    # A batch of plain payloads passes its checks in bulk; one bad item anywhere in
    # it is still refused, and named.
    limit = engine.opts.max_item_bytes
    assert len(await engine.produce("q", [b"x" * limit] * 3)) == 3  # at the limit: fine
    with pytest.raises(TooLarge) as too_large:
        await engine.produce("q", [b"x", b"y", b"z" * (limit + 1), b"w"])
    assert too_large.value.details["field"] == "items[2]"
    with pytest.raises(InvalidRequest) as err:
        await engine.produce("q", [NewItem(b"a"), NewItem(b"b", enqueue_at_ms=-1)])
    assert err.value.field == "items[1].enqueue_at"
    with pytest.raises(InvalidRequest) as err:
        await engine.produce("q", [NewItem(b"a"), NewItem(b"b", meta={"headers": {"a": 1}})])
    assert err.value.field == "items[1].headers"
    assert (await engine.stats("q")).available == 3  # nothing of the refused calls


async def test_input_limits(engine: Engine) -> None:
    with pytest.raises(TooLarge):
        await engine.produce("q", [b"x" * (engine.opts.max_item_bytes + 1)])
    with pytest.raises(InvalidRequest) as err:
        await engine.produce("q", [])
    assert err.value.field == "items"
    with pytest.raises(InvalidRequest) as err:
        await engine.lease("q", 0)
    assert err.value.field == "batch_size"
    with pytest.raises(TooLarge) as too_large:  # over a limit: 413, as over HTTP
        await engine.lease("q", engine.opts.max_batch + 1)
    assert too_large.value.details["field"] == "batch_size"
    with pytest.raises(InvalidRequest) as err:
        await engine.lease("q", 1, wait=-1)
    assert err.value.field == "request_timeout"
    s = await engine.stats("q")
    assert (s.available, s.segments) == (0, 0)


async def test_namespaces_are_isolated(store: Store, clock: ManualClock) -> None:
    a = make_engine(store, clock, namespace="team-a")
    b = make_engine(store, clock, namespace="team-b")
    await a.create_queue("q")
    await b.create_queue("q")
    await a.produce("q", [b"for a"])
    assert await b.lease("q", 10) == []
    assert [i.payload for i in await a.lease("q", 10)] == [b"for a"]


async def test_long_poll_answers_when_items_arrive(store: Store) -> None:
    e = make_engine(store, SystemClock())
    await e.create_queue("q")
    began = time.monotonic()
    waiter = asyncio.create_task(e.lease("q", 5, wait=10))
    await asyncio.sleep(0.3)
    await e.produce("q", [b"hello"])
    got = await waiter
    took = time.monotonic() - began
    assert [i.payload for i in got] == [b"hello"]
    assert took < 5, f"long poll took {took:.1f}s to see a produce"
    began = time.monotonic()
    assert await e.lease("q", 5, wait=0.5) == []
    assert time.monotonic() - began >= 0.45


async def test_lease_cost_does_not_grow_with_backlog(store: Store, clock: ManualClock) -> None:
    counting = CountingStore(store)
    e = make_engine(counting, clock)
    await e.create_queue("small")
    await e.create_queue("big")
    await e.produce("small", [f"s{k}".encode() for k in range(10)])
    for n in range(30):  # 30 segments of backlog
        await e.produce("big", [f"{n}-{k}".encode() for k in range(10)])
        clock.advance(0.01)
    cold = {}
    for queue in ("small", "big"):
        fresh = make_engine(counting, clock)  # a cold engine: nothing cached
        counting.reset()
        assert len(await fresh.lease(queue, 10)) == 10
        cold[queue] = counting.total
    # manifest GET + lease object GET (absent) + segment GET + lease object PUT; and a
    # cold engine reads the big manifest's chunks once (10 of 3 segments each here)
    assert cold == {"small": 4, "big": 4 + 30 // CHUNK}, cold
    warm = make_engine(counting, clock)
    costs = []
    for _ in range(25):  # walk through the backlog, leaving completed segments behind
        clock.advance(1)  # older than manifest_max_age: the manifest is re-read
        counting.reset()
        got = await warm.lease("big", 10)
        costs.append(counting.total)
        assert len(got) == 10
        await warm.complete([i.token for i in got])
    # the same plus, at most, one re-read of the head segment whose leases the cold
    # engine holds (lease objects with leases are re-read after lease_state_max_age);
    # this engine's first lease reads the chunks too
    assert costs[0] <= 5 + 30 // CHUNK and max(costs[1:]) <= 5, costs
    assert max(costs[-10:]) <= max(costs[:10]), costs


async def test_complete_and_produce_is_one_step(engine: Engine, store: Store,
                                                clock: ManualClock) -> None:
    await engine.create_queue("out")
    await engine.produce("q", [b"in"])
    (item,) = await engine.lease("q", 1)
    ids = await engine.complete_and_produce(item.token, "out", [b"o1", b"o2"])
    assert len(ids) == 2
    assert await engine.complete_and_produce(item.token, "out", [b"o1", b"o2"]) == ids
    got = await engine.lease("out", 10)
    assert [i.payload for i in got] == [b"o1", b"o2"]  # published once
    assert await engine.lease("q", 1) == []
    # a stale delivery's outputs never appear
    await engine.produce("q", [b"in2"])
    (first,) = await engine.lease("q", 1)
    clock.advance(11)
    (second,) = await engine.lease("q", 1)
    with pytest.raises(LeaseLost):
        await engine.complete_and_produce(first.token, "out", [b"stale"])
    await engine.complete_and_produce(second.token, "out", [b"fresh"])
    assert [i.payload for i in await engine.lease("out", 10)] == [b"fresh"]


async def test_outputs_of_a_crashed_completion_are_published_by_a_helper(
    store: Store, clock: ManualClock
) -> None:
    from okq.store import FaultyStore, SimulatedCrash

    faulty = FaultyStore(store)
    crashing = make_engine(faulty, clock)
    await crashing.create_queue("in")
    await crashing.create_queue("out")
    await crashing.produce("in", [b"job"])
    (item,) = await crashing.lease("in", 1)
    faulty.inject("put", "crash", key="/manifests/out")  # dies after the completion CAS
    with pytest.raises(SimulatedCrash):
        await crashing.complete_and_produce(item.token, "out", [b"result"])
    helper = make_engine(store, clock)
    assert await helper.lease("out", 10) == []  # not published yet
    clock.advance(helper.opts.dead_grace + 1)
    assert await helper.lease("in", 10) == []  # walking past it publishes the outputs
    assert [i.payload for i in await helper.lease("out", 10)] == [b"result"]
    assert (await helper.stats("in")).completed == 1
