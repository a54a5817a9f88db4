"""The Worker completes the items that finish together in one call, and a lease lost
in such a call fails its own item alone; it renews a lease while its handler runs,
and not after."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import pairwise
from types import SimpleNamespace
from typing import Any

from okq.errors import LeaseLost
from okq.wire import LeasedItemOut
from okq.worker import Worker

NOW = datetime(2026, 12, 2, tzinfo=UTC)


def item(n: int) -> LeasedItemOut:
    return LeasedItemOut(id=f"id{n}", token=f"t{n}", attempts=1, lease_deadline=NOW,
                         produced_at=NOW, bytes=b"x")


class Queue:
    """A Queues stand-in: ``count`` items to lease, then none; complete calls kept, and
    the tokens in ``lost`` refused as the node refuses them (LeaseLost naming each)."""

    def __init__(self, count: int, lost: frozenset[str] = frozenset()) -> None:
        self.items = [item(n) for n in range(count)]
        self.lost = lost
        self.completes: list[list[str]] = []
        self.renewals: list[tuple[str, float]] = []

    async def lease(self, queue: str, batch_size: int = 1, *,
                    lease_timeout: float | None = None,
                    request_timeout: float = 0.0) -> list[LeasedItemOut]:
        got, self.items = self.items[:batch_size], self.items[batch_size:]
        if not got:
            await asyncio.sleep(0.01)
        return got

    async def renew(self, queue: str, token: str, lease_timeout: float | None = None) -> Any:
        self.renewals.append((token, asyncio.get_running_loop().time()))
        return NOW

    async def complete(self, queue: str, tokens: Sequence[str]) -> int:
        self.completes.append(list(tokens))
        await asyncio.sleep(0)
        failed = [{"index": n, "id": t, "reason": "lost"} for n, t in enumerate(tokens)
                  if t in self.lost]
        if failed:
            raise LeaseLost(f"{len(failed)} of {len(tokens)} completions refused",
                            failed=failed)
        return len(tokens)

    async def complete_and_produce(self, queue: str, token: str, out_queue: str,
                                   items: Sequence[bytes]) -> list[str]:
        raise AssertionError("no outputs here")

    async def retry(self, queue: str, token: str, **_: Any) -> None:
        raise AssertionError("no retries here")

    async def queue_info(self, name: str) -> Any:
        return SimpleNamespace(lease_timeout=30.0, max_attempts=5)


async def noop(item: LeasedItemOut) -> None:
    return None


async def test_items_finished_together_complete_in_one_call() -> None:
    queue = Queue(10)
    stats = await Worker(queue, "q", noop, concurrency=10, limit=10).run()
    assert stats.completed == 10
    assert sorted(t for call in queue.completes for t in call) == sorted(
        f"t{n}" for n in range(10))
    assert len(queue.completes) < 10  # at least some shared a call
    assert max(len(call) for call in queue.completes) <= 10  # at most concurrency a call


async def test_a_lost_lease_fails_its_item_alone() -> None:
    queue = Queue(6, lost=frozenset({"t2", "t4"}))
    worker = Worker(queue, "q", noop, concurrency=6)
    task = asyncio.create_task(worker.run())
    while sum(len(call) for call in queue.completes) < 6:
        await asyncio.sleep(0.01)
    worker.stop()
    stats = await task
    assert stats.completed == 4  # the two lost leases are not counted
    assert stats.errors == []  # a lost lease is a warning, not an error


async def test_a_lease_is_renewed_every_half_timeout_while_its_handler_runs_and_not_after(
        ) -> None:
    queue = Queue(2)
    finished: dict[str, float] = {}

    async def handler(got: LeasedItemOut) -> None:
        await asyncio.sleep(0.35 if got.token == "t0" else 0.0)  # t1 ends before a renewal
        finished[got.token] = asyncio.get_running_loop().time()

    began = asyncio.get_running_loop().time()
    stats = await Worker(queue, "q", handler, concurrency=2, limit=2, lease_timeout=0.2).run()
    await asyncio.sleep(0.25)  # a renewal still pending would come now
    assert stats.completed == 2
    times = [at - began for token, at in queue.renewals if token == "t0"]
    assert [t for token, t in queue.renewals if token != "t0"] == []
    # every half lease timeout (0.1 s) from the lease on, while t0's handler runs (a
    # busy machine may delay them, never bring them early), and none after it ended
    assert times and times[0] >= 0.09 and all(b - a >= 0.09 for a, b in pairwise(times)), times
    assert len(times) <= (finished["t0"] - began) / 0.1 + 1, times
    assert all(at <= finished["t0"] for _, at in queue.renewals)
