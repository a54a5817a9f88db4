"""Group commit for produce: many produce calls, one segment, one manifest CAS.

Produce calls on one engine and queue are gathered for ``linger`` seconds (and
while the previous publish is in flight) into one segment. The segment is
written create-only under a fresh id, then published by one manifest CAS; every
call waits for that CAS. A crash between the two leaves an unreferenced
segment that nobody reads and the garbage collector removes.

Publish deadline: a segment records ``publish_by``; the manifest change refuses
to publish it after that time, or when the manifest's ``gc_floor`` has passed
its creation time (a collector may already consider it an orphan). Either way
the produce fails with PublishAborted and nothing is visible.

Producer idempotency: an item with a ``key`` is recorded in the manifest's
``idem`` map for the queue's idempotency window; a later produce with the same
key returns the first item's id instead of publishing again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from okq.cell import Cell, Unchanged
from okq.clock import MAX_CLOCK_SKEW_MS, Clock
from okq.errors import (
    CASConflict,
    ObjectNotFound,
    OkqError,
    OutcomeUnknown,
    Overloaded,
    PublishAborted,
    StorageError,
)
from okq.keys import item_id, lease_key, new_segment_id, segment_key
from okq.model import Manifest, Segment, SegmentItem, SegmentMeta, encode_segment
from okq.store.base import Store


@dataclass(slots=True)
class NewItem:
    payload: bytes
    enqueue_at_ms: int | None = None
    key: str | None = None  # producer idempotency key
    meta: dict[str, Any] | None = None


@dataclass
class _Request:
    items: list[NewItem]
    fut: asyncio.Future[list[str]]
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = sum(len(i.payload) for i in self.items)


class _Redo(OkqError):
    """Keys published elsewhere since the segment was cut: cut it again."""


class Publisher:
    def __init__(
        self,
        store: Store,
        namespace: str,
        queue: str,
        manifest: Cell[Manifest],
        clock: Clock,
        *,
        linger: float,
        publish_timeout_ms: int,
        idem_window_ms: int,
        max_segment_items: int,
        max_segment_bytes: int,
        max_idem_keys: int = 10_000,
        max_clock_skew_ms: int = MAX_CLOCK_SKEW_MS,
    ) -> None:
        self.store = store
        self.ns = namespace
        self.queue = queue
        self.manifest = manifest
        self.clock = clock
        self.linger = linger
        self.publish_timeout_ms = publish_timeout_ms
        self.idem_window_ms = idem_window_ms
        # Keys are kept for the window plus twice the skew bound, so that the
        # window holds for a reader whose clock is ahead of the writer's.
        self.idem_keep_ms = idem_window_ms + 2 * max_clock_skew_ms
        self.max_idem_keys = max_idem_keys
        self.max_items = max_segment_items
        self.max_bytes = max_segment_bytes
        self._pending: list[_Request] = []
        self._task: asyncio.Task[None] | None = None
        self.segments_written = 0

    def pending_items(self) -> int:
        return sum(len(r.items) for r in self._pending)

    async def produce(self, items: list[NewItem]) -> list[str]:
        fut: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(items, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"publish {self.queue}")
        return await fut

    async def _run(self) -> None:
        while self._pending:
            if self.linger:
                await asyncio.sleep(self.linger)
            batch = self._take()
            try:
                ids = await self._publish([i for r in batch for i in r.items])
            except BaseException as exc:
                for r in batch:
                    if not r.fut.done():
                        r.fut.set_exception(exc)
                if not isinstance(exc, Exception):
                    for r in self._pending:
                        r.fut.set_exception(exc)
                    self._pending = []
                    return
                continue
            pos = 0
            for r in batch:
                if not r.fut.done():
                    r.fut.set_result(ids[pos : pos + len(r.items)])
                pos += len(r.items)

    def _take(self) -> list[_Request]:
        batch: list[_Request] = []
        items = size = 0
        while self._pending:
            r = self._pending[0]
            if batch and (items + len(r.items) > self.max_items or size + r.size > self.max_bytes):
                break
            batch.append(self._pending.pop(0))
            items += len(r.items)
            size += r.size
        return batch

    async def _publish(self, items: list[NewItem]) -> list[str]:
        for _ in range(5):
            manifest = await self.manifest.read(max_age_ms=60_000)
            if manifest is None:
                await self.manifest.refresh()
                manifest = self.manifest.cached()
            fresh, ids, twins = _dedupe(items, manifest, self.clock.now_ms())
            try:
                if fresh:
                    await self._publish_segment(items, fresh, ids)
            except _Redo:
                self.manifest.forget()
                continue
            for dup, first in twins.items():
                ids[dup] = ids[first]
            return [i or "" for i in ids]
        raise PublishAborted("idempotency keys kept changing under this produce; retry it")

    async def write_segment(self, items: list[NewItem]) -> SegmentMeta:
        """Write a segment of ``items``, create-only; it is invisible until published."""
        now = self.clock.now_ms()
        seg_id = new_segment_id(now)
        segment = Segment(
            seg_id,
            self.queue,
            now,
            now + self.publish_timeout_ms,
            [SegmentItem(i.payload, i.enqueue_at_ms, i.meta) for i in items],
        )
        data = encode_segment(segment)
        await self._write_segment(segment_key(self.ns, self.queue, seg_id), data)
        self.segments_written += 1
        return SegmentMeta(seg_id, len(items), now, len(data))

    async def _publish_segment(
        self, items: list[NewItem], fresh: list[int], ids: list[str | None]
    ) -> None:
        """Write one segment of the ``fresh`` items and publish it; fills in ``ids``."""
        meta = await self.write_segment([items[i] for i in fresh])
        publish_by = meta.created_ms + self.publish_timeout_ms
        for n, i in enumerate(fresh):
            ids[i] = item_id(meta.id, n)
        keys: dict[str, str] = {}
        for i in fresh:
            k, iid = items[i].key, ids[i]
            if k is not None and iid is not None:
                keys[k] = iid

        ambiguous = self.manifest.ambiguous
        tried = False  # whether a write carrying this publish was attempted

        def publish(m: Manifest, now_ms: int) -> Unchanged | None:
            nonlocal tried
            if meta.id in m.purged or any(s.id == meta.id for s in m.segments):
                # An earlier, ambiguous write of this very change landed (whoever
                # wrote since): published once. A compactor never folds or merges
                # a segment before its publish deadline has passed on every clock
                # (docs/DESIGN.md, "Ambiguous writes"), so within the deadline
                # "not listed" means "not published".
                return Unchanged()
            if now_ms > publish_by:
                if tried and self.manifest.ambiguous != ambiguous:
                    raise OutcomeUnknown(
                        "the store failed while publishing and the publish deadline "
                        "passed before okq could confirm it: the items may or may not "
                        "be in the queue (produce with idempotency keys to retry safely)"
                    )
                raise PublishAborted("the produce missed its publish deadline; retry it")
            if meta.created_ms < m.gc_floor_ms:
                raise PublishAborted("the segment fell behind the GC floor; retry the produce")
            if any(_live_key(m, k, now_ms) for k in keys):
                raise _Redo("idempotency keys were published meanwhile")
            _prune_idem(m, now_ms)
            self._check_room(m, len(keys))
            expires = now_ms + self.idem_keep_ms
            for k, iid in keys.items():
                m.idem[k] = [iid, expires]
            m.segments.append(meta)
            m.produced += meta.count
            tried = True
            return None

        await self.manifest.update(publish)

    def _check_room(self, m: Manifest, adding: int) -> None:
        """Refuse keyed produces that would grow the idempotency map past its
        bound: it rides in the manifest, rewritten by every publish."""
        if adding and len(m.idem) + adding > self.max_idem_keys:
            raise Overloaded(
                f"queue {self.queue!r} holds {len(m.idem)} idempotency keys, its limit is "
                f"{self.max_idem_keys}; keyed produces wait until older keys expire",
                retry_after=5.0,
            )

    async def publish_written(self, meta: SegmentMeta) -> None:
        """Publish a segment written earlier whose publication is already decided
        (a completion's outputs). Idempotent however late it comes: a segment is
        published once if it is listed, recorded by its marker, or has a lease
        object (its items were leased or sealed, so it was published and a
        compactor has since folded or merged it away)."""
        marker = f"seg:{meta.id}"
        if self.clock.now_ms() - meta.created_ms > self.publish_timeout_ms:
            # Late: the marker may have expired and a compactor may have folded
            # or merged the segment away (it never does so sooner than this).
            try:
                await self.store.head(lease_key(self.ns, self.queue, meta.id))
            except ObjectNotFound:
                pass
            else:
                return  # published earlier, and compacted away since

        def publish(m: Manifest, now_ms: int) -> Unchanged | None:
            if (_live_key(m, marker, now_ms) or meta.id in m.purged
                    or any(s.id == meta.id for s in m.segments)):
                return Unchanged()
            if meta.created_ms < m.gc_floor_ms:
                raise PublishAborted(f"outputs segment {meta.id} fell behind the GC floor")
            _prune_idem(m, now_ms)
            m.idem[marker] = [meta.id, now_ms + self.idem_keep_ms]
            m.segments.append(meta)
            m.produced += meta.count
            return None

        await self.manifest.update(publish)

    async def _write_segment(self, key: str, data: bytes) -> None:
        """Create-only write; an ambiguous failure is resolved by writing again."""
        for attempt in range(4):
            try:
                await self.store.put(key, data, if_none_match=True)
                return
            except CASConflict:
                if attempt == 0:  # a fresh random id cannot exist yet
                    raise StorageError(f"new segment {key!r} already exists") from None
                return  # our earlier, ambiguous attempt landed
            except StorageError:
                if attempt == 3:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)


def _live_key(m: Manifest, key: str, now_ms: int) -> bool:
    entry = m.idem.get(key)
    return entry is not None and entry[1] > now_ms


def _prune_idem(m: Manifest, now_ms: int) -> None:
    """Drop expired keys from the front of the map (keys are appended in roughly
    expiry order), so a publish costs O(expired), not O(map). A key left behind
    an unexpired one is dropped later; expired keys never count as live."""
    expired = []
    for k, v in m.idem.items():
        if v[1] > now_ms:
            break
        expired.append(k)
    for k in expired:
        del m.idem[k]


def _dedupe(
    items: list[NewItem], m: Manifest | None, now_ms: int
) -> tuple[list[int], list[str | None], dict[int, int]]:
    """Indexes of items to publish, ids already known, and in-batch twins (dup -> first)."""
    fresh: list[int] = []
    ids: list[str | None] = [None] * len(items)
    first: dict[str, int] = {}
    twins: dict[int, int] = {}
    for i, item in enumerate(items):
        if item.key is not None and m is not None and _live_key(m, item.key, now_ms):
            ids[i] = m.idem[item.key][0]
        elif item.key is not None and item.key in first:
            twins[i] = first[item.key]
        else:
            if item.key is not None:
                first[item.key] = i
            fresh.append(i)
    return fresh, ids, twins
