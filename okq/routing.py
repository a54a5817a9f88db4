"""The queue service in sequencer mode: each change goes to its shard's holder.

:class:`RoutedService` is a :class:`~okq.service.QueueService` whose state
changes (produce, lease, renew, complete, retry, give-back, purge, queue update
and delete) run on the node that holds the queue's sequencer role
(``okq.sequencer``): here when this node holds it, else forwarded to the holder.
The forwarding node checks what it can on its own first (batch sizes, tokens,
its long-poll admission), so bad input is refused where it arrived.

When the holder cannot be reached (its port refuses connections), the node
claims the role or learns the new holder, and after a few tries runs the change
itself: direct writes are always correct, only slower. A forward that was sent
and got no answer is not repeated here (it may have landed): the caller gets
``OutcomeUnknown`` (503) and retries, with idempotency keys for produce.

:meth:`RoutedService.run_forwarded` is what the holder runs for a forward.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from okq.engine import Engine, LeasedItem, QueueInfo
from okq.errors import InvalidRequest, StorageError
from okq.fleetwire import Unreachable
from okq.model import QueueConfig
from okq.publisher import NewItem
from okq.sequencer import Sequencer
from okq.service import Admission, Outputs, QueueService, Retry, RetryOutcome

log = logging.getLogger("okq.routing")

#: Forwards to a holder that refuses connections before the node writes directly.
ROUTE_TRIES = 3
#: Seconds a forwarded change (other than a long poll, which adds its wait) may take.
FORWARD_TIMEOUT = 75.0


def _items_out(items: Sequence[NewItem]) -> list[list[Any]]:
    return [[i.payload, i.enqueue_at_ms, i.key, i.meta] for i in items]


def _items_in(raw: list[list[Any]]) -> list[NewItem]:
    return [NewItem(bytes(p), at, key, meta) for p, at, key, meta in raw]


#: Every field of a leased item, in order: a forwarded lease carries them all.
_LEASED_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(LeasedItem)))


def _leased_out(items: Sequence[LeasedItem]) -> list[list[Any]]:
    """Leased items as plain lists (``dataclasses.asdict`` deep-copies: slow)."""
    return [list(_LEASED_FIELDS(i)) for i in items]


def _leased_in(raw: list[list[Any]]) -> list[LeasedItem]:
    return [LeasedItem(*fields) for fields in raw]


def _info_out(info: QueueInfo) -> dict[str, Any]:
    return {"name": info.name, "config": info.config.model_dump(),
            "created_ms": info.created_ms, "segments": info.segments,
            "produced": info.produced}


def _info_in(raw: dict[str, Any]) -> QueueInfo:
    return QueueInfo(name=raw["name"], config=QueueConfig(**raw["config"]),
                     created_ms=raw["created_ms"], segments=raw["segments"],
                     produced=raw["produced"])


class RoutedService(QueueService):
    """A queue service that runs each state change on its shard's sequencer."""

    def __init__(self, engine: Engine, sequencer: Sequencer,
                 admission: Admission | None = None) -> None:
        super().__init__(engine, admission)
        self.sequencer = sequencer
        engine.runtime.trusted = sequencer.holds
        sequencer.on_gain.append(self._gained)

    def _gained(self, shard: int) -> None:
        """A role was just taken: what this node cached of the shard's queues was
        written by others, so nothing of it is trusted until read again."""
        self.engine.runtime.forget_cached(lambda q: self.sequencer.holds(q))

    async def _routed(self, queue: str, op: str, args: Callable[[], dict[str, Any]],
                      local: Callable[[], Awaitable[Any]], timeout: float = FORWARD_TIMEOUT,
                      check: Callable[[], None] | None = None) -> Any:
        """Run the change where its shard's holder is. ``local`` runs it here (and
        checks its input itself); before a forward, ``check`` refuses bad input here
        and ``args`` builds the message, each once and only then."""
        seq = self.sequencer
        message: dict[str, Any] | None = None
        for _ in range(ROUTE_TRIES):
            try:
                holder = await seq.route(queue)
            except StorageError as exc:
                log.info("sequencer role unreadable (%s): writing directly", exc)
                break
            if holder is None:
                return await local()
            if message is None:
                if check is not None:
                    check()
                message = args()
            try:
                return await seq.forward(holder, op, queue, message, timeout)
            except Unreachable as exc:
                if not exc.refused:
                    break  # maybe alive but out of reach: write directly, claim nothing
                seq.holder_unreachable(queue, holder, f"is gone ({exc})")
        seq.count("direct")
        return await local()

    # -- the lease API, routed ------------------------------------------------------------
    async def produce(self, queue: str, items: Sequence[NewItem]) -> list[str]:
        ids: list[str] = await self._routed(
            queue, "produce", lambda: {"items": _items_out(items)},
            lambda: super(RoutedService, self).produce(queue, items),
            check=lambda: self.check_batch(len(items), "items"))
        return ids

    async def _lease(self, queue: str, batch_size: int, lease_timeout: float | None,
                     wait: float) -> list[LeasedItem]:
        raw = await self._routed(
            queue, "lease", lambda: {"n": batch_size, "lt": lease_timeout, "wait": wait},
            lambda: self._lease_here(queue, batch_size, lease_timeout, wait),
            timeout=wait + FORWARD_TIMEOUT)
        return raw if not raw or isinstance(raw[0], LeasedItem) else _leased_in(raw)

    async def _lease_here(self, queue: str, n: int, lt: float | None,
                          wait: float) -> list[LeasedItem]:
        return await self.engine.lease(queue, n, lease_timeout=lt, wait=wait)

    async def give_back(self, queue: str, items: Sequence[LeasedItem]) -> None:
        await self._routed(queue, "give_back",
                           lambda: {"items": _leased_out(items)},
                           lambda: super(RoutedService, self).give_back(queue, items))

    async def renew(self, queue: str, token: str, lease_timeout: float | None = None) -> int:
        deadline: int = await self._routed(
            queue, "renew", lambda: {"token": token, "lt": lease_timeout},
            lambda: super(RoutedService, self).renew(queue, token, lease_timeout),
            check=lambda: self.engine.check_tokens([token], queue, "token"))
        return deadline

    async def complete(self, queue: str, tokens: Sequence[str],
                       outputs: Outputs | None = None) -> list[str] | None:
        def check() -> None:
            self.check_batch(len(tokens), "tokens")
            self.check_tokens(tokens, queue, "tokens[{n}]")
            if outputs is not None and len(tokens) != 1:
                raise InvalidRequest("outputs need exactly one token", field="tokens")

        def args() -> dict[str, Any]:
            if outputs is None:
                return {"tokens": list(tokens)}
            return {"tokens": list(tokens), "oq": outputs.queue,
                    "oitems": _items_out(outputs.items)}

        ids: list[str] | None = await self._routed(
            queue, "complete", args,
            lambda: super(RoutedService, self).complete(queue, tokens, outputs), check=check)
        return ids

    async def retry(self, queue: str, retries: Sequence[Retry]) -> RetryOutcome:
        def check() -> None:
            self.check_batch(len(retries), "items")
            self.check_tokens([r.token for r in retries], queue, "items[{n}].token")

        raw = await self._routed(
            queue, "retry", lambda: {"r": [dataclasses.astuple(r) for r in retries]},
            lambda: super(RoutedService, self).retry(queue, retries), check=check)
        return raw if isinstance(raw, RetryOutcome) else RetryOutcome(**raw)

    async def purge(self, queue: str, not_within: float = 0.0) -> None:
        await self._routed(queue, "purge", lambda: {"nw": not_within},
                           lambda: super(RoutedService, self).purge(queue, not_within))

    async def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        raw = await self._routed(name, "update_queue", lambda: {"changes": changes},
                                 lambda: super(RoutedService, self).update_queue(name, **changes))
        return raw if isinstance(raw, QueueInfo) else _info_in(raw)

    async def delete_queue(self, name: str) -> None:
        await self._routed(name, "delete_queue", dict,
                           lambda: super(RoutedService, self).delete_queue(name))

    # -- the holder's side -----------------------------------------------------------------
    async def run_forwarded(self, op: str, queue: str, args: dict[str, Any],
                            client_gone: Callable[[], bool]) -> Any:
        """Run a change another node forwarded here; its result in wire form.

        It runs here whether or not this node holds the role now (a sender with an
        old view costs contention, not correctness); the reply says which."""
        if op == "produce":
            return await QueueService.produce(self, queue, _items_in(args["items"]))
        if op == "lease":
            items = await self._lease_here(queue, args["n"], args["lt"], args["wait"])
            if items and client_gone():  # the forwarding node's caller went away
                await QueueService.give_back(self, queue, items)
                items = []
            return _leased_out(items)
        if op == "give_back":
            return await QueueService.give_back(self, queue, _leased_in(args["items"]))
        if op == "renew":
            return await QueueService.renew(self, queue, args["token"], args["lt"])
        if op == "complete":
            outputs = None
            if "oq" in args:
                outputs = Outputs(args["oq"], _items_in(args["oitems"]))
            return await QueueService.complete(self, queue, args["tokens"], outputs)
        if op == "retry":
            outcome = await QueueService.retry(self, queue, [Retry(*r) for r in args["r"]])
            return dataclasses.asdict(outcome)
        return await self._run_admin(op, queue, args)

    async def _run_admin(self, op: str, queue: str, args: dict[str, Any]) -> Any:
        if op == "purge":
            return await QueueService.purge(self, queue, float(args.get("nw", 0.0)))
        if op == "update_queue":
            return _info_out(await QueueService.update_queue(self, queue, **args["changes"]))
        if op == "delete_queue":
            return await QueueService.delete_queue(self, queue)
        raise InvalidRequest(f"unknown forwarded operation {op!r}", field="op")
