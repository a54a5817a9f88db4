"""Dead queues: which ones a queue may name, deleting one that is in use, stats
that never recurse, and a redrive that moves each dead letter back exactly once
however it is interrupted (issue 8, defects 6, 11 and 13).

On the memory and file stores; crashes are simulated with FaultyStore's
``crash`` mode (the process "dies" before the chosen store call).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from itertools import pairwise

import pytest

from okq import Engine, ManualClock, NewItem, QueueConfig
from okq.errors import InvalidRequest, OkqError, QueueNotFound
from okq.model import Manifest
from okq.store import FaultyStore, Store
from okq.store.faulty import SimulatedCrash
from tests.engines import make_engine
from tests.stores import StoreFactory

pytestmark = pytest.mark.parametrize("kind", ["memory", "file"])


def dead_to(name: str, **settings: object) -> QueueConfig:
    return QueueConfig(dead_queue=name, **settings)


# -- which dead queue a queue may name (defects 11 and 13) --------------------------------


async def test_create_refuses_a_dead_queue_that_does_not_exist(engine: Engine) -> None:
    with pytest.raises(InvalidRequest) as err:
        await engine.create_queue("orders", dead_to("orders-dlq"))
    assert err.value.field == "dead_queue"
    assert "'orders-dlq' does not exist" in err.value.message
    with pytest.raises(QueueNotFound):
        await engine.get_queue("orders")  # nothing was created


async def test_update_refuses_a_dead_queue_that_does_not_exist(engine: Engine) -> None:
    await engine.create_queue("orders", QueueConfig(max_attempts=2))
    with pytest.raises(InvalidRequest) as err:
        await engine.update_queue("orders", dead_queue="nowhere", max_attempts=5)
    assert err.value.field == "dead_queue"
    info = await engine.get_queue("orders")
    assert (info.config.dead_queue, info.config.max_attempts) == (None, 2)  # unchanged


@pytest.mark.parametrize("length", [2, 3, 4])
async def test_dead_queue_loops_are_refused(engine: Engine, length: int) -> None:
    """q0 <- q1 <- ... <- q{n-1} exists; q0 -> q{n-1} would close the loop."""
    names = [f"q{n}" for n in range(length)]
    await engine.create_queue(names[0])
    for prev, name in pairwise(names):
        await engine.create_queue(name, dead_to(prev))
    with pytest.raises(InvalidRequest) as err:
        await engine.update_queue(names[0], dead_queue=names[-1])
    assert err.value.field == "dead_queue"
    loop = " -> ".join([names[0], *reversed(names)])
    assert loop in err.value.message, err.value.message
    assert (await engine.get_queue(names[0])).config.dead_queue is None


async def test_a_chain_without_a_loop_is_accepted(engine: Engine) -> None:
    await engine.create_queue("c")
    await engine.create_queue("b", dead_to("c"))
    await engine.create_queue("a", dead_to("b"))
    await engine.create_queue("x")
    info = await engine.update_queue("c", dead_queue="x")  # a -> b -> c -> x: no loop
    assert info.config.dead_queue == "x"


async def test_create_refuses_a_loop_through_a_dangling_dead_queue(
    engine: Engine, store: Store, clock: ManualClock
) -> None:
    """``b`` names ``a`` as its dead queue although ``a`` does not exist (a delete
    that raced an update): creating ``a`` with ``b`` as dead queue closes a loop."""
    await engine.create_queue("a")
    await engine.create_queue("b", dead_to("a"))
    await engine.store.delete(engine.runtime.manifest_cell("a").key)  # as a racing delete would
    fresh = make_engine(store, clock)
    with pytest.raises(InvalidRequest) as err:
        await fresh.create_queue("a", dead_to("b"))
    assert err.value.field == "dead_queue" and "a -> b -> a" in err.value.message


async def force_config(engine: Engine, queue: str, dead_queue: str) -> None:
    """Write a dead queue into a manifest past every check: what two racing
    updates (each checking before the other landed) can leave behind."""

    def change(m: Manifest, now: int) -> None:
        m.config = m.config.model_copy(update={"dead_queue": dead_queue})

    await engine.runtime.manifest_cell(queue).update(change)


async def test_stats_never_recurse_through_a_loop(engine: Engine) -> None:
    """A loop that racing updates closed: stats count one level down and answer."""
    await engine.create_queue("a")
    await engine.create_queue("b")
    await force_config(engine, "a", "b")
    await force_config(engine, "b", "a")
    await engine.produce("a", [b"a1"])
    await engine.produce("b", [b"b1", b"b2"])
    sa, sb = await engine.stats("a"), await engine.stats("b")
    assert (sa.available, sa.dead) == (1, 2)
    assert (sb.available, sb.dead) == (2, 1)


async def test_stats_count_the_dead_queue_one_level_down(engine: Engine) -> None:
    await engine.create_queue("c")
    await engine.create_queue("b", dead_to("c"))
    await engine.create_queue("a", dead_to("b"))
    await engine.produce("b", [b"dead in b"])
    await engine.produce("c", [b"c1", b"c2", b"c3"])
    assert (await engine.stats("a")).dead == 1  # b's live items, not c's
    assert (await engine.stats("b")).dead == 3


# -- deleting a dead queue (defect 13) -------------------------------------------------


async def test_delete_refuses_a_queue_that_is_another_queues_dead_queue(engine: Engine) -> None:
    await engine.create_queue("dlq")
    await engine.create_queue("jobs", dead_to("dlq"))
    await engine.create_queue("mail", dead_to("dlq"))
    await engine.create_queue("other")
    with pytest.raises(OkqError) as err:
        await engine.delete_queue("dlq")
    assert (err.value.status, err.value.code) == (409, "queue_in_use")
    assert err.value.details["used_by"] == ["jobs", "mail"]
    assert "'jobs', 'mail'" in err.value.message and "nothing was deleted" in err.value.message
    assert (await engine.get_queue("dlq")).name == "dlq"  # still there

    await engine.update_queue("jobs", dead_queue="other")
    await engine.delete_queue("mail")
    await engine.delete_queue("dlq")  # nobody uses it now
    assert sorted(await engine.list_queues()) == ["jobs", "other"]


async def test_a_queue_that_names_a_dead_queue_can_be_deleted(engine: Engine) -> None:
    await engine.create_queue("dlq")
    await engine.create_queue("jobs", dead_to("dlq"))
    await engine.delete_queue("jobs")
    await engine.delete_queue("dlq")
    assert await engine.list_queues() == []


# -- redrive: exactly once, and what stats say afterwards (defect 6) --------------------


async def make_dead_letters(engine: Engine) -> Counter[bytes]:
    """Dead letters in ``dlq`` from two queues: two dead-lettered from ``a`` (one
    by one, as workers give up), three from ``b`` in one segment (as an import
    of dead letters would write them). Returns the payloads."""
    await engine.create_queue("dlq")
    await engine.create_queue("a", dead_to("dlq", max_attempts=1))
    await engine.create_queue("b", dead_to("dlq"))
    await engine.produce("a", [b"a0", b"a1"])
    for item in await engine.lease("a", 10):
        await engine.retry(item.token, error="gave up")
    await engine.produce("dlq", [NewItem(f"b{n}".encode(), meta={"source_queue": "b"})
                                 for n in range(3)])
    assert (await engine.stats("a")).dead == 5
    return Counter([b"a0", b"a1", b"b0", b"b1", b"b2"])


async def payloads(engine: Engine, queue: str) -> Counter[bytes]:
    items, after = await engine.browse(queue, limit=1000)
    assert after is None
    return Counter(i.payload for i in items)


async def assert_moved_once(engine: Engine, expected: Counter[bytes]) -> None:
    back = await payloads(engine, "a") + await payloads(engine, "b")
    assert back == expected, f"each dead letter must be back exactly once: {back}"
    s = await engine.stats("dlq")
    assert (s.available, s.in_flight, s.scheduled, s.waiting_retry) == (0, 0, 0, 0), s


def crash_from(call: int) -> Callable[[str], bool]:
    """A key predicate true from the ``call``-th store call on: the process is dead."""
    seen = [0]

    def dead(key: str) -> bool:
        seen[0] += 1
        return seen[0] > call

    return dead


async def redrive_calls(store_factory: StoreFactory, kind: str) -> int:
    """How many store calls one uninterrupted redrive of the dead letters makes."""
    faulty = FaultyStore(await store_factory(kind))
    clock = ManualClock()
    await make_dead_letters(make_engine(faulty, clock))
    faulty.calls.clear()
    assert await make_engine(faulty, clock).redrive("dlq") == 5
    return len(faulty.calls)


@pytest.mark.parametrize("rerun_after", [301.0, 3600.0], ids=["after-lease", "an-hour-later"])
async def test_redrive_crashed_at_any_store_call_and_rerun_moves_each_item_once(
    store_factory: StoreFactory, kind: str, rerun_after: float
) -> None:
    """Crash a redrive before each of its store calls in turn; re-run it on a
    fresh engine once every lease it held has run out (301 s: also past the 300 s
    idempotency window; and an hour later). Every dead letter is back exactly once
    and the dead queue is empty."""
    calls = await redrive_calls(store_factory, kind)
    assert calls > 10
    for call in range(calls):
        inner = await store_factory(kind)
        clock = ManualClock()
        expected = await make_dead_letters(make_engine(inner, clock))
        faulty = FaultyStore(inner)
        faulty.inject("*", "crash", key=crash_from(call), times=-1)
        with pytest.raises(SimulatedCrash):
            await make_engine(faulty, clock).redrive("dlq")
        clock.advance(rerun_after)
        rerun = make_engine(inner, clock)
        await rerun.redrive("dlq")
        try:
            await assert_moved_once(rerun, expected)
        except AssertionError as exc:
            raise AssertionError(f"crash before store call {call} of {calls}: {exc}") from exc
        assert await rerun.redrive("dlq") == 0


async def test_two_redrives_at_once_move_each_item_once(store: Store, clock: ManualClock) -> None:
    expected = await make_dead_letters(make_engine(store, clock))
    one, two = make_engine(store, clock), make_engine(store, clock)
    moved = await asyncio.gather(one.redrive("dlq"), two.redrive("dlq"))
    assert sum(moved) == 5
    await assert_moved_once(one, expected)


async def test_redriven_items_come_back_fresh_with_where_they_were(engine: Engine) -> None:
    await make_dead_letters(engine)
    assert await engine.redrive("dlq", limit=4) == 4
    assert await engine.redrive("dlq") == 1
    back = [i for q in ("a", "b") for i in (await engine.browse(q))[0]]
    assert sorted(i.payload for i in back) == [b"a0", b"a1", b"b0", b"b1", b"b2"]
    assert {i.state for i in back} == {"available"} and {i.attempts for i in back} == {0}
    assert all(i.meta and i.meta["redriven_from"] == "dlq" for i in back)


async def test_redrive_to_a_destination_moves_every_dead_letter_there_once(
    engine: Engine,
) -> None:
    await make_dead_letters(engine)
    await engine.create_queue("elsewhere")
    with pytest.raises(InvalidRequest) as err:
        await engine.redrive("dlq", destination="dlq")
    assert err.value.field == "destination"
    with pytest.raises(QueueNotFound):
        await engine.redrive("dlq", destination="nowhere")
    assert await payloads(engine, "dlq") == Counter([b"a0", b"a1", b"b0", b"b1", b"b2"])
    assert await engine.redrive("dlq", destination="elsewhere") == 5
    assert await engine.redrive("dlq", destination="elsewhere") == 0
    assert await payloads(engine, "elsewhere") == Counter([b"a0", b"a1", b"b0", b"b1", b"b2"])
    assert await payloads(engine, "a") == Counter() and await payloads(engine, "b") == Counter()
    moved = (await engine.browse("elsewhere"))[0]
    assert all(i.meta and i.meta["redriven_from"] == "dlq" for i in moved)


async def test_stats_count_a_redriven_dead_letter_as_redriven_not_completed(
    engine: Engine,
) -> None:
    await make_dead_letters(engine)
    [kept] = await engine.lease("dlq", 1)  # a worker of the dead queue takes one...
    await engine.complete([kept.token])  # ...and deals with it: completed work
    assert await engine.redrive("dlq") == 4
    s = await engine.stats("dlq")
    assert s.completed == 1, "a redriven dead letter is not completed work"
    assert (s.redriven, s.dead_lettered) == (4, 0)
    assert (s.available, s.in_flight) == (0, 0)
    assert (await engine.stats("a")).dead == 0


async def test_redrive_leaves_dead_letters_whose_queue_is_gone_and_says_so(
    engine: Engine,
) -> None:
    await make_dead_letters(engine)
    await engine.delete_queue("b")
    with pytest.raises(QueueNotFound) as err:
        await engine.redrive("dlq")
    assert err.value.details["missing"] == ["b"]
    assert "3 stay in 'dlq'" in err.value.message, err.value.message
    assert await payloads(engine, "dlq") == Counter([b"b0", b"b1", b"b2"])
    assert sorted(i.state for i in (await engine.browse("dlq"))[0]) == ["available"] * 3
    assert await payloads(engine, "a") == Counter([b"a0", b"a1"])
    assert err.value.details["moved"] == 2


async def test_a_redrive_slower_than_its_lease_moves_nothing_twice(
    store: Store, clock: ManualClock
) -> None:
    """The redrive stalls writing the copies of ``b``'s dead letters past its
    lease; another engine leases the dead letters meanwhile. The stalled redrive's
    completion is refused, its copies are never published, and the dead letters
    stay with their new holder, to be moved later, once."""
    expected = await make_dead_letters(make_engine(store, clock))
    faulty = FaultyStore(store)
    faulty.inject("put", "latency", key="/segments/b/", delay=0.3)
    slow = asyncio.create_task(make_engine(faulty, clock).redrive("dlq"))
    while not faulty.injected:
        await asyncio.sleep(0.01)
    clock.advance(3600)  # every lease the slow redrive holds has run out
    thief = make_engine(store, clock)
    stolen = await thief.lease("dlq", 10)
    moved = await slow
    held = Counter(i.payload for i in stolen)
    assert Counter(b"b0 b1 b2".split()) <= held
    back = await payloads(thief, "a") + await payloads(thief, "b")
    assert sum(back.values()) == moved and back + held == expected  # nothing twice

    for i in stolen:
        await thief.retry(i.token, count_attempt=False)
    assert await thief.redrive("dlq") == len(stolen)
    await assert_moved_once(thief, expected)
