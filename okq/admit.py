"""The pipeline's admission layer: what a node lets in before it sheds load, and
the one place a lease whose caller went away is given back.

- a produce is shed (``Overloaded``) while too many of the queue's items wait to
  be published on this node (``max_pending_produce``);
- a long poll is shed while ``max_waiting`` others wait on the queue; one longer
  than the engine's ``max_wait`` is refused; a long poll whose caller has gone
  stops counting toward ``max_waiting`` within ``GONE_CHECK`` seconds;
- what a lease took for a caller that has gone (a closed connection, a worker
  stopped by Ctrl-C) is given back at once, uncounted, instead of sitting leased
  until its lease times out.

On a sequencer holder, a forward enters here (``ctx.forwarded``): the sender
already held the long poll's place; the holder sheds produce by its own
publishing backlog and gives back what it leased for a sender that went away.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from okq import ops
from okq.engine import Engine
from okq.errors import Overloaded
from okq.leases import LeasedItem
from okq.limits import check_wait

R = TypeVar("R")

#: Seconds between looks at whether a long poll's caller has gone away.
GONE_CHECK = 0.5


@dataclass(frozen=True)
class Admission:
    """How much a node lets in before it sheds load (the node's ``--max-*``, whose
    defaults these are)."""

    max_waiting: int = 100  # long polls per queue before 429
    #: items waiting to be published on a queue before a produce is shed
    max_pending_produce: int = 50_000


class _Slot:
    """One long poll's place in ``max_waiting``, given back once."""

    def __init__(self, waiting: Counter[str], queue: str) -> None:
        self.waiting, self.queue, self.held = waiting, queue, True
        waiting[queue] += 1

    def release(self) -> None:
        if self.held:
            self.held = False
            self.waiting[self.queue] -= 1
            if not self.waiting[self.queue]:
                del self.waiting[self.queue]


async def _free_when_gone(slot: _Slot, gone: Callable[[], bool]) -> None:
    """Give the slot back as soon as the caller is seen gone."""
    while not gone():
        await asyncio.sleep(GONE_CHECK)
    slot.release()


class Admit:
    """Admission for one namespace of one node."""

    def __init__(self, inner: ops.Layer, admission: Admission, engine: Engine) -> None:
        self.inner = inner
        self.admission = admission
        self.engine = engine  # its publishing backlog, its longest long poll
        self._waiting: Counter[str] = Counter()  # long polls waiting, by queue

    def waiting(self, queue: str) -> int:
        """Long polls waiting on ``queue`` now."""
        return self._waiting[queue]

    def handle(self, op: ops.Op[R], ctx: ops.Context) -> Awaitable[R]:
        kind = type(op)
        if kind is ops.Lease:
            return cast(Awaitable[R], self._lease(cast(ops.Lease, op), ctx))
        if kind is ops.Produce and self.engine.pending_produce(op.queue) > \
                self.admission.max_pending_produce:
            raise Overloaded("too many items waiting to be published on this queue; retry later",
                             retry_after=1, queue=op.queue)
        return self.inner.handle(op, ctx)

    async def _lease(self, op: ops.Lease, ctx: ops.Context) -> list[LeasedItem]:
        if ctx.forwarded:  # the sender admitted it and holds its place
            items = await self.inner.handle(op, ctx)
        else:
            items = await self._admitted(op, ctx)
        if items and ctx.gone():  # nobody would get the tokens
            await self.inner.handle(ops.GiveBack(op.queue, items), ctx)
            return []
        return items

    async def _admitted(self, op: ops.Lease, ctx: ops.Context) -> list[LeasedItem]:
        check_wait(op.wait, self.engine.opts.max_wait)
        limit = self.admission.max_waiting
        if op.wait > 0 and self._waiting[op.queue] >= limit:
            raise Overloaded(f"{limit} lease requests are already waiting on this queue",
                             retry_after=1, queue=op.queue)
        slot = _Slot(self._waiting, op.queue)
        watcher: asyncio.Task[Any] | None = None
        if ctx.gone is not ops.never_gone and op.wait > GONE_CHECK:  # shorter: freed soon
            watcher = asyncio.create_task(_free_when_gone(slot, ctx.gone))
        try:
            return await self.inner.handle(op, ctx)
        finally:
            if watcher is not None:
                watcher.cancel()
            slot.release()

