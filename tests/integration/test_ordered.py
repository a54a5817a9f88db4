"""Ordered (fifo) queues with message groups, at the engine level: one behaviour a test.

An ordered queue (``QueueConfig(fifo=True)``) hands out the items of a message group
(``NewItem(meta={"group": g})``) in the order they were produced, one handout of a
group at a time: the lease walk goes in sequence order (``SegmentMeta.seq``), and a
group whose first unfinished item is not leasable now (leased, waiting for a retry
time, scheduled for later, being dead-lettered, sealed by a compactor), or that has
an item of an earlier handout still in flight, has none of its later items handed
out. A lease may hand out the head of a group and items right after it (how far it
goes past the end of a produce call's segment is not fixed here). Items without a
group block nothing; on a standard queue groups change nothing.

:class:`OrderRules` checks the two rules of an ordered queue on every lease call's
list, here and in tests/integration/test_ordered_property.py:

* order: when an item of group g is handed out, every item of g produced before it
  (a produce call acknowledged before its own began, or earlier in its own call) is
  finished (completed or dead-lettered) or earlier in the same list;
* one handout of a group in flight: the items of g in one lease call's list are one
  handout of g, in flight until each of them is completed, retried, or its lease
  deadline is passed by the clock; a lease call hands out nothing of g while another
  handout of g is in flight.

Stores: memory and file. Clocks: ManualClock, so nothing sleeps.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from compactor import Compactor, CompactorOptions
from okq import Engine, LeasedItem, ManualClock, NewItem, QueueConfig
from okq.errors import InvalidRequest, LeaseLost
from okq.keys import manifest_key, segment_key
from okq.manifests import read_manifest
from okq.model import Manifest, SegmentMeta, decode_segment, group_of, with_group
from okq.store import FaultyStore, SimulatedCrash, Store
from tests.engines import make_engine

pytestmark = pytest.mark.parametrize("kind", ["memory", "file"])

NS = "default"
Q = "q"
DLQ = "dlq"


# -- the order rules ----------------------------------------------------------------------


@dataclass(eq=False)
class Delivery:
    """One item of one lease call's list (compared by identity)."""

    item: str
    group: str | None
    token: str
    deadline: int
    call: int  # which lease call (OrderRules.calls) handed it out
    position: int  # its place in that call's list
    open: bool = True  # neither completed nor retried

    def in_flight(self, now: int) -> bool:
        return self.open and self.deadline > now


