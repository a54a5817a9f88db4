"""The compactor: folding, merging, retention, garbage collection, a crash at
every object-store call of a pass, and two compactors at once.

Stores: memory and file; SeaweedFS (marked ``s3``) for the fold/GC test and for
the concurrent-compactors test. Compactors run with ``safety_age=0`` unless a
test says otherwise, so garbage is collected at once. Engines that lease after a
pass first move their ManualClock past ``manifest_max_age`` so they re-read the
manifest (``test_engine_with_a_recent_manifest_never_redelivers_merged_items``
shows why that matters when the safety age is 0).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from compactor import Compactor, CompactorOptions, Report
from okq import Engine, LeasedItem, ManualClock, NewItem, QueueConfig, SystemClock
from okq.clock import Clock, OffsetClock
from okq.errors import PublishAborted
from okq.headers import with_headers
from okq.keys import chunk_key, lease_key, segment_key
from okq.leases import DEAD, DONE, decode_lease
from okq.manifests import read_manifest as read_stored_manifest
from okq.model import Manifest
from okq.store import CountingStore, FaultyStore, MemoryStore, SimulatedCrash, Store, list_all
from tests.engines import make_engine
from tests.stores import StoreFactory

T = TypeVar("T")
NS = "default"
LOCAL = ["memory", "file"]
WITH_SEAWEED = [*LOCAL, pytest.param("seaweed", marks=pytest.mark.s3)]


@pytest.fixture(params=LOCAL)
async def store(request: pytest.FixtureRequest, store_factory: StoreFactory) -> Store:
    return await store_factory(request.param)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# -- helpers ---------------------------------------------------------------------


def new_compactor(store: Store, clock: Clock, **options: Any) -> Compactor:
    """A compactor with an engine of its own (safety_age 0 and min_age 0 unless given:
    these tests fold and merge what they just produced)."""
    opts = CompactorOptions(**{"safety_age": 0.0, "lease_grace": 0.0, "min_age": 0.0,
                               **options})
    return Compactor(make_engine(store, clock), clock=clock, options=opts)


def idle(r: Report) -> bool:
    return not (r.segments_folded or r.segments_merged or r.items_expired
                or r.objects_deleted)


async def compact_until_idle(c: Compactor, clock: ManualClock, max_passes: int = 4) -> None:
    """Run passes (a second apart) until one changes nothing."""
    for _ in range(max_passes):
        clock.advance(1)
        if idle(await c.run_once()):
            return
    pytest.fail(f"the compactor did not settle in {max_passes} passes")


async def keys_of(store: Store, prefix: str = "") -> list[str]:
    return [info.key async for info in list_all(store, prefix)]


async def read_manifest(store: Store, queue: str) -> Manifest:
    return await read_stored_manifest(store, NS, queue)


async def assert_tidy(store: Store) -> None:
    """The bucket holds manifests, their chunks and the objects their segments need,
    nothing else:
    no sealed segment in a manifest, no finished segment left unfolded, no
    unreferenced segment or lease object."""
    keys = await keys_of(store)
    prefix = f"{NS}/manifests/"
    needed = {k for k in keys if k.startswith(prefix)}
    for mkey in sorted(needed):
        queue = mkey[len(prefix):]
        m = await read_manifest(store, queue)
        needed.update(chunk_key(NS, queue, c.id) for c in m.chunks)
        for sm in m.segments:
            skey, lkey = segment_key(NS, queue, sm.id), lease_key(NS, queue, sm.id)
            assert skey in keys, f"{queue}: segment {sm.id} is in the manifest but not stored"
            needed.add(skey)
            if lkey in keys:
                needed.add(lkey)
                obj = decode_lease((await store.get(lkey)).data)
                assert not obj.sealed, f"{queue}: sealed segment {sm.id} left in the manifest"
                states = [obj.items.get(i) for i in range(sm.count)]
                assert not all(st is not None and st.s in (DONE, DEAD) for st in states), (
                    f"{queue}: finished segment {sm.id} was not folded")
    assert sorted(keys) == sorted(needed), f"unreferenced: {sorted(set(keys) - needed)}"


async def browse_all(engine: Engine, queue: str) -> dict[bytes, Any]:
    items, after = await engine.browse(queue, limit=1000)
    assert after is None
    out = {i.payload: i for i in items}
    assert len(out) == len(items), "an item is listed twice"
    return out


async def drain(engine: Engine, queue: str, clock: ManualClock, *, until_ms: int | None = None,
                step: float = 2.0, batch: int = 10) -> list[tuple[LeasedItem, int]]:
    """Lease and complete everything ready, moving the clock by ``step`` while nothing
    is, until ``until_ms``; returns each delivery with the time it was leased."""
    out: list[tuple[LeasedItem, int]] = []
    while True:
        got = await engine.lease(queue, batch)
        if got:
            out.extend((g, clock.now_ms()) for g in got)
            await engine.complete([g.token for g in got])
            continue
        if until_ms is None or clock.now_ms() >= until_ms:
            return out
        clock.advance(step)


def payloads(delivered: list[tuple[LeasedItem, int]]) -> list[bytes]:
    return [g.payload for g, _ in delivered]


def once_each(values: list[bytes]) -> set[bytes]:
    dups = sorted(v for v, n in Counter(values).items() if n > 1)
    assert not dups, f"delivered more than once: {dups}"
    return set(values)


# -- 1. fold and collect --------------------------------------------------------------


@pytest.mark.parametrize("kind", WITH_SEAWEED)
async def test_fold_and_collect_finished_segments(store_factory: StoreFactory, kind: str) -> None:
    store = await store_factory(kind)
    clock = ManualClock()
    e = make_engine(store, clock)
    await e.create_queue("q")
    for n in range(5):
        await e.produce("q", [f"{n}-{k}".encode() for k in range(10)])
        clock.advance(1)
    got = await e.lease("q", 50)
    assert len(got) == 50
    await e.complete([g.token for g in got])
    # The manifest, a chunk of its first 3 segments (tests' engines cut chunks of 3),
    # 5 segments, 5 lease objects.
    assert len(await keys_of(store)) == 12
    assert len(await keys_of(store, f"{NS}/mchunks/q/")) == 1

    counting = CountingStore(store)
    c = Compactor(make_engine(counting, clock), clock=clock,
                  options=CompactorOptions(safety_age=0, lease_grace=0, min_age=0))
    r = await c.run_once()
    assert (r.queues, r.segments_folded, r.segments_merged, r.items_moved) == (1, 5, 0, 0)
    assert r.objects_deleted == 11 and r.bytes_reclaimed > 0  # the chunk with them
    assert (await read_manifest(store, "q")).segments == []
    assert await keys_of(store) == [f"{NS}/manifests/q"]

    clock.advance(1)
    counting.reset()
    again = await c.run_once()
    assert idle(again) and again.merged_into == 0, again
    assert counting.requests["put"] == counting.requests["delete"] == 0, counting.requests
    assert await keys_of(store) == [f"{NS}/manifests/q"]

    clock.advance(1)
    s = await e.stats("q")
    assert (s.segments, s.completed, s.available, s.in_flight) == (0, 0, 0, 0)
    await e.produce("q", [b"after"])  # the queue still works
    [item] = await e.lease("q", 5)
    assert item.payload == b"after"
    await e.complete([item.token])


# -- 2. a merge keeps every in-flight state --------------------------------------------


@dataclass
class Twins:
    """Queues ``a`` (compacted) and ``b`` (never compacted), driven identically."""

    engine: Engine
    clock: ManualClock
    t0: int
    held: dict[str, dict[bytes, LeasedItem]] = field(
        default_factory=lambda: {"a": {}, "b": {}})
    completed: set[bytes] = field(default_factory=set)
    ready: dict[bytes, int] = field(default_factory=dict)  # not deliverable before

    def scheduled_at(self, s: int) -> int:
        return self.t0 + (400 + s) * 1000

    def retry_at(self, s: int, i: int) -> int:
        return self.t0 + (200 + 10 * s + i) * 1000

    async def build(self) -> None:
        e = self.engine
        for q in "ab":
            await e.create_queue(q, QueueConfig(lease_timeout=30))
        for s in range(10):  # 10 narrow segments; item 7 of each is scheduled
            at = self.scheduled_at(s)
            self.ready[f"s{s}-7".encode()] = at
            batch = [NewItem(f"s{s}-{i}".encode(), at if i == 7 else None,
                             meta=with_headers(None, {"item": f"s{s}-{i}"})) for i in range(8)]
            for q in "ab":
                await e.produce(q, batch)
            self.clock.advance(1)
        order = {q: await self._work(q) for q in "ab"}
        assert order["a"] == order["b"] and len(order["a"]) == 30

    async def _work(self, q: str) -> list[bytes]:
        """Lease 30 items (segments 0-3, two of segment 4): hold three, retry eight
        with a ready time and an error, complete the rest."""
        got = await self.engine.lease(q, 30)
        for g in got:
            s, i = (int(x) for x in g.payload.decode()[1:].split("-"))
            if (s == 0 and i < 2) or (s == 3 and i == 0):
                self.held[q][g.payload] = g
            elif i in (2, 3):
                self.ready[g.payload] = self.retry_at(s, i)
                await self.engine.retry(g.token, retry_at_ms=self.retry_at(s, i),
                                        error=f"boom {s}-{i}")
            else:
                await self.engine.complete([g.token])
                self.completed.add(g.payload)
        return [g.payload for g in got]

    async def drain_in_lockstep(self, until_ms: int) -> list[bytes]:
        """One item at a time from each: the same items, in the same order, with the
        same attempts, never before their ready time, never a completed one."""
        e, delivered = self.engine, []
        while self.clock.now_ms() < until_ms:
            ga, gb = await e.lease("a", 1), await e.lease("b", 1)
            assert [(g.payload, g.attempts) for g in ga] == [
                (g.payload, g.attempts) for g in gb]
            if not ga:
                self.clock.advance(5)
                continue
            p = ga[0].payload
            assert p not in self.completed, f"completed item {p!r} came back"
            assert self.clock.now_ms() >= self.ready.get(p, 0), f"{p!r} delivered early"
            retried = p in self.ready and not p.endswith(b"-7")
            assert ga[0].attempts == (2 if retried else 1)
            delivered.append(p)
            await e.complete([ga[0].token, gb[0].token])
        return delivered


def _browsed(i: Any) -> tuple[Any, ...]:
    return (i.state, i.attempts, i.produced_ms, i.ready_ms, i.meta, i.error)


async def test_merge_keeps_in_flight_state(store: Store, clock: ManualClock) -> None:
    e = make_engine(store, clock)
    tw = Twins(e, clock, clock.now_ms())
    await tw.build()

    before = await read_manifest(store, "a")
    r = await new_compactor(store, clock).compact_queue("a")
    assert (r.segments_folded, r.segments_merged, r.merged_into) == (0, 8, 1), r
    after = await read_manifest(store, "a")
    kept = [sm.id for sm in after.segments if sm.id in {x.id for x in before.segments}]
    assert len(after.segments) == 3 and kept == [before.segments[0].id, before.segments[3].id]
    # the segments with leased items are those not merged
    assert {g.id.rpartition(".")[0] for g in tw.held["a"].values()} == set(kept)
    merged = next(sm for sm in after.segments if sm.id not in kept)
    assert merged.count == 3 + 3 + 6 + 5 * 8  # the live items of segments 1, 2, 4-9
    assert len((await read_manifest(store, "b")).segments) == 10  # the twin is untouched

    clock.advance(1)  # re-read manifests
    # Every live item keeps its state, attempts, ready time, birth and error.
    view = {q: await browse_all(e, q) for q in "ab"}
    assert set(view["a"]) == set(view["b"]) == {
        f"s{s}-{i}".encode() for s in range(10) for i in range(8)} - tw.completed
    assert {p: _browsed(i) for p, i in view["a"].items()} == {
        p: _browsed(i) for p, i in view["b"].items()}
    assert all(i.headers == {"item": p.decode()} for p, i in view["a"].items())
    s12, s57 = view["a"][b"s1-2"], view["a"][b"s5-7"]
    assert (s12.state, s12.attempts, s12.error, s12.ready_ms) == (
        "waiting", 1, "boom 1-2", tw.retry_at(1, 2))
    assert (s57.state, s57.ready_ms) == ("scheduled", tw.scheduled_at(5))
    sa, sb = await e.stats("a"), await e.stats("b")
    assert (sa.available, sa.in_flight, sa.scheduled, sa.waiting_retry) == (
        sb.available, sb.in_flight, sb.scheduled, sb.waiting_retry) == (40, 3, 10, 8)

    # Tokens held across the merge still renew and complete.
    for q in "ab":
        for g in tw.held[q].values():
            assert await e.renew(g.token, lease_timeout=60) == clock.now_ms() + 60_000
        await e.complete([g.token for g in tw.held[q].values()])
    tw.completed |= set(tw.held["a"])

    delivered = await tw.drain_in_lockstep(tw.t0 + 500_000)
    assert once_each(delivered) == set(view["a"]) - set(tw.held["a"])
    assert len(delivered) == 80 - len(tw.completed) == 58
    assert await e.lease("a", 100) == await e.lease("b", 100) == []


# -- 3. retention -----------------------------------------------------------------------


@pytest.mark.parametrize("dead_letter", [False, True], ids=["drop", "dead-letter"])
async def test_retention(store: Store, clock: ManualClock, dead_letter: bool) -> None:
    e = make_engine(store, clock)
    t0 = clock.now_ms()
    await e.create_queue("dlq")
    await e.create_queue("q", QueueConfig(
        retention=60, lease_timeout=600, dead_queue="dlq" if dead_letter else None,
        retention_dead_letter=dead_letter))
    ids = dict(zip([b"old-0", b"old-1", b"old-2", b"old-3"], await e.produce(
        "q", [b"old-0", b"old-1", b"old-2", b"old-3"]), strict=True))
    held, flaky, done = await e.lease("q", 3)
    assert (held.payload, flaky.payload, done.payload) == (b"old-0", b"old-1", b"old-2")
    await e.retry(flaky.token, retry_at_ms=t0 + 5_000, error="flaky")
    await e.complete([done.token])
    clock.advance(50)
    await e.produce("q", [b"new-0", b"new-1"])
    clock.advance(20)  # old items are 70 s old, past the 60 s retention; new ones 20 s

    c = new_compactor(store, clock)
    r = await c.run_once()
    assert r.items_expired == 2  # old-1 (waiting) and old-3 (fresh); old-0 is leased
    assert r.items_expired_to_dead == (2 if dead_letter else 0)
    clock.advance(1)
    s = await e.stats("q")
    assert (s.available, s.in_flight, s.waiting_retry, s.scheduled) == (2, 1, 0, 0)
    assert s.dead == (2 if dead_letter else 0)
    assert set(await browse_all(e, "q")) == {b"old-0", b"new-0", b"new-1"}

    dead = await e.lease("dlq", 10)
    if dead_letter:
        assert sorted((d.payload, d.meta["source_id"], d.meta["attempts"], d.meta["error"])
                      for d in dead if d.meta) == [
            (b"old-1", ids[b"old-1"], 1, "retention expired"),
            (b"old-3", ids[b"old-3"], 0, "retention expired")]
        assert all(d.meta and d.meta["source_queue"] == "q" for d in dead)
        await e.complete([d.token for d in dead])
    else:
        assert dead == []

    # The leased item was not expired; once released, the next pass expires it.
    assert await e.renew(held.token) == clock.now_ms() + 600_000
    await e.retry(held.token)
    clock.advance(1)
    r = await c.run_once()
    assert r.items_expired == 1
    clock.advance(1)
    rest = await e.lease("q", 10)
    assert sorted(g.payload for g in rest) == [b"new-0", b"new-1"]
    await e.complete([g.token for g in rest])
    if dead_letter:
        [late] = await e.lease("dlq", 10)
        assert late.payload == b"old-0" and late.meta and late.meta["attempts"] == 1
        await e.complete([late.token])
    await compact_until_idle(c, clock)
    assert sorted(await keys_of(store)) == [f"{NS}/manifests/dlq", f"{NS}/manifests/q"]


async def test_retention_applies_to_items_carried_by_a_merge(
        store: Store, clock: ManualClock) -> None:
    e = make_engine(store, clock)
    t0 = clock.now_ms()
    await e.create_queue("q", QueueConfig(retention=60))
    for n in range(3):
        await e.produce("q", [f"{n}-done".encode(), f"{n}-later".encode()])
        clock.advance(1)
    for g in await e.lease("q", 6):
        if g.payload.endswith(b"done"):
            await e.complete([g.token])
        else:
            await e.retry(g.token, retry_at_ms=t0 + 3_600_000, error="later")
    c = new_compactor(store, clock)
    clock.advance(50)  # 50 s old: kept, but the three narrow segments are merged
    assert (await c.run_once()).segments_merged == 3
    clock.advance(20)  # 70 s old, past the 60 s retention
    await c.run_once()
    clock.advance(1)
    assert await browse_all(e, "q") == {}


# -- 4. a crash at every store call of a pass --------------------------------------------


class CrashAt(FaultyStore):
    """'Dies' at the ``at``-th store call (0-based): before it runs, or right after it
    landed (``after``). A dead process makes no more calls: those it had begun at
    once (asyncio.gather) die unrecorded."""

    def __init__(self, inner: Store, at: int, *, after: bool) -> None:
        super().__init__(inner)
        self.at, self.after = at, after

    async def _call(self, op: str, key: str, write: bool,
                    fn: Callable[[], Awaitable[T]]) -> T:
        if len(self.calls) > self.at:
            raise SimulatedCrash(f"dead since call #{self.at}")
        if len(self.calls) != self.at:
            return await super()._call(op, key, write, fn)
        self.calls.append((op, key))
        if self.after:
            try:
                await fn()
            except Exception:  # it ran and failed (a GET of a missing key): die anyway
                pass
        raise SimulatedCrash(f"killed {'after' if self.after else 'before'} call "
                             f"#{self.at}: {op} {key}")


KILL_OPTS = {"merge_below": 6, "merge_target": 8}  # three merge groups, one wide segment
FAR = 1_000_000  # ms after t0: when the old items would become ready


@dataclass
class Scenario:
    store: MemoryStore
    clock: ManualClock
    t0: int
    dead_letter: bool
    live: set[bytes] = field(default_factory=set)  # must each be delivered once
    old: set[bytes] = field(default_factory=set)  # past retention: dropped or dead-lettered
    completed: set[bytes] = field(default_factory=set)
    held: dict[bytes, str] = field(default_factory=dict)  # leased before the pass
    ready: dict[bytes, int] = field(default_factory=dict)  # not deliverable before


class _Builder:
    """Drives one engine over queue ``q`` and records what the reference model needs."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.e = make_engine(sc.store, sc.clock, linger=0)
        self.produced: set[bytes] = set()

    async def produce(self, *items: NewItem) -> None:
        await self.e.produce("q", list(items))
        self.produced.update(i.payload for i in items)
        self.sc.clock.advance(1)

    async def lease(self, n: int) -> dict[str, LeasedItem]:
        got = await self.e.lease("q", n)
        assert len(got) == n
        return {g.payload.decode(): g for g in got}

    async def complete(self, g: LeasedItem) -> None:
        await self.e.complete([g.token])
        self.sc.completed.add(g.payload)

    async def retry(self, g: LeasedItem, at_ms: int | None, error: str | None) -> None:
        await self.e.retry(g.token, retry_at_ms=at_ms, error=error)
        if at_ms is not None:
            self.sc.ready[g.payload] = at_ms

    async def hold(self, g: LeasedItem) -> None:
        await self.e.renew(g.token, lease_timeout=43_200)
        self.sc.held[g.payload] = g.token


