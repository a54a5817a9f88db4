"""The batching compare-and-swap writer (okq/cell.py) on the memory store."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from okq import leases as tr
from okq.cell import Cell
from okq.changes import Unchanged
from okq.clock import ManualClock
from okq.errors import CASConflict, LeaseLost, ObjectNotFound, StorageError
from okq.leases import DONE, LEASED, ItemState, LeaseObject, decode_lease, encode_lease
from okq.model import new_nonce
from okq.store import CountingStore, FaultyStore, MemoryStore, SimulatedCrash, Store

KEY = "ns/leases/q/018b5e3c2a00-0123456789"
SEG = "018b5e3c2a00-0123456789"

Change = Callable[[LeaseObject, int], Any]


def make_cell(
    store: Store,
    clock: ManualClock | None = None,
    *,
    initial: bool = True,
    on_conflict: Callable[[], None] | None = None,
) -> Cell[LeaseObject]:
    return Cell(
        store,
        KEY,
        clock or ManualClock(),
        encode_lease,
        decode_lease,
        initial=(lambda: LeaseObject(SEG)) if initial else None,
        on_conflict=on_conflict,
    )


async def stored(store: Store) -> LeaseObject:
    return decode_lease((await store.get(KEY)).data)


class Calls(Counter[str]):
    """Counts how many times each change ran (a change may be re-applied)."""

    def mark(self, index: int, name: str | None = None) -> Change:
        label = name or f"mark{index}"

        def fn(obj: LeaseObject, now: int) -> int:
            self[label] += 1
            obj.items[index] = ItemState(DONE, 1, 1, now)
            return index

        return fn

    def refuse(self, name: str = "refuse") -> Change:
        def fn(obj: LeaseObject, now: int) -> None:
            self[name] += 1
            raise LeaseLost("no longer held", state="test")

        return fn


async def seed(store: Store, obj: LeaseObject | None = None) -> LeaseObject:
    obj = obj or LeaseObject(SEG, ver=1, nonce=new_nonce())
    await store.put(KEY, encode_lease(obj), if_none_match=True)
    return obj


# -- basics ------------------------------------------------------------------------------


async def test_update_creates_a_missing_object_from_initial() -> None:
    store = CountingStore(MemoryStore())
    clock = ManualClock()
    cell = make_cell(store, clock)
    calls = Calls()
    assert await cell.update(calls.mark(4)) == 4
    assert store.requests == {"get": 1, "put": 1}
    obj = await stored(store)
    assert obj.items == {4: ItemState(DONE, 1, 1, clock.now_ms())}
    assert obj.ver == 1 and len(obj.nonce) == 16


async def test_update_of_a_missing_object_without_initial_is_object_not_found() -> None:
    store = MemoryStore()
    cell = make_cell(store, initial=False)
    with pytest.raises(ObjectNotFound):
        await cell.update(Calls().mark(0))
    assert await cell.read() is None
    with pytest.raises(ObjectNotFound):
        await store.get(KEY)


async def test_every_write_bumps_ver_and_changes_the_nonce() -> None:
    store = MemoryStore()
    cell = make_cell(store)
    calls = Calls()
    seen = []
    for i in range(3):
        await cell.update(calls.mark(i))
        obj = await stored(store)
        seen.append((obj.ver, obj.nonce))
    assert [v for v, _ in seen] == [1, 2, 3]
    assert len({n for _, n in seen}) == 3


async def test_read_uses_the_cache_within_max_age() -> None:
    store = CountingStore(MemoryStore())
    clock = ManualClock()
    await seed(store)
    cell = make_cell(store, clock)
    store.reset()
    assert (await cell.read(max_age_ms=1_000)) is not None
    assert (await cell.read(max_age_ms=1_000)) is not None
    assert store.requests["get"] == 1
    clock.advance(1.5)
    await cell.read(max_age_ms=1_000)
    assert store.requests["get"] == 2
    # read returns a fresh copy each time: mutating it does not touch the cache
    copy1 = await cell.read(max_age_ms=10_000)
    assert copy1 is not None
    copy1.items[0] = ItemState(DONE, 1, 1, 0)
    assert cell.cached() == LeaseObject(SEG, ver=1, nonce=copy1.nonce)


# -- group commit -----------------------------------------------------------------------


async def test_concurrent_updates_land_in_one_put() -> None:
    store = CountingStore(MemoryStore())
    clock = ManualClock()
    cell = make_cell(store, clock)
    calls = Calls()
    await cell.update(calls.mark(100))  # creates it and caches the ETag
    store.reset()
    results = await asyncio.gather(*(cell.update(calls.mark(i)) for i in range(20)))
    assert results == list(range(20))
    assert store.requests == {"put": 1}
    obj = await stored(store)
    assert set(obj.items) == {100, *range(20)}
    assert obj.ver == 2
    assert all(calls[f"mark{i}"] == 1 for i in range(20))


async def test_updates_submitted_during_a_write_share_the_next_put() -> None:
    faulty = FaultyStore(MemoryStore())
    store = CountingStore(faulty)
    cell = make_cell(store)
    calls = Calls()
    await cell.update(calls.mark(100))
    store.reset()
    faulty.inject("put", "latency", delay=0.01)
    first = asyncio.create_task(cell.update(calls.mark(0)))
    while store.requests["put"] == 0:  # the first write is in flight
        await asyncio.sleep(0)
    rest = [asyncio.create_task(cell.update(calls.mark(i))) for i in range(1, 11)]
    assert await asyncio.gather(first, *rest) == list(range(11))
    assert store.requests == {"put": 2}
    obj = await stored(store)
    assert obj.ver == 3 and set(obj.items) == {100, *range(11)}


async def test_group_commit_with_real_transitions() -> None:
    store = CountingStore(MemoryStore())
    clock = ManualClock()
    cell = make_cell(store, clock)

    def lease(obj: LeaseObject, now: int) -> list[tr.Leased]:
        return tr.lease(obj, [(i, now) for i in range(5)], now, 30_000, 0)[0]

    leased = await cell.update(lease)
    assert [x.index for x in leased] == list(range(5))
    store.reset()

    def complete(i: int, v: int) -> Change:
        return lambda obj, now: tr.complete(obj, i, v)

    results = await asyncio.gather(
        cell.update(complete(0, 1)),
        cell.update(complete(1, 2)),  # stale v: refused
        cell.update(complete(2, 1)),
        cell.update(lambda obj, now: tr.renew(obj, 3, 1, now + 5, 1_000)),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLost)
    assert results[3] == clock.now_ms() + 5 + 1_000
    assert store.requests == {"put": 1}
    obj = await stored(store)
    assert [obj.items[i].s for i in range(5)] == [DONE, LEASED, DONE, LEASED, LEASED]


# -- refusals -----------------------------------------------------------------------------


async def test_a_refused_change_fails_alone() -> None:
    store = CountingStore(MemoryStore())
    cell = make_cell(store)
    calls = Calls()
    await cell.update(calls.mark(100))
    store.reset()
    results = await asyncio.gather(
        cell.update(calls.mark(0)),
        cell.update(calls.refuse()),
        cell.update(calls.mark(1)),
        return_exceptions=True,
    )
    assert results[0] == 0 and results[2] == 1
    assert isinstance(results[1], LeaseLost)
    assert store.requests == {"put": 1}
    assert set((await stored(store)).items) == {100, 0, 1}


async def test_a_batch_of_only_refused_changes_writes_nothing() -> None:
    store = CountingStore(MemoryStore())
    await seed(store)
    cell = make_cell(store)
    calls = Calls()
    store.reset()
    results = await asyncio.gather(
        cell.update(calls.refuse("a")), cell.update(calls.refuse("b")), return_exceptions=True
    )
    assert all(isinstance(r, LeaseLost) for r in results)
    assert store.requests == {"get": 1}
    assert (await stored(store)).ver == 1


async def test_a_batch_that_changes_nothing_writes_nothing() -> None:
    store = CountingStore(MemoryStore())
    cell = make_cell(store)
    await cell.update(Calls().mark(0))
    store.reset()

    def look(obj: LeaseObject, now: int) -> Unchanged:
        return Unchanged(len(obj.items))

    # e.g. a retried completion: the item is already DONE by this delivery
    results = await asyncio.gather(
        cell.update(look),
        cell.update(lambda obj, now: tr.complete(obj, 0, 1)),
        cell.update(Calls().refuse()),
        return_exceptions=True,
    )
    assert results[0] == 1 and results[1] is None and isinstance(results[2], LeaseLost)
    # no write: the cached copy was only confirmed by one fresh read
    assert store.requests == {"get": 1}
    assert (await stored(store)).ver == 1


async def test_a_non_okq_exception_fails_the_whole_batch_and_writes_nothing() -> None:
    store = CountingStore(MemoryStore())
    await seed(store)
    cell = make_cell(store)
    calls = Calls()
    store.reset()

    def broken(obj: LeaseObject, now: int) -> None:
        raise ZeroDivisionError("bug in a change")

    results = await asyncio.gather(
        cell.update(calls.mark(0)), cell.update(broken), return_exceptions=True
    )
    assert all(isinstance(r, ZeroDivisionError) for r in results)
    assert store.requests["put"] == 0
    # the cell keeps working afterwards
    assert await cell.update(calls.mark(1)) == 1
    assert set((await stored(store)).items) == {1}


# -- CAS conflicts --------------------------------------------------------------------------


async def test_cas_conflict_rereads_and_reapplies() -> None:
    store = CountingStore(MemoryStore())
    clock = ManualClock()
    conflicts: list[int] = []
    cell = make_cell(store, clock, on_conflict=lambda: conflicts.append(clock.now_ms()))
    calls = Calls()
    await seed(store)
    await cell.read()
    # another process changes the object behind the cell's back
    other = await stored(store)
    other.items[99] = ItemState(DONE, 1, 1, 0)
    other.ver += 1
    other.nonce = new_nonce()
    await store.put(KEY, encode_lease(other))
    clock.advance(1)
    store.reset()

    assert await cell.update(calls.mark(0)) == 0
    assert calls["mark0"] == 2  # applied to the stale copy, then to the fresh one
    assert store.requests == {"put": 2, "get": 1}
    assert conflicts == [clock.now_ms()]
    assert cell.conflict_ms == clock.now_ms()
    obj = await stored(store)
    assert set(obj.items) == {0, 99}  # the other writer's change survives
    assert obj.ver == 3


async def test_two_cells_on_one_key_lose_no_update() -> None:
    store = MemoryStore()
    a, b = make_cell(store), make_cell(store)
    calls = Calls()
    await a.update(calls.mark(0))
    await b.read()
    await a.update(calls.mark(1))  # b's cached ETag is now stale
    await asyncio.gather(
        *(c.update(calls.mark(i)) for i, c in zip(range(2, 12), [a, b] * 5, strict=True))
    )
    obj = await stored(store)
    assert set(obj.items) == set(range(12))


async def test_cas_conflict_creating_the_object_rereads_it() -> None:
    store = MemoryStore()
    cell = make_cell(store)
    await cell.read()  # sees no object: will create with If-None-Match
    await seed(store, LeaseObject(SEG, {7: ItemState(DONE, 1, 1, 0)}, ver=1, nonce="x"))
    calls = Calls()
    assert await cell.update(calls.mark(0)) == 0
    assert calls["mark0"] == 2
    assert set((await stored(store)).items) == {0, 7}


class AlwaysConflicting(MemoryStore):
    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        raise CASConflict("always", key=key)


async def test_endless_conflicts_give_up_with_a_storage_error() -> None:
    store = CountingStore(AlwaysConflicting())
    conflicts: list[None] = []
    cell = make_cell(store, on_conflict=lambda: conflicts.append(None))
    cell.GIVE_UP_AFTER = 0.2  # seconds of lost races; backoff between attempts is jittered
    calls = Calls()
    with pytest.raises(StorageError, match="gave up") as info:
        await cell.update(calls.mark(0))
    assert not isinstance(info.value, CASConflict)
    attempts = calls["mark0"]
    assert attempts >= 3  # it retried, re-reading and re-applying each time
    assert store.requests == {"get": attempts, "put": attempts}
    assert len(conflicts) == attempts
    assert f"{attempts} attempts" in info.value.message


# -- ambiguous writes ------------------------------------------------------------------------


async def test_ambiguous_write_that_landed_is_not_applied_twice() -> None:
    faulty = FaultyStore(MemoryStore())
    store = CountingStore(faulty)
    conflicts: list[None] = []
    cell = make_cell(store, on_conflict=lambda: conflicts.append(None))
    calls = Calls()
    await cell.update(calls.mark(100))
    store.reset()
    faulty.inject("put", "ambiguous", key=KEY)
    assert await cell.update(calls.mark(0)) == 0
    assert faulty.injected == [("put", KEY, "ambiguous")]
    assert calls["mark0"] == 1
    assert store.requests == {"put": 1, "get": 1}  # the write, then the nonce check
    obj = await stored(store)
    assert obj.ver == 2 and set(obj.items) == {0, 100}
    # the cell adopted the landed version: the next write does not conflict
    store.reset()
    assert await cell.update(calls.mark(1)) == 1
    assert store.requests == {"put": 1}
    assert conflicts == []
    assert (await stored(store)).ver == 3


async def test_ambiguous_create_that_landed_is_not_applied_twice() -> None:
    faulty = FaultyStore(MemoryStore())
    cell = make_cell(faulty)
    calls = Calls()
    faulty.inject("put", "ambiguous", key=KEY)
    assert await cell.update(calls.mark(0)) == 0
    assert calls["mark0"] == 1
    obj = await stored(faulty)
    assert obj.ver == 1 and set(obj.items) == {0}


async def test_failed_write_that_did_not_land_is_applied_again() -> None:
    faulty = FaultyStore(MemoryStore())
    store = CountingStore(faulty)
    cell = make_cell(store)
    calls = Calls()
    await cell.update(calls.mark(100))
    store.reset()
    faulty.inject("put", "error", key=KEY)
    assert await cell.update(calls.mark(0)) == 0
    assert calls["mark0"] == 2
    assert store.requests == {"put": 2, "get": 1}
    obj = await stored(store)
    assert obj.ver == 2 and set(obj.items) == {0, 100}


async def test_ambiguous_write_with_a_whole_batch_applies_each_change_once() -> None:
    faulty = FaultyStore(MemoryStore())
    cell = make_cell(faulty)
    calls = Calls()
    await cell.update(calls.mark(100))
    faulty.inject("put", "ambiguous", key=KEY)
    results = await asyncio.gather(
        *(cell.update(calls.mark(i)) for i in range(5)),
        cell.update(calls.refuse()),
        return_exceptions=True,
    )
    assert results[:5] == list(range(5)) and isinstance(results[5], LeaseLost)
    assert all(calls[f"mark{i}"] == 1 for i in range(5))
    assert calls["refuse"] == 1
    assert (await stored(faulty)).ver == 2


# -- crashes --------------------------------------------------------------------------------


async def test_a_crash_reaches_every_waiter() -> None:
    faulty = FaultyStore(MemoryStore())
    await seed(faulty)
    cell = make_cell(faulty)
    calls = Calls()
    faulty.inject("get", "latency", key=KEY, delay=0.01)
    faulty.inject("put", "crash", key=KEY)
    faulty.calls.clear()
    first = [asyncio.create_task(cell.update(calls.mark(i))) for i in range(3)]
    while not faulty.calls:  # the batch of three is reading the object
        await asyncio.sleep(0)
    pending = [asyncio.create_task(cell.update(calls.mark(i))) for i in range(3, 6)]
    results = await asyncio.gather(*first, *pending, return_exceptions=True)
    assert all(isinstance(r, SimulatedCrash) for r in results), results
    assert [calls[f"mark{i}"] for i in range(6)] == [1, 1, 1, 0, 0, 0]
    assert faulty.calls == [("get", KEY), ("put", KEY)]
    assert (await stored(faulty)).ver == 1  # nothing was written
    # a new update after the crash starts a fresh writer
    assert await cell.update(calls.mark(9)) == 9
    assert set((await stored(faulty)).items) == {9}


async def test_a_crash_while_reading_reaches_the_waiter() -> None:
    faulty = FaultyStore(MemoryStore())
    await seed(faulty)
    cell = make_cell(faulty)
    calls = Calls()
    faulty.inject("get", "crash", key=KEY)
    with pytest.raises(SimulatedCrash):
        await cell.update(calls.mark(0))
    assert calls["mark0"] == 0
    await cell.close()


async def test_close_waits_for_the_writer() -> None:
    faulty = FaultyStore(MemoryStore())
    cell = make_cell(faulty)
    faulty.inject("put", "latency", key=KEY, delay=0.01)
    task = asyncio.create_task(cell.update(Calls().mark(0)))
    while not any(op == "put" for op, _ in faulty.calls):
        await asyncio.sleep(0)
    await cell.close()
    assert task.done() and task.result() == 0


# -- known bugs ----------------------------------------------------------------------------


async def test_initial_is_used_when_the_clock_reads_zero() -> None:
    cell = make_cell(MemoryStore(), ManualClock(start_ms=0))
    assert await cell.update(Calls().mark(0)) == 0


# -- copies instead of decodes (lease cells) ------------------------------------


async def test_a_copying_cell_never_changes_the_view_a_reader_holds() -> None:
    """A write changes a copy of the readers' view: a view taken before it, or
    during a write that is refused or loses its race, is the same as before."""
    store = CountingStore(MemoryStore())
    clock = ManualClock()
    cell: Cell[LeaseObject] = Cell(store, KEY, clock, encode_lease, decode_lease,
                                   initial=lambda: LeaseObject(SEG), copy=LeaseObject.copy)
    await cell.update(lambda o, now: tr.lease(o, [(0, 0), (1, 0)], now, 30_000, 0)[0])
    held = cell.view()
    assert held is not None
    before = encode_lease(held)
    token_v = 1  # the first delivery of each item
    await cell.update(lambda o, now: tr.renew(o, 0, token_v, now, 60_000))
    await cell.update(lambda o, now: tr.complete(o, 1, token_v))
    assert encode_lease(held) == before  # the states it shares were replaced, not changed
    gets = store.requests["get"]
    after = cell.view()
    assert after is not held and after.items[1].s == DONE
    assert after.items[0].t == clock.now_ms() + 60_000
    assert store.requests["get"] == gets  # the landed write is the view: no read, no decode
    assert decode_lease((await store.get(KEY)).data) == after

    # A race lost: the copy that was changed is dropped, the view read afresh.
    other = make_cell(store)
    await other.update(lambda o, now: tr.complete(o, 0, token_v))
    view_before = cell.view()
    await cell.update(lambda o, now: tr.renew(o, 0, token_v, now, 90_000)
                      if o.items[0].s != DONE else Unchanged("done"))
    assert view_before is not None and view_before.items[0].t == clock.now_ms() + 60_000
    assert cell.view() is not None and cell.view().items[0].s == DONE  # type: ignore[union-attr]


# -- a reader's refresh while a write awaits ----------------------------------------


async def test_a_refresh_during_a_writes_prepare_does_not_let_it_replace_a_newer_version() -> None:
    """A write is conditional on the version its change was applied to, not on what
    the cell holds when the PUT goes out. The campaign lost acknowledged produces
    without the sequencer this way: a manifest write awaited its chunk writes
    (``prepare``), a lease's read of the manifest meanwhile brought another node's
    newer version into the cell, and the PUT, sent with that version's ETag,
    replaced it with a change of the older one (docs/DESIGN.md, "Cells")."""
    store = MemoryStore()
    clock = ManualClock()
    gate = asyncio.Event()
    prepared = asyncio.Event()
    calls = Calls()

    async def prepare(obj: LeaseObject) -> None:
        if not gate.is_set():
            prepared.set()
            await gate.wait()

    writer: Cell[LeaseObject] = Cell(store, KEY, clock, encode_lease, decode_lease,
                                     initial=lambda: LeaseObject(SEG), prepare=prepare)
    other = make_cell(store, clock)
    await other.update(calls.mark(0))
    await writer.read(0)
    writing = asyncio.ensure_future(writer.update(calls.mark(1, "mine")))
    await prepared.wait()  # the writer's change is applied to version 1; its PUT waits
    await other.update(calls.mark(2, "theirs"))  # version 2, by another node
    await writer.read(0)  # a reader of the writer's cell brings version 2 in
    gate.set()
    await writing
    final = await stored(store)
    assert sorted(final.items) == [0, 1, 2], "a version was replaced by a change of an older one"
    assert calls["mine"] == 2  # applied to version 1, lost its race, applied again to 2


# -- follow-ups: work done while the write is on its way -----------------------------------------


class HeldPuts(MemoryStore):
    """A memory store whose puts wait for ``release`` after they start: a write on its way."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = 0

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        self.started.set()
        await self.release.wait()
        etag = await super().put(key, data, if_match=if_match, if_none_match=if_none_match,
                                 want_etag=want_etag)
        self.finished += 1
        return etag