@dataclass
class OrderRules:
    """A model of what an ordered queue may hand out; see the module docstring.

    Items are named by their payloads (unique): a compactor merge gives an item a
    new id. ``finished`` holds the completed items and those seen in the dead-letter
    queue (the caller reports them with :meth:`dead`)."""

    tick: int = 0
    group: dict[str, str | None] = field(default_factory=dict)
    # item -> the items of its group that must come before it
    before: dict[str, set[str]] = field(default_factory=dict)
    acked: list[tuple[int, list[str]]] = field(default_factory=list)  # (ack tick, items)
    finished: set[str] = field(default_factory=set)
    completed: dict[str, Delivery] = field(default_factory=dict)
    latest: dict[str, Delivery] = field(default_factory=dict)  # item -> its last delivery
    attempts: dict[str, int] = field(default_factory=dict)  # item -> times handed out
    first: dict[str, tuple[int, int]] = field(default_factory=dict)  # item -> (call, position)
    calls: int = 0
    handed_out: int = 0

    def begin(self) -> int:
        """Call before a produce: its start, for :meth:`produced`."""
        self.tick += 1
        return self.tick

    def produced(self, items: Sequence[tuple[str, str | None]], began: int) -> None:
        """A produce call that :meth:`begin` returned ``began`` for was acknowledged.
        Its items come after those of every produce acknowledged before it began
        (not those of a produce that overlapped it), and after their own call's
        earlier items."""
        earlier = [i for ack, call in self.acked if ack < began for i in call]
        for n, (item, group) in enumerate(items):
            assert item not in self.group, f"payload {item} produced twice"
            self.group[item] = group
            if group is None:
                self.before[item] = set()
                continue
            self.before[item] = ({i for i in earlier if self.group[i] == group}
                                 | {i for i, g in items[:n] if g == group})
        self.acked.append((self.begin(), [i for i, _ in items]))

    def leased(self, got: Sequence[LeasedItem], now: int) -> list[Delivery]:
        """Check one lease call's list (leased at ``now``) and record it."""
        self.calls += 1
        here: set[str] = set()
        for x in got:
            item = x.payload.decode()
            assert item in self.group, f"handed out {item}, which was never produced"
            group = self.group[item]
            assert group_of(x.meta) == group, (item, x.meta)
            assert item not in here, f"{item} twice in one lease call's list: {names(got)}"
            assert item not in self.finished, f"{item} handed out after it finished"
            prev = self.latest.get(item)
            assert prev is None or not prev.in_flight(now), (
                f"{item} handed out while its delivery of call {prev.call} is in flight")
            assert x.attempts == self.attempts.get(item, 0) + 1, (item, x.attempts)
            missing = sorted(self.before[item] - self.finished - here)
            assert not missing, (
                f"{item} of group {group} handed out (list {names(got)}) before {missing}, "
                "produced earlier, finished")
            here.add(item)
        groups = {self.group[x.payload.decode()] for x in got} - {None}
        for g in sorted(groups, key=str):
            other = sorted({(d.call, d.item) for d in self.latest.values()
                            if d.group == g and d.in_flight(now)})
            assert not other, (
                f"group {g} handed out again (list {names(got)}) while an earlier handout of "
                f"it is in flight: (call, item) {other}")
        out = []
        for n, x in enumerate(got):
            item = x.payload.decode()
            d = Delivery(item, self.group[item], x.token, x.lease_deadline_ms, self.calls, n)
            self.latest[item] = d
            self.attempts[item] = self.attempts.get(item, 0) + 1
            self.first.setdefault(item, (self.calls, n))
            out.append(d)
        self.handed_out += len(out)
        return out

    def current(self, d: Delivery) -> bool:
        """Whether ``d`` is its item's current delivery (an expired lease nobody leased
        again still is, until a lease dead-letters it)."""
        return d.open and self.latest.get(d.item) is d and d.item not in self.finished

    def complete(self, d: Delivery) -> None:
        assert self.current(d) and d.item not in self.completed, d
        d.open = False
        self.finished.add(d.item)
        self.completed[d.item] = d

    def retried(self, d: Delivery) -> None:
        assert self.current(d), d
        d.open = False

    def dead(self, item: str) -> None:
        assert item not in self.completed, f"{item} completed and dead-lettered"
        self.finished.add(item)

    def unfinished(self) -> set[str]:
        return set(self.group) - self.finished

    def check_first_handouts(self) -> None:
        """Each group's items were first handed out in produce order."""
        for item, at in self.first.items():
            for earlier in self.before[item]:
                assert earlier in self.first and self.first[earlier] < at, (
                    f"{item} first handed out at (call, position) {at}, {earlier} (produced "
                    f"before it) at {self.first.get(earlier)}")

    def check_completion_order(self) -> None:
        """The deliveries that completed items came in produce order, group by group
        (when the consumer completes each list whole, in order)."""
        for item, d in self.completed.items():
            for earlier in self.before[item] & set(self.completed):
                e = self.completed[earlier]
                assert (e.call, e.position) < (d.call, d.position), (
                    f"{item} completed from call {d.call}, {earlier} (produced before it) "
                    f"from call {e.call}")


# -- helpers ----------------------------------------------------------------------------


def new(name: str, group: str | None = None, at: int | None = None) -> NewItem:
    return NewItem(name.encode(), at, meta=with_group(None, group))


def names(got: Sequence[LeasedItem]) -> list[str]:
    return [x.payload.decode() for x in got]


async def fifo(engine: Engine, **settings: Any) -> None:
    await engine.create_queue(Q, QueueConfig(fifo=True, **settings))


async def lease(engine: Engine, n: int, **kw: Any) -> tuple[list[str], list[LeasedItem]]:
    got = await engine.lease(Q, n, **kw)
    return names(got), got


async def produce_groups(engine: Engine, calls: Sequence[Sequence[tuple[str, str | None]]]
                         ) -> dict[str | None, list[str]]:
    """Produce each call's (name, group) items; returns each group's names in order."""
    order: dict[str | None, list[str]] = {}
    for call in calls:
        await engine.produce(Q, [new(n, g) for n, g in call])
        for n, g in call:
            order.setdefault(g, []).append(n)
    return order


def assert_head_first(got: Sequence[str], rest: Sequence[str]) -> None:
    """``got`` (a list's items of one group) is the group's head and items right after
    it: a prefix of ``rest``, the group's unfinished items in order. A handout may
    stop at a segment's end (produce call's), so how far it goes is not fixed."""
    assert got and list(got) == list(rest[:len(got)]), (got, rest)


def by_group(seq: Sequence[str], groups: Mapping[str, str | None]
             ) -> dict[str | None, list[str]]:
    out: dict[str | None, list[str]] = {}
    for n in seq:
        out.setdefault(groups[n], []).append(n)
    return out


