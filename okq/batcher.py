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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    def __init__(
        self,
        process: Callable[[list[T]], Awaitable[list[R | BaseException]]],
        *,
        name: str,
        linger: float | Callable[[], float] = 0.0,
        take: Callable[[list[T]], int] | None = None,
    ) -> None:
        """``linger``: seconds to wait for more before each batch (or a function
        saying how long, asked before each batch); ``take``: how many of the
        waiting submissions the next batch takes (at least one; all by default)."""
        self.process = process
        self.name = name
        self.linger = linger
        self.take = take
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    def waiting(self) -> list[T]:
        """The submissions not yet taken into a batch."""
        return [item for item, _ in self._pending]

    async def submit(self, item: T) -> R:
        """Add ``item`` to the next batch; its result once the batch was processed."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self.name)
        return await fut

    async def _run(self) -> None:
        while self._pending:
            linger = self.linger() if callable(self.linger) else self.linger
            if linger:
                await asyncio.sleep(linger)
            n = max(1, self.take(self.waiting())) if self.take else len(self._pending)
            batch, self._pending = self._pending[:n], self._pending[n:]
            try:
                results = await self.process([item for item, _ in batch])
            except BaseException as exc:
                _fail(batch, exc)
                if not isinstance(exc, Exception):  # a crash or a cancel: stop here
                    _fail(self._pending, exc)
                    self._pending = []
                    return
                continue
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
