"""The queue service: one layer below every front end.

A front end (the HTTP node in ``okq.server``, a program in library mode, a
later SQS-compatible API) parses its own requests, calls one method here and
renders the answer or the okq error it raises. What is policy rather than
storage lives here, once:

- admission: a produce is shed (``Overloaded``) while too many of the queue's
  items wait to be published (``max_pending_produce``); a long poll is shed
  while ``max_waiting`` others wait on the queue; a long poll longer than the
  engine's ``max_wait`` is refused;
- batch limits: a batch over the engine's ``max_batch`` is ``TooLarge``, a token
  repeated in one batch is refused (it names one delivery);
- the retry batch: each retry applied on its own, the lost leases reported per
  item (``RetryOutcome``), the others landed;
- giving back what a long poll leased for a caller that has gone.

The ranges (batch sizes, lease timeouts, times, retention) are defined once in
``okq.limits``; the engine enforces those of its own arguments too, so library
mode gets the same answers as HTTP.

Library mode, with the node's admission limits::

    async with Engine(store, TokenSigner(keys)) as engine:
        service = QueueService(engine, Admission(max_waiting=10))
        await service.produce("jobs", [NewItem(b"hello")])
        for item in await service.lease("jobs", 10, wait=20):
            ...
            await service.complete("jobs", [item.token])

The node builds its ``Admission`` from its settings (``Admission.from_settings``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from okq.engine import BrowsedItem, Engine, LeasedItem, QueueInfo, QueueStats
from okq.errors import InvalidRequest, LeaseLost, OkqError, Overloaded, QueueNotFound
from okq.limits import check_batch
from okq.model import QueueConfig
from okq.movetasks import MoveTaskStore
from okq.publisher import NewItem
from okq.settings import Settings

log = logging.getLogger("okq.service")

_DEFAULTS = Settings.model_fields


@dataclass(frozen=True)
class Admission:
    """How much a front end lets in before it sheds load (the node's ``--max-*``;
    their defaults are the node's)."""

    max_waiting: int = _DEFAULTS["max_waiting"].default  # long polls per queue before 429
    #: items waiting to be published on a queue before a produce is shed
    max_pending_produce: int = _DEFAULTS["max_pending_produce"].default

    @classmethod
    def from_settings(cls, settings: Settings) -> Admission:
        return cls(max_waiting=settings.max_waiting,
                   max_pending_produce=settings.max_pending_produce)


@dataclass(frozen=True)
class Outputs:
    """Items produced to ``queue`` in the same step as a completion."""

    queue: str
    items: Sequence[NewItem]


@dataclass(frozen=True)
class Retry:
    """One delivery to release: ready again at ``retry_at_ms`` (now by default), or
    dead-lettered; ``count_attempt=False`` gives it back without counting a try."""

    token: str
    retry_at_ms: int | None = None
    dead: bool = False
    error: str | None = None
    count_attempt: bool = True


@dataclass
class RetryOutcome:
    """What a retry batch did: how many landed, and each refusal by its index."""

    total: int
    retried: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)  # {"index", "reason"}

    def raise_if_failed(self) -> None:
        """LeaseLost naming the refused items, when any was refused."""
        if self.failed:
            landed = f"; the other {self.retried} landed" if self.retried else ""
            raise LeaseLost(f"{len(self.failed)} of {self.total} retries refused: the lease "
                            f"was lost{landed}", failed=self.failed)


#: Seconds between looks at whether a long poll's caller has gone away.
GONE_CHECK = 0.5


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