async def segments(store: Store, m: Manifest) -> list[tuple[SegmentMeta, list[tuple[int, str]]]]:
    """Each listed segment, by sequence number, with its items' (sequence number, name)."""
    out = []
    for sm in sorted(m.segments, key=lambda s: -1 if s.seq is None else s.seq):
        seg = decode_segment((await store.get(segment_key(NS, Q, sm.id))).data)
        items = []
        for i, item in enumerate(seg.items[:sm.count]):
            seq = sm.item_seq(i, item)
            assert seq is not None, f"item {i} of segment {sm.id} has no sequence number"
            items.append((seq, item.payload.decode()))
        out.append((sm, items))
    return out


# -- order --------------------------------------------------------------------------------


async def test_a_group_comes_out_in_produce_order_across_produce_calls(engine: Engine) -> None:
    await fifo(engine)
    calls = [[(f"{g}{k}-{i}", g) for g in ("a", "b") for i in range(k % 3)]
             + [(f"c{k}", "c")] for k in range(6)]
    want = await produce_groups(engine, calls)
    out: list[str] = []
    while got := await engine.lease(Q, 1):
        out += names(got)
        await engine.complete([x.token for x in got])
    # One at a time and each completed: the whole queue comes out in produce order.
    assert out == [n for call in calls for n, _ in call]
    groups = {n: g for call in calls for n, g in call}
    assert by_group(out, groups) == want


async def test_a_lease_hands_out_consecutive_items_of_a_group(engine: Engine) -> None:
    """Several consecutive items of one group in one list, in order; the batch size
    bounds them; the group is held while they are in flight."""
    await fifo(engine)
    await engine.produce(Q, [new("a0", "a"), new("a1", "a"), new("a2", "a"), new("b0", "b")])
    got, items = await lease(engine, 2)
    assert got == ["a0", "a1"]
    got, more = await lease(engine, 10)
    assert got == ["b0"]  # a2 waits for a0 and a1
    await engine.complete([x.token for x in items + more])
    assert (await lease(engine, 10))[0] == ["a2"]


async def test_a_lease_takes_several_groups_each_in_order(engine: Engine) -> None:
    """Groups interleaved in a produce: one lease takes them all, each group's items
    in order (how the groups interleave in the list is not fixed here)."""
    await fifo(engine)
    produced = ["a0", "b0", "a1", "x0", "a2", "b1", "x1"]
    await engine.produce(Q, [new(n, None if n[0] == "x" else n[0]) for n in produced])
    got, items = await lease(engine, 10)
    assert sorted(got) == sorted(produced)
    groups = {n: None if n[0] == "x" else n[0] for n in produced}
    assert by_group(got, groups) == by_group(produced, groups)
    assert await lease(engine, 10) == ([], [])
    await engine.complete([x.token for x in items])


async def test_a_handout_goes_on_into_later_produce_calls_in_order(engine: Engine) -> None:
    """A group's items from several produce calls: a handout is its head and (maybe)
    the items right after it, never one that skips an item, and nothing of the group
    while that handout is in flight."""
    await fifo(engine)
    calls = [[("a0", "a"), ("a1", "a")], [("b0", "b"), ("a2", "a")], [("a3", "a")]]
    await produce_groups(engine, calls)
    rest = ["a0", "a1", "a2", "a3"]
    while rest:
        got, items = await lease(engine, 10)
        mine = [n for n in got if n.startswith("a")]
        assert_head_first(mine, rest)
        assert await lease(engine, 10) == ([], [])  # nothing more of a (or b) meanwhile
        await engine.complete([x.token for x in items])
        rest = rest[len(mine):]


# -- one handout of a group at a time ----------------------------------------------------------


async def test_a_group_in_flight_is_held_and_other_groups_are_not(engine: Engine) -> None:
    await fifo(engine)
    await produce_groups(engine, [[("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b")],
                                  [("c0", "c"), ("a2", "a")]])
    got, first = await lease(engine, 1)
    assert got == ["a0"]
    got, second = await lease(engine, 10)
    assert got == ["b0", "b1", "c0"]  # nothing of a while a0 is in flight
    assert await lease(engine, 10) == ([], [])
    await engine.complete([first[0].token])
    got, third = await lease(engine, 10)
    assert_head_first(got, ["a1", "a2"])  # a2 is in a later produce call's segment
    await engine.complete([x.token for x in second + third])
    if got == ["a1"]:
        got, last = await lease(engine, 10)
        assert got == ["a2"]
        await engine.complete([last[0].token])
    stats = await engine.stats(Q)
    assert (stats.completed, stats.available, stats.in_flight) == (6, 0, 0)


