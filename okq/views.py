"""Read-only views: browsing a queue's live items and its stats, read fresh from
the store.

Browsing reads one segment per page step (an operator's call, not a hot path).
Stats must stay quick on a deep backlog: one LIST of the queue's lease objects
tells which segments were never leased, and such a segment whose manifest entry
says all its items are due is counted from the manifest alone; the others are
read concurrently (at most :data:`STATS_READS` at a time). A queue of a few
segments GETs each lease object instead: S3 bills a LIST as 12.5 GETs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from okq.errors import (
    QueueNotFound,
)
from okq.headers import headers_of
from okq.keys import (
    item_id,
    leases_prefix,
    parse_item_id,
    segment_key,
)
from okq.leases import DONE, OUTPUTS_PENDING, ItemState, LeaseObject, classify
from okq.model import (
    Manifest,
    Segment,
    SegmentItem,
    SegmentMeta,
    dead_letter_source,
    decode_segment,
    fresh_due_ms,
    fresh_ready_ms,
)
from okq.store.base import list_all

if TYPE_CHECKING:
    from okq.runtime import QueueRuntime, Runtime


@dataclass
class BrowsedItem:
    id: str
    state: str  # available, scheduled, leased, waiting
    attempts: int
    produced_ms: int
    ready_ms: int | None
    payload: bytes
    meta: dict[str, Any] | None
    error: str | None

    @property
    def headers(self) -> dict[str, str]:
        """Its headers (okq/headers.py): those in its meta, and its SQS String attributes."""
        return headers_of(self.meta)


#: Segments (with their lease objects) that stats reads at once: bounds the
#: memory a deep backlog's stats take and the burst of GETs on the store.
STATS_READS = 32
#: Stats LIST the lease objects of a queue of more segments than this, and GET
#: each one of a smaller queue: S3 bills a LIST at 12.5 times a GET.
STATS_LIST_ABOVE = 12


@dataclass
class QueueStats:
    queue: str
    available: int = 0
    in_flight: int = 0
    scheduled: int = 0
    waiting_retry: int = 0
    dead: int = 0  # items in this queue's dead-letter queue
    dead_lettered: int = 0  # items moved out of this queue, not yet compacted
    completed: int = 0  # tombstones not yet compacted
    redriven: int = 0  # dead letters moved back to their source queue, not yet compacted
    segments: int = 0
    oldest_age_s: float = 0.0


class Views:
    """Read-only views of a queue: browse its live items, count them by state."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def browse(
        self, queue: str, *, start_after: str | None = None, limit: int = 100
    ) -> tuple[list[BrowsedItem], str | None]:
        """Live items in delivery-log order, without leasing them."""
        q = self.rt.queue(queue)
        m = await self.rt.manifest(q, 0)
        after = parse_item_id(start_after, "start_after") if start_after else None
        now = self.rt.clock.now_ms()
        out: list[BrowsedItem] = []
        for sm in m.segments:
            if after is not None and sm.id < after[0]:
                continue
            obj, seg = await self._read(q, sm)
            first = after[1] + 1 if after is not None and sm.id == after[0] else 0
            for idx in range(first, sm.count):
                item = _browsed(sm, seg, obj, idx, now)
                if item is None:
                    continue
                if len(out) == limit:
                    return out, out[-1].id
                out.append(item)
        return out, None

    async def stats(self, queue: str) -> QueueStats:
        """Counts by state, read fresh from the store (one GET per segment), and
        the live items in the queue's dead queue.

        The dead queue is counted one level down only, never its own dead queue:
        a chain of dead queues costs one more queue, and a loop that two racing
        updates closed cannot make this recurse."""
        q = self.rt.queue(queue)
        m = await self.rt.manifest(q, 0)
        s = await self._count(q, m)
        if m.config.dead_queue:  # never the queue itself: admin refuses that
            s.dead = await self._live_in(m.config.dead_queue)
        return s

    async def _live_in(self, queue: str) -> int:
        """Live items (available, in flight, scheduled, waiting) of a queue; 0 if
        it does not exist. Does not look at that queue's own dead queue."""
        q = self.rt.queue(queue, "dead_queue")
        try:
            m = await self.rt.manifest(q, 0)
        except QueueNotFound:
            return 0
        return _live(await self._count(q, m))

    async def _count(self, q: QueueRuntime, m: Manifest) -> QueueStats:
        """A queue's items counted by state (``dead`` left at 0).

        Segments without a lease object whose manifest entry tells enough
        (:func:`_needs_items`) are counted unread; the others concurrently."""
        now = self.rt.clock.now_ms()
        s = QueueStats(q.name, segments=len(m.segments))
        leased = await self._with_lease_objects(q, m)
        gate = asyncio.Semaphore(STATS_READS)
        untouched = LeaseObject("")
        found: list[int | None] = []
        reads = []
        for sm in m.segments:
            if sm.id in leased or _needs_items(sm, untouched, now):
                reads.append(self._count_read(q, sm, sm.id in leased, gate, s, now))
            else:
                found.append(_tally(s, sm, untouched, None, now))
        found.extend(await asyncio.gather(*reads))
        oldest = min((b for b in found if b is not None), default=None)
        s.oldest_age_s = 0.0 if oldest is None else max(0, now - oldest) / 1000
        return s

    async def _with_lease_objects(self, q: QueueRuntime, m: Manifest) -> set[str]:
        """The segments of the queue that have a lease object (one LIST per 1,000):
        the others were never leased, so all their items are fresh. Every segment
        of a queue of a few: their lease objects are read, a LIST would cost more."""
        if len(m.segments) <= STATS_LIST_ABOVE:
            return {sm.id for sm in m.segments}
        prefix = leases_prefix(self.rt.ns, q.name)
        return {info.key[len(prefix):] async for info in list_all(self.rt.store, prefix)}

    async def _count_read(self, q: QueueRuntime, sm: SegmentMeta, leased: bool,
                          gate: asyncio.Semaphore, s: QueueStats, now: int) -> int | None:
        """Count one segment that needs a read: its lease object, if it has one,
        then its items, if the lease object and the manifest do not tell enough."""
        async with gate:
            obj = LeaseObject(sm.id)
            if leased:
                cell = self.rt.lease_cell(q, sm.id)
                await cell.refresh()
                obj = cell.view() or obj  # not changed here: the readers' shared copy
            seg = await self._items(q, sm) if _needs_items(sm, obj, now) else None
        return _tally(s, sm, obj, seg, now)

    async def _items(self, q: QueueRuntime, sm: SegmentMeta) -> Segment:
        """A segment, from the cache if there, else read and decoded without being
        cached: a deep backlog's stats must not push the lease path's segments out."""
        seg = self.rt.segments.get(sm.id)
        if seg is None:
            blob = await self.rt.store.get(segment_key(self.rt.ns, q.name, sm.id))
            seg = decode_segment(blob.data)
        return seg

    async def _read(self, q: QueueRuntime, sm: SegmentMeta) -> tuple[LeaseObject, Segment]:
        """A segment and its lease object read fresh (the views count what is true now)."""
        cell = self.rt.lease_cell(q, sm.id)
        await cell.refresh()
        return cell.cached() or LeaseObject(sm.id), await self.rt.segment(q, sm)


