"""Fair sharing between message groups on standard queues, at the engine level.

On a standard (non-fifo) queue whose items name message groups
(``NewItem(meta={"group": g})``, okq.model.with_group), a lease shares its batch out
among the groups (okq/scheduler.py, ``Scheduler._pick_fair``): one item at a time to
the group with the lowest share (its items in flight in the segments walked, plus
its handouts among this process's last ones), so that a group with a deep backlog
does not hold the others back. Items without a group share as one group. The walk
passes over segments whose groups all have their candidates without reading them,
by the manifest's ``SegmentMeta.groups`` (also written by the compactor's merges).

The measure (the issue's): one group with 100 times the backlog of nine others;
each lease completed at once; in the first 900 deliveries every one of the nine gets
close to its tenth. Deliveries are counted by the payload's name up to its first
"-" (the group it was produced for, or "_" for an item without a group), so that a
control without groups is counted the same way.

Stores: memory and file (the partitioned queue's tests, whose spread layer is above
the store, on memory). Clocks: ManualClock, so nothing sleeps.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import count
from typing import Any

import msgpack
import pytest

from compactor import Compactor, CompactorOptions
from okq import Engine, LeasedItem, ManualClock, NewItem, QueueConfig, scheduler
from okq.errors import LeaseLost
from okq.keys import partition_name, segment_key
from okq.manifests import read_manifest
from okq.model import GROUPS_LISTED, SegmentMeta, decode_segment, group_of, groups_of, with_group
from okq.partitions import GROUP_HASH_PREFIX, key_partition, token_queue
from okq.scheduler import Scheduler
from okq.service import QueueService
from okq.store import Store
from tests.engines import make_engine

BOTH = pytest.mark.parametrize("kind", ["memory", "file"])

NS = "default"
Q = "q"
NINE = tuple("BCDEFGHIJ")  # the groups with the short backlogs; "A" has the deep one


@pytest.fixture
def kind() -> str:
    return "memory"  # the tests marked BOTH run on the file store too


# -- helpers ----------------------------------------------------------------------------


def new(name: str, group: str | None = None, at: int | None = None) -> NewItem:
    return NewItem(name.encode(), at, meta=with_group(None, group))


def who(x: LeasedItem) -> str:
    """Whom an item was produced for: its payload's name up to the first "-"."""
    return x.payload.decode().split("-")[0]


async def deliver(engine: Engine | QueueService, n: int, batch: int,
                  queue: str = Q) -> Counter[str]:
    """Lease ``batch`` at a time, completing each lease at once, until ``n`` items
    were delivered; the deliveries by :func:`who`."""
    counts: Counter[str] = Counter()
    delivered = 0
    while delivered < n:
        got = await engine.lease(queue, batch)
        assert got, f"nothing leased after {delivered} deliveries (of {n}): {dict(counts)}"
        got = got[:n - delivered]  # the last lease may be cut: its rest is not counted
        counts.update(who(x) for x in got)
        delivered += len(got)
        if isinstance(engine, QueueService):
            await engine.complete(queue, [x.token for x in got])
        else:
            await engine.complete([x.token for x in got])
    return counts


def assert_shares(counts: Counter[str], groups: Iterable[str], floor: int) -> None:
    """Each of ``groups`` had at least ``floor`` deliveries."""
    short = {g: counts[g] for g in groups if counts[g] < floor}
    assert not short, (f"groups short of {floor} deliveries: {short}; "
                       f"all: {dict(sorted(counts.items()))}")


async def deep_backlog(engine: Engine, clock: ManualClock, grouped: bool = True,
                       a_batches: int = 100) -> None:
    """A: ``a_batches`` produce calls of 100 items (each a millisecond after the one
    before: A's items have waited longest); then each of NINE, 100 items in one call.
    ``grouped=False``: the same items without groups."""
    def group(g: str) -> str | None:
        return g if grouped else None

    for b in range(a_batches):
        await engine.produce(Q, [new(f"A-{b}-{i}", group("A")) for i in range(100)])
        clock.advance(0.001)
    for g in NINE:
        await engine.produce(Q, [new(f"{g}-{i}", group(g)) for i in range(100)])


async def listed(store: Store, queue: str = Q) -> list[SegmentMeta]:
    """The segments the queue's manifest in the store lists, in list order."""
    return list((await read_manifest(store, NS, queue)).segments)