async def test_completing_part_of_a_handout_keeps_the_group_held(engine: Engine) -> None:
    await fifo(engine)
    await produce_groups(engine, [[("a0", "a"), ("a1", "a"), ("a2", "a")]])
    _, items = await lease(engine, 2)
    await engine.complete([items[0].token])  # a1 is still in flight
    assert await lease(engine, 5) == ([], [])
    await engine.complete([items[1].token])
    assert (await lease(engine, 5))[0] == ["a2"]


# -- retry, expiry, dead letters ----------------------------------------------------------------


async def test_a_retried_head_keeps_its_place(engine: Engine) -> None:
    await fifo(engine)
    await produce_groups(engine, [[("a0", "a"), ("a1", "a"), ("a2", "a")], [("a3", "a")]])
    _, items = await lease(engine, 1)
    await engine.retry(items[0].token)
    got, items = await lease(engine, 5)
    assert got[:3] == ["a0", "a1", "a2"]
    assert_head_first(got, ["a0", "a1", "a2", "a3"])
    assert [x.attempts for x in items[:3]] == [2, 1, 1]


async def test_a_retry_time_holds_the_whole_group(engine: Engine, clock: ManualClock) -> None:
    await fifo(engine)
    await produce_groups(engine, [[("a0", "a"), ("b0", "b"), ("a1", "a"), ("b1", "b")]])
    _, items = await lease(engine, 1)
    await engine.retry(items[0].token, retry_at_ms=clock.now_ms() + 10_000)
    got, b = await lease(engine, 10)
    assert got == ["b0", "b1"]  # a1 waits behind a0's retry time
    await engine.complete([x.token for x in b])
    clock.advance(9.9)
    assert await lease(engine, 10) == ([], [])
    clock.advance(0.1)
    got, items = await lease(engine, 10)
    assert got == ["a0", "a1"]
    assert [x.attempts for x in items] == [2, 1]


async def test_an_expired_lease_redelivers_the_head_first(
    engine: Engine, clock: ManualClock
) -> None:
    await fifo(engine, lease_timeout=5)
    await produce_groups(engine, [[("a0", "a"), ("a1", "a"), ("a2", "a"), ("b0", "b")]])
    got, _ = await lease(engine, 2)
    assert got == ["a0", "a1"]
    clock.advance(4.999)
    assert (await lease(engine, 5))[0] == ["b0"]  # a is held until the deadline
    clock.advance(0.001)
    got, items = await lease(engine, 5)
    assert got == ["a0", "a1", "a2"]
    assert [x.attempts for x in items] == [2, 2, 1]


async def test_a_head_out_of_attempts_is_dead_lettered_and_unblocks_its_group(
    engine: Engine, clock: ManualClock
) -> None:
    await engine.create_queue(DLQ)
    await fifo(engine, lease_timeout=5, max_attempts=2, dead_queue=DLQ)
    await produce_groups(engine, [[("a0", "a"), ("a1", "a"), ("a2", "a")], [("b0", "b")]])
    # a0 by retries: the second retry moves it to the dead-letter queue.
    for attempt in (1, 2):
        got, items = await lease(engine, 1)
        assert got == ["a0"] and items[0].attempts == attempt
        await engine.retry(items[0].token, error=f"boom {attempt}")
    got, items = await lease(engine, 1)
    assert got == ["a1"]
    # a1 by expiry: the lease that finds it out of attempts dead-letters it.
    clock.advance(5)
    got, items = await lease(engine, 1)
    assert got == ["a1"] and items[0].attempts == 2
    clock.advance(5)
    got, b0 = await lease(engine, 5)
    assert got == ["b0"]  # a1 went to the dead-letter path; a2 waits for the move
    await engine.complete([b0[0].token])
    got, items = await lease(engine, 5)
    assert got == ["a2"] and items[0].attempts == 1
    dead = await engine.lease(DLQ, 10)
    assert names(dead) == ["a0", "a1"]
    assert [(x.meta or {}).get("error") for x in dead] == ["boom 2", None]
    assert all(group_of(x.meta) == "a" for x in dead)  # the group rides along in the meta


