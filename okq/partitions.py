"""The pipeline's spread layer: one queue over several partitions.

A queue created (or updated) with ``partitions: P`` keeps its items in P
partitions, each a queue of the engine's own: partition 0 under the queue's name,
partition ``p`` under ``{queue}~{p}`` (``okq.keys.partition_name``; no name a user
gives holds ``~``). Each has its own manifest, segments, lease objects and
sequencer shard (``okq.sequencer.shard_of`` puts partition ``p`` ``p`` shards after
partition 0), so different nodes hold different partitions of one queue and a
fleet adds throughput to it. Users name only the queue; this layer turns each
operation on it into operations on its partitions (docs/DESIGN.md, "Partitions"):

- produce (only into partitions not ``read_only``; those are drained by leases):
  a batch without idempotency keys goes whole to one partition: one this
  node holds (the one with the fewest items waiting to be published here), else
  one whose holder this node does not know yet (it claims the role or learns the
  holder), else the next in turn. Items with a message group go to the partition
  their group hashes to, so that a group stays in one partition, in order; other
  items with keys go to the partition their key hashes to (a jump hash: raising P
  moves 1/P of the keys), so deduplication stays exact (for a key always produced
  with the same group); items with neither in such a batch go with its first routed
  item. An ordered (fifo) queue's partitions never change, so neither does a
  group's partition. A batch
  whose items land in several partitions is published in each; if one of those
  fails after another landed, the produce answers ``outcome_unknown``;
- lease: partitions this node holds first, then the others, each in turn from a
  rotating start; every ``FAIR_EVERY``-th lease of a queue starts from the
  rotation over all partitions, so that no partition starves, whoever holds it.
  A long poll looks at every partition, then waits for a wake-up (a produce into
  any partition through this node or into one it holds) or its next look
  (``poll_interval``, doubling to ``idle_poll_max`` while idle);
- renew, complete, retry, give-back, token checks: each token goes to the
  partition it names (a token carries its partition's name, under its MAC); every
  token of a batch is verified before any is acted on;
- purge, stats, browse, redrive, info, listing, update and delete see the queue
  whole. A queue's ``partitions`` is read from partition 0's manifest, cached for
  ``COUNT_MAX_AGE`` seconds. Partition 0 is created last and deleted last, so a
  queue that is listed has every partition it counts, and a partition found
  already there is kept, never emptied.

A forward from another node is a partition's already, and an operation on a queue
of one partition passes straight through.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar, cast

import msgpack

from okq import ops
from okq.admin import QueueInfo
from okq.engine import Engine
from okq.errors import (
    InvalidRequest,
    LeaseLost,
    OkqError,
    OutcomeUnknown,
    QueueExists,
    QueueInUse,
    QueueNotFound,
)
from okq.keys import PARTITION_SEP, partition_name, split_partition
from okq.leases import LeasedItem
from okq.limits import check_batch
from okq.local import check_repeats
from okq.manifest_ops import merged_config
from okq.model import QueueConfig, group_of
from okq.publisher import NewItem, Place, Produced
from okq.sequencer import Sequencer
from okq.tokens import shared_head
from okq.views import BrowsedItem, QueueStats

log = logging.getLogger("okq.partitions")

R = TypeVar("R")

#: Seconds a queue's partition count is taken from this node's cache: a raise
#: counts on every node within this (plus the manifest cache's own age).
COUNT_MAX_AGE = 5.0
#: Every this many leases of a queue, one starts from the rotation over all its
#: partitions rather than from those this node holds.
FAIR_EVERY = 16
#: Put before a message group's name when it is hashed to its partition, so that a
#: group and an idempotency key of the same name may land apart.
GROUP_HASH_PREFIX = "group:"
#: Token heads remembered (a head names a segment's partition).
_HEADS_MAX = 8192


class _Count(NamedTuple):
    """What the spread layer keeps of a queue's config, until ``until`` (monotonic)."""

    partitions: int
    read_only: frozenset[int]
    until: float
    fifo: bool


def jump_hash(key: int, buckets: int) -> int:
    """The bucket of ``key`` among ``buckets`` (Lamping and Veach's jump consistent
    hash): going from n to n + 1 buckets moves 1/(n + 1) of the keys, all to the new one."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def key_partition(key: str, partitions: int) -> int:
    """The partition an idempotency key belongs to."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return jump_hash(int.from_bytes(digest, "big"), partitions)


