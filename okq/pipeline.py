"""One pipeline for every operation of a namespace.

Every front end turns what it was asked into an operation (``okq.ops``) and
hands it, with a :class:`Context` (who asks, whether the caller is still
there), to the namespace's :class:`Pipeline`. The pipeline is a chain of
layers composed once, at start-up; each has one method, ``handle(op, ctx)``,
and either acts on the operation or passes it to the layer below::

    authorize   a key's role and queue prefixes (okq.auth), one model for API keys
                and SQS keys; a listing keeps the queues the key covers
    meter       items and batch sizes (okq_items_total, okq_batch_items), once per
                item whatever the front end (a node only)
    admit       long-poll and produce admission, and the lease of a caller that
                went away given back (okq.admit)
    spread      a queue of several partitions: each operation on it turned into
                operations on its partitions (okq.partitions)
    route       sequencer mode: a change runs on its queue's holder (okq.routing;
                a node in sequencer mode only)
    local       the engine (okq.local)

A forward from another node enters its holder's pipeline at ``admit`` with
``ctx.forwarded`` set: the fleet signature stood for authorize, the sender
metered it, its spread chose the partition, and route runs it here.

A layer that has nothing to do for an operation returns the layer below's
awaitable without awaiting it (one method call, no coroutine of its own): a
plain ``def handle`` that may return ``self.inner.handle(op, ctx)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from prometheus_client import Counter, Histogram

from okq import ops
from okq.admit import Admission, Admit
from okq.clock import Clock
from okq.engine import Engine
from okq.errors import Forbidden
from okq.local import Local
from okq.ops import SYSTEM, Context, Layer
from okq.partitions import Spread
from okq.routing import Route
from okq.sequencer import Sequencer

R = TypeVar("R")


class Authorize:
    """A key may call the operation (its role) on the queues it names (its prefixes);
    a listing keeps the queues the key covers."""

    def __init__(self, inner: Layer) -> None:
        self.inner = inner

    def handle(self, op: ops.Op[R], ctx: Context) -> Awaitable[R]:
        who = ctx.principal
        if not who.may(op.right):
            raise Forbidden(f"a {who.role} key may not call {op.right}", role=who.role)
        if who.prefixes:
            for queue, field in op.named():
                who.check_queue(queue, field)
            if isinstance(op, ops.QueueNames | ops.QueueInfos):
                return cast(Awaitable[R], self._covered(op, ctx))
        return self.inner.handle(op, ctx)

    async def _covered(self, op: ops.QueueNames | ops.QueueInfos, ctx: Context) -> list[Any]:
        found: list[Any] = await self.inner.handle(op, ctx)
        who = ctx.principal
        if isinstance(op, ops.QueueNames):
            return [n for n in found if who.covers(n)]
        return [i for i in found if who.covers(i.name)]


class Meter:
    """Counts the items each operation moved, once, after it succeeded."""

    def __init__(self, inner: Layer, items: Counter, batch: Histogram) -> None:
        self.inner = inner
        self.produced, self.leased = items.labels("produced"), items.labels("leased")
        self.completed, self.retried = items.labels("completed"), items.labels("retried")
        self.batch_produce, self.batch_lease = batch.labels("produce"), batch.labels("lease")
        self.batch_complete = batch.labels("complete")
        self._meters: dict[type[Any], Callable[[Any, Context], Awaitable[Any]]] = {
            ops.Produce: self._produce, ops.Lease: self._lease,
            ops.Complete: self._complete, ops.RetryItems: self._retry,
        }

    def handle(self, op: ops.Op[R], ctx: Context) -> Awaitable[R]:
        meter = self._meters.get(type(op))
        if meter is None:
            return self.inner.handle(op, ctx)
        return cast(Awaitable[R], meter(op, ctx))

    async def _produce(self, op: ops.Produce, ctx: Context) -> list[str]:
        ids = await self.inner.handle(op, ctx)
        self.batch_produce.observe(len(op.items))
        self.produced.inc(len(op.items))
        return ids

    async def _lease(self, op: ops.Lease, ctx: Context) -> list[Any]:
        items = await self.inner.handle(op, ctx)
        self.batch_lease.observe(len(items))
        self.leased.inc(len(items))
        return items

    async def _complete(self, op: ops.Complete, ctx: Context) -> list[str] | None:
        ids = await self.inner.handle(op, ctx)
        if op.outputs is not None:
            self.produced.inc(len(op.outputs.items))
        self.batch_complete.observe(len(op.tokens))
        self.completed.inc(len(op.tokens))
        return ids

    async def _retry(self, op: ops.RetryItems, ctx: Context) -> ops.RetryOutcome:
        outcome = await self.inner.handle(op, ctx)
        self.retried.inc(outcome.retried)
        return outcome


class Pipeline:
    """A namespace's layers, composed once (``build``): ``handle`` enters at the top,
    ``forwarded`` at admit (a forward from another node of the fleet)."""

    def __init__(self, top: Layer, admit: Admit, engine: Engine) -> None:
        self.top = top
        self.admit = admit
        self.clock: Clock = engine.clock

    def handle(self, op: ops.Op[R], ctx: Context = SYSTEM) -> Awaitable[R]:
        return self.top.handle(op, ctx)

    def forwarded(self, op: ops.Op[R], ctx: Context) -> Awaitable[R]:
        return self.admit.handle(op, ctx)

    def waiting(self, queue: str) -> int:
        """Long polls waiting on ``queue`` now."""
        return self.admit.waiting(queue)


@dataclass(frozen=True)
class Meters:
    """Where the meter layer counts (a node's metrics)."""

    items: Counter
    batch: Histogram


def build(engine: Engine, admission: Admission | None = None, *, meters: Meters | None = None,
          sequencer: Sequencer | None = None, authorize: bool = True,
          default_partitions: int = 1) -> Pipeline:
    """authorize → meter → admit → spread → route → local over ``engine``: meter with
    ``meters`` only (a node), route with a ``sequencer`` only (sequencer mode); a queue
    created without saying how many partitions gets ``default_partitions``."""
    layer: Layer = Local(engine)
    if sequencer is not None:
        layer = Route(layer, engine, sequencer)
    layer = Spread(layer, engine, sequencer, default_partitions)
    admit = Admit(layer, admission or Admission(), engine)
    layer = admit
    if meters is not None:
        layer = Meter(layer, meters.items, meters.batch)
    if authorize:
        layer = Authorize(layer)
    return Pipeline(layer, admit, engine)