def _redriven(st: ItemState | None, item: SegmentItem) -> bool:
    """Whether a completed item is a dead letter that went back to the queue it
    came from (a redrive): neither work done nor a dead letter any more."""
    source = dead_letter_source(item.meta)
    return st is not None and st.out is not None and source is not None and st.out[0] == source


def _live(s: QueueStats) -> int:
    return s.available + s.in_flight + s.scheduled + s.waiting_retry


def _classify(st: ItemState | None, sm: SegmentMeta, item: SegmentItem,
              now: int) -> tuple[str, int | None]:
    """An item's state as stats counts it (a QueueStats field), and its ready time.
    A fresh item is available once due (0 when not scheduled), whatever its
    producer's clock said of its ready time."""
    if st is not None:
        return classify(st, now)
    ready = fresh_ready_ms(sm, item)
    if ready <= now or fresh_due_ms(sm, item) <= now:
        return "available", ready
    return "scheduled", ready


def _first_born(sm: SegmentMeta) -> int | None:
    """The earliest produce time of a segment's items, when its manifest entry
    tells it: its creation for a segment a producer wrote (its items carry no
    ``born_ms``); the merge's lower bound of ready times for a merged segment
    with nothing scheduled (ready == born for each item), unless that bound was
    capped at the merge's own time (``created_ms``)."""
    if sm.min_ready_ms is None:
        return sm.created_ms
    if sm.last_due_ms == 0 and sm.min_ready_ms < sm.created_ms:
        return sm.min_ready_ms
    return None


