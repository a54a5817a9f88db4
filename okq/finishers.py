"""The finishers: dead-letter moves and the outputs of completions.

An item out of attempts (or retried ``dead``) is ``X`` until it is produced to
its queue's dead-letter queue and marked ``Z``; a completion with outputs is
``P`` until its outputs segment is published and it is marked ``D``. Whoever
made the first step finishes it; a crash leaves it to any node's lease walk or
compactor pass that comes by (docs/DESIGN.md, "Dead-lettering").
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from okq import leases as tr
from okq.errors import (
    ObjectNotFound,
    OkqError,
    PublishAborted,
    QueueNotFound,
)
from okq.keys import (
    item_id,
    split_partition,
)
from okq.leases import DEAD_PENDING, OUTPUTS_PENDING, ItemState
from okq.model import (
    QueueConfig,
    SegmentMeta,
    dead_letter_meta,
    dead_letter_source,
    groups_of,
)
from okq.publisher import NewItem

if TYPE_CHECKING:
    from okq.runtime import QueueRuntime, Runtime


log = logging.getLogger("okq.engine")


#: After a failed help (e.g. a dead queue gone), none for this long.
HELP_BACKOFF_MS = 60_000


class Finishers:
    """Finish what is half done on an item: a dead-letter move (X -> Z) or a
    completion's outputs (P -> D); node walks and compactor passes call them."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def help_noted(self, q: QueueRuntime) -> None:
        """Help the half-done items a lease walk noted, outside the queue's lock:
        a dead-letter move produces into another queue and must not hold up
        other lease calls on this one. The queue's settings are read once for
        all of them."""
        if not q.stalled:
            return
        config = (await self.rt.manifest(q, 0)).config
        while q.stalled:
            (_, idx), sm = q.stalled.popitem()
            await self.help_stalled(q, sm, idx, config)

    async def help_dead(self, q: QueueRuntime, sm: SegmentMeta, idx: int,
                        config: QueueConfig | None = None) -> None:
        """Finish moving a DEAD_PENDING item: produce it to the dead-letter queue
        (idempotently, keyed by its delivery), then mark it DEAD. Where it goes
        (or whether it is dropped: no dead queue) follows the queue's settings
        read now, never a cached copy: ``config`` if the caller just read it,
        else read here."""
        cell = self.rt.lease_cell(q, sm.id)
        obj = cell.cached()
        st = obj.items.get(idx) if obj else None
        if st is None or st.s != DEAD_PENDING:
            return
        # A copy may be old (a lease walk re-reads only a few objects per call): the
        # move may be done, and its idempotency key gone, since. Decide on the store's.
        await cell.refresh()
        obj = cell.cached()
        st = obj.items.get(idx) if obj else None
        if st is None or st.s != DEAD_PENDING:
            return
        if config is None:
            config = (await self.rt.manifest(q, 0)).config
        dead_queue = config.dead_queue
        iid = item_id(sm.id, idx)
        if dead_queue:
            try:
                await self._dead_letter(q, sm, idx, st, dead_queue)
            except OkqError as exc:
                log.error("cannot dead-letter %s of %s into %s: %s; trying again later",
                          iid, q.name, dead_queue, exc)
                q.help_after[(sm.id, idx)] = self.rt.clock.now_ms() + HELP_BACKOFF_MS
                return
        v = st.v
        await cell.update(lambda o, now: tr.finish_dead(o, idx, v))
        q.help_after.pop((sm.id, idx), None)

    async def _dead_letter(self, q: QueueRuntime, sm: SegmentMeta, idx: int, st: ItemState,
                           dead_queue: str) -> None:
        seg = await self.rt.segment(q, sm)
        iid = item_id(sm.id, idx)
        item = seg.items[idx]
        # The source is the queue, whichever of its partitions held the item: a
        # redrive puts it back through the queue's partition 0.
        meta = dead_letter_meta(item.meta, split_partition(q.name)[0], iid,
                                item.born_ms or sm.created_ms, st.attempts, st.err)
        key = f"dlq:{self.rt.ns}:{q.name}:{iid}:{st.v}"
        await self.rt.produce(dead_queue, [NewItem(item.payload, None, key, meta)])

    async def help_stalled(self, q: QueueRuntime, sm: SegmentMeta, idx: int,
                           config: QueueConfig | None = None) -> None:
        """Finish what a crashed node left half done on an item (``config``: the
        queue's settings, if the caller has just read them)."""
        obj = self.rt.lease_cell(q, sm.id).cached()
        st = obj.items.get(idx) if obj else None
        if st is not None and st.s == DEAD_PENDING:
            await self.help_dead(q, sm, idx, config)
        elif st is not None and st.s == OUTPUTS_PENDING and st.out is not None:
            try:
                await self.finish_outputs(q, sm, idx, st.v, st.out)
            except OkqError as exc:
                log.error("outputs of %s of %s: %s", item_id(sm.id, idx), q.name, exc)

    async def finish_outputs(self, q: QueueRuntime, sm: SegmentMeta, idx: int, v: int,
                              out: list[Any]) -> None:
        """Publish a completion's outputs segment, then mark the item DONE.

        Outputs that can never be published (their queue was deleted, or their
        segment fell behind its GC floor) abandon the completion: the item is
        dead-lettered with the reason, and the error is raised. A transient store
        failure leaves the item P, to be finished by a retry or a helper.
        """
        outq = self.rt.queue(out[0])
        written = SegmentMeta(*out[1:])
        with contextlib.suppress(ObjectNotFound):  # gone: published and compacted, or lost
            # Its groups, which the lease object does not keep (docs/DESIGN.md, "Fair
            # sharing"): the segment was cached when this process wrote it.
            seg = await self.rt.segment(outq, written)
            written.groups = groups_of(item.meta for item in seg.items)
        try:
            await outq.publisher.publish_written(written)
        except (QueueNotFound, ObjectNotFound, PublishAborted) as exc:
            reason = f"outputs could not be published to queue {out[0]!r}: {exc.message}"
            # A dead letter on its way back to its source queue waits in the dead
            # queue again; any other item is dead-lettered with the reason.
            meta = (await self.rt.segment(q, sm)).items[idx].meta
            back = dead_letter_source(meta) == out[0]
            cell = self.rt.lease_cell(q, sm.id)
            moved = await cell.update(
                lambda o, now: tr.abandon_outputs(o, idx, v, now, reason, back=back))
            if moved and not back:
                await self.help_dead(q, sm, idx)
            what = "waits in its queue again" if back else "was dead-lettered"
            message = f"the completion did not take: {reason}; the item {what}"
            if isinstance(exc, PublishAborted):
                raise PublishAborted(message) from exc
            raise QueueNotFound(message, queue=out[0], field="outputs.queue_name") from exc
        self.rt.wake(outq)
        await self.rt.lease_cell(q, sm.id).update(
            lambda o, now: tr.finish_outputs(o, idx, v)
        )
