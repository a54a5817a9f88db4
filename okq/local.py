"""The pipeline's last layer: each operation run on this node's engine.

What is an operation's own input rule rather than storage lives here, once per
path (a forwarded operation is checked on the holder only):

- a token repeated in one batch is refused (it names one delivery and would be
  counted twice);
- outputs go with exactly one token;
- a retry batch: every token verified before any is released, each retry applied
  on its own, the lost leases reported per item (``RetryOutcome``);
- a give-back releases each item uncounted; one that fails is left to its lease
  timeout.

The engine checks the rest (batch sizes, ranges, tokens' signatures) itself, so
library mode gets the same answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from okq import ops
from okq.engine import Engine
from okq.errors import InvalidRequest, LeaseLost, OkqError, QueueNotFound
from okq.limits import check_batch

log = logging.getLogger("okq.service")

R = TypeVar("R")


def check_repeats(tokens: Sequence[str], pattern: str) -> None:
    """InvalidRequest when a token appears twice (``pattern`` names the n-th)."""
    if len(set(tokens)) == len(tokens):
        return  # the commonest case, found without a loop here
    seen: dict[str, int] = {}
    for n, token in enumerate(tokens):
        if token in seen:
            here, first = pattern.format(n=n), pattern.format(n=seen[token])
            raise InvalidRequest(f"{here} repeats {first}", field=here)
        seen[token] = n


class Local:
    """Runs operations on one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = e = engine
        self._run: dict[type[Any], Callable[[Any], Awaitable[Any]]] = {
            ops.Produce: lambda op: e.produce(op.queue, op.items),
            ops.Lease: lambda op: e.lease(op.queue, op.batch_size,
                                          lease_timeout=op.lease_timeout, wait=op.wait),
            ops.Renew: lambda op: e.renew(op.token, op.lease_timeout, queue=op.queue),
            ops.FirstLeased: lambda op: e.first_leased(op.token, queue=op.queue),
            ops.Complete: self._complete,
            ops.RetryItems: self._retry,
            ops.GiveBack: self._give_back,
            ops.CheckTokens: self._check_tokens,
            ops.Purge: lambda op: e.purge(op.queue, op.not_within),
            ops.CreateQueue: lambda op: e.create_queue(op.queue, op.config),
            ops.GetQueue: lambda op: e.get_queue(op.queue, op.max_age),
            ops.UpdateQueue: lambda op: e.update_queue(op.queue, **op.changes),
            ops.DeleteQueue: lambda op: e.delete_queue(op.queue),
            ops.QueueNames: lambda op: e.list_queues(),
            ops.QueueInfos: self._infos,
            ops.Stats: lambda op: e.stats(op.queue),
            ops.Browse: lambda op: e.browse(op.queue, start_after=op.start_after,
                                            limit=op.limit),
            ops.Redrive: lambda op: e.redrive(op.queue, op.limit, op.destination),
            ops.StartMoveTask: lambda op: e.move_tasks.create(op.task),
            ops.MoveTasksOf: lambda op: e.move_tasks.of_queue(op.queue),
            ops.UpdateMoveTask: lambda op: e.move_tasks.update(op.queue, op.seq, op.apply,
                                                               e.clock.now_ms),
            ops.ActiveMoveTasks: lambda op: e.move_tasks.active(),
        }

    def handle(self, op: ops.Op[R], ctx: ops.Context) -> Awaitable[R]:
        return cast(Awaitable[R], self._run[type(op)](op))

    async def _complete(self, op: ops.Complete) -> list[str] | None:
        check_batch(len(op.tokens), self.engine.opts.max_batch, "tokens")  # 413 comes first
        check_repeats(op.tokens, "tokens[{n}]")
        if op.outputs is None:
            await self.engine.complete(op.tokens, queue=op.queue)
            return None
        if len(op.tokens) != 1:
            raise InvalidRequest("outputs need exactly one token", field="tokens")
        return await self.engine.complete_and_produce(op.tokens[0], op.outputs.queue,
                                                      op.outputs.items, queue=op.queue)

    async def _retry(self, op: ops.RetryItems) -> ops.RetryOutcome:
        check_batch(len(op.retries), self.engine.opts.max_batch, "items")
        tokens = [r.token for r in op.retries]
        check_repeats(tokens, "items[{n}].token")
        self.engine.check_tokens(tokens, op.queue, "items[{n}].token")
        outcome = ops.RetryOutcome(total=len(op.retries))
        for n, r in enumerate(op.retries):
            try:
                dead = await self.engine.retry(r.token, retry_at_ms=r.retry_at_ms,
                                               dead=r.dead, error=r.error, queue=op.queue,
                                               field_name=f"items[{n}].token",
                                               count_attempt=r.count_attempt)
                outcome.retried += 1
                outcome.dead_lettered += dead
            except LeaseLost as exc:
                state = exc.details.get("state")
                outcome.failed.append({"index": n, "reason": exc.message,
                                       **({"state": state} if state else {})})
        return outcome

    async def _give_back(self, op: ops.GiveBack) -> None:
        for item in op.items:
            try:
                await self.engine.retry(item.token, queue=op.queue, count_attempt=False,
                                        error="the lease request's client went away")
            except OkqError as exc:
                log.info("could not give back %s after its client went away: %s", item.id, exc)

    async def _check_tokens(self, op: ops.CheckTokens) -> None:
        self.engine.check_tokens(op.tokens, op.queue, op.pattern)
        check_repeats(op.tokens, op.pattern)

    async def _infos(self, op: ops.QueueInfos) -> list[Any]:
        infos = []
        for name in await self.engine.list_queues():
            try:
                infos.append(await self.engine.get_queue(name))
            except QueueNotFound:
                continue
        return infos
