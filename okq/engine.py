"""The queue engine: okq's public library API, with no HTTP.

An :class:`Engine` serves any number of queues in one namespace of one store.
Any number of engines, in any number of processes, may share a store: every
change is a compare-and-swap on the object that owns it, so the bucket stays
the only source of truth. See docs/DESIGN.md for the object layout, every state
transition and the failure analysis.

The engine is a facade: each call goes to the part that does it.

* okq/runtime.py: the queues' cells, publishers and caches (and ``produce``);
* okq/admin.py: create, read, change, delete, list and purge queues;
* okq/scheduler.py: the lease walk and the long poll;
* okq/deliveries.py: renew, complete, retry and complete-with-outputs;
* okq/finishers.py: dead-letter moves and outputs left half done;
* okq/views.py: browse and stats;
* okq/redrive.py: dead letters back to their queues.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from okq.admin import Admin, QueueInfo
from okq.clock import Clock, SystemClock
from okq.deliveries import Deliveries
from okq.finishers import Finishers
from okq.keys import split_partition
from okq.leases import LeasedItem
from okq.model import QueueConfig
from okq.movetasks import MoveTaskStore
from okq.publisher import NewItem
from okq.redrive import Redriver
from okq.runtime import EngineOptions, Runtime
from okq.scheduler import Scheduler
from okq.store.base import Store
from okq.store.selfcheck import check_conditional_writes
from okq.tokens import TokenSigner, generate_key
from okq.views import BrowsedItem, QueueStats, Views

__all__ = [
    "BrowsedItem",
    "Engine",
    "EngineOptions",
    "LeasedItem",
    "QueueInfo",
    "QueueStats",
    "generate_key",
]


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
        self.signer = signer
        self.runtime = rt = Runtime(store, namespace, clock or SystemClock(),
                                    options or EngineOptions())
        self.finishers = Finishers(rt)
        self.admin = Admin(rt)
        self.scheduler = Scheduler(rt, self.finishers, signer)
        self.deliveries = Deliveries(rt, self.finishers, signer)
        self.views = Views(rt)
        self.redriver = Redriver(rt, self.scheduler, self.deliveries, self.finishers)
        self.move_tasks = MoveTaskStore(store, namespace)

    @property
    def store(self) -> Store:
        return self.runtime.store

    @property
    def ns(self) -> str:
        return self.runtime.ns

    @property
    def clock(self) -> Clock:
        return self.runtime.clock

    @property
    def opts(self) -> EngineOptions:
        return self.runtime.opts

    @property
    def cas_conflicts(self) -> int:
        """Conditional writes of this engine that lost a race (for metrics)."""
        return self.runtime.cas_conflicts

    def queues_served(self) -> list[str]:
        """The queues this engine has served since it started (for metrics): a queue
        once, whichever of its partitions it served."""
        return list(dict.fromkeys(split_partition(q)[0] for q in self.runtime.queues))

    def next_ready_ms(self, queue: str) -> int | None:
        """When the next item of ``queue`` not yet due becomes leasable (ms), as this
        engine's last lease walk of it saw; None when it saw none or never looked."""
        q = self.runtime.queues.get(queue)
        return q.next_ready_ms if q is not None else None

    def trust(self, holds: Callable[[str], bool]) -> None:
        """Every write to the queues ``holds`` names comes through this engine (a
        sequencer role): their caches may be trusted for ``trusted_max_age``."""
        self.runtime.trusted = holds

    def forget_cached(self, which: Callable[[str], bool]) -> None:
        """Drop what is cached of the queues ``which`` names: others wrote them."""
        self.runtime.forget_cached(which)

    # -- life cycle --------------------------------------------------------
    async def start(self, *, self_check: bool = True) -> Engine:
        if self_check:
            await check_conditional_writes(self.store)
        return self

    def stop_waiting(self) -> None:
        """Make long polls return now (with what they have): the node is stopping."""
        self.runtime.stopping = True
        for q in self.runtime.queues.values():
            q.wake_all()

    async def close(self) -> None:
        """Flush pending produce batches and writes; the store stays open."""
        await self.runtime.close()

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- queues ---------------------------------------------------------------
    async def create_queue(
        self, name: str, config: QueueConfig | None = None, *, exist_ok: bool = False
    ) -> QueueInfo:
        """Create a queue; with ``exist_ok`` an existing one is returned unchanged."""
        return await self.admin.create_queue(name, config, exist_ok=exist_ok)

    async def get_queue(self, name: str, max_age: float = 0) -> QueueInfo:
        return await self.admin.get_queue(name, max_age)

    async def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        """Change settings; those not named keep their values."""
        return await self.admin.update_queue(name, **changes)

    async def delete_queue(self, name: str) -> None:
        await self.admin.delete_queue(name)

    async def list_queues(self) -> list[str]:
        return await self.admin.list_queues()

    async def purge(self, queue: str, not_within: float = 0.0) -> None:
        """Drop every item of the queue; PurgeInProgress when it was purged less than
        ``not_within`` seconds ago."""
        await self.admin.purge(queue, not_within)

    # -- items ------------------------------------------------------------------
    async def produce(self, queue: str, items: Sequence[NewItem | bytes]) -> list[str]:
        """Publish items; returns their ids once the manifest CAS has landed."""
        return await self.runtime.produce(queue, items)

    def pending_produce(self, queue: str) -> int:
        """Items waiting in this engine to be published to ``queue``."""
        q = self.runtime.queues.get(queue)
        return q.publisher.pending_items() if q is not None else 0

    async def lease(self, queue: str, batch: int = 1, *, lease_timeout: float | None = None,
                    wait: float = 0.0) -> list[LeasedItem]:
        """Lease up to ``batch`` ready items, waiting up to ``wait`` seconds for some
        (``lease_timeout``: the queue's by default; 0 makes them leasable again at once)."""
        return await self.scheduler.lease(queue, batch, lease_timeout=lease_timeout, wait=wait)

    def check_tokens(self, tokens: Sequence[str], queue: str, field_pattern: str) -> None:
        """Verify every token before acting on any (``field_pattern`` has ``{n}``)."""
        self.deliveries.check_tokens(tokens, queue, field_pattern)

    async def renew(self, token: str, lease_timeout: float | None = None, *,
                    queue: str | None = None) -> int:
        """Extend a lease from now; returns the new deadline (ms)."""
        return await self.deliveries.renew(token, lease_timeout, queue=queue)

    async def first_leased(self, token: str, *, queue: str | None = None) -> int | None:
        """When the token's item was first leased (ms), while the delivery is current."""
        return await self.deliveries.first_leased(token, queue=queue)

    async def complete(self, tokens: Sequence[str], *, queue: str | None = None) -> None:
        """Complete deliveries; LeaseLost names those refused, after the others landed."""
        await self.deliveries.complete(tokens, queue=queue)

    async def retry(self, token: str, *, retry_at_ms: int | None = None, dead: bool = False,
                    error: str | None = None, queue: str | None = None,
                    field_name: str = "token", count_attempt: bool = True) -> bool:
        """Release a delivery: ready again at ``retry_at``, or dead-lettered (True:
        dead-lettered, by ``dead`` or for being out of attempts)."""
        return await self.deliveries.retry(token, retry_at_ms=retry_at_ms, dead=dead,
                                           error=error, queue=queue, field_name=field_name,
                                           count_attempt=count_attempt)

    async def complete_and_produce(self, token: str, out_queue: str,
                                   items: Sequence[NewItem | bytes], *,
                                   queue: str | None = None) -> list[str]:
        """Complete one delivery and produce ``items`` if and only if it commits."""
        return await self.deliveries.complete_and_produce(token, out_queue, items, queue=queue)

    # -- views and redrive ----------------------------------------------------------
    async def browse(self, queue: str, *, start_after: str | None = None,
                     limit: int = 100) -> tuple[list[BrowsedItem], str | None]:
        """Live items in delivery-log order, without leasing them."""
        return await self.views.browse(queue, start_after=start_after, limit=limit)

    async def stats(self, queue: str) -> QueueStats:
        """Counts by state, read fresh from the store."""
        return await self.views.stats(queue)

    async def redrive(self, dead_queue: str, limit: int = 1000,
                      destination: str | None = None) -> int:
        """Move dead letters back to the queues they came from (or all of them to
        ``destination``); how many moved."""
        return await self.redriver.redrive(dead_queue, limit, destination)
