"""The queue engine: okq's public library API, with no HTTP.

An :class:`Engine` serves any number of queues in one namespace of one store.
Any number of engines, in any number of processes, may share a store: every
change is a compare-and-swap on the object that owns it, so the bucket stays
the only source of truth. See docs/DESIGN.md for the object layout, every state
transition and the failure analysis.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from okq import transitions as tr
from okq.cell import Cell, Unchanged
from okq.clock import Clock, SystemClock
from okq.errors import (
    CASConflict,
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    ObjectNotFound,
    OkqError,
    PublishAborted,
    QueueExists,
    QueueNotFound,
    TooLarge,
)
from okq.keys import (
    check_name,
    item_id,
    lease_key,
    manifest_key,
    manifests_prefix,
    parse_item_id,
    segment_key,
)
from okq.model import (
    DEAD_PENDING,
    DONE,
    LEASED,
    OUTPUTS_PENDING,
    ItemState,
    LeaseObject,
    Manifest,
    QueueConfig,
    Segment,
    SegmentMeta,
    decode_lease,
    decode_manifest,
    decode_segment,
    encode_lease,
    encode_manifest,
    fresh_ready_ms,
    new_nonce,
)
from okq.publisher import NewItem, Publisher
from okq.store.base import Store, list_all
from okq.store.selfcheck import check_conditional_writes
from okq.tokens import Delivery, TokenSigner

log = logging.getLogger("okq.engine")

MAX_TIME_MS = 221_845_392_000_000  # 9000-01-01: far enough, and every time renders


@dataclass
class EngineOptions:
    """Tunables. Times in seconds, sizes in bytes."""

    linger: float = 0.005  # produce group-commit window
    publish_timeout: float = 60.0  # a segment must be published within this
    idem_window: float = 300.0  # how long producer idempotency keys are kept
    max_segment_items: int = 10_000
    max_segment_bytes: int = 16 << 20
    max_item_bytes: int = 1 << 20
    max_batch: int = 1000
    max_wait: float = 900.0  # longest long poll
    manifest_max_age: float = 0.2  # lease path: manifest staleness allowed
    config_max_age: float = 30.0  # renew/retry: queue config staleness allowed
    lease_state_max_age: float = 1.0  # re-read lease objects with leases this often
    poll_interval: float = 0.25  # long poll: how often to look at the store
    dead_grace: float = 10.0  # help a stalled dead-letter move after this
    contention_backoff: float = 1.0  # avoid a segment this long after losing a race
    segment_cache_bytes: int = 64 << 20


@dataclass
class LeasedItem:
    id: str
    queue: str
    token: str
    attempts: int
    lease_deadline_ms: int
    payload: bytes
    produced_ms: int
    enqueue_at_ms: int | None = None
    meta: dict[str, Any] | None = None


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
class QueueInfo:
    name: str
    config: QueueConfig
    created_ms: int
    segments: int
    produced: int


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
    segments: int = 0
    oldest_age_s: float = 0.0


@dataclass
class _Summary:
    """What a lease object says about its segment, derived once per version."""

    ready: list[tuple[int, int]]  # (ready_ms, index) of items that can be leased
    inflight: bool
    stalled: list[tuple[int, int]]  # (since_ms, index) in DEAD_PENDING or OUTPUTS_PENDING


@dataclass
class _Queue:
    name: str
    manifest: Cell[Manifest]
    publisher: Publisher
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    leases: dict[str, Cell[LeaseObject]] = field(default_factory=dict)
    summaries: dict[str, tuple[bytes | None, _Summary]] = field(default_factory=dict)
    seen_ver: int = -1


class Engine:
    def __init__(
        self,
        store: Store,
        signer: TokenSigner,
        *,
        namespace: str = "default",
        clock: Clock | None = None,
        options: EngineOptions | None = None,
    ) -> None:
        self.store = store
        self.signer = signer
        self.ns = check_name(namespace, "namespace")
        self.clock = clock or SystemClock()
        self.opts = options or EngineOptions()
        self._queues: dict[str, _Queue] = {}
        self._segments: OrderedDict[str, Segment] = OrderedDict()
        self._segment_bytes = 0
        self._sizes: dict[str, int] = {}
        self._stopping = False
        self.cas_conflicts = 0  # lost CAS races, for metrics

    # -- life cycle --------------------------------------------------------
    async def start(self, *, self_check: bool = True) -> Engine:
        if self_check:
            await check_conditional_writes(self.store)
        return self

    def stop_waiting(self) -> None:
        """Make long polls return now (with what they have): the node is stopping."""
        self._stopping = True
        for q in self._queues.values():
            q.wake.set()

    async def close(self) -> None:
        """Flush pending produce batches and writes; the store stays open."""
        for q in list(self._queues.values()):
            await q.publisher.close()
            await q.manifest.close()
            for cell in q.leases.values():
                await cell.close()

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- runtime objects -----------------------------------------------------
    def _q(self, name: str, field_name: str = "queue") -> _Queue:
        q = self._queues.get(name)
        if q is not None:
            return q
        check_name(name, field_name)
        cell: Cell[Manifest] = Cell(
            self.store, manifest_key(self.ns, name), self.clock, encode_manifest, decode_manifest,
            on_conflict=self._conflict,
        )
        o = self.opts
        pub = Publisher(
            self.store,
            self.ns,
            name,
            cell,
            self.clock,
            linger=o.linger,
            publish_timeout_ms=int(o.publish_timeout * 1000),
            idem_window_ms=int(o.idem_window * 1000),
            max_segment_items=o.max_segment_items,
            max_segment_bytes=o.max_segment_bytes,
        )
        q = self._queues[name] = _Queue(name, cell, pub)
        return q

    def _conflict(self) -> None:
        self.cas_conflicts += 1

    def _lease_cell(self, q: _Queue, segment: str) -> Cell[LeaseObject]:
        cell = q.leases.get(segment)
        if cell is None:
            cell = q.leases[segment] = Cell(
                self.store,
                lease_key(self.ns, q.name, segment),
                self.clock,
                encode_lease,
                decode_lease,
                initial=lambda: LeaseObject(segment),
                on_conflict=self._conflict,
            )
        return cell

    async def _manifest(self, q: _Queue, max_age: float) -> Manifest:
        m = await q.manifest.read(int(max_age * 1000))
        if m is None:
            if not q.publisher.pending_items() and self._queues.get(q.name) is q:
                del self._queues[q.name]  # do not keep runtimes of unknown queues
            raise QueueNotFound(f"queue {q.name!r} does not exist", queue=q.name)
        return m

    async def _segment(self, q: _Queue, sm: SegmentMeta) -> Segment:
        seg = self._segments.get(sm.id)
        if seg is not None:
            self._segments.move_to_end(sm.id)
            return seg
        blob = await self.store.get(segment_key(self.ns, q.name, sm.id))
        seg = decode_segment(blob.data)
        self._segments[sm.id] = seg
        self._sizes[sm.id] = len(blob.data)
        self._segment_bytes += len(blob.data)
        while self._segment_bytes > self.opts.segment_cache_bytes and len(self._segments) > 1:
            old, _ = self._segments.popitem(last=False)
            self._segment_bytes -= self._sizes.pop(old)
        return seg

    # -- queues --------------------------------------------------------------
    async def create_queue(self, name: str, config: QueueConfig | None = None) -> QueueInfo:
        q = self._q(name)
        config = config or QueueConfig()
        self._check_dead_queue(name, config)
        m = Manifest(name, self.clock.now_ms(), config, ver=1, nonce=new_nonce())
        try:
            await self.store.put(q.manifest.key, encode_manifest(m), if_none_match=True)
        except CASConflict:
            raise QueueExists(f"queue {name!r} already exists", queue=name) from None
        q.manifest.forget()
        return self._info(m)

    async def get_queue(self, name: str) -> QueueInfo:
        return self._info(await self._manifest(self._q(name), 0))

    async def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        q = self._q(name)
        await self._manifest(q, 0)

        def change(m: Manifest, now: int) -> Manifest:
            try:
                m.config = QueueConfig.model_validate({**m.config.model_dump(), **changes})
            except ValidationError as exc:
                raise _invalid(exc) from None
            self._check_dead_queue(name, m.config)
            return m

        m: Manifest = await q.manifest.update(change)
        return self._info(m)

    async def delete_queue(self, name: str) -> None:
        """Delete the manifest; the compactor collects the queue's objects."""
        q = self._q(name)
        await self._manifest(q, 0)
        await self.store.delete(q.manifest.key)
        self._queues.pop(name, None)

    async def list_queues(self) -> list[str]:
        prefix = manifests_prefix(self.ns)
        return [info.key[len(prefix) :] async for info in list_all(self.store, prefix)]

    @staticmethod
    def _check_dead_queue(name: str, config: QueueConfig) -> None:
        if config.dead_queue == name:
            raise InvalidRequest("dead_queue cannot be the queue itself", field="dead_queue")

    @staticmethod
    def _info(m: Manifest) -> QueueInfo:
        return QueueInfo(m.queue, m.config, m.created_ms, len(m.segments), m.produced)

    # -- produce -------------------------------------------------------------
    async def produce(self, queue: str, items: Sequence[NewItem | bytes]) -> list[str]:
        """Publish items; returns their ids once the manifest CAS has landed."""
        batch = self._new_items(items, "items")
        q = self._q(queue)
        await self._manifest(q, 60)  # a missing queue fails before a segment is written
        try:
            ids = await q.publisher.produce(batch)
        except Exception as exc:
            if _missing(exc):
                raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue) from exc
            raise
        q.wake.set()
        return ids

    def _new_items(self, items: Sequence[NewItem | bytes], field_name: str) -> list[NewItem]:
        """The items of a produce, checked against the limits."""
        batch = [i if isinstance(i, NewItem) else NewItem(i) for i in items]
        self._check_batch(len(batch), field_name)
        for n, item in enumerate(batch):
            if len(item.payload) > self.opts.max_item_bytes:
                raise TooLarge(
                    f"{field_name}[{n}] is {len(item.payload)} bytes; the limit is "
                    f"{self.opts.max_item_bytes}",
                    field=f"{field_name}[{n}]",
                )
            if item.enqueue_at_ms is not None and not 0 <= item.enqueue_at_ms <= MAX_TIME_MS:
                raise InvalidRequest(f"{field_name}[{n}].enqueue_at is out of range",
                                     field=f"{field_name}[{n}].enqueue_at")
        return batch

    def _check_batch(self, n: int, field_name: str) -> None:
        if n < 1 or n > self.opts.max_batch:
            raise InvalidRequest(
                f"{field_name} must hold 1 to {self.opts.max_batch} entries; got {n}",
                field=field_name,
            )

    # -- lease ---------------------------------------------------------------
    async def lease(
        self,
        queue: str,
        batch: int = 1,
        *,
        lease_timeout: float | None = None,
        wait: float = 0.0,
    ) -> list[LeasedItem]:
        """Lease up to ``batch`` ready items, waiting up to ``wait`` seconds for some."""
        self._check_batch(batch, "batch_size")
        if lease_timeout is not None and not 0.1 <= lease_timeout <= 43_200:
            raise InvalidRequest("lease_timeout must be 0.1 to 43200 seconds",
                                 field="lease_timeout")
        if not 0 <= wait <= self.opts.max_wait:
            raise InvalidRequest(f"request_timeout must be 0 to {self.opts.max_wait} seconds",
                                 field="request_timeout")
        q = self._q(queue)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait
        while True:
            q.wake.clear()
            items, next_ready = await self._lease_once(q, batch, lease_timeout)
            left = give_up - loop.time()
            if items or left <= 0 or self._stopping:
                return items
            pause = min(left, self.opts.poll_interval)
            if next_ready is not None:
                pause = min(pause, max(0.0, (next_ready - self.clock.now_ms()) / 1000))
            try:
                await asyncio.wait_for(q.wake.wait(), pause)
            except TimeoutError:
                pass

    async def _lease_once(
        self, q: _Queue, n: int, lease_timeout: float | None
    ) -> tuple[list[LeasedItem], int | None]:
        async with q.lock:
            m = await self._manifest(q, self.opts.manifest_max_age)
            cfg = m.config
            lease_ms = int(lease_timeout * 1000) if lease_timeout else cfg.lease_ms
            out: list[LeasedItem] = []
            next_ready: int | None = None
            metas = {sm.id: sm for sm in m.segments}
            idle = 0
            # Passes until the batch is full. A pass can fall short: items lost to
            # another engine, or out of attempts and dead-lettered instead. Stop
            # after three passes in a row that changed nothing.
            while len(out) < n and idle < 3:
                picks, next_ready = await self._pick(q, m, n - len(out))
                if not picks:
                    break
                groups: dict[str, list[tuple[int, int]]] = {}
                for _, sid, idx, fresh_ready in picks:
                    groups.setdefault(sid, []).append((idx, fresh_ready))
                results = await asyncio.gather(
                    *(self._lease_in(q, cfg, metas[s], w, lease_ms) for s, w in groups.items())
                )
                progress = 0
                for items, dead in results:
                    out.extend(items)
                    progress += len(items) + dead
                idle = 0 if progress else idle + 1
            return out, next_ready

    async def _pick(
        self, q: _Queue, m: Manifest, n: int
    ) -> tuple[list[tuple[int, str, int, int]], int | None]:
        """Choose up to n ready items, oldest ready time first.

        Returns (sort key, segment, index, fresh ready time) and the earliest
        future ready time seen, for the long poll.
        """
        now = self.clock.now_ms()
        if q.seen_ver != m.ver:  # forget state of segments the manifest dropped
            live = {sm.id for sm in m.segments}
            for sid in [sid for sid in q.leases if sid not in live]:
                q.leases.pop(sid)
                q.summaries.pop(sid, None)
            q.seen_ver = m.ver
        backoff = int(self.opts.contention_backoff * 1000)
        cands: list[tuple[int, str, int, int]] = []
        next_ready: int | None = None
        for sm in _scan_order(m):
            if len(cands) >= n:
                cands.sort()
                if cands[n - 1][0] <= sm.first_ready_ms:
                    break  # every item further on becomes ready later than these
            cell = self._lease_cell(q, sm.id)
            try:
                summary = await self._summary(q, sm, cell, now)
            except ObjectNotFound:  # removed by a compactor since this manifest was read
                q.manifest.forget()
                continue
            penalty = backoff if now - cell.conflict_ms < backoff else 0
            for ready, idx in summary.ready:
                if ready > now:
                    next_ready = ready if next_ready is None else min(next_ready, ready)
                    break
                cands.append((ready + penalty, sm.id, idx, self._fresh_ready(sm, idx)))
            for since, idx in summary.stalled:
                if now - since > self.opts.dead_grace * 1000:
                    await self._help_stalled(q, m.config, sm, idx)
        cands.sort()
        return cands[:n], next_ready

    def _fresh_ready(self, sm: SegmentMeta, idx: int) -> int:
        seg = self._segments.get(sm.id)
        return fresh_ready_ms(sm, seg.items[idx]) if seg is not None else sm.first_ready_ms

    async def _summary(self, q: _Queue, sm: SegmentMeta, cell: Cell[LeaseObject],
                       now: int) -> _Summary:
        cached = q.summaries.get(sm.id)
        stale = cell.fetched_ms is None or (
            cached is not None
            and cached[1].inflight
            and now - cell.fetched_ms > self.opts.lease_state_max_age * 1000
        )
        if stale:
            await cell.refresh()
        if cached is not None and cached[0] is cell.data and not stale:
            return cached[1]
        obj = cell.cached() or LeaseObject(sm.id)
        # Only fresh items need the segment (for their enqueue time).
        seg = await self._segment(q, sm) if len(obj.items) < sm.count else None
        summary = _summarise(sm, seg, obj)
        q.summaries[sm.id] = (cell.data, summary)
        return summary

    async def _lease_in(
        self,
        q: _Queue,
        cfg: QueueConfig,
        sm: SegmentMeta,
        wanted: list[tuple[int, int]],
        lease_ms: int,
    ) -> tuple[list[LeasedItem], int]:
        """Lease what is still available of ``wanted``; returns the items and how
        many were dead-lettered instead (out of attempts)."""
        cell = self._lease_cell(q, sm.id)

        def lease(obj: LeaseObject, now: int) -> object:
            result = tr.lease(obj, wanted, now, lease_ms, cfg.max_attempts)
            return result if result[0] or result[1] else Unchanged(result)

        leased, dead = await cell.update(lease)
        seg = await self._segment(q, sm)
        for idx in dead:
            await self._help_dead(q, cfg, sm, idx)
        return [self._leased_item(q.name, sm, seg, x) for x in leased], len(dead)

    def _leased_item(self, queue: str, sm: SegmentMeta, seg: Segment, x: tr.Leased) -> LeasedItem:
        item = seg.items[x.index]
        token = self.signer.sign(Delivery(self.ns, queue, sm.id, x.index, x.v))
        return LeasedItem(
            id=item_id(sm.id, x.index),
            queue=queue,
            token=token,
            attempts=x.attempts,
            lease_deadline_ms=x.deadline_ms,
            payload=item.payload,
            produced_ms=item.born_ms or sm.created_ms,
            enqueue_at_ms=item.enqueue_at_ms,
            meta=item.meta,
        )

    # -- dead letters ----------------------------------------------------------
    async def _help_dead(self, q: _Queue, cfg: QueueConfig, sm: SegmentMeta, idx: int) -> None:
        """Finish moving a DEAD_PENDING item: produce it to the dead-letter queue
        (idempotently, keyed by its delivery), then mark it DEAD."""
        cell = self._lease_cell(q, sm.id)
        obj = cell.cached()
        st = obj.items.get(idx) if obj else None
        if st is None or st.s != DEAD_PENDING:
            return
        seg = await self._segment(q, sm)
        iid = item_id(sm.id, idx)
        if cfg.dead_queue:
            meta = {
                "source_queue": q.name,
                "source_id": iid,
                "attempts": st.attempts,
                "error": st.err,
            }
            key = f"dlq:{self.ns}:{q.name}:{iid}:{st.v}"
            try:
                await self.produce(
                    cfg.dead_queue, [NewItem(seg.items[idx].payload, None, key, meta)]
                )
            except OkqError as exc:
                log.error("cannot dead-letter %s of %s into %s: %s",
                          iid, q.name, cfg.dead_queue, exc)
                return
        v = st.v
        await cell.update(lambda o, now: tr.finish_dead(o, idx, v))

    async def _help_stalled(self, q: _Queue, cfg: QueueConfig, sm: SegmentMeta,
                            idx: int) -> None:
        """Finish what a crashed node left half done on an item."""
        obj = self._lease_cell(q, sm.id).cached()
        st = obj.items.get(idx) if obj else None
        if st is not None and st.s == DEAD_PENDING:
            await self._help_dead(q, cfg, sm, idx)
        elif st is not None and st.s == OUTPUTS_PENDING and st.out is not None:
            await self._finish_outputs(q, sm.id, idx, st.v, st.out)

    async def _finish_outputs(self, q: _Queue, segment: str, idx: int, v: int,
                              out: list[Any]) -> None:
        """Publish a completion's outputs segment, then mark the item DONE."""
        outq = self._q(out[0])
        try:
            await outq.publisher.publish_written(SegmentMeta(*out[1:]))
        except (QueueNotFound, ObjectNotFound, PublishAborted) as exc:
            log.error("cannot publish outputs of %s to %s: %s",
                      item_id(segment, idx), out[0], exc)
            return
        outq.wake.set()
        await self._lease_cell(q, segment).update(
            lambda o, now: tr.finish_outputs(o, idx, v)
        )

    async def complete_and_produce(
        self, token: str, out_queue: str, items: Sequence[NewItem | bytes], *,
        queue: str | None = None,
    ) -> list[str]:
        """Complete one delivery and produce ``items`` to ``out_queue`` in one step:
        the outputs become visible if and only if the completion commits.

        The outputs are written first as an unpublished segment; the completion
        CAS records it in the item's tombstone (state P); then it is published and
        the item becomes D. A crash after the completion is finished by any node
        or compactor that walks past the P item. Returns the outputs' ids; a
        retried call returns the ids of the first one's outputs.
        """
        d, q = self._delivery(token, queue=queue)
        batch = self._new_items(items, "outputs.items")
        outq = self._q(out_queue, "outputs.queue_name")
        await self._manifest(outq, 60)
        sm = await outq.publisher.write_segment(batch)
        out = [out_queue, sm.id, sm.count, sm.created_ms, sm.size]
        cell = self._lease_cell(q, d.segment)
        recorded: list[Any] | None = await cell.update(
            lambda o, now: tr.complete(o, d.index, d.v, now, out)
        )
        if recorded is None:
            return []  # completed earlier without outputs
        await self._finish_outputs(q, d.segment, d.index, d.v, recorded)
        return [item_id(recorded[1], n) for n in range(recorded[2])]

    # -- token operations ------------------------------------------------------
    def _delivery(
        self, token: str, field_name: str = "token", queue: str | None = None
    ) -> tuple[Delivery, _Queue]:
        if not isinstance(token, str):
            raise InvalidRequest(f"{field_name} must be a string", field=field_name)
        d = self.signer.verify(token, self.ns, field_name)
        if queue is not None and d.queue != queue:
            raise InvalidToken(
                f"{field_name} belongs to queue {d.queue!r}, not {queue!r}", field=field_name
            )
        return d, self._q(d.queue)

    def pending_produce(self, queue: str) -> int:
        """Items waiting in this engine to be published to ``queue``."""
        q = self._queues.get(queue)
        return q.publisher.pending_items() if q is not None else 0

    def check_tokens(self, tokens: Sequence[str], queue: str, field_pattern: str) -> None:
        """Verify every token before acting on any (``field_pattern`` has ``{n}``)."""
        for n, token in enumerate(tokens):
            self._delivery(token, field_pattern.format(n=n), queue)

    async def renew(
        self, token: str, lease_timeout: float | None = None, *, queue: str | None = None
    ) -> int:
        """Extend a lease from now; returns the new deadline (ms)."""
        d, q = self._delivery(token, queue=queue)
        if lease_timeout is not None and not 0.1 <= lease_timeout <= 43_200:
            raise InvalidRequest("lease_timeout must be 0.1 to 43200 seconds",
                                 field="lease_timeout")
        lease_ms = (
            int(lease_timeout * 1000)
            if lease_timeout
            else (await self._manifest(q, self.opts.config_max_age)).config.lease_ms
        )
        cell = self._lease_cell(q, d.segment)
        deadline: int = await cell.update(
            lambda o, now: tr.renew(o, d.index, d.v, now, lease_ms)
        )
        return deadline

    async def complete(self, tokens: Sequence[str], *, queue: str | None = None) -> None:
        """Complete deliveries. Each token is applied on its own; if any lease was
        lost, LeaseLost is raised after the others landed, naming the failures."""
        self._check_batch(len(tokens), "tokens")
        parsed = [self._delivery(t, f"tokens[{n}]", queue) for n, t in enumerate(tokens)]
        calls = [self._lease_cell(q, d.segment).update(_completion(d)) for d, q in parsed]
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed: list[dict[str, Any]] = []
        for n, ((d, _), r) in enumerate(zip(parsed, results, strict=True)):
            if isinstance(r, LeaseLost):
                failed.append({"index": n, "id": item_id(d.segment, d.index), "reason": r.message})
            elif isinstance(r, BaseException):
                raise r
        if failed:
            raise LeaseLost(
                f"{len(failed)} of {len(tokens)} completions refused: the lease was lost",
                failed=failed,
            )

    async def retry(
        self,
        token: str,
        *,
        retry_at_ms: int | None = None,
        dead: bool = False,
        error: str | None = None,
        queue: str | None = None,
        field_name: str = "token",
        count_attempt: bool = True,
    ) -> None:
        """Release a delivery: ready again at ``retry_at`` (now by default), at the
        back of the line; or dead-lettered when ``dead`` or out of attempts."""
        d, q = self._delivery(token, field_name, queue)
        if retry_at_ms is not None and not 0 <= retry_at_ms <= MAX_TIME_MS:
            raise InvalidRequest("retry_at is out of range", field="retry_at")
        m = await self._manifest(q, self.opts.config_max_age)
        cfg = m.config
        err = error[:4096] if error else None
        cell = self._lease_cell(q, d.segment)
        to_dead: bool = await cell.update(
            lambda o, now: tr.retry(o, d.index, d.v, now, retry_at_ms, dead, err,
                                    cfg.max_attempts, count_attempt)
        )
        if to_dead:
            sm = next((s for s in m.segments if s.id == d.segment), None)
            if sm is None:
                m = await self._manifest(q, 0)
                sm = next((s for s in m.segments if s.id == d.segment), None)
            if sm is not None:
                await self._help_dead(q, cfg, sm, d.index)
        q.wake.set()

    # -- for the compactor, which shares this engine's cells and caches -----------
    def manifest_cell(self, queue: str) -> Cell[Manifest]:
        return self._q(queue).manifest

    def lease_cell(self, queue: str, segment: str) -> Cell[LeaseObject]:
        return self._lease_cell(self._q(queue), segment)

    async def segment(self, queue: str, sm: SegmentMeta) -> Segment:
        return await self._segment(self._q(queue), sm)

    async def help_stalled(self, queue: str, config: QueueConfig, sm: SegmentMeta,
                           index: int) -> None:
        """Finish an item's half-done step: a dead-letter move (X -> Z) or the
        publication of a completion's outputs (P -> D)."""
        await self._help_stalled(self._q(queue), config, sm, index)

    def forget_segments(self, queue: str, segments: Sequence[str]) -> None:
        """Drop cached state of segments no longer in the manifest."""
        q = self._q(queue)
        for sid in segments:
            q.leases.pop(sid, None)
            q.summaries.pop(sid, None)
            if sid in self._segments:
                del self._segments[sid]
                self._segment_bytes -= self._sizes.pop(sid)

    # -- purge, browse, redrive ---------------------------------------------------
    async def purge(self, queue: str) -> None:
        """Drop every item: the manifest stops referencing the queue's segments, so
        nothing in them is leased again (the compactor deletes them). A late
        completion or renewal of an item leased before the purge still lands on its
        lease object and changes nothing visible."""
        q = self._q(queue)
        await self._manifest(q, 0)

        def purge(m: Manifest, now: int) -> None:
            m.segments = []

        await q.manifest.update(purge)
        q.summaries.clear()

    async def browse(
        self, queue: str, *, start_after: str | None = None, limit: int = 100
    ) -> tuple[list[BrowsedItem], str | None]:
        """Live items in delivery-log order, without leasing them."""
        q = self._q(queue)
        m = await self._manifest(q, 0)
        after = parse_item_id(start_after, "start_after") if start_after else None
        now = self.clock.now_ms()
        out: list[BrowsedItem] = []
        for sm in m.segments:
            if after is not None and sm.id < after[0]:
                continue
            cell = self._lease_cell(q, sm.id)
            await cell.refresh()
            obj = cell.cached() or LeaseObject(sm.id)
            seg = await self._segment(q, sm)
            first = after[1] + 1 if after is not None and sm.id == after[0] else 0
            for idx in range(first, sm.count):
                item = _browsed(sm, seg, obj, idx, now)
                if item is None:
                    continue
                if len(out) == limit:
                    return out, out[-1].id
                out.append(item)
        return out, None

    async def redrive(self, dead_queue: str, limit: int = 1000) -> int:
        """Move dead-lettered items back to the queue they came from."""
        moved = 0
        while moved < limit:
            items = await self.lease(dead_queue, min(limit - moved, self.opts.max_batch),
                                     lease_timeout=300)
            if not items:
                break
            back = [i for i in items if i.meta and isinstance(i.meta.get("source_queue"), str)]
            for i in items:
                if i not in back:  # not a dead letter: leave it where it is
                    await self.retry(i.token, retry_at_ms=self.clock.now_ms() + 3_600_000)
            by_source: dict[str, list[LeasedItem]] = {}
            for i in back:
                by_source.setdefault(str(i.meta["source_queue"]), []).append(i)  # type: ignore[index]
            for source, group in by_source.items():
                await self.produce(
                    source,
                    [NewItem(i.payload, None, f"redrive:{i.id}:{i.attempts}",
                             {"redriven_from": dead_queue, "dead_id": i.id}) for i in group],
                )
                await self.complete([i.token for i in group])
                moved += len(group)
            if len(back) < len(items):
                break
        return moved

    # -- stats -----------------------------------------------------------------
    async def stats(self, queue: str) -> QueueStats:
        """Counts by state, read fresh from the store (one GET per segment)."""
        q = self._q(queue)
        m = await self._manifest(q, 0)
        now = self.clock.now_ms()
        s = QueueStats(queue, segments=len(m.segments))
        oldest: int | None = None
        for sm in m.segments:
            cell = self._lease_cell(q, sm.id)
            await cell.refresh()
            obj = cell.cached() or LeaseObject(sm.id)
            seg = await self._segment(q, sm)
            for idx in range(sm.count):
                st = obj.items.get(idx)
                state, _ = _classify(st, fresh_ready_ms(sm, seg.items[idx]), now)
                setattr(s, state, getattr(s, state) + 1)
                if state == "available":
                    born = seg.items[idx].born_ms or sm.created_ms
                    oldest = born if oldest is None else min(oldest, born)
        s.oldest_age_s = 0.0 if oldest is None else max(0, now - oldest) / 1000
        if m.config.dead_queue:
            try:
                dq = await self.stats(m.config.dead_queue) if m.config.dead_queue != queue else s
                s.dead = dq.available + dq.in_flight + dq.scheduled + dq.waiting_retry
            except QueueNotFound:
                s.dead = 0
        return s