async def build_scenario(dead_letter: bool) -> Scenario:
    """One queue with everything a pass deals with, built the same way every time."""
    clock = ManualClock()
    t0 = clock.now_ms()
    sc = Scenario(MemoryStore(), clock, t0, dead_letter)
    b = _Builder(sc)
    await b.e.create_queue("dlq")
    await b.e.create_queue("q", QueueConfig(
        lease_timeout=30, retention=60, dead_queue="dlq" if dead_letter else None,
        retention_dead_letter=dead_letter))

    # t0: items past retention when the pass runs (they would be ready only much
    # later); an item of their first segment is leased, so it is never sealed.
    far = t0 + FAR
    await b.produce(NewItem(b"old-a0"), NewItem(b"old-a1"), NewItem(b"old-a2", far),
                    NewItem(b"old-a3"))
    g = await b.lease(3)
    await b.complete(g["old-a0"])
    await b.hold(g["old-a1"])
    await b.retry(g["old-a3"], far, "old error")
    await b.produce(NewItem(b"old-b0", far), NewItem(b"old-b1"))
    await b.complete((await b.lease(1))["old-b1"])
    sc.old = {b"old-a2", b"old-a3", b"old-b0"}

    clock.t = t0 + 90_000
    for f in range(3):  # finished segments
        await b.produce(*(NewItem(f"f{f}-{i}".encode()) for i in range(3)))
    for g1 in (await b.lease(9)).values():
        await b.complete(g1)
    # a segment with a held lease and a retried item
    await b.produce(*(NewItem(f"h-{i}".encode()) for i in range(3)))
    g = await b.lease(3)
    await b.hold(g["h-0"])
    await b.complete(g["h-1"])
    await b.retry(g["h-2"], t0 + 115_000, "h error")
    await _narrow_segments(b)
    await b.produce(*(NewItem(f"w-{i}".encode()) for i in range(8)))  # too wide to merge
    await b.e.close()

    sc.live = b.produced - sc.old - sc.completed
    assert (len(b.produced), len(sc.live), len(sc.completed)) == (50, 31, 16)
    return sc