async def test_a_head_being_dead_lettered_holds_its_group(
    store: Store, clock: ManualClock
) -> None:
    """A head whose move to the dead-letter queue was cut short (the process died
    after marking it) holds its group until a later walk finishes the move."""
    faulty = FaultyStore(store)
    crashed = await make_engine(faulty, clock).start()
    await crashed.create_queue(DLQ)
    await fifo(crashed, dead_queue=DLQ)
    await crashed.produce(Q, [new("a0", "a"), new("a1", "a"), new("b0", "b")])
    _, items = await lease(crashed, 1)
    faulty.inject("put", "crash", key=manifest_key(NS, DLQ))
    with pytest.raises(SimulatedCrash):
        await crashed.retry(items[0].token, dead=True)
    engine = await make_engine(store, clock).start()  # the node, started again
    got, b = await lease(engine, 5)
    assert got == ["b0"]  # a0 is being dead-lettered: a1 waits
    await engine.complete([b[0].token])
    clock.advance(5)
    assert await lease(engine, 5) == ([], [])  # within dead_grace: nobody helps yet
    clock.advance(6)
    # Past it: the walk notes the move and finishes it after its lease; a1 comes in
    # the next one.
    assert await lease(engine, 5) == ([], [])
    assert (await lease(engine, 5))[0] == ["a1"]
    assert names(await engine.lease(DLQ, 5)) == ["a0"]


@pytest.mark.parametrize("ordered", [True, False], ids=["fifo", "standard"])
async def test_a_stale_copy_never_dead_letters_twice(
    store: Store, clock: ManualClock, ordered: bool
) -> None:
    """An engine whose copy of a lease object still says "being dead-lettered" (its
    walk re-reads only ``lease_state_reads`` objects a call) does not move the item to
    the dead-letter queue again after another engine did, even once the move's
    idempotency key expired (found by test_ordered_property.py: okq/finishers.py
    helped from the cached copy; it re-reads it now)."""
    faulty = FaultyStore(store)
    stale = await make_engine(store, clock).start()
    crashed = make_engine(faulty, clock)
    await stale.create_queue(DLQ)
    await stale.create_queue(Q, QueueConfig(fifo=ordered, lease_timeout=3600,
                                            dead_queue=DLQ))
    for k in range(4):
        await stale.produce(Q, [new(f"i{k}")])
    await stale.produce(Q, [new("x")])
    held = await stale.lease(Q, 4)  # four leases in flight: four re-reads a walk
    got, items = await lease(crashed, 1)
    assert got == ["x"]
    faulty.inject("put", "crash", key=manifest_key(NS, DLQ))
    with pytest.raises(SimulatedCrash):  # x is marked, its move cut short
        await crashed.retry(items[0].token, dead=True)
    assert await lease(stale, 1) == ([], [])  # stale's copy: x is being dead-lettered
    clock.advance(11)
    helper = await make_engine(store, clock).start()
    assert await lease(helper, 1) == ([], [])  # finishes the move: x is dead
    assert names(await helper.lease(DLQ, 10, lease_timeout=3600)) == ["x"]
    clock.advance(500)  # past the dead letter's idempotency window
    assert await lease(stale, 1) == ([], [])
    dead = await helper.lease(DLQ, 10)
    assert names(dead) == [], f"x dead-lettered again: {[x.meta for x in dead]}"
    await stale.complete([x.token for x in held])


async def test_a_retry_marked_dead_unblocks_the_group(engine: Engine) -> None:
    await engine.create_queue(DLQ)
    await fifo(engine, dead_queue=DLQ)
    await produce_groups(engine, [[("a0", "a"), ("a1", "a")]])
    _, items = await lease(engine, 1)
    await engine.retry(items[0].token, dead=True)
    assert (await lease(engine, 5))[0] == ["a1"]
    assert names(await engine.lease(DLQ, 5)) == ["a0"]


# -- items without a group, scheduled items, standard queues ------------------------------------


async def test_items_without_a_group_block_nothing(engine: Engine) -> None:
    await fifo(engine)
    await produce_groups(engine, [[("x0", None), ("a0", "a"), ("x1", None)],
                                  [("a1", "a"), ("x2", None)]])
    assert (await lease(engine, 1))[0] == ["x0"]
    assert (await lease(engine, 1))[0] == ["a0"]  # x0 in flight holds nothing back
    assert (await lease(engine, 5))[0] == ["x1", "x2"]  # a1 is held by a0


async def test_a_scheduled_head_holds_its_group_until_due(
    engine: Engine, clock: ManualClock
) -> None:
    await fifo(engine)
    at = clock.now_ms() + 10_000
    await engine.produce(Q, [new("a0", "a", at), new("a1", "a"), new("b0", "b"),
                             new("x0", None, at), new("x1", None)])
    got, items = await lease(engine, 10)
    assert got == ["b0", "x1"]  # x0 (scheduled, no group) holds x1 back no more than b0
    await engine.complete([x.token for x in items])
    clock.advance(9.999)
    assert await lease(engine, 10) == ([], [])
    clock.advance(0.001)
    assert (await lease(engine, 10))[0] == ["a0", "a1", "x0"]


