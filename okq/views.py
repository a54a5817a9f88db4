"""Read-only views: browsing a queue's live items and its stats, read fresh from
the store (one GET per segment: an operator's call, not a hot path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from okq import transitions as tr
from okq.errors import (
    QueueNotFound,
)
from okq.keys import (
    item_id,
    parse_item_id,
)
from okq.model import (
    DONE,
    LEASED,
    OUTPUTS_PENDING,
    ItemState,
    LeaseObject,
    Manifest,
    Segment,
    SegmentItem,
    SegmentMeta,
    dead_letter_source,
    fresh_due_ms,
    fresh_ready_ms,
)

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
        """A queue's items counted by state (``dead`` left at 0)."""
        now = self.rt.clock.now_ms()
        s = QueueStats(q.name, segments=len(m.segments))
        oldest: int | None = None
        for sm in m.segments:
            obj, seg = await self._read(q, sm)
            for idx in range(sm.count):
                st = obj.items.get(idx)
                state, _ = _classify(st, sm, seg.items[idx], now)
                if state == "completed" and _redriven(st, seg.items[idx]):
                    state = "redriven"
                setattr(s, state, getattr(s, state) + 1)
                if state == "available":
                    born = seg.items[idx].born_ms or sm.created_ms
                    oldest = born if oldest is None else min(oldest, born)
        s.oldest_age_s = 0.0 if oldest is None else max(0, now - oldest) / 1000
        return s

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
    ready = tr.ready_at(st, fresh_ready_ms(sm, item))
    if st is not None and st.s == LEASED and st.t > now:
        return "in_flight", st.t
    if ready is not None:
        if ready <= now or (st is None and fresh_due_ms(sm, item) <= now):
            return "available", ready
        return ("scheduled" if st is None else "waiting_retry"), ready
    if st is not None and st.s in (DONE, OUTPUTS_PENDING):
        return "completed", None
    return "dead_lettered", None


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