async def _narrow_segments(b: _Builder) -> None:
    """Six narrow segments of completed, retried, scheduled and fresh items."""
    t0 = b.sc.t0
    for s in range(6):
        at = t0 + (120 + s) * 1000
        b.sc.ready[f"n{s}-2".encode()] = at
        await b.produce(*(NewItem(f"n{s}-{i}".encode(), at if i == 2 else None)
                          for i in range(4)))
    # At t0+100 the first four are leased: items 0, 1 and 3 of each are ready.
    for p, g in (await b.lease(12)).items():
        s, i = int(p[1]), int(p[3])
        if i == 0:
            await b.complete(g)
        elif i == 1:
            await b.retry(g, t0 + (110 + s) * 1000, f"error {s}")
        else:
            await b.retry(g, None, None)  # back in line now


async def check_recovery(sc: Scenario) -> None:
    """After a crashed (or clean) pass: the state is whole, a fresh pass finishes the
    work, every live item is delivered once, nothing finished or dropped comes back."""
    store, clock, t0 = sc.store, sc.clock, sc.t0
    clock.advance(1)
    e = make_engine(store, clock)
    listed = set(await browse_all(e, "q"))
    assert sc.live <= listed <= sc.live | sc.old, (
        f"lost: {sorted(sc.live - listed)}; back: {sorted(listed - sc.live - sc.old)}")

    # What is ready now is delivered at once (items of sealed segments wait for a pass).
    first = await drain(e, "q", clock)
    assert once_each(payloads(first)) <= sc.live - set(sc.held)
    for token in sc.held.values():  # leases taken before the pass still hold
        await e.renew(token, lease_timeout=3600)

    await compact_until_idle(new_compactor(store, clock, **KILL_OPTS), clock)
    await assert_tidy(store)
    clock.advance(1)
    assert set(await browse_all(e, "q")) == sc.live - set(payloads(first))
    await e.complete(list(sc.held.values()))

    rest = await drain(e, "q", clock, until_ms=t0 + 140_000)
    delivered = first + rest
    assert once_each(payloads(delivered)) == sc.live - set(sc.held)
    for g, when in delivered:
        assert when >= sc.ready.get(g.payload, 0), f"{g.payload!r} delivered early"
    clock.t = t0 + FAR + 60_000  # past the dropped items' ready times
    assert await e.lease("q", 100) == []

    c = new_compactor(store, clock, **KILL_OPTS)
    await compact_until_idle(c, clock)
    await assert_tidy(store)
    assert (await read_manifest(store, "q")).segments == []
    clock.advance(1)
    dead = await drain(e, "dlq", clock)
    if sc.dead_letter:
        assert once_each(payloads(dead)) == sc.old
        assert all(g.meta and g.meta["source_queue"] == "q"
                   and g.meta["error"] == "retention expired" for g, _ in dead)
    else:
        assert dead == []
    await compact_until_idle(c, clock)
    assert sorted(await keys_of(store)) == [f"{NS}/manifests/dlq", f"{NS}/manifests/q"]


