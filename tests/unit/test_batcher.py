"""The group commit's linger ends early once every caller of the last batch has
called again, and only then (okq/batcher.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable

import pytest

from okq.batcher import Batcher

LONG = 60.0  # a linger no test waits out


class Recorder:
    """A batcher whose first batch goes at once and every later one lingers LONG,
    recording its batches."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.lingers = [0.0]
        self.batcher: Batcher[str, str] = Batcher(self._process, name="test", linger=self._linger)
        self.calls: list[asyncio.Task[str]] = []

    def _linger(self) -> float:
        return self.lingers.pop(0) if self.lingers else LONG

    async def _process(self, items: list[str]) -> list[str | BaseException]:
        self.batches.append(items)
        return [f"done {i}" for i in items]

    def call(self, item: str, source: Hashable | None) -> asyncio.Task[str]:
        self.calls.append(asyncio.ensure_future(self.batcher.submit(item, source)))
        return self.calls[-1]


@pytest.fixture
async def rec() -> AsyncIterator[Recorder]:
    r = Recorder()
    yield r
    for task in [*r.calls, r.batcher._task]:
        if task is not None:
            task.cancel()
    await asyncio.gather(*r.calls, return_exceptions=True)


async def first_batch(rec: Recorder, *calls: tuple[str, Hashable | None]) -> None:
    await asyncio.gather(*(rec.call(item, source) for item, source in calls))
    assert rec.batches == [[item for item, _ in calls]]


async def test_a_batch_goes_once_every_caller_of_the_last_is_back(rec: Recorder) -> None:
    await first_batch(rec, ("a1", "A"), ("b1", "B"))
    a2 = rec.call("a2", "A")
    await asyncio.sleep(0.05)
    assert not a2.done()  # B may still call: the linger goes on
    b2 = rec.call("b2", "B")
    assert await asyncio.wait_for(asyncio.gather(a2, b2), 5) == ["done a2", "done b2"]
    assert rec.batches[1] == ["a2", "b2"]


async def test_a_stranger_does_not_end_the_linger_and_joins_the_batch(rec: Recorder) -> None:
    await first_batch(rec, ("a1", "A"), ("b1", "B"))
    a2, c1 = rec.call("a2", "A"), rec.call("c1", "C")
    await asyncio.sleep(0.05)
    assert not a2.done() and not c1.done()
    b2 = rec.call("b2", "B")
    await asyncio.wait_for(asyncio.gather(a2, c1, b2), 5)
    assert rec.batches[1] == ["a2", "c1", "b2"]


async def test_a_caller_alone_in_a_closed_loop_never_waits(rec: Recorder) -> None:
    await first_batch(rec, ("a1", "A"))
    for n in range(2, 6):  # each after the last returned: the task has ended between
        assert await asyncio.wait_for(rec.call(f"a{n}", "A"), 5) == f"done a{n}"
    assert len(rec.batches) == 5


@pytest.mark.parametrize("unknown", ["in the last batch", "calling again"])
async def test_an_unknown_caller_gets_the_whole_linger(rec: Recorder, unknown: str) -> None:
    if unknown == "in the last batch":
        await first_batch(rec, ("a1", "A"), ("x1", None))
        later = rec.call("a2", "A")
    else:
        await first_batch(rec, ("a1", "A"))
        later = rec.call("x1", None)
    await asyncio.sleep(0.2)
    assert not later.done()
    assert len(rec.batches) == 1


async def test_the_linger_still_ends_on_its_own() -> None:
    seen: list[list[int]] = []

    async def process(items: list[int]) -> list[int | BaseException]:
        seen.append(items)
        return items

    batcher: Batcher[int, int] = Batcher(process, name="test", linger=0.05)
    await asyncio.gather(batcher.submit(1, "A"), batcher.submit(2, "B"))
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await asyncio.wait_for(batcher.submit(3, "A"), 5) == 3  # B never comes back
    assert loop.time() - began >= 0.05
    assert seen == [[1, 2], [3]]


@pytest.mark.parametrize("later", [False, True])
async def test_answer_later_lets_a_task_the_batch_woke_start_its_own_work_first(
        later: bool) -> None:
    """A batch wakes a task, which starts a task of its own (as a woken long poll
    starts its lease object's write): answered later, the submitter comes after
    that task; answered at once, before it."""
    order: list[str] = []
    wake = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def woken() -> None:
        await wake.wait()
        order.append("woken")
        tasks.append(asyncio.ensure_future(started()))

    async def started() -> None:
        order.append("its own work")

    async def process(items: list[int]) -> list[int | BaseException]:
        wake.set()
        return items

    b: Batcher[int, int] = Batcher(process, name="t", answer_later=lambda: later)
    waiter = asyncio.ensure_future(woken())
    await asyncio.sleep(0)
    assert await b.submit(1) == 1
    order.append("answered")
    await waiter
    await asyncio.gather(*tasks)
    assert order == (["woken", "its own work", "answered"] if later
                     else ["woken", "answered", "its own work"])
