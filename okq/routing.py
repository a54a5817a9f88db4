"""The pipeline's route layer (sequencer mode): each change runs on its queue's holder.

An operation that changes state (``op.change``: produce, lease, give-back, renew,
complete, retry, purge, queue update and delete, redrive) runs on the node that
holds its queue's sequencer role (``okq.sequencer``): on this node's engine when
this node holds it, else carried whole to the holder (``okq.forwarding``), which
runs it through its own pipeline from admit down (``Pipeline.forwarded``). Reads
and everything else pass straight to the layer below.

When the holder cannot be reached (its port refuses connections), the node
claims the role or learns the new holder, and after a few tries runs the change
itself: direct writes are always correct, only slower. A forward that was sent
and got no answer is not repeated here (it may have landed): the caller gets
``OutcomeUnknown`` (503) and retries, with idempotency keys for produce.

Input is checked where the operation runs (on the holder, once): a bad token or
an oversized batch costs a forward, and its error comes back as the same class.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable
from typing import Any, TypeVar

from okq import ops
from okq.engine import Engine
from okq.errors import OutcomeUnknown, StorageError
from okq.fleetwire import Unreachable
from okq.forwarding import Forwarder
from okq.sequencer import Sequencer

log = logging.getLogger("okq.routing")

R = TypeVar("R")

#: Forwards to a holder that refuses connections before the node writes directly.
ROUTE_TRIES = 3
#: Seconds a forwarded change (other than a long poll, which adds its wait) may take.
FORWARD_TIMEOUT = 75.0


class Route:
    """Runs each change where its shard's sequencer role is held."""

    def __init__(self, inner: ops.Layer, engine: Engine, sequencer: Sequencer) -> None:
        self.inner = inner
        self.engine = engine
        self.sequencer = sequencer
        self.forwarder = Forwarder(sequencer)
        engine.trust(sequencer.holds)
        sequencer.on_gain.append(self._gained)

    def _gained(self, shard: int) -> None:
        """A role was just taken: what this node cached of the shard's queues was
        written by others, so nothing of it is trusted until read again."""
        self.engine.forget_cached(self.sequencer.holds)

    def handle(self, op: ops.Op[R], ctx: ops.Context) -> Awaitable[R]:
        if not op.change or ctx.forwarded:  # a read, or sent here to run here
            return self.inner.handle(op, ctx)
        return self._routed(op, ctx)

    async def _routed(self, op: ops.Op[R], ctx: ops.Context) -> R:
        seq, queue = self.sequencer, op.queue
        wire: dict[str, Any] | None = None
        rid = ctx.rid
        for _ in range(ROUTE_TRIES):
            try:
                holder = await seq.route(queue)
            except StorageError as exc:
                log.info("sequencer role unreadable (%s): writing directly", exc)
                break
            if holder is None:
                return await self.inner.handle(op, ctx)
            if wire is None:
                wire, rid = ops.to_wire(op), rid or secrets.token_hex(8)
            timeout = FORWARD_TIMEOUT + (op.wait if isinstance(op, ops.Lease) else 0.0)
            try:
                return await self.forwarder.forward(holder, op, wire, rid, timeout)
            except OutcomeUnknown as exc:
                log.warning("%s %s forwarded to %s: %s", op.name, rid, holder.url, exc.message)
                raise
            except Unreachable as exc:
                if not exc.refused:
                    break  # maybe alive but out of reach: write directly, claim nothing
                seq.holder_unreachable(queue, holder, f"is gone ({exc})")
        seq.count("direct")
        return await self.inner.handle(op, ctx)
