"""Idle long polls back off: an idle queue costs few store reads, a produce through
the same process still wakes a waiting lease at once, one through another process
within the longest pause."""

from __future__ import annotations

import asyncio

from okq import Engine, NewItem
from okq.clock import SystemClock
from okq.store import CountingStore, MemoryStore
from tests.engines import make_engine


async def _started(store: CountingStore | MemoryStore, **options: object) -> Engine:
    engine = make_engine(store, SystemClock(), **options)
    await engine.start(self_check=False)
    return engine


async def _until(condition: object, bound: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + bound
    while not condition() and loop.time() < give_up:  # type: ignore[operator]
        await asyncio.sleep(0.01)


async def test_an_idle_long_poll_backs_off() -> None:
    counting = CountingStore(MemoryStore())
    engine = await _started(counting)
    try:
        await engine.create_queue("q")
        counting.reset()
        assert await engine.lease("q", wait=3) == []
        # 0.25 s looks cost 12 manifest GETs in 3 s; backing off 0.25, 0.5, 1, 2 ...
        assert counting.requests["get"] <= 7, counting.requests
        assert counting.put_class == 0
    finally:
        await engine.close()


async def test_many_waiters_on_one_queue_share_their_looks() -> None:
    counting = CountingStore(MemoryStore())
    engine = await _started(counting)
    try:
        await engine.create_queue("q")
        counting.reset()
        await asyncio.gather(*(engine.lease("q", wait=3) for _ in range(8)))
        # They share each look, as one waiter's (the 0.25 s looks cost 13 GETs).
        assert counting.requests["get"] <= 7, counting.requests
    finally:
        await engine.close()


async def test_a_produce_here_wakes_a_backed_off_long_poll_at_once() -> None:
    engine = await _started(MemoryStore())
    try:
        await engine.create_queue("q")
        waiting = asyncio.create_task(engine.lease("q", wait=30))
        q = engine.runtime.queue("q")
        await _until(lambda: q.idle_pause >= 2)
        assert q.idle_pause >= 2  # backed off
        loop = asyncio.get_running_loop()
        start = loop.time()
        await engine.produce("q", [NewItem(b"x")])
        items = await asyncio.wait_for(waiting, 5)
        assert [i.payload for i in items] == [b"x"]
        assert loop.time() - start < 1.0  # the pause had grown to 2 s or more
    finally:
        await engine.close()


async def test_a_produce_through_another_process_arrives_within_the_longest_pause() -> None:
    shared = MemoryStore()
    here = await _started(shared, idle_poll_max=1.0)
    there = await _started(shared)
    try:
        await here.create_queue("q")
        waiting = asyncio.create_task(here.lease("q", wait=30))
        q = here.runtime.queue("q")
        await _until(lambda: q.idle_pause >= 1.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await there.produce("q", [NewItem(b"y")])
        items = await asyncio.wait_for(waiting, 10)
        assert [i.payload for i in items] == [b"y"]
        assert loop.time() - start < 1.0 + 2.0  # the pause, and room for a loaded machine
        assert q.idle_pause == 0  # found items: the next long poll starts looking fast
    finally:
        await here.close()
        await there.close()