@pytest.mark.parametrize("dead_letter", [False, True], ids=["drop", "dead-letter"])
async def test_crash_at_every_store_call_of_a_pass(dead_letter: bool) -> None:
    # The reference pass, uninterrupted: it enumerates the calls to kill at.
    sc = await build_scenario(dead_letter)
    spy = FaultyStore(sc.store)
    report = await Compactor(make_engine(spy, sc.clock), clock=sc.clock,
                             options=CompactorOptions(safety_age=0, lease_grace=0, min_age=0,
                                                      **KILL_OPTS)).run_once()
    assert (report.segments_folded, report.segments_merged, report.merged_into) == (4, 6, 3)
    assert report.items_expired == 3
    reference = list(spy.calls)
    ops = Counter(op for op, _ in reference)
    assert ops["put"] and ops["delete"] and ops["get"] and ops["list"]
    await check_recovery(sc)

    killed = 0
    for after in (False, True):
        for k in range(len(reference)):
            sc = await build_scenario(dead_letter)
            faulty = CrashAt(sc.store, k, after=after)
            doomed = Compactor(make_engine(faulty, sc.clock), clock=sc.clock,
                               options=CompactorOptions(safety_age=0, lease_grace=0, min_age=0,
                                                        **KILL_OPTS))
            with pytest.raises(SimulatedCrash):
                await doomed.run_once()
            del doomed  # the process died with its engine and caches
            assert [op for op, _ in faulty.calls] == [op for op, _ in reference[: k + 1]]
            try:
                await check_recovery(sc)
            except AssertionError as exc:
                where = "after" if after else "before"
                raise AssertionError(f"crash {where} call #{k} {reference[k]}: {exc}") from exc
            killed += 1
    print(f"\n[kill points] {'dead-letter' if dead_letter else 'drop'}: {len(reference)} "
          f"store calls in a pass ({dict(ops)}); {killed} crashes exercised "
          f"({len(reference)} before + {len(reference)} after a call)")