async def items_of(store: Store, sm: SegmentMeta, queue: str = Q) -> list[Any]:
    seg = decode_segment((await store.get(segment_key(NS, queue, sm.id))).data)
    return list(seg.items[:sm.count])


def spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The segments the lease walk reads (their lease state and layout), in order,
    from now on: ``Scheduler._summary``'s calls."""
    read: list[str] = []
    real = Scheduler._summary

    async def spy(self: Scheduler, q: Any, sm: SegmentMeta, *args: Any) -> Any:
        read.append(sm.id)
        return await real(self, q, sm, *args)

    monkeypatch.setattr(Scheduler, "_summary", spy)
    return read


# -- 1. the measure: a deep backlog and nine short ones ---------------------------


def measure(kind: str, batch: int) -> tuple[int, int]:
    """The deliveries counted and each of the nine's floor among them: the first 900
    (a tenth: 90), at least 85 each, for leases of 10 and for leases of one (these go
    round the groups by the one served least lately). On the file store, whose writes
    wait for the disk, the first 300 (a tenth: 30), at least 27."""
    if kind == "memory":
        return 900, 85
    return 300, 27


@BOTH
@pytest.mark.parametrize("batch", [10, 1], ids=["batch10", "batch1"])
async def test_a_deep_backlog_does_not_hold_back_nine_other_groups(
    engine: Engine, clock: ManualClock, kind: str, batch: int
) -> None:
    """A: 10,000 items produced first; B..J: 100 each. In the first 900 deliveries
    each of the nine gets close to its 90 (see :func:`measure`), and A no more than
    its share either."""
    await engine.create_queue(Q)
    await deep_backlog(engine, clock)
    n, floor = measure(kind, batch)
    counts = await deliver(engine, n, batch)
    assert_shares(counts, NINE, floor)
    assert counts["A"] <= 2 * n // 10 - floor, dict(counts)


@BOTH
@pytest.mark.parametrize("control", ["without-groups", "fair-walk-bypassed"])
async def test_the_measure_fails_without_fair_sharing(
    engine: Engine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, kind: str,
    control: str
) -> None:
    """The control: the same backlog without groups, or with groups but the old lease
    walk (okq/scheduler.py ``_pick``, oldest ready first), delivers A's 10,000 items
    first: the measure above fails on it."""
    await engine.create_queue(Q)
    if control == "fair-walk-bypassed":
        monkeypatch.setattr(scheduler, "_grouped", lambda groups: False)
    await deep_backlog(engine, clock, grouped=control == "fair-walk-bypassed")
    n, floor = measure(kind, 10)
    counts = await deliver(engine, n, 10)
    assert counts == Counter({"A": n})
    with pytest.raises(AssertionError, match=f"short of {floor}"):
        assert_shares(counts, NINE, floor)


# -- 2. interleaved produce --------------------------------------------------------------


@BOTH
@pytest.mark.parametrize("calls", ["one-call-each", "one-call-together"])
async def test_a_group_produced_at_100_times_the_rate_does_not_crowd_out_the_others(
    engine: Engine, clock: ManualClock, calls: str
) -> None:
    """50 ticks, a second apart: each tick A produces 100 items (one call) and each
    of B..J one item, in a call of its own ("one-call-each": segments of one item,
    one group each) or in one call of the nine ("one-call-together": segments of more
    than GROUPS_LISTED groups, listed as ``()``). In the first 450 deliveries (leases
    of 10, completed at once) each of the nine gets close to its 45.

    "one-call-each" FAILS on the okq under test: the walk counts segments it has
    read against FAIR_READS (256) even when they hold nothing to lease, so once 256
    one-item segments of the nine are finished (and not yet folded away by a
    compactor), the walk stops in them and every lease goes to A alone: B..J get 28
    or 29 each of the first 450, A 195 (at 100 ticks, A 645 of the first 900). With
    a compactor pass every 10 leases folding the finished segments, each gets ~90 of
    900. See test_finished_segments_at_the_front_do_not_use_up_the_walks_reads for
    the cause, shown directly."""
    await engine.create_queue(Q)
    for t in range(50):
        await engine.produce(Q, [new(f"A-{t}-{i}", "A") for i in range(100)])
        if calls == "one-call-each":
            for g in NINE:
                await engine.produce(Q, [new(f"{g}-{t}", g)])
        else:
            await engine.produce(Q, [new(f"{g}-{t}", g) for g in NINE])
        clock.advance(1)
    counts = await deliver(engine, 450, 10)
    assert_shares(counts, NINE, 36)


