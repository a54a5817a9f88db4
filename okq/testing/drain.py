"""Run an ``okq.worker.Worker`` with a test's handler until its queue drains.

The queue is drained when none of its items is available, in flight, scheduled
or waiting for a retry (``queue.stats``): every item was completed or
dead-lettered. The worker is then stopped, and what it did is returned.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field

from okq.client import Client
from okq.wire import LeasedItemOut, StatsResponse
from okq.worker import Handler, Outputs, Worker, WorkStats

#: How often the queue's stats are read while the worker runs, in seconds.
CHECK_EVERY = 0.05
#: The worker's long poll: a stopped worker waits for the one it has out, so it also
#: bounds how long the worker takes to stop once the queue is drained.
POLL = 0.1
#: How long a stopped worker may take to finish (its handlers, their completions).
STOP_WAIT = 30.0


@dataclass
class Drained(WorkStats):
    """What the worker did (``okq.worker.WorkStats``: completed, retried, dead,
    released, outputs, failed, errors), every delivery its handler was given, in
    the order given (a retried item appears once per attempt), and how long it took."""

    deliveries: list[LeasedItemOut] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def payloads(self) -> list[bytes]:
        """The payload of each delivery, in order."""
        return [item.bytes for item in self.deliveries]


class NotDrained(AssertionError):
    """The queue still had items when the time was up."""


def pending(stats: StatsResponse) -> int:
    """Items not yet done with: available, in flight, scheduled, waiting for a retry."""
    return stats.available + stats.in_flight + stats.scheduled + stats.waiting_retry


async def drain(url: str, queue: str, handler: Handler, *, concurrency: int = 4,
                timeout: float = 30.0, backoff: float = 0.0,
                lease_timeout: float | None = None) -> Drained:
    """Run a ``Worker`` on ``queue`` of the node at ``url`` with ``handler`` until the
    queue drains, and return what it did. ``backoff``: the worker's ``backoff_base``
    (0: a failed item is retried at once); ``timeout``: raise ``NotDrained`` if the
    queue still has items after that many seconds. An error the worker cannot
    outlast (the queue does not exist) is raised as the worker raises it."""
    began = time.monotonic()
    deliveries: list[LeasedItemOut] = []

    async def recorded(item: LeasedItemOut) -> Outputs | None:
        deliveries.append(item)
        return await handler(item)

    async with Client(url) as client:
        worker = Worker(client, queue, recorded, concurrency=concurrency,
                        lease_timeout=lease_timeout, poll=POLL, backoff_base=backoff,
                        backoff_max=max(backoff, 1.0))
        running = asyncio.create_task(worker.run())
        try:
            await _until_drained(client, queue, running, began + timeout)
        except BaseException:  # not drained, or cancelled: stop now, items go back
            running.cancel()
            await asyncio.wait({running})
            if not running.cancelled():
                running.exception()  # retrieved: this error is the one to raise
            raise
        worker.stop()  # drained: graceful, so that what is finishing is counted
        await _stopped(running)
        stats = running.result()  # raises what stopped the worker, if anything did
    return Drained(**asdict(stats), deliveries=deliveries, seconds=time.monotonic() - began)


async def _until_drained(client: Client, queue: str, running: asyncio.Task[WorkStats],
                         deadline: float) -> None:
    while not running.done():
        stats = await client.stats(queue)
        if pending(stats) == 0:
            return
        if time.monotonic() > deadline:
            raise NotDrained(f"queue {queue!r} did not drain in time: {stats.available} "
                             f"available, {stats.in_flight} in flight, {stats.scheduled} "
                             f"scheduled, {stats.waiting_retry} waiting for a retry")
        await asyncio.wait({running}, timeout=CHECK_EVERY)


async def _stopped(running: asyncio.Task[WorkStats]) -> None:
    """Wait for a stopped worker to finish; cancel one that does not in time."""
    await asyncio.wait({running}, timeout=STOP_WAIT)
    if not running.done():
        running.cancel()
        await asyncio.wait({running})