def _classify(st: ItemState | None, fresh_ready: int, now: int) -> tuple[str, int | None]:
    """An item's state as stats counts it (a QueueStats field), and its ready time."""
    ready = tr.ready_at(st, fresh_ready)
    if st is not None and st.s == LEASED and st.t > now:
        return "in_flight", st.t
    if ready is not None:
        if ready <= now:
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
    state, when = _classify(st, fresh_ready_ms(sm, item), now)
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


_SCAN_ORDER: dict[tuple[str, int, str], list[SegmentMeta]] = {}


def _scan_order(m: Manifest) -> list[SegmentMeta]:
    """Segments by the earliest ready time of their items (publish order, unless
    a compactor merge carried older items into a newer segment)."""
    key = (m.queue, m.ver, m.nonce)
    order = _SCAN_ORDER.get(key)
    if order is None:
        if len(_SCAN_ORDER) > 256:
            _SCAN_ORDER.clear()
        order = _SCAN_ORDER[key] = sorted(m.segments, key=lambda sm: sm.first_ready_ms)
    return order


def _completion(d: Delivery) -> Callable[[LeaseObject, int], object]:
    return lambda obj, now: tr.complete(obj, d.index, d.v)


def _summarise(sm: SegmentMeta, seg: Segment | None, obj: LeaseObject) -> _Summary:
    ready: list[tuple[int, int]] = []
    stalled: list[tuple[int, int]] = []
    inflight = False
    for idx in range(sm.count):
        st = obj.items.get(idx)
        if st is not None and st.s in (LEASED, DEAD_PENDING, OUTPUTS_PENDING):
            inflight = True
            if st.s != LEASED:
                stalled.append((st.t, idx))
        fresh = fresh_ready_ms(sm, seg.items[idx]) if seg is not None and st is None else 0
        r = tr.ready_at(st, fresh)
        if r is not None:
            ready.append((r, idx))
    ready.sort()
    return _Summary(ready, inflight, stalled)


def _missing(exc: BaseException) -> bool:
    return isinstance(exc, ObjectNotFound)


def _invalid(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    name = ".".join(str(p) for p in first["loc"]) or "config"
    return InvalidRequest(f"{name}: {first['msg']}", field=name)


def generate_key() -> bytes:
    """A fresh random signing key."""
    return secrets.token_bytes(32)
