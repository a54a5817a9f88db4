"""Running message move tasks: each task lives in the bucket (``okq/movetasks.py``);
a node runs the tasks whose claim it holds, and takes over any whose claim lapsed.

A runner moves a batch, then renews its claim recording what it moved and how long
the dead letters it may lease next can stay held; it stops when its task is
cancelled or another node took it over. A node that stops (or is killed) writes
nothing: its claim lapses after ``ttl`` and the next node to look resumes the task,
which it finds when a client lists, starts or cancels tasks of that queue, or on its
sweep of the namespace (every ``sweep`` seconds, once it has served an SQS call of
that namespace). A resumer finishes the task only once nothing the old runner leased
can still come back: the dead-letter queue has nothing in flight, or the leases the
old runner may have taken have ended.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

from okq.errors import LeaseLost, ObjectNotFound, OkqError, StorageError, TaskLost
from okq.model import MoveTask, redriven_meta
from okq.movetasks import (
    ACTIVE,
    CANCELLED,
    CANCELLING,
    COMPLETED,
    FAILED,
    beat,
    claim,
    finish,
)
from okq.publisher import NewItem
from okq.redrive import REDRIVE_LEASE_S
from okq.service import Outputs, QueueService

log = logging.getLogger("okq.sqs")

#: A task's runner renews its claim at least this often; others wait ``ttl`` for it.
TTL_S = 10.0
#: How often a node looks for tasks of a namespace it serves whose claim lapsed.
SWEEP_S = 30.0
#: Dead letters leased by a move to a destination queue are held this long at most.
MOVE_LEASE_S = REDRIVE_LEASE_S
#: The most dead letters moved in one step.
BATCH = 100


class Moves:
    """This node's move task runners, and the namespaces it sweeps."""

    def __init__(self, ttl: float = TTL_S, sweep: float = SWEEP_S) -> None:
        self.owner = secrets.token_hex(8)  # this node process, as a task's claimant
        self.ttl_ms = int(ttl * 1000)
        self.sweep_s = sweep
        self.runners: dict[tuple[str, str, int], asyncio.Task[None]] = {}
        self.sweeps: dict[str, asyncio.Task[None]] = {}

    def hold_ms(self, now: int) -> int:
        """Until when dead letters leased from ``now`` may come back to their queue."""
        return now + int(MOVE_LEASE_S * 1000) + self.ttl_ms

    def serve(self, namespace: str, service: QueueService) -> None:
        """Sweep ``namespace`` from now on (the first SQS call of it starts this)."""
        if namespace not in self.sweeps:
            self.sweeps[namespace] = asyncio.get_running_loop().create_task(
                self._sweep(namespace, service))

    async def _sweep(self, namespace: str, service: QueueService) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                for task in await service.active_move_tasks():
                    await self.resume(namespace, service, task)
            except OkqError as exc:
                log.info("move tasks of namespace %r: sweep failed: %s", namespace, exc.message)

    def start(self, namespace: str, service: QueueService, task: MoveTask) -> None:
        """Run a task whose claim this node holds."""
        key = (namespace, task.dead, task.seq)
        runner = Runner(self, service, task, wait_until_ms=0)
        self.runners[key] = asyncio.get_running_loop().create_task(runner.run())
        self.runners[key].add_done_callback(lambda _: self.runners.pop(key, None))

    async def resume(self, namespace: str, service: QueueService, task: MoveTask) -> None:
        """Take over an active task whose claim lapsed (not when this node runs it)."""
        if task.status not in ACTIVE or (namespace, task.dead, task.seq) in self.runners:
            return
        if task.beat_ms > service.now_ms():
            return
        try:
            claimed = await service.update_move_task(
                task.dead, task.seq, claim(self.owner, self.ttl_ms, self.hold_ms(service.now_ms())))
        except (TaskLost, ObjectNotFound):
            return  # another node was quicker, or the task ended
        log.info("resuming move task %s/%d of namespace %r", task.dead, task.seq, namespace)
        key = (namespace, claimed.dead, claimed.seq)
        runner = Runner(self, service, claimed, wait_until_ms=task.hold_ms)
        self.runners[key] = asyncio.get_running_loop().create_task(runner.run())
        self.runners[key].add_done_callback(lambda _: self.runners.pop(key, None))

    async def close(self) -> None:
        """Stop every runner and sweep, writing nothing: the tasks stay in the bucket,
        claimed until their claims lapse, for another node to resume."""
        tasks = [*self.runners.values(), *self.sweeps.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Runner:
    """One task, run by this node while it holds the claim."""

    def __init__(self, moves: Moves, service: QueueService, task: MoveTask,
                 wait_until_ms: int) -> None:
        self.moves = moves
        self.service = service
        self.task = task
        self.wait_until_ms = wait_until_ms  # a previous runner's leases may last so long

    async def _update(self, change: Callable[[MoveTask, int], MoveTask]) -> MoveTask:
        return await self.service.update_move_task(self.task.dead, self.task.seq, change)

    async def run(self) -> None:
        owner, ttl = self.moves.owner, self.moves.ttl_ms
        try:
            while True:
                if self.task.status == CANCELLING:
                    await self._update(finish(owner, CANCELLED, 0))
                    return
                began = time.monotonic()
                n = await self._step()
                if n == 0 and await self._done():
                    await self._update(finish(owner, COMPLETED, 0))
                    return
                now = self.service.now_ms()
                self.task = await self._update(beat(owner, ttl, n or 0,
                                                    self.moves.hold_ms(now)))
                await asyncio.sleep(self._pause(n, time.monotonic() - began))
        except TaskLost:
            return  # another node runs it now, or it was ended
        except OkqError as exc:
            log.warning("move task %s/%d failed: %s", self.task.dead, self.task.seq,
                        exc.message)
            try:
                await self._update(finish(owner, FAILED, 0, exc.message))
            except OkqError:
                pass  # the claim lapses; a resumer tries again

    def _pause(self, moved: int | None, took: float) -> float:
        if not moved:  # waiting for a previous runner's leases to end, or to try again
            return min(self.moves.ttl_ms / 3000, 1.0)
        rate = self.task.rate
        return max(0.0, moved / rate - took) if rate else 0.0

    async def _step(self) -> int | None:
        """Move one batch; how many moved (None: unknown, try again)."""
        batch = min(self.task.rate or BATCH, BATCH)
        try:
            if self.task.target is None:
                return await self.service.redrive(self.task.dead, batch)
            return await self._move_to_target(batch)
        except (LeaseLost, StorageError) as exc:  # a race, or the store hiccuped: again
            log.info("move task %s/%d: %s", self.task.dead, self.task.seq, exc.message)
            return None

    async def _move_to_target(self, batch: int) -> int:
        """Each dead letter produced to the target in the step that completes it."""
        assert self.task.target is not None
        dead = self.task.dead
        moved = 0
        for item in await self.service.lease(dead, batch, lease_timeout=MOVE_LEASE_S):
            meta = redriven_meta(item.meta, dead, item.id)
            outputs = Outputs(self.task.target, [NewItem(item.payload, None, None, meta)])
            try:
                await self.service.complete(dead, [item.token], outputs)
                moved += 1
            except LeaseLost:
                continue  # leased again by another runner meanwhile: it moves it
        return moved

    async def _done(self) -> bool:
        """Nothing left to move: nothing ready, and nothing a previous runner leased
        still held (none in flight, or its leases have ended)."""
        if self.service.now_ms() >= self.wait_until_ms:
            return True
        return (await self.service.stats(self.task.dead)).in_flight == 0