async def test_a_scheduled_item_after_the_head_ends_the_handout(
    engine: Engine, clock: ManualClock
) -> None:
    await fifo(engine)
    at = clock.now_ms() + 10_000
    await engine.produce(Q, [new("a0", "a"), new("a1", "a", at), new("a2", "a")])
    got, items = await lease(engine, 10)
    assert got == ["a0"]
    await engine.complete([items[0].token])
    assert await lease(engine, 10) == ([], [])  # a1 is the head now, due later
    clock.advance(10)
    assert (await lease(engine, 10))[0] == ["a1", "a2"]


async def test_a_standard_queue_ignores_groups(engine: Engine, clock: ManualClock) -> None:
    await engine.create_queue(Q, QueueConfig(lease_timeout=5))
    at = clock.now_ms() + 10_000
    await engine.produce(Q, [new("a0", "a", at), new("a1", "a"), new("a2", "a")])
    got, items = await lease(engine, 1)
    assert got == ["a1"]  # a0 is scheduled: nothing waits for it
    got, _ = await lease(engine, 5)
    assert got == ["a2"]  # a1 in flight holds nothing back
    await engine.retry(items[0].token, retry_at_ms=clock.now_ms() + 60_000)
    clock.advance(10)
    got, _ = await lease(engine, 5)
    assert sorted(got) == ["a0", "a2"]  # a2's lease is over; a1 waits for its retry time


@pytest.mark.parametrize("ordered", [True, False], ids=["fifo", "standard"])
async def test_a_zero_lease_timeout_hands_out_each_item_once_a_call(
    engine: Engine, ordered: bool
) -> None:
    """A delivery with lease_timeout=0 is over at once; the lease call still hands
    each item out once (okq/scheduler.py's lease passes used to lease the same items
    again until the batch was full: a0, a1, a0, a1, a0, a group's earlier item after
    its later one)."""
    await engine.create_queue(Q, QueueConfig(fifo=ordered))
    await engine.produce(Q, [new("a0", "a"), new("a1", "a")])
    got, _ = await lease(engine, 5, lease_timeout=0)
    assert got == ["a0", "a1"]  # not a0, a1, a0, a1, a0 (attempts 1, 1, 2, 2, 3)


# -- sequence numbers and compaction -----------------------------------------------------------


@pytest.mark.parametrize("ordered", [True, False], ids=["fifo", "standard"])
async def test_published_segments_are_numbered_by_items_produced(
    engine: Engine, store: Store, ordered: bool
) -> None:
    await engine.create_queue(Q, QueueConfig(fifo=ordered))
    sizes = [3, 1, 4, 2]
    for k, size in enumerate(sizes):
        await engine.produce(Q, [new(f"s{k}-{i}", "a") for i in range(size)])
    m = await read_manifest(store, NS, Q)
    assert [sm.seq for sm in m.segments] == [0, 3, 4, 8] and m.produced == 10
    listed = await segments(store, m)
    assert [s for _, items in listed for s, _ in items] == list(range(10))
    assert [n for _, items in listed for _, n in items] == [
        f"s{k}-{i}" for k, size in enumerate(sizes) for i in range(size)]
    assert SegmentMeta.unpack(m.segments[1].pack()) == m.segments[1]