# -- 3. items without a group ------------------------------------------------------------


@BOTH
async def test_items_without_a_group_share_as_one_group(
    engine: Engine, clock: ManualClock
) -> None:
    """A: 1,000 items and 1,000 without a group, produced together (50 of each a
    call, A's first: segments listing ("", "A")), then B: 200. A lease of 10 at a time:
    the items without a group get a third, like A and B, not the whole lease."""
    await engine.create_queue(Q)
    for b in range(20):
        await engine.produce(Q, [new(f"A-{b}-{i}", "A") for i in range(50)]
                             + [new(f"_-{b}-{i}") for i in range(50)])
        clock.advance(0.001)
    await engine.produce(Q, [new(f"B-{i}", "B") for i in range(200)])
    counts = await deliver(engine, 300, 10)
    assert_shares(counts, ["A", "_", "B"], 90)
    # And the same at one a time.
    counts = await deliver(engine, 30, 1)
    assert_shares(counts, ["A", "_", "B"], 9)


@BOTH
async def test_a_queue_with_no_groups_takes_the_old_walk(
    engine: Engine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items without groups only: oldest first, as before fair sharing, and the
    fair walk is not entered."""
    await engine.create_queue(Q)
    await engine.produce(Q, [new(f"x-{i}") for i in range(5)])
    clock.advance(0.001)
    await engine.produce(Q, [new(f"y-{i}") for i in range(5)])

    async def refuse(*args: Any) -> Any:
        raise AssertionError("the fair walk ran on a queue without groups")

    monkeypatch.setattr(Scheduler, "_pick_fair", refuse)
    got = await engine.lease(Q, 7)
    assert [x.payload.decode() for x in got] == [f"x-{i}" for i in range(5)] + ["y-0", "y-1"]


# -- 4. in-flight shares -----------------------------------------------------------------


@BOTH
async def test_a_group_holding_leases_gets_fewer_new_ones(
    store: Store, clock: ManualClock
) -> None:
    """A's 10 items leased (by one engine) and held; B produced. Another engine (no
    handouts of its own to go by) leases 10: all B, since A's share is its 10 in
    flight. Once A's leases are over (their deadline passed), with B's 10 held, a
    third engine's lease of 10 goes to A."""
    first, second, third = [await make_engine(store, clock).start() for _ in range(3)]
    await first.create_queue(Q, QueueConfig(lease_timeout=10))
    await first.produce(Q, [new(f"A-{i}", "A") for i in range(100)])
    held_a = await first.lease(Q, 10)
    assert {who(x) for x in held_a} == {"A"}
    await first.produce(Q, [new(f"B-{i}", "B") for i in range(100)])
    held_b = await second.lease(Q, 10, lease_timeout=60)
    assert Counter(who(x) for x in held_b) == {"B": 10}
    clock.advance(10)  # A's leases are over; B's last another 50 s
    got = await third.lease(Q, 10)
    assert Counter(who(x) for x in got) == {"A": 10}
    for e in (first, second, third):
        await e.close()


@BOTH
async def test_one_engine_gives_its_next_lease_to_the_group_not_in_flight(
    engine: Engine
) -> None:
    """One engine: A's 10 leased and held, B produced; the next lease of 10 is B's."""
    await engine.create_queue(Q)
    await engine.produce(Q, [new(f"A-{i}", "A") for i in range(100)])
    first = await engine.lease(Q, 10)
    assert {who(x) for x in first} == {"A"}
    await engine.produce(Q, [new(f"B-{i}", "B") for i in range(100)])
    got = await engine.lease(Q, 10)
    assert Counter(who(x) for x in got) == {"B": 10}
    await engine.complete([x.token for x in first + got])
    got = await engine.lease(Q, 10)  # nothing in flight, 10 handouts of each lately
    assert Counter(who(x) for x in got) == {"A": 5, "B": 5}


# -- 5. segment metas --------------------------------------------------------------------