class QueueService:
    """The operations of the lease API over one ``Engine``, with admission."""

    def __init__(self, engine: Engine, admission: Admission | None = None) -> None:
        self.engine = engine
        self.admission = admission or Admission()
        self._waiting: Counter[str] = Counter()  # long polls waiting, by queue

    # -- limits -----------------------------------------------------------------
    def check_batch(self, n: int, field_name: str) -> None:
        """1 to the engine's ``max_batch`` entries; 413 over it."""
        check_batch(n, self.engine.opts.max_batch, field_name)

    def check_tokens(self, tokens: Sequence[str], queue: str, pattern: str) -> None:
        """Each token well formed and of ``queue``, and none twice (``pattern`` names
        the n-th: ``tokens[{n}]``): a repeat would be counted twice although it names
        one delivery."""
        self.engine.check_tokens(tokens, queue, pattern)
        seen: dict[str, int] = {}
        for n, token in enumerate(tokens):
            if token in seen:
                here, first = pattern.format(n=n), pattern.format(n=seen[token])
                raise InvalidRequest(f"{here} repeats {first}", field=here)
            seen[token] = n

    def waiting(self, queue: str) -> int:
        """Long polls waiting on ``queue`` now."""
        return self._waiting[queue]

    # -- the lease API --------------------------------------------------------------
    async def produce(self, queue: str, items: Sequence[NewItem]) -> list[str]:
        """Publish items; their ids once durable. Shed while too many wait."""
        self.check_batch(len(items), "items")
        if self.engine.pending_produce(queue) > self.admission.max_pending_produce:
            raise Overloaded("too many items waiting to be published on this queue; retry later",
                             retry_after=1, queue=queue)
        return await self.engine.produce(queue, items)

    async def lease(self, queue: str, batch_size: int = 1, *, lease_timeout: float | None = None,
                    wait: float = 0.0, gone: Callable[[], bool] | None = None
                    ) -> list[LeasedItem]:
        """Lease up to ``batch_size`` ready items, long-polling up to ``wait`` seconds.

        ``gone`` tells whether the caller has gone away (a closed connection): its
        long poll then stops counting toward ``max_waiting`` within
        ``GONE_CHECK`` seconds; what it leases after that is the front end's to give
        back (``give_back``)."""
        self.check_batch(batch_size, "batch_size")
        max_wait = self.engine.opts.max_wait
        if wait > max_wait:
            raise InvalidRequest(f"request_timeout: at most {max_wait} seconds",
                                 field="request_timeout")
        limit = self.admission.max_waiting
        if wait > 0 and self._waiting[queue] >= limit:
            raise Overloaded(f"{limit} lease requests are already waiting on this queue",
                             retry_after=1, queue=queue)
        slot = _Slot(self._waiting, queue)
        watcher = (asyncio.create_task(_free_when_gone(slot, gone))
                   if gone is not None and wait > GONE_CHECK else None)  # shorter: freed soon
        try:
            return await self._lease(queue, batch_size, lease_timeout, wait)
        finally:
            if watcher is not None:
                watcher.cancel()
            slot.release()

    async def _lease(self, queue: str, batch_size: int, lease_timeout: float | None,
                     wait: float) -> list[LeasedItem]:
        """The lease itself, once admitted (a routing front end sends it elsewhere)."""
        return await self.engine.lease(queue, batch_size, lease_timeout=lease_timeout, wait=wait)

    async def give_back(self, queue: str, items: Sequence[LeasedItem]) -> None:
        """Release, uncounted, what a lease took for a caller that has gone (a worker
        stopped by Ctrl-C while its long poll waited): nobody would get the tokens, and
        the items would sit leased until their lease timed out. A release that fails
        leaves the item to that timeout."""
        for item in items:
            try:
                await self.engine.retry(item.token, queue=queue, count_attempt=False,
                                        error="the lease request's client went away")
            except OkqError as exc:
                log.info("could not give back %s after its client went away: %s", item.id, exc)

    async def renew(self, queue: str, token: str, lease_timeout: float | None = None) -> int:
        """Extend a lease from now; the new deadline (ms)."""
        return await self.engine.renew(token, lease_timeout, queue=queue)

    async def first_leased(self, queue: str, token: str) -> int | None:
        """When the token's item was first leased (ms), while its delivery is current
        (a read: it runs on any node)."""
        return await self.engine.first_leased(token, queue=queue)

    def now_ms(self) -> int:
        """The time by this node's clock (ms)."""
        return self.engine.clock.now_ms()

    async def complete(self, queue: str, tokens: Sequence[str],
                       outputs: Outputs | None = None) -> list[str] | None:
        """Complete deliveries; with ``outputs`` (one token), produce them in the same
        step and return their ids."""
        self.check_batch(len(tokens), "tokens")
        if outputs is not None:
            self.check_batch(len(outputs.items), "outputs.items")
        self.check_tokens(tokens, queue, "tokens[{n}]")
        if outputs is None:
            await self.engine.complete(tokens, queue=queue)
            return None
        if len(tokens) != 1:
            raise InvalidRequest("outputs need exactly one token", field="tokens")
        return await self.engine.complete_and_produce(tokens[0], outputs.queue, outputs.items,
                                                      queue=queue)

    async def retry(self, queue: str, retries: Sequence[Retry]) -> RetryOutcome:
        """Release deliveries, each on its own. A lost lease does not stop the
        others: it is reported in the outcome (``raise_if_failed`` makes it an error)."""
        self.check_batch(len(retries), "items")
        self.check_tokens([r.token for r in retries], queue, "items[{n}].token")
        outcome = RetryOutcome(total=len(retries))
        for n, r in enumerate(retries):
            try:
                await self.engine.retry(r.token, retry_at_ms=r.retry_at_ms, dead=r.dead,
                                        error=r.error, queue=queue, field_name=f"items[{n}].token",
                                        count_attempt=r.count_attempt)
                outcome.retried += 1
            except LeaseLost as exc:
                state = exc.details.get("state")
                outcome.failed.append({"index": n, "reason": exc.message,
                                       **({"state": state} if state else {})})
        return outcome

    # -- queues and views ---------------------------------------------------------------
    async def stats(self, queue: str) -> QueueStats:
        return await self.engine.stats(queue)

    async def purge(self, queue: str, not_within: float = 0.0) -> None:
        await self.engine.purge(queue, not_within)

    async def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return await self.engine.create_queue(name, config)

    async def queue(self, name: str, max_age: float = 0) -> QueueInfo:
        """A queue's info; ``max_age`` lets a front end take it from the manifest cache
        (a per-message read of settings, such as the SQS API's delay and long poll)."""
        return await self.engine.get_queue(name, max_age)

    async def queue_names(self) -> list[str]:
        """The names of the namespace's queues (one LIST)."""
        return await self.engine.list_queues()

    async def queues(self) -> list[QueueInfo]:
        """Every queue of the namespace; one deleted while listing is left out."""
        infos = []
        for name in await self.queue_names():
            try:
                infos.append(await self.engine.get_queue(name))
            except QueueNotFound:
                continue
        return infos

    async def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        return await self.engine.update_queue(name, **changes)

    async def delete_queue(self, name: str) -> None:
        await self.engine.delete_queue(name)

    async def browse(self, queue: str, *, start_after: str | None = None,
                     limit: int = 100) -> tuple[list[BrowsedItem], str | None]:
        return await self.engine.browse(queue, start_after=start_after, limit=limit)

    @property
    def move_tasks(self) -> MoveTaskStore:
        """The namespace's message move tasks, kept in the bucket (the SQS API's)."""
        return self.engine.move_tasks

    async def redrive(self, dead_queue: str, limit: int = 1000) -> int:
        return await self.engine.redrive(dead_queue, limit)