# -- 5. two compactors at once, with a producer and a consumer ----------------------------


class _Workload:
    """A producer, a consumer and two compactors on one queue, each its own engine."""

    def __init__(self, store: Store, total: int) -> None:
        self.clock = SystemClock()
        self.producer = make_engine(store, self.clock)
        self.consumer = make_engine(store, self.clock)
        # A safety age well above the consumer's manifest staleness (0.2 s) and the
        # time a merge takes to publish; GC still runs during the test.
        self.compactors = [Compactor(make_engine(store, self.clock), options=CompactorOptions(
            safety_age=1.5, merge_below=40, merge_target=60, min_age=0)) for _ in range(2)]
        self.rng = random.Random(11)
        self.total = total
        self.produced: list[bytes] = []
        self.completed: Counter[bytes] = Counter()
        self.inflight: set[bytes] = set()
        self.problems: list[str] = []
        self.producing_done = asyncio.Event()
        self.reports: list[Report] = []

    def finished(self) -> bool:
        return self.producing_done.is_set() and len(self.completed) == len(self.produced)

    async def produce(self) -> None:
        n = 0
        while n < self.total:
            batch = [f"p{n + i}".encode() for i in range(self.rng.randint(1, 8))]
            try:
                await self.producer.produce("q", batch)
            except PublishAborted:
                continue  # fenced by a GC floor: nothing was published; send again
            self.produced.extend(batch)
            n += len(batch)
            await asyncio.sleep(self.rng.uniform(0, 0.02))
        self.producing_done.set()

    async def consume(self) -> None:
        await asyncio.sleep(0.3)  # let a backlog of narrow segments build up
        while not self.finished():
            got = await self.consumer.lease("q", self.rng.randint(1, 6))
            for g in got:
                if g.payload in self.completed:
                    self.problems.append(f"completed {g.payload!r} came back")
                if g.payload in self.inflight:
                    self.problems.append(f"{g.payload!r} leased twice at once")
                self.inflight.add(g.payload)
            if got and self.rng.random() < 0.3:
                await asyncio.sleep(self.rng.uniform(0, 0.05))  # hold leases across a pass
            for g in got:
                await self._settle(g)
            await asyncio.sleep(0.01 if got else 0.02)

    async def _settle(self, g: LeasedItem) -> None:
        self.inflight.discard(g.payload)
        if g.attempts < 3 and self.rng.random() < 0.15:
            later = self.clock.now_ms() + self.rng.randint(0, 300)
            await self.consumer.retry(g.token, retry_at_ms=later, error="try again")
        else:
            await self.consumer.complete([g.token])
            self.completed[g.payload] += 1

    async def compact(self) -> None:
        rounds = 0
        while rounds < 8 or not self.finished():
            rounds += 1
            self.reports.extend(await asyncio.gather(*(c.run_once() for c in self.compactors)))
            await asyncio.sleep(self.rng.uniform(0, 0.1))


