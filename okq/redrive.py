"""Redrive: dead letters back to their source queues, exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from okq import leases as tr
from okq.changes import Unchanged
from okq.errors import (
    InvalidRequest,
    LeaseLost,
    QueueNotFound,
)
from okq.keys import (
    check_name,
    item_id,
)
from okq.leases import DONE, LEASED, OUTPUTS_PENDING, LeaseObject
from okq.model import (
    dead_letter_source,
    redriven_meta,
)
from okq.publisher import NewItem
from okq.tokens import Delivery

if TYPE_CHECKING:
    from okq.deliveries import Deliveries
    from okq.finishers import Finishers
    from okq.leases import LeasedItem
    from okq.runtime import QueueRuntime, Runtime
    from okq.scheduler import Scheduler


#: How long a redrive holds the dead letters it moves (seconds): long enough for
#: one batch (a segment write and two CASes per segment of dead letters), short
#: so that the dead letters of a crashed redrive can soon be redriven again.
REDRIVE_LEASE_S = 60.0


class Redriver:
    """Moves dead letters back to the queues they came from."""

    def __init__(self, rt: Runtime, scheduler: Scheduler, deliveries: Deliveries,
                 finishers: Finishers) -> None:
        self.rt = rt
        self.scheduler = scheduler
        self.deliveries = deliveries
        self.finishers = finishers

    async def redrive(self, dead_queue: str, limit: int = 1000,
                      destination: str | None = None) -> int:
        """Move dead letters back to the queues they came from (or all of them to
        ``destination``), as fresh items; returns how many moved.

        Exactly once, however a redrive is interrupted and whenever it is re-run.
        A dead letter goes back the way a completion with outputs does: its copy
        is written to the source queue as an unpublished segment; one CAS on the
        dead letter's lease object completes it and records that segment (``P``);
        then the segment is published and the dead letter becomes ``D``. The copy
        is visible if and only if that completion committed, and a completion is
        fenced by the delivery counter, so two redrives, or a re-run after a
        crash, never both move one dead letter. Killed before the completion: the
        segment is an orphan the compactor collects, and the dead letter is leased
        again once its redrive lease (``REDRIVE_LEASE_S``) ends. Killed after it:
        the ``P`` item names its segment, and the next lease walk of the dead queue
        or compactor pass publishes it (once, however late: ``publish_written``).

        No producer idempotency key is involved, on purpose. A re-run can come any
        time after the redrive lease ends (an hour later, say), long after any key
        has expired, so a key, even a stable one such as ``redrive:{id}``, would
        only stop duplicates for re-runs that happen to come soon enough. The lease
        length only decides how soon a crashed redrive's dead letters can be
        moved again; a redrive slower than its lease loses those completions
        (``LeaseLost``) and moves nothing twice.

        Items of the dead queue that are not dead letters stay, out of the way
        for an hour. Dead letters whose source queue does not exist stay too, and
        the redrive then ends with QueueNotFound saying how many moved.
        """
        if destination is not None:
            check_name(destination, "destination")
            if destination == dead_queue:
                raise InvalidRequest("destination must be another queue than the "
                                     "dead-letter queue", field="destination")
        dq = self.rt.queue(dead_queue)
        moved = 0
        missing: dict[str, int] = {}
        while moved < limit and not missing:
            batch = min(limit - moved, self.rt.opts.max_batch)
            items = await self.scheduler.lease(dead_queue, batch, lease_timeout=REDRIVE_LEASE_S)
            if not items:
                break
            groups, others = await self._redrive_groups(items, destination)
            for i in others:  # not a dead letter: leave it where it is
                await self.deliveries.retry(
                    i.token, retry_at_ms=self.rt.clock.now_ms() + 3_600_000, count_attempt=False)
            exists = {source: await self._queue_exists(source) for _, source in groups}
            for (segment, source), group in groups.items():
                if exists[source]:
                    moved += await self._redrive_group(dq, segment, source, group)
                    continue
                for i, _ in group:  # give them back at once, uncounted
                    await self.deliveries.retry(i.token, count_attempt=False)
                missing[source] = missing.get(source, 0) + len(group)
            if others:
                break
        if missing:
            raise _sources_missing(dead_queue, moved, missing)
        return moved

    async def _redrive_groups(
        self, items: list[LeasedItem], destination: str | None = None
    ) -> tuple[dict[tuple[str, str], list[tuple[LeasedItem, Delivery]]], list[LeasedItem]]:
        """Leased dead letters grouped by (their segment, the queue they go to: their
        source queue or ``destination``, or the partition of it the runtime's ``route``
        names), and the items that are not dead letters."""
        groups: dict[tuple[str, str], list[tuple[LeasedItem, Delivery]]] = {}
        others: list[LeasedItem] = []
        route = self.rt.route
        for i in items:
            source = _source_queue(i)
            if source is None:
                others.append(i)
                continue
            source = destination or source
            if route is not None:
                source = await route(source, i.meta)
            d, _ = self.deliveries.delivery(i.token)
            groups.setdefault((d.segment, source), []).append((i, d))
        return groups, others

    async def _queue_exists(self, name: str) -> bool:
        """Whether the queue exists now (a fresh manifest read)."""
        try:
            await self.rt.manifest(self.rt.queue(name), 0)
        except QueueNotFound:
            return False
        return True

    async def _redrive_group(self, dq: QueueRuntime, segment: str, source: str,
                             group: list[tuple[LeasedItem, Delivery]]) -> int:
        """Move dead letters of one segment back to ``source`` with one completion
        CAS; returns how many moved. Those whose redrive lease was lost meanwhile
        (another redrive leased them after it ran out) are left to that one."""
        outq = self.rt.queue(source)
        cell = self.rt.lease_cell(dq, segment)
        while group:
            sm = await outq.publisher.write_segment([
                NewItem(i.payload, None, None, redriven_meta(i.meta, dq.name, i.id))
                for i, _ in group
            ])
            out = [source, sm.id, sm.count, sm.created_ms, sm.size]
            try:
                recorded = await cell.update(_redrive_change([d for _, d in group], out))
            except LeaseLost as exc:
                lost = set(exc.details.get("lost", ()))
                if not lost:
                    raise
                group = [(i, d) for i, d in group if i.id not in lost]
                continue  # the segment just written is an orphan: never published
            dsm = await self.rt.segment_meta(dq, segment)
            await asyncio.gather(*(self.finishers.finish_outputs(dq, dsm, d.index, d.v, recorded)
                                   for _, d in group))
            return _finished(cell.cached(), [d for _, d in group])
        return 0


def _source_queue(item: LeasedItem) -> str | None:
    """The queue a dead letter came from, or None if the item is not a dead letter
    (or names no valid queue)."""
    source = dead_letter_source(item.meta)
    if source is None:
        return None
    try:
        return check_name(source, "source_queue")
    except InvalidRequest:
        return None


def _redrive_change(ds: list[Delivery], out: list[Any]) -> Callable[[LeaseObject, int], object]:
    """One lease-object change for a group of dead letters: every L(v) -> P(out),
    or none (their copies share one segment, so a dead letter whose lease was
    lost must not go back with the others: its new holder may move it too).

    Re-applied after its own ambiguous write landed, it finds them all completed
    by these deliveries and answers the segment recorded then."""

    def change(obj: LeaseObject, now: int) -> object:
        states = [obj.items.get(d.index) for d in ds]
        done = [st for d, st in zip(ds, states, strict=True)
                if st is not None and st.v == d.v and st.s in (DONE, OUTPUTS_PENDING)]
        if len(done) == len(ds):
            return Unchanged(done[0].out)
        lost = [item_id(d.segment, d.index) for d, st in zip(ds, states, strict=True)
                if st is None or st.s != LEASED or st.v != d.v]
        if lost:
            raise LeaseLost(f"{len(lost)} dead letters were leased again since this "
                            "redrive's lease ran out", lost=lost)
        for d in ds:
            tr.complete(obj, d.index, d.v, now, out)
        return out

    return change


def _finished(obj: LeaseObject | None, ds: list[Delivery]) -> int:
    """How many of these deliveries are completed (D), outputs published."""
    if obj is None:
        return 0
    return sum(1 for d in ds if (st := obj.items.get(d.index)) is not None
               and st.s == DONE and st.v == d.v)


def _sources_missing(dead_queue: str, moved: int, missing: dict[str, int]) -> QueueNotFound:
    kept = sum(missing.values())
    names = ", ".join(repr(n) for n in sorted(missing))
    return QueueNotFound(
        f"moved {moved} dead letter(s) back; {kept} stay in {dead_queue!r} because the "
        f"queue they came from does not exist: {names}",
        queue=sorted(missing)[0], missing=sorted(missing), moved=moved,
    )
