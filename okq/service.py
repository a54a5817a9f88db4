"""The queue service: the operations of a namespace as typed methods, for one caller.

Each method builds one operation (``okq.ops``) and runs it through the
namespace's pipeline (``okq.pipeline``: authorize → meter → admit → route →
local), as the caller its context names. The SQS API, the SQS move task runners,
the worker in library mode and programs use it; the HTTP handlers hand their
operations to the pipeline themselves.

Library mode, with the node's admission limits::

    async with Engine(store, TokenSigner(keys)) as engine:
        service = QueueService(engine, Admission(max_waiting=10))
        await service.produce("jobs", [NewItem(b"hello")])
        for item in await service.lease("jobs", 10, wait=20):
            ...
            await service.complete("jobs", [item.token])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from okq import ops
from okq.admit import Admission
from okq.engine import BrowsedItem, Engine, LeasedItem, QueueInfo, QueueStats
from okq.model import MoveTask, QueueConfig
from okq.ops import SYSTEM, Context, Outputs, Retry, RetryOutcome
from okq.pipeline import Pipeline, build
from okq.publisher import NewItem

__all__ = ["Admission", "Outputs", "QueueService", "Retry", "RetryOutcome"]


class QueueService:
    """The typed operations over a pipeline, as the caller ``ctx`` names.

    ``QueueService(engine, admission)`` builds the library-mode pipeline over
    ``engine`` (admit → local); ``QueueService.over(pipeline, ctx)`` acts through a
    node's pipeline as one caller."""

    def __init__(self, engine: Engine | None = None, admission: Admission | None = None, *,
                 pipeline: Pipeline | None = None, ctx: Context = SYSTEM) -> None:
        if pipeline is None:
            if engine is None:
                raise TypeError("QueueService needs an engine or a pipeline")
            pipeline = build(engine, admission, authorize=False)
        self.pipeline = pipeline
        self.ctx = ctx

    @classmethod
    def over(cls, pipeline: Pipeline, ctx: Context = SYSTEM) -> QueueService:
        return cls(pipeline=pipeline, ctx=ctx)

    def as_caller(self, ctx: Context) -> QueueService:
        """The same pipeline, as another caller."""
        return QueueService(pipeline=self.pipeline, ctx=ctx)

    def background(self) -> QueueService:
        """The same pipeline, for the node's own work that outlives a request (the SQS
        API's move task runners): every right, and no caller to go away."""
        return QueueService(pipeline=self.pipeline)

    def waiting(self, queue: str) -> int:
        """Long polls waiting on ``queue`` now."""
        return self.pipeline.waiting(queue)

    def now_ms(self) -> int:
        """The time by this node's clock (ms)."""
        return self.pipeline.clock.now_ms()

    # -- the lease API --------------------------------------------------------------
    async def produce(self, queue: str, items: Sequence[NewItem]) -> list[str]:
        """Publish items; their ids once durable. Shed while too many wait."""
        return await self.pipeline.handle(ops.Produce(queue, items), self.ctx)

    async def lease(self, queue: str, batch_size: int = 1, *, lease_timeout: float | None = None,
                    wait: float = 0.0, gone: Callable[[], bool] | None = None
                    ) -> list[LeasedItem]:
        """Lease up to ``batch_size`` ready items, long-polling up to ``wait`` seconds.

        ``gone`` tells whether the caller has gone away (a closed connection): its
        long poll then stops counting toward ``max_waiting`` within ``GONE_CHECK``
        seconds, and what it leased is given back."""
        ctx = self.ctx if gone is None else Context(self.ctx.principal, gone, rid=self.ctx.rid)
        return await self.pipeline.handle(ops.Lease(queue, batch_size, lease_timeout, wait), ctx)

    async def give_back(self, queue: str, items: Sequence[LeasedItem]) -> None:
        """Release, uncounted, what a lease took for a caller that has gone."""
        await self.pipeline.handle(ops.GiveBack(queue, items), self.ctx)

    async def renew(self, queue: str, token: str, lease_timeout: float | None = None) -> int:
        """Extend a lease from now; the new deadline (ms)."""
        return await self.pipeline.handle(ops.Renew(queue, token, lease_timeout), self.ctx)

    async def first_leased(self, queue: str, token: str) -> int | None:
        """When the token's item was first leased (ms), while its delivery is current."""
        return await self.pipeline.handle(ops.FirstLeased(queue, token), self.ctx)

    async def check_tokens(self, tokens: Sequence[str], queue: str, pattern: str) -> None:
        """Each token well formed and of ``queue``, and none twice."""
        await self.pipeline.handle(ops.CheckTokens(queue, tokens, pattern), self.ctx)

    async def complete(self, queue: str, tokens: Sequence[str],
                       outputs: Outputs | None = None) -> list[str] | None:
        """Complete deliveries; with ``outputs`` (one token), produce them in the same
        step and return their ids."""
        return await self.pipeline.handle(ops.Complete(queue, tokens, outputs), self.ctx)

    async def retry(self, queue: str, retries: Sequence[Retry]) -> RetryOutcome:
        """Release deliveries, each on its own. A lost lease does not stop the
        others: it is reported in the outcome (``raise_if_failed`` makes it an error)."""
        return await self.pipeline.handle(ops.RetryItems(queue, retries), self.ctx)

    # -- queues and views ---------------------------------------------------------------
    async def stats(self, queue: str) -> QueueStats:
        return await self.pipeline.handle(ops.Stats(queue), self.ctx)

    async def purge(self, queue: str, not_within: float = 0.0) -> None:
        await self.pipeline.handle(ops.Purge(queue, not_within), self.ctx)

    async def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return await self.pipeline.handle(ops.CreateQueue(name, config), self.ctx)

    async def queue(self, name: str, max_age: float = 0) -> QueueInfo:
        """A queue's info; ``max_age`` lets a front end take it from the manifest cache."""
        return await self.pipeline.handle(ops.GetQueue(name, max_age), self.ctx)

    async def queue_names(self) -> list[str]:
        """The names of the namespace's queues (one LIST)."""
        return await self.pipeline.handle(ops.QueueNames(), self.ctx)

    async def queues(self) -> list[QueueInfo]:
        """Every queue of the namespace; one deleted while listing is left out."""
        return await self.pipeline.handle(ops.QueueInfos(), self.ctx)

    async def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        return await self.pipeline.handle(ops.UpdateQueue(name, changes), self.ctx)

    async def delete_queue(self, name: str) -> None:
        await self.pipeline.handle(ops.DeleteQueue(name), self.ctx)

    async def browse(self, queue: str, *, start_after: str | None = None,
                     limit: int = 100) -> tuple[list[BrowsedItem], str | None]:
        return await self.pipeline.handle(ops.Browse(queue, start_after, limit), self.ctx)

    async def redrive(self, dead_queue: str, limit: int = 1000,
                      destination: str | None = None) -> int:
        return await self.pipeline.handle(ops.Redrive(dead_queue, limit, destination),
                                          self.ctx)

    # -- the SQS API's move tasks -----------------------------------------------------
    async def start_move_task(self, task: MoveTask) -> bool:
        return await self.pipeline.handle(ops.StartMoveTask(task.dead, task), self.ctx)

    async def move_tasks_of(self, dead_queue: str) -> list[MoveTask]:
        return await self.pipeline.handle(ops.MoveTasksOf(dead_queue), self.ctx)

    async def update_move_task(self, dead_queue: str, seq: int,
                               change: Callable[[MoveTask, int], MoveTask]) -> MoveTask:
        """Apply ``change`` (``okq.movetasks``: cancel, claim, beat, finish) by CAS."""
        return await self.pipeline.handle(ops.UpdateMoveTask(dead_queue, seq, change), self.ctx)

    async def active_move_tasks(self) -> list[MoveTask]:
        return await self.pipeline.handle(ops.ActiveMoveTasks(), self.ctx)
