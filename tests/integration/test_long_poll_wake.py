"""Which long polls a produce wakes (okq/scheduler.py, ``Scheduler.lease``): the
one waiting longest, and the next only when that one took a full batch. The other
waiters sleep on: they would look, find nothing and wait again, and a look of
theirs queued ahead of the lease that found the items delayed its write.

The pause between looks is set long (30 s), so every answer here comes from a
wake-up, none from a look at the pause's end."""

from __future__ import annotations

import asyncio

import pytest

from okq import Engine
from okq.clock import SystemClock
from okq.scheduler import Scheduler
from okq.store import MemoryStore
from tests.engines import make_engine

PAUSE = 30.0


@pytest.fixture
async def engine() -> Engine:
    e = make_engine(MemoryStore(), SystemClock(), poll_interval=PAUSE, idle_poll_max=PAUSE)
    await e.create_queue("q")
    return e


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many items each look of a lease walk took, in order."""
    taken: list[int] = []
    once = Scheduler._lease_once

    async def counted(self: Scheduler, *args: object) -> tuple[list[object], int | None]:
        items, ready = await once(self, *args)  # type: ignore[arg-type]
        taken.append(len(items))
        return items, ready

    monkeypatch.setattr(Scheduler, "_lease_once", counted)
    return taken


async def waiting(engine: Engine, n: int, batch: int) -> list[asyncio.Task[list[object]]]:
    """``n`` long polls asleep on ``q``, oldest first."""
    polls = []
    for _ in range(n):
        polls.append(asyncio.ensure_future(engine.lease("q", batch, wait=PAUSE)))
        await asyncio.sleep(0.01)
    q = engine.runtime.queue("q")
    assert len(q.sleepers) == n
    return polls  # type: ignore[return-value]


async def test_a_produce_wakes_the_longest_waiting_long_poll_alone(
        engine: Engine, looks: list[int]) -> None:
    first, second, third = await waiting(engine, 3, batch=10)
    looks.clear()
    await engine.produce("q", [b"one"])
    got = await asyncio.wait_for(first, 5)
    assert [i.payload for i in got] == [b"one"]
    await asyncio.sleep(0.05)
    assert looks == [1]  # the other two did not look
    assert not second.done() and not third.done()
    assert len(engine.runtime.queue("q").sleepers) == 2
    for poll in (second, third):
        poll.cancel()
    await asyncio.gather(second, third, return_exceptions=True)


async def test_a_full_batch_wakes_the_next_until_the_items_run_out(
        engine: Engine, looks: list[int]) -> None:
    polls = await waiting(engine, 4, batch=100)
    looks.clear()
    await engine.produce("q", [b"%d" % n for n in range(250)])
    got = await asyncio.wait_for(asyncio.gather(*polls[:3]), 5)
    assert [len(g) for g in got] == [100, 100, 50]
    assert len({i.id for g in got for i in g}) == 250
    await asyncio.sleep(0.05)
    assert looks == [100, 100, 50]  # the third took less than a batch: the fourth sleeps
    assert not polls[3].done()
    polls[3].cancel()
    await asyncio.gather(polls[3], return_exceptions=True)


async def test_a_long_poll_woken_and_gone_before_its_look_passes_the_wake_up_on(
        engine: Engine, looks: list[int]) -> None:
    first, second = await waiting(engine, 2, batch=10)
    # The produce wakes the first, whose caller is gone before its look.
    engine.runtime.on_wake.append(lambda name: first.cancel())
    await engine.produce("q", [b"late"])
    got = await asyncio.wait_for(second, 5)
    assert [i.payload for i in got] == [b"late"]
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_stopping_wakes_every_long_poll(engine: Engine) -> None:
    polls = await waiting(engine, 3, batch=10)
    engine.stop_waiting()
    assert await asyncio.wait_for(asyncio.gather(*polls), 5) == [[], [], []]