@pytest.mark.parametrize("kind", WITH_SEAWEED)
async def test_two_compactors_at_once(store_factory: StoreFactory, kind: str) -> None:
    raw = await store_factory(kind)
    # Random latency on the in-memory store, so that tasks interleave at store calls.
    store: Store = FaultyStore(raw, seed=7, max_latency=0.003) if kind == "memory" else raw
    await make_engine(store, SystemClock()).create_queue("q", QueueConfig(lease_timeout=120))
    w = _Workload(store, total=240 if kind != "seaweed" else 160)
    await asyncio.wait_for(asyncio.gather(w.produce(), w.consume(), w.compact()), 120)

    assert w.problems == []
    assert len(w.produced) >= w.total
    assert once_each(w.produced) == set(w.completed)  # nothing lost
    assert set(w.completed.values()) == {1}  # nothing completed twice
    merged = sum(r.segments_merged for r in w.reports)
    print(f"\n[two compactors, {kind}] {len(w.reports)} passes: {merged} segments merged, "
          f"{sum(r.segments_folded for r in w.reports)} folded, "
          f"{sum(r.objects_deleted for r in w.reports)} objects deleted")
    assert merged > 0, "no merge happened while the queue was in use"
    assert await w.consumer.lease("q", 100) == []

    # Everything finished. When a pass has nothing to fold, it leaves a GC floor
    # younger than a minute alone, so objects the last passes orphaned are collected
    # by a pass a minute later: a clock 61 s ahead stands for it.
    later = OffsetClock(w.clock, 61)
    final = Compactor(make_engine(store, later),
                      options=CompactorOptions(safety_age=0, lease_grace=0, min_age=0))
    await final.run_once()
    await final.run_once()
    await assert_tidy(raw)
    assert await keys_of(raw) == [f"{NS}/manifests/q"]