GROUPS_CASES = [
    (["b", "a", "a", "b"], ("a", "b")),
    ([None, "a", None], ("", "a")),
    ([f"g{k}" for k in range(GROUPS_LISTED)], tuple(f"g{k}" for k in range(GROUPS_LISTED))),
    ([f"g{k}" for k in range(GROUPS_LISTED + 1)], ()),
    ([None] + [f"g{k}" for k in range(GROUPS_LISTED)], ()),  # "" is a name too
    ([None, None], None),
]


@BOTH
async def test_a_published_segment_lists_its_groups(engine: Engine, store: Store) -> None:
    """``groups``: the names sorted, "" for items without one, ``()`` past
    GROUPS_LISTED, None when no item names a group (and then the entry packs as
    before fair sharing: 7 fields on a standard queue; 8 with groups)."""
    await engine.create_queue(Q)
    for n, (groups, _) in enumerate(GROUPS_CASES):
        await engine.produce(Q, [new(f"s{n}-{i}", g) for i, g in enumerate(groups)])
    segments = await listed(store)
    assert [sm.groups for sm in segments] == [want for _, want in GROUPS_CASES]
    for sm in segments:
        packed = sm.pack()
        if sm.groups is None:
            assert len(packed) == 7, packed
        else:
            assert len(packed) == 8 and packed[7] == list(sm.groups), packed
            # The groups are only a trailing field: an okq before fair sharing reads
            # the first seven as ever, and an old 7-field entry unpacks without groups.
            assert packed[:7] == dataclasses.replace(sm, groups=None).pack()
            assert SegmentMeta.unpack(packed[:7]) == dataclasses.replace(sm, groups=None)
        # Round trips, also through msgpack (a list comes back, a tuple is kept).
        assert SegmentMeta.unpack(packed) == sm
        assert SegmentMeta.unpack(msgpack.unpackb(msgpack.packb(packed))) == sm
        assert groups_of(x.meta for x in await items_of(store, sm)) == sm.groups


def test_segment_meta_pack_round_trips() -> None:
    """Entries of every length unpack as packed; a field after the groups (a later
    okq's) is ignored."""
    metas = [
        SegmentMeta("s", 3, 1, 10),
        SegmentMeta("s", 3, 1, 10, 5, 7),
        SegmentMeta("s", 3, 1, 10, 5, 7, 42),
        SegmentMeta("s", 3, 1, 10, groups=("a",)),
        SegmentMeta("s", 3, 1, 10, 5, 0, 42, ("", "a", "b")),
        SegmentMeta("s", 3, 1, 10, 5, 0, 42, ()),
    ]
    for sm in metas:
        packed = sm.pack()
        assert SegmentMeta.unpack(msgpack.unpackb(msgpack.packb(packed))) == sm
        if sm.groups is not None:
            assert SegmentMeta.unpack([*packed, "later"]) == sm
    assert len(metas[2].pack()) == 7 and SegmentMeta.unpack(metas[2].pack()).groups is None


MERGE_CASES = {
    # produce calls (each a segment), and the groups of the items completed first
    "two-groups-and-none": ([["A", "A"], ["B"], [None]], [], ("", "A", "B")),
    "only-live-items-count": ([["A", None], [None]], ["A"], None),
    "past-the-limit": ([["C", "D", "E"], ["F", "G", "H"], ["I", "J", "K"]], [], ()),
    "no-groups": ([[None], [None, None]], [], None),
    "one-group-left": ([["A", "B"], ["B", "C"]], ["C", "A"], ("B",)),
}


