"""The calls a worker makes (``Queues``), and ``EngineQueues``: an engine in this
process, through the pipeline, as ``Queues`` (library mode).

``okq.client.Client`` has these calls over HTTP; ``EngineQueues(engine)`` runs them
through a ``QueueService`` (``okq.service``): the same pipeline as a node's below
its key checks and metrics, so a worker in library mode gets a node's admission
(long polls over ``max_waiting`` are shed) and a lease whose worker stopped while
it waited is given back.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from okq.wire import LeasedItemOut, leased_item_out, to_datetime

if TYPE_CHECKING:  # EngineQueues' parts, imported where used: okq.client needs none of them
    from okq.admit import Admission
    from okq.engine import Engine
    from okq.model import QueueConfig
    from okq.service import QueueService


class QueueSettings(Protocol):
    """A queue's settings, as far as a worker reads them."""

    @property
    def max_attempts(self) -> int: ...

    @property
    def lease_timeout(self) -> float: ...


class Queues(Protocol):
    """The calls a worker makes: ``Client`` over HTTP, ``EngineQueues`` in this process.

    Errors are okq's own (``okq.errors``) either way: ``LeaseLost`` when a token's
    delivery is over; ``okq.retrying.retryable`` ones (``Unavailable``,
    ``Overloaded``, ``StorageError``, ...) when trying again later may help.
    """

    async def lease(self, queue: str, batch_size: int = 1, *,
                    lease_timeout: float | None = None,
                    request_timeout: float = 0.0) -> list[LeasedItemOut]:
        """Lease up to ``batch_size`` items for ``lease_timeout`` seconds (the queue's
        by default), waiting up to ``request_timeout`` seconds for some."""

    async def renew(self, queue: str, token: str,
                    lease_timeout: float | None = None) -> datetime:
        """Extend a lease from now; returns its new deadline."""

    async def complete(self, queue: str, tokens: Sequence[str]) -> int:
        """Complete deliveries; returns how many."""

    async def complete_and_produce(self, queue: str, token: str, out_queue: str,
                                   items: Sequence[bytes]) -> list[str]:
        """Complete one delivery and produce ``items`` to ``out_queue`` in one step."""

    async def retry(self, queue: str, token: str, *, retry_at: datetime | None = None,
                    dead: bool = False, error: str | None = None,
                    count_attempt: bool = True) -> bool:
        """Release a delivery: ready again at ``retry_at`` (now by default), or
        dead-lettered; ``count_attempt=False`` gives it back without spending a try.
        True when it was dead-lettered (``dead``, or out of attempts)."""

    async def queue_info(self, name: str) -> QueueSettings:
        """The queue's settings."""


class EngineQueues:
    """An ``Engine`` in this process as ``Queues``: ``Worker(EngineQueues(engine), ...)``
    is a worker in library mode, through the engine's pipeline (``admission``: the
    node's defaults unless given); or over a ``QueueService`` already built."""

    def __init__(self, engine: Engine | QueueService,
                 admission: Admission | None = None) -> None:
        from okq.service import QueueService

        self.service = engine if isinstance(engine, QueueService) \
            else QueueService(engine, admission)

    async def lease(self, queue: str, batch_size: int = 1, *,
                    lease_timeout: float | None = None,
                    request_timeout: float = 0.0) -> list[LeasedItemOut]:
        items = await self.service.lease(queue, batch_size, lease_timeout=lease_timeout,
                                         wait=request_timeout)
        return [leased_item_out(i) for i in items]

    async def renew(self, queue: str, token: str,
                    lease_timeout: float | None = None) -> datetime:
        return to_datetime(await self.service.renew(queue, token, lease_timeout))

    async def complete(self, queue: str, tokens: Sequence[str]) -> int:
        await self.service.complete(queue, tokens)
        return len(tokens)

    async def complete_and_produce(self, queue: str, token: str, out_queue: str,
                                   items: Sequence[bytes]) -> list[str]:
        from okq.ops import Outputs
        from okq.publisher import NewItem

        outputs = Outputs(out_queue, [NewItem(i) for i in items])
        return await self.service.complete(queue, [token], outputs) or []

    async def retry(self, queue: str, token: str, *, retry_at: datetime | None = None,
                    dead: bool = False, error: str | None = None,
                    count_attempt: bool = True) -> bool:
        from okq.ops import Retry

        at_ms = None if retry_at is None else int(retry_at.timestamp() * 1000)
        outcome = await self.service.retry(queue, [Retry(token, at_ms, dead, error,
                                                         count_attempt)])
        outcome.raise_if_failed()
        return outcome.dead_lettered > 0

    async def queue_info(self, name: str) -> QueueConfig:
        return (await self.service.queue(name)).config