# -- 6. lease cost does not grow with history ---------------------------------------------


async def test_lease_cost_does_not_grow_with_history(store: Store, clock: ManualClock) -> None:
    e = make_engine(store, clock)
    for q in ("fresh", "history"):
        await e.create_queue(q)
    for n in range(24):  # 24 segments, every item completed
        await e.produce("history", [f"{n}-{k}".encode() for k in range(5)])
        clock.advance(1)
    for _ in range(2):
        got = await e.lease("history", 100)
        await e.complete([g.token for g in got])
    assert (await e.stats("history")).completed == 120
    for q in ("fresh", "history"):
        await e.produce(q, [b"x", b"y", b"z"])
    clock.advance(1)

    async def lease_cost(queue: str) -> Counter[str]:
        """Requests of one lease (and its completion) by a just-started engine."""
        counting = CountingStore(store)
        fresh_engine = make_engine(counting, clock)
        [item] = await fresh_engine.lease(queue, 1)
        await fresh_engine.complete([item.token])
        return Counter(counting.requests)

    fresh, history = await lease_cost("fresh"), await lease_cost("history")
    assert history["get"] > fresh["get"] + 20  # uncompacted: a GET per lease object
    assert (await new_compactor(store, clock).run_once()).segments_folded == 24
    clock.advance(1)
    assert await lease_cost("history") == await lease_cost("fresh") == fresh