@BOTH
@pytest.mark.parametrize("case", list(MERGE_CASES))
async def test_a_merged_segment_lists_its_live_items_groups(
    engine: Engine, store: Store, clock: ManualClock, case: str
) -> None:
    """A compactor merge writes ``groups`` of the items it carries (those finished are
    folded away, and their groups with them); then everything is still leased."""
    calls, finish, want = MERGE_CASES[case]
    await engine.create_queue(Q, QueueConfig(lease_timeout=5))
    names: list[str] = []
    for k, call in enumerate(calls):
        batch = [new(f"{g or '_'}-{k}-{i}", g) for i, g in enumerate(call)]
        await engine.produce(Q, batch)
        names += [x.payload.decode() for x in batch]
    before = {sm.id for sm in await listed(store)}
    # Complete those of the groups in ``finish``; retry the others (the merge
    # carries them waiting).
    got = await engine.lease(Q, 100)
    assert len(got) == len(names)
    done = [x for x in got if group_of(x.meta) in finish]
    if done:
        await engine.complete([x.token for x in done])
    for x in got:
        if x not in done:
            await engine.retry(x.token)
    clock.advance(1)
    report = await Compactor(make_engine(store, clock), clock=clock, options=CompactorOptions(
        min_age=0, merge_below=10_000)).run_once()
    assert report.merged_into == 1, report
    merged = [sm for sm in await listed(store) if sm.id not in before]
    assert len(merged) == 1
    assert merged[0].groups == want
    items = await items_of(store, merged[0])
    assert len(items) == len(names) - len(done)
    assert groups_of(x.meta for x in items) == want
    clock.advance(1)  # past manifest_max_age: the engine reads the merged manifest
    left = await engine.lease(Q, 100)
    assert sorted(x.payload.decode() for x in left) == sorted(
        x.payload.decode() for x in got if x not in done)
    await engine.complete([x.token for x in left])


@BOTH
async def test_merged_segments_keep_a_deep_backlog_fair(
    engine: Engine, store: Store, clock: ManualClock
) -> None:
    """A's backlog and B's merged by a compactor (segments listing ("A",) and ("A",
    "B")): B still gets its half of each lease."""
    await engine.create_queue(Q)
    for b in range(6):
        await engine.produce(Q, [new(f"A-{b}-{i}", "A") for i in range(20)])
        clock.advance(0.001)
    for b in range(3):
        await engine.produce(Q, [new(f"B-{b}-{i}", "B") for i in range(5)])
    clock.advance(1)
    report = await Compactor(make_engine(store, clock), clock=clock, options=CompactorOptions(
        min_age=0, merge_below=10_000, merge_target=50)).run_once()
    assert report.merged_into >= 2, report
    for sm in await listed(store):
        assert sm.groups == groups_of(x.meta for x in await items_of(store, sm))
    assert ("A", "B") in {sm.groups for sm in await listed(store)}
    clock.advance(1)
    counts = await deliver(engine, 30, 10)
    assert counts == {"A": 15, "B": 15}


@BOTH
async def test_a_completions_grouped_outputs_get_their_share(
    engine: Engine, store: Store, clock: ManualClock
) -> None:
    """300 items without a group (and one of A: the queue is walked fairly), then a
    completion elsewhere produces 10 items of group X into the queue: X gets about a
    third of the first 30 deliveries. The outputs segment's entry names its groups
    (read from the segment when it is published: the lease object keeps none); without
    them X's items came after the 300."""
    await engine.create_queue(Q)
    await engine.create_queue("src")
    await engine.produce(Q, [new("A-0", "A")])
    for b in range(3):
        await engine.produce(Q, [new(f"_-{b}-{i}") for i in range(100)])
        clock.advance(0.001)
    await engine.produce("src", [new("s")])
    [x] = await engine.lease("src", 1)
    clock.advance(1)
    await engine.complete_and_produce(x.token, Q, [new(f"X-{i}", "X") for i in range(10)])
    assert (await listed(store))[-1].groups == ("X",)  # the outputs segment's entry
    counts = await deliver(engine, 30, 10)
    assert counts["X"] >= 8, dict(counts)


# -- 6. passing over segments by their entries ---------------------------------------------


@BOTH
async def test_a_lease_writes_two_segments_at_most_and_the_groups_take_turns(
    engine: Engine, clock: ManualClock
) -> None:
    """Ten groups, each in segments of its own: a lease of 10 takes from two segments
    at most (one lease-object write each), two groups a lease; the shares put the
    others first in the next leases, so five leases serve all ten, five items each."""
    await engine.create_queue(Q)
    for g in "ABCDEFGHIJ":
        await engine.produce(Q, [new(f"{g}-{i}", g) for i in range(20)])
        clock.advance(0.001)
    served: Counter[str] = Counter()
    for _ in range(5):
        got = await engine.lease(Q, 10)
        assert len({x.id.rsplit(".", 1)[0] for x in got}) <= 2, [x.id for x in got]
        assert len(got) == 10 and len({who(x) for x in got}) == 2, [who(x) for x in got]
        served.update(who(x) for x in got)
        await engine.complete([x.token for x in got])
    assert served == {g: 5 for g in "ABCDEFGHIJ"}, served