def token_queue(token: str) -> str | None:
    """The queue (partition) a token names, read without checking its MAC (the
    engine checks it where the token is used); None when it is no token."""
    head = token.partition(".")[0]
    try:
        raw = msgpack.unpackb(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except Exception:  # anything at all: not a token; the engine says why
        return None
    if isinstance(raw, list) and len(raw) >= 4 and isinstance(raw[2], str):
        return raw[2]
    return None



def _renumbered(exc: BaseException, where: Sequence[int]) -> BaseException:
    """A partition's error about its n-th entry, about the entry it was in the batch."""
    if isinstance(exc, OkqError):
        field = exc.details.get("field")
        if isinstance(field, str) and "[" in field:
            name, _, rest = field.partition("[")
            index, _, tail = rest.partition("]")
            if index.isdigit() and int(index) < len(where):
                new = f"{name}[{where[int(index)]}]{tail}"
                exc.details["field"] = new
                exc.message = exc.message.replace(field, new)
                exc.args = (exc.message,)
    return exc


class Spread:
    """Operations on a queue turned into operations on its partitions."""

    def __init__(self, inner: ops.Layer, engine: Engine,
                 sequencer: Sequencer | None = None, default_partitions: int = 1) -> None:
        self.inner = inner
        self.default = default_partitions  # of a queue created without saying
        self.engine = engine
        self.sequencer = sequencer
        self._counts: dict[str, _Count] = {}  # queue -> what its config says, for a while
        self._heads: dict[str, str | None] = {}  # token head -> the queue it names
        self._turns: dict[str, int] = {}  # queue -> operations that took a turn
        self._woken: dict[str, asyncio.Event] = {}  # queue -> set on a wake-up
        engine.runtime.on_wake.append(self._wake)
        engine.runtime.route = self._route
        self._spread: dict[type[Any], Callable[[Any, ops.Context, int], Awaitable[Any]]] = {
            ops.Produce: self._produce, ops.Lease: self._lease, ops.Purge: self._purge,
            ops.Stats: self._stats, ops.Browse: self._browse, ops.Redrive: self._redrive,
            ops.GetQueue: self._get, ops.DeleteQueue: self._delete,
        }
        self._by_token: dict[type[Any], Callable[[Any, ops.Context], Awaitable[Any]]] = {
            ops.Renew: self._one_token, ops.FirstLeased: self._one_token,
            ops.Complete: self._complete, ops.RetryItems: self._retry,
            ops.GiveBack: self._give_back, ops.CheckTokens: self._check_tokens,
        }

    # -- dispatch -----------------------------------------------------------------------
    def handle(self, op: ops.Op[R], ctx: ops.Context) -> Awaitable[R]:
        if ctx.forwarded:  # another node's spread chose the partition
            return self.inner.handle(op, ctx)
        if PARTITION_SEP in op.queue:
            self._refuse(op)
        kind = type(op)
        by_token = self._by_token.get(kind)
        if by_token is not None:
            return cast(Awaitable[R], by_token(op, ctx))
        spread = self._spread.get(kind)
        if spread is not None:
            n = self._cached(op.queue)
            if n == 1:
                return self.inner.handle(op, ctx)
            return cast(Awaitable[R], self._counted(spread, op, ctx, n))
        if kind is ops.CreateQueue:
            return cast(Awaitable[R], self._create(cast(ops.CreateQueue, op), ctx))
        if kind is ops.UpdateQueue:
            return cast(Awaitable[R], self._update(cast(ops.UpdateQueue, op), ctx))
        if kind is ops.QueueNames:
            return cast(Awaitable[R], self._names(cast(ops.QueueNames, op), ctx))
        if kind is ops.QueueInfos:
            return cast(Awaitable[R], self._infos(cast(ops.QueueInfos, op), ctx))
        return self.inner.handle(op, ctx)

    @staticmethod
    def _refuse(op: ops.Op[Any]) -> None:
        """A caller names a queue, never one of its partitions (the engine's own names)."""
        for queue, field in op.named():
            if PARTITION_SEP in queue:
                raise InvalidRequest(f"{field} must name a queue, not a partition of one: "
                                     f"{queue!r}", field=field)

    async def _counted(self, spread: Callable[[Any, ops.Context, int], Awaitable[Any]],
                       op: ops.Op[Any], ctx: ops.Context, n: int | None) -> Any:
        if n is None:
            n = await self.count(op.queue)
        if n == 1:
            return await self.inner.handle(op, ctx)
        return await spread(op, ctx, n)

    # -- the partition count ------------------------------------------------------------
    def _cached(self, queue: str) -> int | None:
        hit = self._counts.get(queue)
        if hit is not None and hit.until > time.monotonic():
            return hit.partitions
        return None

    async def count(self, queue: str, max_age: float = COUNT_MAX_AGE) -> int:
        """The queue's partitions, read no longer than ``max_age`` ago; 1 for a queue
        that does not exist (the operation then fails as on any missing queue)."""
        if max_age > 0:
            cached = self._cached(queue)
            if cached is not None:
                return cached
        try:
            info: QueueInfo = await self.inner.handle(ops.GetQueue(queue, max_age), ops.SYSTEM)
        except QueueNotFound:
            return 1
        self._note(queue, info.config)
        return info.config.partitions

    def _note(self, queue: str, config: QueueConfig) -> None:
        self._counts[queue] = _Count(config.partitions, frozenset(config.read_only),
                                     time.monotonic() + COUNT_MAX_AGE, config.fifo)

    def _open(self, queue: str, n: int) -> list[int]:
        """The partitions of ``queue`` (of ``n``) that take new items."""
        hit = self._counts.get(queue)
        ro = hit.read_only if hit is not None else None
        return [p for p in range(n) if p not in ro] if ro else list(range(n))

    def _key_partition(self, queue: str, n: int, key: str) -> int:
        """The partition a key goes to: one of those taking new items."""
        open_ = self._open(queue, n)
        return open_[key_partition(key, len(open_))]

    async def _route(self, queue: str, meta: dict[str, Any] | None) -> str:
        """The engine queue an item the engine moves into ``queue`` (a redrive) goes
        to: its message group's partition, else partition 0 (``queue`` itself)."""
        group = group_of(meta)
        if group is None or PARTITION_SEP in queue:
            return queue
        n = await self.count(queue)
        return queue if n == 1 else partition_name(queue, self._group_partition(queue, n, group))

    def _group_partition(self, queue: str, n: int, group: str) -> int:
        """The partition a message group goes to: one of those taking new items."""
        return self._key_partition(queue, n, GROUP_HASH_PREFIX + group)

    def _item_partition(self, queue: str, n: int, item: NewItem) -> int | None:
        """The partition an item must go to: its message group's, so that a group stays
        in one partition, in order; else its idempotency key's; else None (any)."""
        group = group_of(item.meta)
        if group is not None:
            return self._group_partition(queue, n, group)
        return None if item.key is None else self._key_partition(queue, n, item.key)

    def _check_groups_together(self, outputs: ops.Outputs, routed: list[int | None],
                               p: int) -> None:
        """On an ordered queue a completion's outputs, published in one partition, may
        not hold an item whose group belongs in another: it would be out of order."""
        hit = self._counts.get(outputs.queue)
        if hit is None or not hit.fifo:
            return
        for index, (item, at) in enumerate(zip(outputs.items, routed, strict=True)):
            if at is not None and at != p and group_of(item.meta) is not None:
                field = f"outputs.items[{index}].group"
                raise InvalidRequest(
                    f"{field}: a completion's outputs are published in one partition of "
                    f"{outputs.queue!r}, and this group belongs in another; give its "
                    "outputs one group, or produce the others separately", field=field)

    def _turn(self, queue: str) -> int:
        n = self._turns.get(queue, -1) + 1
        self._turns[queue] = n
        return n

    def _holds(self, name: str) -> bool:
        return self.sequencer is not None and self.sequencer.holds(name)

    # -- produce ------------------------------------------------------------------------
    def _target(self, queue: str, n: int) -> int:
        """The partition a batch without keys goes to (the module's doc says which)."""
        open_ = self._open(queue, n)
        start = self._turn(queue)
        order = [open_[(start + i) % len(open_)] for i in range(len(open_))]
        seq = self.sequencer
        if seq is None:
            return order[0]
        own = [p for p in order if seq.holds(partition_name(queue, p))]
        if own:
            pending = self.engine.pending_produce
            return min(own, key=lambda p: pending(partition_name(queue, p)))
        for p in order:
            if not seq.known(partition_name(queue, p)):
                return p
        return order[0]

    async def _produce(self, op: ops.Produce, ctx: ops.Context, n: int) -> list[str]:
        keyed = [self._item_partition(op.queue, n, i) for i in op.items]
        first = next((p for p in keyed if p is not None), None)
        if first is None:
            to = self._target(op.queue, n)
            return await self.inner.handle(ops.Produce(partition_name(op.queue, to), op.items),
                                           ctx)
        groups: dict[int, list[int]] = {}
        for index, at in enumerate(keyed):
            groups.setdefault(first if at is None else at, []).append(index)
        if len(groups) == 1:
            return await self.inner.handle(ops.Produce(partition_name(op.queue, first),
                                                       op.items), ctx)
        parts = list(groups.items())
        results = await asyncio.gather(*(
            self.inner.handle(ops.Produce(partition_name(op.queue, p),
                                          [op.items[i] for i in where]), ctx)
            for p, where in parts), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            if len(failed) == len(results):
                raise failed[0]
            raise OutcomeUnknown(
                "the batch's items went to several partitions of the queue and some were "
                f"published, some not ({failed[0]}); retry it: its idempotency keys keep "
                "what landed from landing twice", queue=op.queue)
        ids = [""] * len(op.items)
        sequence: list[Place | None] = [None] * len(op.items)
        duplicates = 0
        for (_, where), got in zip(parts, results, strict=True):
            got = cast(list[str], got)
            for i, item_id in zip(where, got, strict=True):
                ids[i] = item_id
            if isinstance(got, Produced):
                duplicates += got.duplicates
                for i, place in zip(where, got.sequence or [None] * len(where), strict=True):
                    sequence[i] = place
        return Produced(ids, duplicates, sequence)

    # -- lease --------------------------------------------------------------------------
    def _wake(self, name: str) -> None:
        """Items of ``name`` (a partition, maybe) became leasable through this process."""
        event = self._woken.get(split_partition(name)[0]) if self._woken else None
        if event is not None:
            event.set()

    def _lease_order(self, queue: str, n: int) -> list[int]:
        turn = self._turn(queue)
        order = [(turn + i) % n for i in range(n)]
        if self.sequencer is None or turn % FAIR_EVERY == FAIR_EVERY - 1:
            return order
        own = [p for p in order if self._holds(partition_name(queue, p))]
        return own + [p for p in order if p not in own] if own else order

    async def _lease(self, op: ops.Lease, ctx: ops.Context, n: int) -> list[LeasedItem]:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + op.wait
        opts = self.engine.opts
        pause = opts.poll_interval
        woken = self._woken.setdefault(op.queue, asyncio.Event()) if op.wait > 0 else None
        while True:
            if woken is not None:
                woken.clear()
            items = await self._lease_once(op, ctx, n)
            left = give_up - loop.time()
            if items or woken is None or left <= 0 or ctx.gone() or self.engine.runtime.stopping:
                return items
            try:
                await asyncio.wait_for(woken.wait(), min(pause, left, self._due(op.queue, n)))
                pause = opts.poll_interval
            except TimeoutError:
                pause = min(pause * 2, opts.idle_poll_max)

    def _due(self, queue: str, n: int) -> float:
        """Seconds until the first item not yet due of a partition whose lease walk ran
        here becomes leasable (inf when none is known): a long poll looks again then,
        as a queue's own does. One in a partition leased through another node is seen
        at the next look."""
        now = self.engine.clock.now_ms()
        dues = [d for p in range(n)
                if (d := self.engine.next_ready_ms(partition_name(queue, p))) is not None
                and d > now]  # one past is a walk's of long ago (or another node's lease)
        return (min(dues) - now) / 1000 if dues else float("inf")

    async def _lease_once(self, op: ops.Lease, ctx: ops.Context, n: int) -> list[LeasedItem]:
        out: list[LeasedItem] = []
        for p in self._lease_order(op.queue, n):
            want = op.batch_size - len(out)
            sub = ops.Lease(partition_name(op.queue, p), want, op.lease_timeout, 0.0)
            try:
                got: list[LeasedItem] = await self.inner.handle(sub, ctx)
                out += got
            except OkqError as exc:
                if not out:
                    raise
                log.info("partition %s of %s not leased from: %s", p, op.queue, exc)
                return out  # what was leased stays leased: its tokens go back
            if len(out) >= op.batch_size:
                break
        return out

    # -- tokens -------------------------------------------------------------------------
    def _token_queue(self, token: object) -> str | None:
        if not isinstance(token, str):
            return None
        head = token.partition(".")[0]
        try:
            return self._heads[head]
        except KeyError:
            pass
        if len(self._heads) >= _HEADS_MAX:
            self._heads.clear()
        found: str | None = token_queue(head)
        self._heads[head] = found
        return found

    def _partitions(self, queue: str, tokens: Sequence[str]) -> dict[str, list[int]] | None:
        """The entries of ``tokens`` by the partition of ``queue`` each names; None
        when all name the queue itself (or none names a partition of it)."""
        prefix = queue + PARTITION_SEP
        shared = shared_head(tokens)
        if shared is not None:  # a batch's tokens of one segment, the commonest case
            name = self._token_queue(tokens[0])
            if name is None or not name.startswith(prefix):
                return None
            whose = name if split_partition(name)[0] == queue else queue
            return {whose: list(range(len(tokens)))}
        names: list[str | None] = []
        head, name = "", None  # a batch's tokens of one segment share their head
        for t in tokens:
            if not (head and isinstance(t, str) and t.startswith(head)):
                name = self._token_queue(t)
                head = t.partition(".")[0] + "." if isinstance(t, str) else ""
            names.append(name)
        if not any(name is not None and name.startswith(prefix) for name in names):
            return None
        groups: dict[str, list[int]] = {}
        for index, name in enumerate(names):
            ok = name is not None and name.startswith(prefix) \
                and split_partition(name)[0] == queue
            groups.setdefault(name if ok and name is not None else queue, []).append(index)
        return groups

    async def _one_token(self, op: ops.Renew | ops.FirstLeased, ctx: ops.Context) -> Any:
        name = self._token_queue(op.token)
        if name is not None and name != op.queue and split_partition(name)[0] == op.queue:
            op = dataclasses.replace(op, queue=name)
        return await self.inner.handle(op, ctx)

    async def _verify(self, groups: dict[str, list[int]], tokens: Sequence[str],
                      pattern: str, ctx: ops.Context) -> None:
        """Every token checked against the partition it names, before any is used."""
        for name, where in groups.items():
            for i in where:
                field = pattern.format(n=i).replace("{", "{{").replace("}", "}}")
                await self.inner.handle(ops.CheckTokens(name, [tokens[i]], field), ctx)

    async def _gathered(self, calls: list[tuple[list[int], Awaitable[Any]]]) -> list[Any]:
        """Results of sub-operations run at once; the first failure (renumbered to
        the batch's entries) raised once all are done."""
        results = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        for (where, _), result in zip(calls, results, strict=True):
            if isinstance(result, BaseException):
                raise _renumbered(result, where)
        return list(results)

    def _complete(self, op: ops.Complete, ctx: ops.Context) -> Awaitable[list[str] | None]:
        groups = self._partitions(op.queue, op.tokens)
        if groups is None and op.outputs is None:
            return self.inner.handle(op, ctx)
        return self._complete_spread(op, ctx, groups)

    async def _complete_spread(self, op: ops.Complete, ctx: ops.Context,
                               groups: dict[str, list[int]] | None) -> list[str] | None:
        outputs = op.outputs
        if outputs is not None:
            if PARTITION_SEP in outputs.queue:
                self._refuse(op)
            n = await self.count(outputs.queue)
            if n > 1:  # one partition of the outputs' queue, in the completion's step
                routed = [self._item_partition(outputs.queue, n, i) for i in outputs.items]
                p = next((p for p in routed if p is not None), None)
                if p is None:
                    p = self._target(outputs.queue, n)
                self._check_groups_together(outputs, routed, p)
                outputs = ops.Outputs(partition_name(outputs.queue, p), outputs.items)
        if groups is None:
            return await self.inner.handle(ops.Complete(op.queue, op.tokens, outputs), ctx)
        if len(groups) == 1:  # one partition's: its engine checks the batch as a queue's
            return await self.inner.handle(ops.Complete(next(iter(groups)), op.tokens, outputs),
                                           ctx)
        check_batch(len(op.tokens), self.engine.opts.max_batch, "tokens")
        check_repeats(op.tokens, "tokens[{n}]")
        if outputs is not None:
            raise InvalidRequest("outputs need exactly one token", field="tokens")
        await self._verify(groups, op.tokens, "tokens[{n}]", ctx)
        parts = list(groups.values())
        results = await asyncio.gather(*(
            self.inner.handle(ops.Complete(name, [op.tokens[i] for i in where]), ctx)
            for name, where in groups.items()), return_exceptions=True)
        failed: list[dict[str, Any]] = []
        for where, result in zip(parts, results, strict=True):
            if isinstance(result, LeaseLost):  # each partition's lost leases, in batch order
                failed += [{**f, "index": where[f["index"]]}
                           for f in result.details.get("failed", [])]
            elif isinstance(result, BaseException):
                raise _renumbered(result, where)
        if failed:
            failed.sort(key=lambda f: int(f["index"]))
            raise LeaseLost(f"{len(failed)} of {len(op.tokens)} completions refused: the "
                            "lease was lost", failed=failed)
        return None

    def _by_tokens(self, op: ops.Op[R], ctx: ops.Context, tokens: Sequence[str],
                   spread: Callable[[dict[str, list[int]]], Awaitable[R]]) -> Awaitable[R]:
        """``op`` on the queue its tokens name: passed on as it is when they name the
        queue itself, retargeted when they all name one partition, else ``spread``
        over the partitions they name (entries by partition)."""
        groups = self._partitions(op.queue, tokens)
        if groups is None:
            return self.inner.handle(op, ctx)
        if len(groups) == 1:
            # Every operation is a frozen dataclass; Op, their base, is not one itself.
            retargeted: ops.Op[R] = dataclasses.replace(  # type: ignore[type-var]
                op, queue=next(iter(groups)))
            return self.inner.handle(retargeted, ctx)
        return spread(groups)

    def _retry(self, op: ops.RetryItems, ctx: ops.Context) -> Awaitable[ops.RetryOutcome]:
        return self._by_tokens(op, ctx, [r.token for r in op.retries],
                               lambda groups: self._retry_spread(op, ctx, groups))

    async def _retry_spread(self, op: ops.RetryItems, ctx: ops.Context,
                            groups: dict[str, list[int]]) -> ops.RetryOutcome:
        check_batch(len(op.retries), self.engine.opts.max_batch, "items")
        tokens = [r.token for r in op.retries]
        check_repeats(tokens, "items[{n}].token")
        await self._verify(groups, tokens, "items[{n}].token", ctx)
        parts = list(groups.items())
        results = await self._gathered([
            (where, self.inner.handle(ops.RetryItems(name, [op.retries[i] for i in where]), ctx))
            for name, where in parts])
        outcome = ops.RetryOutcome(total=len(op.retries))
        for (_, where), got in zip(parts, results, strict=True):
            outcome.retried += got.retried
            outcome.dead_lettered += got.dead_lettered
            outcome.failed += [{**f, "index": where[f["index"]]} for f in got.failed]
        outcome.failed.sort(key=lambda f: int(f["index"]))
        return outcome

    def _give_back(self, op: ops.GiveBack, ctx: ops.Context) -> Awaitable[None]:
        return self._by_tokens(op, ctx, [i.token for i in op.items],
                               lambda groups: self._give_back_spread(op, ctx, groups))

    async def _give_back_spread(self, op: ops.GiveBack, ctx: ops.Context,
                                groups: dict[str, list[int]]) -> None:
        await asyncio.gather(*(
            self.inner.handle(ops.GiveBack(name, [op.items[i] for i in where]), ctx)
            for name, where in groups.items()))

    def _check_tokens(self, op: ops.CheckTokens, ctx: ops.Context) -> Awaitable[None]:
        return self._by_tokens(op, ctx, op.tokens,
                               lambda groups: self._check_spread(op, ctx, groups))

    async def _check_spread(self, op: ops.CheckTokens, ctx: ops.Context,
                            groups: dict[str, list[int]]) -> None:
        await self._verify(groups, op.tokens, op.pattern, ctx)
        check_repeats(op.tokens, op.pattern)

    # -- the queue whole ----------------------------------------------------------------
    def _each(self, queue: str, n: int, make: Callable[[str], ops.Op[R]],
              ctx: ops.Context) -> Awaitable[list[R]]:
        return asyncio.gather(*(self.inner.handle(make(partition_name(queue, p)), ctx)
                                for p in range(n)))

    async def _purge(self, op: ops.Purge, ctx: ops.Context, n: int) -> None:
        await self.inner.handle(op, ctx)  # partition 0 first: PurgeInProgress before any
        await asyncio.gather(*(self.inner.handle(ops.Purge(partition_name(op.queue, p)), ctx)
                               for p in range(1, n)))

    async def _stats(self, op: ops.Stats, ctx: ops.Context, n: int) -> QueueStats:
        parts = await self._each(op.queue, n, ops.Stats, ctx)
        out = dataclasses.replace(parts[0], queue=op.queue)
        for s in parts[1:]:
            for f in ("available", "in_flight", "scheduled", "waiting_retry", "dead_lettered",
                      "completed", "redriven", "segments"):
                setattr(out, f, getattr(out, f) + getattr(s, f))
            out.oldest_age_s = max(out.oldest_age_s, s.oldest_age_s)
        return out

    async def _get(self, op: ops.GetQueue, ctx: ops.Context, n: int) -> QueueInfo:
        parts = await self._each(op.queue, n, lambda q: ops.GetQueue(q, op.max_age), ctx)
        return self._whole(op.queue, parts)

    @staticmethod
    def _whole(queue: str, parts: Sequence[QueueInfo]) -> QueueInfo:
        first = parts[0]
        return dataclasses.replace(first, name=queue,
                                   segments=sum(i.segments for i in parts),
                                   produced=sum(i.produced for i in parts))

    async def _browse(self, op: ops.Browse, ctx: ops.Context,
                      n: int) -> tuple[list[BrowsedItem], str | None]:
        """Partition after partition; a cursor past partition 0 is ``{item id}@{p}``
        (an empty id: from the partition's start)."""
        after, start = op.start_after, 0
        if after is not None and "@" in after:
            after, _, number = after.rpartition("@")
            if not (number.isdigit() and 0 < int(number) < n):
                raise InvalidRequest(f"start_after is not a cursor of this queue: "
                                     f"{op.start_after!r}", field="start_after")
            start, after = int(number), after or None
        out: list[BrowsedItem] = []
        for p in range(start, n):
            got, more = await self.inner.handle(
                ops.Browse(partition_name(op.queue, p), after, op.limit - len(out)), ctx)
            out += got
            after = None
            if more is not None:
                return out, more if p == 0 else f"{more}@{p}"
            if len(out) >= op.limit:
                return out, (f"@{p + 1}" if p + 1 < n else None)
        return out, None

    async def _redrive(self, op: ops.Redrive, ctx: ops.Context, n: int) -> int:
        moved = 0
        for p in range(n):
            if moved >= op.limit:
                break
            moved += await self.inner.handle(
                ops.Redrive(partition_name(op.queue, p), op.limit - moved, op.destination), ctx)
        return moved

    async def _delete(self, op: ops.DeleteQueue, ctx: ops.Context, n: int) -> None:
        """Refused while the queue is another's dead queue (as on a queue of one);
        else its other partitions first, then partition 0 with the queue's name: a
        delete cut short leaves the queue there, to be deleted again, and never a
        partition of a queue that is gone."""
        infos: list[QueueInfo] = await self.inner.handle(ops.QueueInfos(), ctx)
        users = [i.name for i in infos
                 if i.config.dead_queue == op.queue and PARTITION_SEP not in i.name]
        if users:
            named = ", ".join(repr(u) for u in users)
            raise QueueInUse(
                f"queue {op.queue!r} is the dead_queue of {named}: point their dead_queue "
                f"elsewhere or delete them first; nothing was deleted",
                queue=op.queue, used_by=users)
        for p in range(1, n):
            try:
                await self.inner.handle(ops.DeleteQueue(partition_name(op.queue, p)), ctx)
            except QueueNotFound:
                pass
        await self.inner.handle(op, ctx)
        self._counts.pop(op.queue, None)

    async def _ensure_partition(self, name: str, config: QueueConfig,
                                ctx: ops.Context) -> None:
        """Create partition ``name``, or give the one there ``config``. One there is
        kept, never emptied: it is left by a create or a raise cut short (nothing was
        ever published to it) or made by another create or raise at the same time."""
        try:
            await self.inner.handle(ops.CreateQueue(name, config), ctx)
        except QueueExists:
            changes = config.model_dump(exclude={"partitions", "read_only", "attributes"})
            await self.inner.handle(ops.UpdateQueue(name, changes), ctx)

    @staticmethod
    def _partition_config(config: QueueConfig) -> QueueConfig:
        """What a partition keeps of its queue's config: all the engine reads."""
        return config.model_copy(update={"partitions": 1, "read_only": [], "attributes": {}})

    async def _create(self, op: ops.CreateQueue, ctx: ops.Context) -> QueueInfo:
        if self.default != 1 and "partitions" not in op.config.model_fields_set:
            op = ops.CreateQueue(op.queue, op.config.model_copy(
                update={"partitions": self.default}))
        n = op.config.partitions
        if n == 1:
            return await self.inner.handle(op, ctx)
        try:
            await self.inner.handle(ops.GetQueue(op.queue), ctx)
        except QueueNotFound:
            pass
        else:
            raise QueueExists(f"queue {op.queue!r} already exists", queue=op.queue)
        part = self._partition_config(op.config)
        await asyncio.gather(*(self._ensure_partition(partition_name(op.queue, p), part, ctx)
                               for p in range(1, n)))
        info = await self.inner.handle(op, ctx)  # last: a queue is there with all its partitions
        self._note(op.queue, op.config)
        return info

    async def _update(self, op: ops.UpdateQueue, ctx: ops.Context) -> QueueInfo:
        n = await self.count(op.queue, 0)
        want = op.changes.get("partitions", n)
        if want == n and n == 1:
            return await self.inner.handle(op, ctx)
        current: QueueInfo = await self.inner.handle(ops.GetQueue(op.queue), ctx)
        merged = merged_config(current.config, op.changes)  # every field checked first
        if merged.partitions < n:
            raise InvalidRequest(f"partitions can be raised, not lowered: the queue has {n}",
                                 field="partitions")
        part = self._partition_config(merged)
        await asyncio.gather(*(self._ensure_partition(partition_name(op.queue, p), part, ctx)
                               for p in range(n, merged.partitions)))
        await self.inner.handle(op, ctx)
        self._note(op.queue, merged)
        changes = {k: v for k, v in op.changes.items()
                   if k not in ("partitions", "read_only", "attributes")}
        if changes:
            await asyncio.gather(*(
                self.inner.handle(ops.UpdateQueue(partition_name(op.queue, p), changes), ctx)
                for p in range(1, n)))
        return await self._get(ops.GetQueue(op.queue), ctx, merged.partitions)

    async def _names(self, op: ops.QueueNames, ctx: ops.Context) -> list[str]:
        names: list[str] = await self.inner.handle(op, ctx)
        return [q for q in names if PARTITION_SEP not in q]

    async def _infos(self, op: ops.QueueInfos, ctx: ops.Context) -> list[QueueInfo]:
        infos: list[QueueInfo] = await self.inner.handle(op, ctx)
        parts: dict[str, list[QueueInfo]] = {}
        for i in infos:
            parts.setdefault(split_partition(i.name)[0], []).append(i)
        out = []
        for i in infos:
            if PARTITION_SEP in i.name:
                continue
            mine = [j for j in parts[i.name]
                    if split_partition(j.name)[1] < i.config.partitions]
            out.append(self._whole(i.name, mine) if len(mine) > 1 else i)
        return out
