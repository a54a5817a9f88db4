"""Operations on deliveries, named by their signed lease tokens.

Each is one cell change on the item's lease object (okq/leases.py); a
retry that moves the item to the dead-letter path hands it to the finishers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from okq import leases as tr
from okq.errors import (
    LeaseLost,
    OkqError,
)
from okq.keys import (
    item_id,
)
from okq.leases import LEASED, LeaseObject
from okq.limits import check_lease_timeout, check_time_ms
from okq.model import (
    new_request_id,
)
from okq.publisher import NewItem
from okq.tokens import Delivery, TokenSigner, by_lease_object

if TYPE_CHECKING:
    from okq.finishers import Finishers
    from okq.runtime import QueueRuntime, Runtime


T = TypeVar("T")


class Deliveries:
    """What a holder of a lease token may do: renew, complete, retry, and complete
    with outputs. Every token is verified (signature, namespace, queue) first."""

    def __init__(self, rt: Runtime, finishers: Finishers, signer: TokenSigner) -> None:
        self.rt = rt
        self.finishers = finishers
        self.signer = signer

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
        d, q = self.delivery(token, queue=queue)
        batch = self.rt.new_items(items, "outputs.items")
        outq = self.rt.queue(out_queue, "outputs.queue_name")
        await self.rt.manifest(outq, 60)
        sm = await outq.publisher.write_segment(batch)
        out = [out_queue, sm.id, sm.count, sm.created_ms, sm.size]
        cell = self.rt.lease_cell(q, d.segment)
        recorded: list[Any] | None = await cell.update(
            lambda o, now: tr.complete(o, d.index, d.v, now, out)
        )
        if recorded is None:
            return []  # completed earlier without outputs
        sm = await self.rt.segment_meta(q, d.segment)
        await self.finishers.finish_outputs(q, sm, d.index, d.v, recorded)
        return [item_id(recorded[1], n) for n in range(recorded[2])]

    def delivery(
        self, token: str, field_name: str = "token", queue: str | None = None
    ) -> tuple[Delivery, QueueRuntime]:
        return self.deliveries([token], queue,
                               field_name.replace("{", "{{").replace("}", "}}"))[0]

    def deliveries(self, tokens: Sequence[str], queue: str | None,
                   field_pattern: str) -> list[tuple[Delivery, QueueRuntime]]:
        """What each token names, with its queue: every token verified before any is
        used (``field_pattern`` has ``{n}``)."""
        out = []
        q: QueueRuntime | None = None
        for d in self.signer.verify_many(tokens, self.rt.ns, queue, field_pattern):
            if q is None or q.name != d.queue:
                q = self.rt.queue(d.queue)
            out.append((d, q))
        return out

    def check_tokens(self, tokens: Sequence[str], queue: str, field_pattern: str) -> None:
        """Verify every token before acting on any (``field_pattern`` has ``{n}``)."""
        self.signer.verify_many(tokens, self.rt.ns, queue, field_pattern)

    async def renew(
        self, token: str, lease_timeout: float | None = None, *, queue: str | None = None
    ) -> int:
        """Extend a lease from now; returns the new deadline (ms)."""
        d, q = self.delivery(token, queue=queue)
        check_lease_timeout(lease_timeout)
        lease_ms = (
            int(lease_timeout * 1000)
            if lease_timeout
            else (await self.rt.manifest(q, self.rt.opts.config_max_age)).config.lease_ms
        )
        cell = self.rt.lease_cell(q, d.segment)
        deadline: int = await cell.update(
            lambda o, now: tr.renew(o, d.index, d.v, now, lease_ms)
        )
        return deadline

    async def first_leased(self, token: str, *, queue: str | None = None) -> int | None:
        """When the token's item was first leased (ms), while the token's delivery is
        current; None when it is not (a change through the token then says why) or
        the state predates the record. A cached lease object answers when it shows
        the delivery: an item's first lease time never changes once written."""
        d, q = self.delivery(token, queue=queue)
        cell = self.rt.lease_cell(q, d.segment)
        for max_age_ms in (int(self.rt.opts.lease_state_max_age * 1000), 0):
            obj = await cell.read(max_age_ms)
            st = obj.items.get(d.index) if obj is not None else None
            if st is not None and st.s == LEASED and st.v == d.v:
                return st.first
        return None

    async def complete(self, tokens: Sequence[str], *, queue: str | None = None) -> None:
        """Complete deliveries. Each token is applied on its own; if any lease was
        lost, LeaseLost is raised after the others landed, naming the failures."""
        self.rt.check_batch(len(tokens), "tokens")
        ds = self.signer.verify_many(tokens, self.rt.ns, queue, "tokens[{n}]")
        # One change per lease object: a batch leased together completes in one step.
        groups = by_lease_object(ds)
        queues: dict[str, QueueRuntime] = {}
        for name, _, _, _ in groups:
            if name not in queues:
                queues[name] = self.rt.queue(name)
        answers = await _all_answers([
            self.rt.lease_cell(queues[name], segment).update(_completions(members))
            for name, segment, _, members in groups])
        results: list[object] = [None] * len(ds)
        refused = False
        for (_, _, at, _), answer in zip(groups, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer
            if answer.count(None) != len(answer):
                refused = True
                for n, r in zip(at, answer, strict=True):
                    results[n] = r
        for q in queues.values():
            if q.waiters:
                m = q.manifest.view()
                if m is not None and m.config.fifo:
                    self.rt.wake(q)  # a group held by what was completed may be free now
        if refused:
            await self._refused([(d, queues[d.queue]) for d in ds], results)

    async def _refused(self, parsed: list[tuple[Delivery, QueueRuntime]],
                       results: list[object]) -> None:
        """Raise what a batch of completions was refused, naming each refusal."""
        failed: list[dict[str, Any]] = []
        for n, ((d, q), r) in enumerate(zip(parsed, results, strict=True)):
            if isinstance(r, LeaseLost):
                reason = r.message
                if r.details.get("state") == "never leased" and await self.rt.gone(q, d.segment):
                    reason = ("the item is no longer in the queue: its segment was compacted "
                              "away (completed or dropped earlier) or purged")
                failed.append({"index": n, "id": item_id(d.segment, d.index), "reason": reason})
            elif isinstance(r, BaseException):
                raise r
        if failed:
            raise LeaseLost(
                f"{len(failed)} of {len(parsed)} completions refused: the lease was lost",
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
    ) -> bool:
        """Release a delivery: ready again at ``retry_at`` (now by default), at the
        back of the line; or dead-lettered when ``dead`` or out of attempts. True when
        it was dead-lettered (moved to the dead-letter queue, or dropped when the
        queue has none)."""
        d, q = self.delivery(token, field_name, queue)
        check_time_ms(retry_at_ms, "retry_at")
        err = error[:4096] if error else None
        cell = self.rt.lease_cell(q, d.segment)
        rq = new_request_id()
        m, fresh = await self.rt.manifest_read(q, self.rt.opts.config_max_age)
        cfg = m.config

        def release(o: LeaseObject, now: int) -> object:
            st = o.items.get(d.index)
            if not fresh and not dead and cfg.max_attempts and st is not None and st.rq != rq:
                attempts = tr.retry_attempts(tr.current(o, d.index, d.v), count_attempt)
                if attempts >= cfg.max_attempts:
                    raise _StaleConfig("out of attempts by a cached config")
            return tr.retry(o, d.index, d.v, now, retry_at_ms, dead, err, cfg.max_attempts,
                            count_attempt, rq)

        try:
            to_dead: bool = await cell.update(release)
        except _StaleConfig:
            # Dropping or dead-lettering the item is decided on settings read now.
            cfg, fresh = (await self.rt.manifest(q, 0)).config, True
            to_dead = await cell.update(release)
        if to_dead:
            sm = await self.rt.segment_meta(q, d.segment)
            await self.finishers.help_dead(q, sm, d.index, cfg if fresh else None)
        self.rt.wake(q)
        return to_dead


async def _all_answers(calls: list[Coroutine[Any, Any, T]]) -> list[T | BaseException]:
    """``asyncio.gather(*calls, return_exceptions=True)``, without a task for a call
    alone (the commonest case: one lease's tokens)."""
    if len(calls) != 1:
        return await asyncio.gather(*calls, return_exceptions=True)
    try:
        return [await calls[0]]
    except Exception as exc:
        return [exc]


def _completions(ds: list[Delivery]) -> Callable[[LeaseObject, int], object]:
    """One change completing several deliveries of one lease object
    (``okq.leases.complete_many``)."""
    return lambda obj, now: tr.complete_many(obj, ds)


class _StaleConfig(OkqError):
    """A change that would drop or dead-letter an item by a cached config: the
    caller reads the config afresh and applies the change again."""