async def test_a_compactor_merge_keeps_each_group_in_order(
    engine: Engine, store: Store, clock: ManualClock
) -> None:
    await fifo(engine)
    rng = random.Random(5)
    calls = [[(f"{g}{k}-{i}", g) for i in range(rng.randint(1, 2))
              for g in [rng.choice(["a", "b", "c", None])]] for k in range(30)]
    rules = OrderRules()
    for call in calls:
        began = rules.begin()
        await engine.produce(Q, [new(n, g) for n, g in call])
        rules.produced(call, began)
    now = clock.now_ms
    # Some completed, one retried (a waiting item the merge carries), one kept leased
    # (its segment cannot be sealed: it splits the runs that are merged).
    for n in (1, 3):
        done = rules.leased(await engine.lease(Q, n), now())
        await engine.complete([d.token for d in done])
        for d in done:
            rules.complete(d)
    retried = rules.leased(await engine.lease(Q, 1), now())
    await engine.retry(retried[0].token, retry_at_ms=now() + 5_000)
    rules.retried(retried[0])
    held = rules.leased(await engine.lease(Q, 1), now())

    before = await read_manifest(store, NS, Q)
    c = Compactor(make_engine(store, clock), clock=clock,
                  options=CompactorOptions(min_age=0, merge_below=10_000, merge_target=12))
    report = await c.run_once()
    assert report.segments_merged >= 4 and report.merged_into >= 2, report
    after = await read_manifest(store, NS, Q)
    old = {sm.id for sm in before.segments}
    merged = [sm for sm in after.segments if sm.id not in old]
    assert merged and after.produced == before.produced
    listed = await segments(store, after)
    for sm, items in listed:
        if sm.id not in old:
            assert sm.seq == items[0][0], "a merged segment's seq is its first item's"
    seqs = [s for _, items in listed for s, _ in items]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # A merged segment carries live items only; the segments listed, in sequence
    # order, hold every live item in produce order.
    left = rules.unfinished()
    assert {n for sm, items in listed if sm.id not in old for _, n in items} <= left
    listed_live = [n for _, items in listed for _, n in items if n in left]
    produced = [n for call in calls for n, _ in call]
    assert listed_live == [n for n in produced if n in left]

    clock.advance(1)  # past manifest_max_age: the engine reads the merged manifest
    await engine.complete([held[0].token])
    rules.complete(held[0])
    for rounds in range(100):
        got = rules.leased(await engine.lease(Q, rng.randint(1, 4)), now())
        if not got and not rules.unfinished():
            break
        if not got:  # the retried item is not due yet
            clock.advance(1)
            continue
        await engine.complete([d.token for d in got])
        for d in got:
            rules.complete(d)
        if rounds == 3:  # merge again: merged segments' items keep their numbers
            clock.advance(1)
            await c.run_once()
            clock.advance(1)
    assert not rules.unfinished()
    rules.check_first_handouts()
    rules.check_completion_order()
    assert retried[0].item in rules.completed


async def test_a_segment_sealed_for_a_merge_holds_its_groups(
    store: Store, clock: ManualClock
) -> None:
    """A compactor that sealed segments and died before merging them: their groups
    are held (other groups are not) until a later pass merges them, in order."""
    engine = await make_engine(store, clock).start()
    await fifo(engine)
    for name, group in [("x0", None), ("a0", "a"), ("a1", "a"), ("b0", "b")]:
        await engine.produce(Q, [new(name, group)])  # a segment each
    got, held = await lease(engine, 1)
    assert got == ["x0"]  # in flight: its segment is not sealed, and splits no run here
    faulty = FaultyStore(store)
    options = CompactorOptions(min_age=0, merge_below=1_000)
    dying = Compactor(make_engine(faulty, clock), clock=clock, options=options)
    faulty.inject("put", "crash", key=f"/segments/{Q}/")  # the merged segment's write
    with pytest.raises(SimulatedCrash):
        await dying.run_once()
    await engine.produce(Q, [new("b1", "b"), new("c0", "c")])
    clock.advance(1)
    assert (await lease(engine, 5))[0] == ["c0"]  # a0 and b0 are sealed: a and b wait
    report = await Compactor(make_engine(store, clock), clock=clock,
                             options=options).run_once()
    assert (report.segments_merged, report.merged_into) == (3, 1), report
    m = await read_manifest(store, NS, Q)
    assert [sm.seq for sm in m.segments if sm.count == 3] == [1]  # a0's number
    clock.advance(1)
    got, _ = await lease(engine, 5)
    assert got[:3] == ["a0", "a1", "b0"] and got[3:] in ([], ["b1"]), got
    await engine.complete([held[0].token])


# -- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "name"), [
    ({"fifo": False}, "fifo"),
    ({"partitions": 3}, "partitions"),
    ({"read_only": [1]}, "read_only"),
    ({"lease_timeout": 9.0, "partitions": 4}, "partitions"),
])
async def test_an_ordered_queue_refuses_to_change_its_layout(
    engine: Engine, change: dict[str, Any], name: str
) -> None:
    await fifo(engine, partitions=2)
    with pytest.raises(InvalidRequest) as err:
        await engine.update_queue(Q, **change)
    assert err.value.field == name
    config = (await engine.get_queue(Q)).config
    assert (config.fifo, config.partitions, config.read_only, config.lease_timeout) == (
        True, 2, [], 30.0)
    # The same values, and other settings, are accepted.
    info = await engine.update_queue(Q, fifo=True, partitions=2, read_only=[], lease_timeout=9)
    assert (info.config.fifo, info.config.lease_timeout) == (True, 9.0)