def _needs_items(sm: SegmentMeta, obj: LeaseObject, now: int) -> bool:
    """Whether counting a segment needs its items, given its lease object (an
    empty one if it has none). Not when its manifest entry says every fresh item
    is due by now, the items a lease object names were produced together (no
    merge), and no completed item may be a redriven dead letter (its meta tells)."""
    if sm.last_due_ms is None:  # listed by an older okq, or an outputs segment
        return True
    if obj.items:
        if sm.min_ready_ms is not None:  # merged: each item has its own produce time
            return True
        if any(st.out is not None and st.s in (DONE, OUTPUTS_PENDING)
               for st in obj.items.values()):
            return True
    elif _first_born(sm) is None:
        return True
    return sm.last_due_ms > now and sm.count > len(obj.items)


def _tally(s: QueueStats, sm: SegmentMeta, obj: LeaseObject, seg: Segment | None,
           now: int) -> int | None:
    """Add a segment's items to ``s`` by state; returns the produce time of its
    oldest available item. Without ``seg`` (:func:`_needs_items` said it is not
    needed), every fresh item is available and produced at :func:`_first_born`."""
    oldest: int | None = None
    fresh = sm.count
    for idx, st in obj.items.items():
        if not 0 <= idx < sm.count:
            continue
        fresh -= 1
        item = seg.items[idx] if seg is not None else None
        state, _ = classify(st, now)
        if state == "completed" and item is not None and _redriven(st, item):
            state = "redriven"
        setattr(s, state, getattr(s, state) + 1)
        if state == "available":
            oldest = _older(oldest, _born(sm, item))
    if seg is None:
        s.available += fresh
        return _older(oldest, _first_born(sm)) if fresh else oldest
    for idx, item in enumerate(seg.items[:sm.count]):
        if idx in obj.items:
            continue
        state, _ = _classify(None, sm, item, now)
        setattr(s, state, getattr(s, state) + 1)
        if state == "available":
            oldest = _older(oldest, _born(sm, item))
    return oldest


def _born(sm: SegmentMeta, item: SegmentItem | None) -> int:
    """An item's produce time; without the item, the segment's (no merge)."""
    return (item.born_ms if item is not None else None) or sm.created_ms


def _older(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


#: What browsing calls the live states; the others are gone from the user's view.
_BROWSE_STATES = {"in_flight": "leased", "available": "available",
                  "scheduled": "scheduled", "waiting_retry": "waiting"}


def _browsed(
    sm: SegmentMeta, seg: Segment, obj: LeaseObject, idx: int, now: int
) -> BrowsedItem | None:
    st = obj.items.get(idx)
    item = seg.items[idx]
    state, when = _classify(st, sm, item, now)
    if state not in _BROWSE_STATES:
        return None  # completed or dead-lettered: gone
    return BrowsedItem(
        item_id(sm.id, idx),
        _BROWSE_STATES[state],
        st.attempts if st else 0,
        item.born_ms or sm.created_ms,
        when,
        item.payload,
        item.meta,
        st.err if st else None,
    )