# -- findings: stranded merges and re-delivery with a short safety age ---------------------


class Ticking(FaultyStore):
    """Every store call takes 5 ms of the ManualClock: a pass that takes time."""

    def __init__(self, inner: Store, clock: ManualClock) -> None:
        super().__init__(inner)
        self.clock = clock

    async def _call(self, op: str, key: str, write: bool,
                    fn: Callable[[], Awaitable[T]]) -> T:
        self.clock.advance(0.005)
        return await super()._call(op, key, write, fn)


@pytest.mark.parametrize("safety_age", [
    0.0,
    2.0,
])
async def test_merged_items_stay_deliverable_when_a_pass_takes_time(
        store: Store, clock: ManualClock, safety_age: float) -> None:
    e = make_engine(store, clock)
    await e.create_queue("q")
    for n in range(4):
        await e.produce("q", [f"{n}-{k}".encode() for k in range(5)])
        clock.advance(1)
    got = await e.lease("q", 20)
    await e.complete([g.token for g in got if g.payload.endswith(b"-0")])
    for g in got:
        if not g.payload.endswith(b"-0"):
            await e.retry(g.token)
    c = Compactor(make_engine(Ticking(store, clock), clock), clock=clock,
                  options=CompactorOptions(safety_age=safety_age, min_age=0))
    for _ in range(3):
        await c.run_once()
        clock.advance(1)
    assert len((await read_manifest(store, "q")).segments) == 1
    leased = await make_engine(store, clock).lease("q", 100)
    assert len(leased) == 16


@pytest.mark.parametrize("safety_age", [
    0.0,
    5.0,
])
async def test_engine_with_a_recent_manifest_never_redelivers_merged_items(
        store: Store, clock: ManualClock, safety_age: float) -> None:
    e = make_engine(store, clock)
    await e.create_queue("q")
    for n in range(4):
        await e.produce("q", [f"{n}-{k}".encode() for k in range(4)])
        clock.advance(1)
    first = await e.lease("q", 5)  # all of segment 0, one item of segment 1
    await e.complete([g.token for g in first])
    clock.advance(0.1)
    # the default lease grace keeps the sealed lease objects e may still consult
    report = await new_compactor(store, clock, safety_age=safety_age,
                                 lease_grace=60.0).run_once()
    assert report.segments_merged == 3
    seen: list[bytes] = []
    for _ in range(20):  # e's manifest is less than 0.2 s old: it is not re-read
        got = await e.lease("q", 1)
        if not got:
            break
        seen.append(got[0].payload)
        await e.complete([got[0].token])
        clock.advance(0.01)
    clock.advance(1)
    seen += payloads(await drain(make_engine(store, clock), "q", clock))
    assert sorted(seen) == sorted(f"{n}-{k}".encode() for n in range(1, 4) for k in range(4)
                                  if (n, k) != (1, 0))
