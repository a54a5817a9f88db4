"""Group commit: what is submitted while a batch is in flight goes in the next one
(``Batcher``), or what is submitted in one turn of the event loop goes together
(``TurnBatcher``).

One :class:`Batcher` serves every writer that gathers work into one store write:
the cells (many changes, one conditional PUT) and the publisher (many produce
calls, one segment and one manifest CAS). ``process`` handles a batch and
returns one result per submission, an exception standing for a failure of that
submission alone; an exception it raises fails the whole batch. A crash or a
cancellation (a BaseException that is not an Exception) reaches every waiter,
queued ones included, and stops the loop.

A ``Batcher``'s linger ends early once every submitter of the last batch has
submitted again (``submit(item, source)``; a source is whoever cannot submit more
until answered, such as the HTTP connection a call came on). Those are callers
in a closed loop, and the ones that shared the last batch are all in: the linger
was for them. A batch with a submission of no known source never ends a later
linger early.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from contextvars import ContextVar
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Who is calling, for a ``Batcher``'s ``source``: a front end sets it to the
#: connection a request came on (one request at a time each); None where unknown.
CALLER: ContextVar[Hashable | None] = ContextVar("okq_caller", default=None)


class Batcher(Generic[T, R]):
    def __init__(
        self,
        process: Callable[[list[T]], Awaitable[list[R | BaseException]]],
        *,
        name: str,
        linger: float | Callable[[], float] = 0.0,
        take: Callable[[list[T]], int] | None = None,
        answer_later: Callable[[], bool] | None = None,
    ) -> None:
        """``linger``: seconds to wait for more before each batch (or a function
        saying how long, asked before each batch); ``take``: how many of the
        waiting submissions the next batch takes (at least one; all by default);
        ``answer_later``: asked after each batch, whether its submitters are answered
        a turn of the event loop later (by a callback: tasks the batch made ready
        go first) rather than at once."""
        self.process = process
        self.name = name
        self.linger = linger
        self.take = take
        self.answer_later = answer_later
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._sources: list[Hashable | None] = []  # of each pending submission
        self._task: asyncio.Task[None] | None = None
        # The sources of the last batch taken (None: one was unknown), and those of
        # them that have a submission pending again.
        self._last: frozenset[Hashable] | None = None
        self._back: set[Hashable] = set()
        self._gathering: asyncio.Future[None] | None = None  # set while lingering

    def waiting(self) -> list[T]:
        """The submissions not yet taken into a batch."""
        return [item for item, _ in self._pending]

    async def submit(self, item: T, source: Hashable | None = None) -> R:
        """Add ``item`` to the next batch; its result once the batch was processed.
        ``source``: who submitted it, if it cannot submit again before this returns
        (see the module docstring)."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        self._sources.append(source)
        if self._last is not None and source in self._last:
            self._back.add(source)
            gathering = self._gathering
            if gathering is not None and self._all_back() and not gathering.done():
                gathering.set_result(None)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self.name)
        return await fut

    def _all_back(self) -> bool:
        return self._last is not None and len(self._back) == len(self._last)

    async def _linger(self, seconds: float) -> None:
        """Wait ``seconds``, or less: until every source of the last batch is back."""
        if self._all_back():
            return
        loop = asyncio.get_running_loop()
        self._gathering = gathering = loop.create_future()
        timer = loop.call_later(seconds, _resolve, gathering)
        try:
            await gathering
        finally:
            timer.cancel()
            self._gathering = None

    def _taken(self, n: int) -> list[tuple[T, asyncio.Future[R]]]:
        """The first ``n`` pending submissions, taken as a batch: their sources become
        the last batch's."""
        batch, self._pending = self._pending[:n], self._pending[n:]
        sources, self._sources = self._sources[:n], self._sources[n:]
        self._last = None if None in sources else frozenset(sources)
        last = self._last
        self._back = set() if last is None else {s for s in self._sources if s in last}
        return batch

    async def _run(self) -> None:
        while self._pending:
            linger = self.linger() if callable(self.linger) else self.linger
            if linger:
                await self._linger(linger)
            n = max(1, self.take(self.waiting())) if self.take else len(self._pending)
            batch = self._taken(n)
            try:
                results = await self.process([item for item, _ in batch])
            except BaseException as exc:
                _fail(batch, exc)
                if not isinstance(exc, Exception):  # a crash or a cancel: stop here
                    _fail(self._pending, exc)
                    self._pending, self._sources = [], []
                    return
                continue
            if self.answer_later is not None and self.answer_later():
                asyncio.get_running_loop().call_soon(_settle, batch, results)
            else:
                _settle(batch, results)

    async def close(self) -> None:
        """Wait for the batch in flight and those queued behind it."""
        if self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)


class TurnBatcher(Generic[T, R]):
    """What is submitted in one turn of the event loop goes in one batch, sent at the
    end of that turn; unlike ``Batcher``, a batch never waits for another in flight,
    so nothing is later than it would be alone. ``size`` caps a batch (asked at each
    turn); ``process`` is as for ``Batcher``."""

    def __init__(
        self,
        process: Callable[[list[T]], Awaitable[list[R | BaseException]]],
        *,
        name: str,
        size: Callable[[], int],
    ) -> None:
        self.process = process
        self.name = name
        self.size = size
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        if not self._pending:
            loop.call_soon(self._flush)
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        return await fut

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        n = max(1, self.size())
        for start in range(0, len(pending), n):
            task = asyncio.create_task(self._send(pending[start:start + n]), name=self.name)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self.process([item for item, _ in batch])
        except BaseException as exc:
            _fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        _settle(batch, results)

    async def close(self) -> None:
        """Wait for the batches in flight."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _fail(batch: list[tuple[T, asyncio.Future[R]]], exc: BaseException) -> None:
    """Every submission of ``batch`` still waiting fails with ``exc``."""
    for _, fut in batch:
        if not fut.done():
            fut.set_exception(exc)


def _settle(batch: list[tuple[T, asyncio.Future[R]]], results: list[R | BaseException]) -> None:
    """Each submission of ``batch`` gets its result, an exception standing for its
    failure alone; one whose caller was cancelled meanwhile is skipped."""
    for (_, fut), result in zip(batch, results, strict=True):
        if fut.done():
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)