async def test_a_walk_to_the_end_spares_the_next_ones_until_the_manifest_changes(
    engine: Engine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments of ten groups each (more than a manifest entry names), and nine of the
    groups drained: the first lease walks every segment looking for them, the next
    ones (same manifest, within FAIR_EMPTY_MS) read one segment; an expired lease of
    one of the nine is leased again once that second is over, and a produce of one
    (a new manifest) at once."""
    await engine.create_queue(Q)
    for b in range(20):
        await engine.produce(Q, [new(f"A-{b}-{i}", "A") for i in range(91)]
                             + [new(f"{g}-{b}", g) for g in NINE])
        clock.advance(0.001)
    held: list[LeasedItem] = []
    for _ in range(40):  # the nine's 180 items go out in about 20 (A gets a tenth)
        got = await engine.lease(Q, 10, lease_timeout=30)
        held += [x for x in got if who(x) != "A"]
        if done := [x.token for x in got if who(x) == "A"]:
            await engine.complete(done)
        if len(held) == 180:
            break
    assert sorted(who(x) for x in held) == sorted(NINE * 20)
    await engine.complete([x.token for x in held[1:]])
    read = spy_reads(monkeypatch)
    await engine.lease(Q, 1)  # the first walk: to the end
    assert len(read) >= 20
    for _ in range(3):
        read.clear()
        got = await engine.lease(Q, 1)
        assert [who(x) for x in got] == ["A"] and len(read) <= 2, read
    clock.advance(31)  # held[0]'s lease is over, and the note with it
    got = await engine.lease(Q, 10)
    assert held[0].id in {x.id for x in got}, [who(x) for x in got]
    await engine.produce(Q, [new("B-new", "B")])
    got = await engine.lease(Q, 10)
    assert "B-new" in {x.payload.decode() for x in got}, [who(x) for x in got]


@BOTH
async def test_a_deep_backlog_is_passed_over_unread(
    engine: Engine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A: 30 segments of 10 items, more than FAIR_READS (made 4 here); then B: 10.
    The first lease of 10 reaches B, reading two segments: A's first (A then has its
    10 candidates) and B's; A's 29 others are passed over by their entries."""
    monkeypatch.setattr(scheduler, "FAIR_READS", 4)
    await engine.create_queue(Q)
    for b in range(30):
        await engine.produce(Q, [new(f"A-{b}-{i}", "A") for i in range(10)])
        clock.advance(0.001)
    await engine.produce(Q, [new(f"B-{i}", "B") for i in range(10)])
    read = spy_reads(monkeypatch)
    got = await engine.lease(Q, 10)
    assert Counter(who(x) for x in got) == {"A": 5, "B": 5}
    assert len(read) == 2, read
    counts = await deliver(engine, 20, 10)
    assert counts == {"A": 15, "B": 5}  # B's 10 are out: A has the rest


@BOTH
async def test_segments_of_many_groups_are_read_and_shared_fairly(
    engine: Engine, store: Store, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 produce calls of 51 items of A and one each of B..J: segments of ten groups,
    listed as ``()``, that the walk cannot pass over. It reads them, and each of the
    nine gets close to its tenth of the first 300 deliveries."""
    await engine.create_queue(Q)
    for t in range(40):
        await engine.produce(Q, [new(f"A-{t}-{i}", "A") for i in range(51)]
                             + [new(f"{g}-{t}", g) for g in NINE])
        clock.advance(0.001)
    assert {sm.groups for sm in await listed(store)} == {()}
    read = spy_reads(monkeypatch)
    counts = await deliver(engine, 300, 10)
    assert_shares(counts, NINE, 24)
    assert len(set(read)) >= 10  # B's 10 candidates are in ten segments


@BOTH
async def test_finished_segments_at_the_front_do_not_use_up_the_walks_reads(
    engine: Engine, store: Store, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAILS on the okq under test (a bug): 12 one-item segments of groups a and b
    (FAIR_READS made 8 here; the default, 256, fails the same way with 260 segments).
    Leased one at a time and completed: once the first 8 are finished, the walk
    spends its 8 reads on them and leases nothing, although 4 items are available
    (the old walk, for a queue without groups, leases them all). A compactor that
    folds the finished segments away lets the lease find them again.

    The same with the leases held (not completed): 8 segments of items in flight at
    the front stop every lease, and no compactor helps (it cannot seal a segment
    with a lease in it)."""
    monkeypatch.setattr(scheduler, "FAIR_READS", 8)
    await engine.create_queue(Q)
    for i in range(12):
        await engine.produce(Q, [new(f"{'ab'[i % 2]}-{i}", "ab"[i % 2])])
    delivered = []
    for _ in range(12):
        got = await engine.lease(Q, 1)
        if not got:
            break
        delivered += [x.payload.decode() for x in got]
        await engine.complete([x.token for x in got])
    stats = await engine.stats(Q)
    if len(delivered) < 12:
        # Show that the compactor's fold unblocks it (the cause), then fail.
        clock.advance(1)
        await Compactor(make_engine(store, clock), clock=clock,
                        options=CompactorOptions(min_age=0)).run_once()
        clock.advance(1)
        after = await engine.lease(Q, 10)
        pytest.fail(
            f"a lease found nothing after {len(delivered)} deliveries with "
            f"{stats.available} items available (completed {stats.completed}); after a "
            f"compactor pass folded the finished segments it leased "
            f"{sorted(x.payload.decode() for x in after)}")
    assert stats.completed == 12


@BOTH
async def test_segments_in_flight_at_the_front_do_not_stop_every_lease(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAILS on the okq under test (a bug; see the test above): 12 one-item segments
    of groups a and b, FAIR_READS made 8, each leased one at a time and held. The
    9th lease finds nothing, although 4 items are available."""
    monkeypatch.setattr(scheduler, "FAIR_READS", 8)
    await engine.create_queue(Q, QueueConfig(lease_timeout=600))
    for i in range(12):
        await engine.produce(Q, [new(f"{'ab'[i % 2]}-{i}", "ab"[i % 2])])
    held: list[LeasedItem] = []
    for _ in range(12):
        held += await engine.lease(Q, 1)
    stats = await engine.stats(Q)
    assert len(held) == 12, (
        f"leased {len(held)} one at a time, then nothing, with {stats.available} "
        f"available and {stats.in_flight} in flight")


# -- 7. nothing lost or doubled --------------------------------------------------------------


@BOTH
async def test_a_fair_queue_drained_with_retries_and_expiries_completes_each_item_once(
    store: Store, clock: ManualClock
) -> None:
    """Two engines take turns leasing a queue of groups (a deep A, a few short ones,
    items without a group) in batches of 1 to 10; each delivery is completed,
    retried (at once or later), or held until its lease is over; a compactor merges
    midway. No item is handed out while a delivery of it is in flight, and each is
    completed exactly once."""
    engines = [await make_engine(store, clock).start() for _ in range(2)]
    await engines[0].create_queue(Q, QueueConfig(lease_timeout=5))
    rng = random.Random(7)
    produced: list[str] = []
    for k in range(30):
        size = rng.randint(1, 12)
        groups = [rng.choice(["A", "A", "A", "B", "C", None]) for _ in range(size)]
        batch = [new(f"{g or '_'}-{k}-{i}", g) for i, g in enumerate(groups)]
        await engines[k % 2].produce(Q, batch)
        produced += [x.payload.decode() for x in batch]
        clock.advance(0.01)
    completed: Counter[str] = Counter()
    deadline: dict[str, int] = {}  # item -> the deadline of its latest delivery
    held: list[LeasedItem] = []
    compactor = Compactor(make_engine(store, clock), clock=clock, options=CompactorOptions(
        min_age=0, merge_below=10_000, merge_target=40))
    for step in range(1000):
        if len(completed) == len(produced):
            break
        engine = engines[step % 2]
        now = clock.now_ms()
        for x in await engine.lease(Q, rng.randint(1, 10)):
            name = x.payload.decode()
            assert name not in completed, f"{name} handed out after it was completed"
            assert deadline.get(name, 0) <= now, f"{name} handed out while in flight"
            deadline[name] = x.lease_deadline_ms
            what = rng.choice(["complete"] * 5 + ["retry", "later", "hold", "hold"])
            if what == "complete":
                await engine.complete([x.token])
                completed[name] += 1
            elif what in ("retry", "later"):
                at = now + rng.randint(1, 3000) if what == "later" else None
                await engine.retry(x.token, retry_at_ms=at)
                deadline[name] = 0
            else:
                held.append(x)
        for x in list(held):  # some held deliveries are completed later, some too late
            if rng.random() < 0.3:
                held.remove(x)
                name = x.payload.decode()
                try:
                    await engines[0].complete([x.token])
                except LeaseLost:
                    continue  # handed out again since (or moved by a merge)
                assert deadline[name] == x.lease_deadline_ms, (
                    f"{name} completed through a delivery that was not its latest")
                completed[name] += 1
        if step == 40:
            clock.advance(1)
            await compactor.run_once()
        clock.advance(rng.choice([0, 0, 0.5, 2, 6]))
    assert sorted(completed) == sorted(produced), (
        f"not completed: {sorted(set(produced) - set(completed))}")
    assert set(completed.values()) == {1}, {n: c for n, c in completed.items() if c != 1}
    stats = await engines[0].stats(Q)
    assert (stats.available, stats.in_flight, stats.waiting_retry, stats.scheduled) == (
        0, 0, 0, 0), stats
    for e in engines:
        await e.close()


# -- 8. a partitioned queue ----------------------------------------------------------------


def groups_in(partitions: Sequence[int], of: int = 3) -> list[str]:
    """Group names, the k-th hashing to partition ``partitions[k]`` (of ``of``)."""
    out: list[str] = []
    for p in partitions:
        out.append(next(name for k in count() if (name := f"G{k}") not in out
                        and key_partition(GROUP_HASH_PREFIX + name, of) == p))
    return out


async def partitioned_backlog(service: QueueService, heavy: str, light: Sequence[str]) -> None:
    await service.create_queue(Q, QueueConfig(partitions=3))
    for b in range(100):
        await service.produce(Q, [new(f"{heavy}-{b}-{i}", heavy) for i in range(100)])
    for g in light:
        await service.produce(Q, [new(f"{g}-{i}", g) for i in range(100)])


async def test_a_partitioned_queue_shares_fairly_within_each_partition(
    engine: Engine
) -> None:
    """Three partitions; a group's items go to the partition it hashes to. The heavy
    group shares partition 0 with two others; partition 1 holds three, partition 2
    four. A lease of 10 fills from one partition, the partitions taking turns: in the
    first 600 deliveries each partition gives 200, shared fairly among its groups
    (the heavy one no more than the others there)."""
    service = QueueService(engine)
    layout = [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    names = groups_in(layout)
    heavy, light = names[0], names[1:]
    await partitioned_backlog(service, heavy, light)
    by_partition: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for _ in range(60):
        got = await service.lease(Q, 10)
        assert len(got) == 10
        for x in got:
            p = token_queue(x.token)
            assert p == partition_name(Q, layout[names.index(who(x))]), (who(x), p)
            by_partition[p] += 1
        counts.update(who(x) for x in got)
        await service.complete(Q, [x.token for x in got])
    assert sorted(by_partition.values()) == [200, 200, 200], by_partition
    for p in range(3):
        here = [g for g, at in zip(names, layout, strict=True) if at == p]
        fair = 200 / len(here)
        assert_shares(counts, here, int(0.8 * fair))
    assert counts[heavy] <= 1.2 * 200 / 3


@pytest.mark.xfail(strict=True, reason=(
    "fair sharing is per partition: a lease fills from one partition first and the "
    "partitions take turns (okq/partitions.py), so a group alone in its partition gets "
    "1/P of the deliveries however many groups the others hold"))
async def test_a_partitioned_queue_gives_nine_groups_their_share_across_partitions(
    engine: Engine
) -> None:
    """The issue's measure on a queue of 3 partitions, the heavy group alone in
    partition 0 (the nine in partitions 1 and 2): it gets ~300 of the first 900
    deliveries, the nine ~67 each, short of 80."""
    service = QueueService(engine)
    names = groups_in([0, 1, 1, 1, 1, 2, 2, 2, 2, 2])
    await partitioned_backlog(service, names[0], names[1:])
    counts = await deliver(service, 900, 10)
    assert_shares(counts, names[1:], 80)