async def test_a_standard_queue_cannot_become_ordered(engine: Engine) -> None:
    await engine.create_queue(Q, QueueConfig(partitions=2))
    with pytest.raises(InvalidRequest) as err:
        await engine.update_queue(Q, fifo=True)
    assert err.value.field == "fifo"
    info = await engine.update_queue(Q, partitions=3, read_only=[1], fifo=False)
    assert (info.config.fifo, info.config.partitions, info.config.read_only) == (False, 3, [1])


# -- two engines on one store --------------------------------------------------------------------


async def test_two_engines_never_hand_out_a_group_twice_at_once(
    store: Store, clock: ManualClock
) -> None:
    engines = [await make_engine(store, clock).start() for _ in range(2)]
    await engines[0].create_queue(DLQ)
    await fifo(engines[0], lease_timeout=10, max_attempts=3, dead_queue=DLQ)
    rng = random.Random(11)
    rules = OrderRules()
    for k in range(16):
        call = [(f"{g}{k}-{i}", g) for i in range(rng.randint(1, 3))
                for g in [rng.choice(["a", "b", "c", None])]]
        began = rules.begin()
        await engines[k % 2].produce(Q, [new(n, g) for n, g in call])
        rules.produced(call, began)
    held: list[Delivery] = []
    for step in range(400):
        if not rules.unfinished():
            break
        engine = engines[step % 2]
        got = rules.leased(await engine.lease(Q, rng.randint(1, 4)), clock.now_ms())
        held += got
        for x in await engines[0].lease(DLQ, 10):  # dead-lettered by a lease or a retry
            rules.dead(x.payload.decode())
            await engines[0].complete([x.token])
        await _settle(engine, rules, held, rng)
        clock.advance(rng.choice([0, 0, 1, 4]))
    assert not rules.unfinished(), f"not finished after 400 leases: {rules.unfinished()}"
    assert rules.handed_out > len(rules.group)  # some were handed out again
    rules.check_first_handouts()
    for e in engines:
        await e.close()


async def _settle(engine: Engine, rules: OrderRules, held: list[Delivery],
                  rng: random.Random) -> None:
    """Complete, retry (from an item to the end of its group's handout) or keep some
    current deliveries; stale ones are refused."""
    for d in list(held):
        if d not in held:  # retried with an earlier item of its handout
            continue
        if not rules.current(d):
            held.remove(d)
            with pytest.raises(LeaseLost):
                await engine.complete([d.token])
            continue
        what = rng.choice(["complete", "complete", "retry", "keep", "keep"])
        if what == "complete":
            await engine.complete([d.token])
            rules.complete(d)
            held.remove(d)
        elif what == "retry":
            tail = [t for t in held if t.call == d.call and t.group == d.group
                    and t.position >= d.position and rules.current(t)]
            for t in tail:
                await engine.retry(t.token)
                rules.retried(t)
                held.remove(t)


# -- a released head waits for the rest of its handout ---------------------------------------------


@pytest.mark.parametrize("release", ["retry", "expire-after-renewing-the-rest"])
async def test_a_released_head_waits_for_the_rest_of_its_handout(
    engine: Engine, clock: ManualClock, release: str
) -> None:
    """The head of a handout released (retried, or its lease over) while a later item
    of the handout is still leased is not handed out again until that one is done:
    its holder may still complete it, and the head would then be redone after it
    (an early version of okq/scheduler.py _pick_ordered looked at the head alone)."""
    await fifo(engine, lease_timeout=10)
    await produce_groups(engine, [[("a0", "a"), ("a1", "a"), ("a2", "a")]])
    rules = OrderRules()
    rules.produced([("a0", "a"), ("a1", "a"), ("a2", "a")], rules.begin())
    first = rules.leased(await engine.lease(Q, 2), clock.now_ms())
    assert [d.item for d in first] == ["a0", "a1"]
    if release == "retry":
        await engine.retry(first[0].token)  # a1 stays leased, in flight for 10 s
        rules.retried(first[0])
    else:
        await engine.renew(first[1].token, lease_timeout=60)
        first[1].deadline = clock.now_ms() + 60_000
        clock.advance(10)  # a0's lease is over, a1's is not
    got = await engine.lease(Q, 5)
    assert names(got) == [], f"handed out {names(got)} while a1 is in flight"
    await engine.complete([first[1].token])
    rules.complete(first[1])
    if release != "retry":
        clock.advance(50)  # a1's renewed lease would be over by now too
    got = await engine.lease(Q, 5)
    assert names(got) == ["a0", "a2"]
    rules.leased(got, clock.now_ms())