async def test_a_follow_up_runs_while_the_write_is_on_its_way_and_answers_after_it() -> None:
    store = HeldPuts()
    cell = make_cell(store)
    calls = Calls()
    seen: list[tuple[int, bool, int]] = []

    def then(result: int) -> str:
        seen.append((result, store.started.is_set(), store.finished))
        return f"item {result}"

    update = asyncio.ensure_future(cell.update(calls.mark(3), then))
    await store.started.wait()
    for _ in range(3):
        await asyncio.sleep(0)
    # the write started before the follow-up ran, and has not finished
    assert seen == [(3, True, 0)]
    assert not update.done()  # nobody is answered before the write lands
    store.release.set()
    assert await update == "item 3"
    assert store.finished == 1
    assert set((await stored(store)).items) == {3}


class SlowPuts(MemoryStore):
    """A memory store whose puts wait a moment before they succeed or conflict."""

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        await asyncio.sleep(0.01)
        return await super().put(key, data, if_match=if_match, if_none_match=if_none_match,
                                 want_etag=want_etag)


@pytest.mark.parametrize("waits", [True, False], ids=["write-waits", "write-fails-at-once"])
async def test_a_follow_up_runs_again_on_the_result_of_a_write_applied_again(waits: bool) -> None:
    store = SlowPuts() if waits else MemoryStore()
    cell = make_cell(store)
    await seed(store)
    await cell.read()
    other = await stored(store)  # another process writes: the cell's copy is stale
    other.items[99] = ItemState(DONE, 1, 1, 0)
    other.ver, other.nonce = other.ver + 1, new_nonce()
    await store.put(KEY, encode_lease(other))
    applied: list[int] = []

    def change(obj: LeaseObject, now: int) -> int:
        obj.items[0] = ItemState(DONE, 1, 1, now)
        return len(obj.items)  # 1 on the stale copy, 2 on the fresh one

    assert await cell.update(change, lambda n: applied.append(n) or n) == 2
    # The write that lost its race was answered nothing: its follow-up's work (done
    # while it was on its way, when it waited) was dropped with it.
    assert applied == ([1, 2] if waits else [2])


async def test_a_follow_up_that_fails_fails_its_change_alone() -> None:
    store = CountingStore(MemoryStore())
    cell = make_cell(store)
    calls = Calls()

    def broken(result: int) -> int:
        raise ValueError(f"cannot hand out {result}")

    results = await asyncio.gather(
        cell.update(calls.mark(0), broken), cell.update(calls.mark(1), lambda r: r * 10),
        return_exceptions=True)
    assert isinstance(results[0], ValueError) and results[1] == 10
    assert set((await stored(store)).items) == {0, 1}  # the write itself landed


async def test_a_follow_up_of_a_change_with_nothing_to_write_gets_its_value() -> None:
    store = CountingStore(MemoryStore())
    cell = make_cell(store)
    await seed(store)
    store.reset()
    assert await cell.update(lambda obj, now: Unchanged(7), lambda v: v + 1) == 8
    assert store.requests == {"get": 1}

