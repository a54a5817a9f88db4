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

from okq.cell import Cell
from okq.clock import Clock
from okq.errors import CASConflict, PublishAborted, StorageError
from okq.keys import item_id, new_segment_id, segment_key
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


class _Redo(Exception):
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
    ) -> None:
        self.store = store
        self.ns = namespace
        self.queue = queue
        self.manifest = manifest
        self.clock = clock
        self.linger = linger
        self.publish_timeout_ms = publish_timeout_ms
        self.idem_window_ms = idem_window_ms
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
            known = _known_keys(manifest, self.clock.now_ms()) if manifest else {}
            fresh, ids, twins = _dedupe(items, known)
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

        def publish(m: Manifest, now_ms: int) -> None:
            if now_ms > publish_by:
                raise PublishAborted("the produce missed its publish deadline; retry it")
            if meta.created_ms < m.gc_floor_ms:
                raise PublishAborted("the segment fell behind the GC floor; retry the produce")
            if any(k in _known_keys(m, now_ms) for k in keys):
                raise _Redo()
            _prune_idem(m, now_ms)
            for k, iid in keys.items():
                m.idem[k] = [iid, now_ms + self.idem_window_ms]
            m.segments.append(meta)
            m.produced += meta.count

        await self.manifest.update(publish)

    async def publish_written(self, meta: SegmentMeta) -> None:
        """Publish a segment written earlier whose publication is already decided
        (a completion's outputs). Idempotent: a segment published before, or
        recorded within the idempotency window, is not published again."""
        marker = f"seg:{meta.id}"

        def publish(m: Manifest, now_ms: int) -> None:
            if marker in _known_keys(m, now_ms) or any(s.id == meta.id for s in m.segments):
                return
            if meta.created_ms < m.gc_floor_ms:
                raise PublishAborted(f"outputs segment {meta.id} fell behind the GC floor")
            _prune_idem(m, now_ms)
            m.idem[marker] = [meta.id, now_ms + self.idem_window_ms]
            m.segments.append(meta)
            m.produced += meta.count

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


def _known_keys(m: Manifest, now_ms: int) -> dict[str, str]:
    return {k: v[0] for k, v in m.idem.items() if v[1] > now_ms}


def _prune_idem(m: Manifest, now_ms: int) -> None:
    for k in [k for k, v in m.idem.items() if v[1] <= now_ms]:
        del m.idem[k]


def _dedupe(
    items: list[NewItem], known: dict[str, str]
) -> tuple[list[int], list[str | None], dict[int, int]]:
    """Indexes of items to publish, ids already known, and in-batch twins (dup -> first)."""
    fresh: list[int] = []
    ids: list[str | None] = [None] * len(items)
    first: dict[str, int] = {}
    twins: dict[int, int] = {}
    for i, item in enumerate(items):
        if item.key is not None and item.key in known:
            ids[i] = known[item.key]
        elif item.key is not None and item.key in first:
            twins[i] = first[item.key]
        else:
            if item.key is not None:
                first[item.key] = i
            fresh.append(i)
    return fresh, ids, twins
