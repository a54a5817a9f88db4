"""Partitioned queues in library mode (okq/partitions.py): a queue created with
``partitions: P`` keeps its items in P queues of the engine's (``q``, ``q~1``, ...)
and the pipeline's spread layer turns each operation on the queue into operations on
them. Checked through a real engine, with the partitions read back from the engine
and the store: produce and deduplication, leases and tokens across partitions,
views, changes of the queue, deletes (also one cut short), long polls and dead letters.

On the memory store; where what is in the store matters, on the file store too.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import msgpack
import pytest

from okq import Engine, ManualClock, NewItem, QueueConfig, ops
from okq.errors import (
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    OkqError,
    OutcomeUnknown,
    QueueExists,
    QueueInUse,
    QueueNotFound,
)
from okq.keys import manifest_key, manifests_prefix, partition_name
from okq.leases import LeasedItem
from okq.model import dead_letter_source
from okq.partitions import key_partition, token_queue
from okq.pipeline import build
from okq.service import Outputs, QueueService, Retry
from okq.store import Store
from okq.store.base import list_all
from okq.tokens import Delivery, TokenSigner
from tests.engines import KEY, make_engine

BOTH = pytest.mark.parametrize("kind", ["memory", "file"])
STATS_SUMMED = ("available", "in_flight", "scheduled", "waiting_retry", "dead_lettered",
                "completed", "redriven", "segments")


@pytest.fixture
def kind() -> str:
    return "memory"  # the spread layer is above the store; BOTH where the store matters


@pytest.fixture
def service(engine: Engine) -> QueueService:
    return QueueService(engine)


async def create(service: QueueService, name: str = "q", partitions: int = 3,
                 **config: object) -> None:
    await service.create_queue(name, QueueConfig(partitions=partitions, **config))


def key_in(partition: int, partitions: int, prefix: str = "k", skip: int = 0) -> str:
    """An idempotency key (the ``skip``-th found) that hashes to ``partition``."""
    found = (f"{prefix}{n}" for n in range(10_000)
             if key_partition(f"{prefix}{n}", partitions) == partition)
    for _ in range(skip):
        next(found)
    return next(found)


async def manifests(engine: Engine) -> list[str]:
    prefix = manifests_prefix(engine.ns)
    return sorted([i.key[len(prefix):] async for i in list_all(engine.store, prefix)])


async def raw_config(engine: Engine, name: str) -> dict[str, object]:
    """A manifest's config as stored."""
    blob = await engine.store.get(manifest_key(engine.ns, name))
    config: dict[str, object] = msgpack.unpackb(blob.data, raw=False)["config"]
    return config


async def available(engine: Engine, name: str, partitions: int) -> list[int]:
    """Items available in each partition, read from the engine."""
    return [(await engine.stats(partition_name(name, p))).available for p in range(partitions)]


async def leased_by_partition(service: QueueService, n: int, queue: str = "q"
                              ) -> dict[str, list[LeasedItem]]:
    items = await service.lease(queue, n)
    assert len(items) == n
    out: dict[str, list[LeasedItem]] = {}
    for i in items:
        name = token_queue(i.token)
        assert name is not None
        out.setdefault(name, []).append(i)
    return out


async def two_by_two(service: QueueService) -> tuple[list[LeasedItem], list[LeasedItem]]:
    """Queue q of 2 partitions with 2 items in each, all 4 leased: those of q, of q~1."""
    await create(service, partitions=2)
    keyed = [NewItem(f"{p}{j}".encode(), key=key_in(p, 2, skip=j))
             for p in (0, 1) for j in (0, 1)]
    await service.produce("q", keyed)
    got = await leased_by_partition(service, 4)
    assert sorted(got) == ["q", "q~1"]
    return got["q"], got["q~1"]


# -- create and list -----------------------------------------------------------------------


@BOTH
async def test_a_queue_of_three_partitions_is_listed_once_over_three_manifests(
    engine: Engine, service: QueueService
) -> None:
    await create(service, partitions=3, lease_timeout=7)
    assert await service.queue_names() == ["q"]
    assert await manifests(engine) == ["q", "q~1", "q~2"]
    info = await service.queue("q")
    assert (info.name, info.config.partitions, info.config.lease_timeout) == ("q", 3, 7)
    for p in (1, 2):  # each partition is a queue of one partition with the queue's settings
        part = await engine.get_queue(f"q~{p}")
        assert (part.config.partitions, part.config.lease_timeout) == (1, 7)
    await service.produce("q", [NewItem(b"a"), NewItem(b"b")])
    await service.produce("q", [NewItem(b"c")])
    [whole] = await service.queues()
    assert (whole.name, whole.config.partitions, whole.produced) == ("q", 3, 3)
    assert whole.segments == 2


async def test_creating_a_partitioned_queue_over_an_existing_one_is_refused(
    engine: Engine, service: QueueService
) -> None:
    await create(service, partitions=1)
    with pytest.raises(QueueExists):
        await create(service, partitions=3)
    assert await manifests(engine) == ["q"]  # no partitions were made for it
    await create(service, "r", partitions=2)
    with pytest.raises(QueueExists):
        await create(service, "r", partitions=2)
    assert await manifests(engine) == ["q", "r", "r~1"]


# -- produce -------------------------------------------------------------------------------


async def test_batches_without_keys_spread_over_the_partitions(
    engine: Engine, service: QueueService
) -> None:
    """Each batch goes whole to one partition; successive batches to different ones."""
    await create(service, partitions=3)
    for b in range(6):
        ids = await service.produce("q", [NewItem(b"%d" % b), NewItem(b"%d" % b)])
        assert ids[0].split(".")[0] == ids[1].split(".")[0]  # one segment: one partition
    counts = await available(engine, "q", 3)
    assert sum(counts) == 12
    assert all(c > 0 for c in counts), counts
    assert all(c % 2 == 0 for c in counts), counts  # no batch split


async def test_keyed_items_go_to_their_keys_partition_and_deduplicate(
    engine: Engine, service: QueueService
) -> None:
    """Produced again, in one batch or across batches, an item with a key gets the
    id of the first one and is counted a duplicate, whichever partition its key
    hashes to; nothing lands twice."""
    await create(service, partitions=3)
    keys = [key_in(p, 3, skip=j) for j in (0, 1) for p in (0, 1, 2)]
    first = await service.produce("q", [NewItem(k.encode(), key=k) for k in keys])
    assert (len(set(first)), first.duplicates) == (6, 0)  # type: ignore[attr-defined]
    assert await available(engine, "q", 3) == [2, 2, 2]
    for k, item_id in zip(keys, first, strict=True):  # each in its key's partition
        got, _ = await engine.browse(partition_name("q", key_partition(k, 3)))
        assert item_id in [i.id for i in got]

    again = await service.produce("q", [NewItem(b"other", key=k) for k in reversed(keys)])
    assert list(again) == list(reversed(first))
    assert again.duplicates == 6  # type: ignore[attr-defined]

    new = [key_in(p, 3, skip=5) for p in (2, 0)]
    mixed = [NewItem(b"x", key=keys[1]), NewItem(b"y", key=new[0]), NewItem(b"z", key=keys[5]),
             NewItem(b"y2", key=new[0]), NewItem(b"w", key=new[1]), NewItem(b"w2", key=new[1])]
    ids = await service.produce("q", mixed)
    assert (ids[0], ids[2]) == (first[1], first[5])
    assert ids[1] == ids[3] and ids[4] == ids[5] and ids[1] != ids[4]
    assert ids.duplicates == 4  # type: ignore[attr-defined]
    assert (await service.stats("q")).available == 8
    assert await available(engine, "q", 3) == [3, 2, 3]


async def test_items_without_keys_go_with_the_batchs_first_keyed_item(
    engine: Engine, service: QueueService
) -> None:
    await create(service, partitions=3)
    k2, k1 = key_in(2, 3), key_in(1, 3)
    ids = await service.produce("q", [NewItem(b"a"), NewItem(b"b", key=k2), NewItem(b"c"),
                                      NewItem(b"d", key=k1)])
    assert await available(engine, "q", 3) == [0, 1, 3]
    got, _ = await engine.browse("q~2")
    assert sorted(i.id for i in got) == sorted([ids[0], ids[1], ids[2]])


async def test_outputs_to_a_partitioned_queue_land_in_one_partition(
    engine: Engine, service: QueueService
) -> None:
    """A completion's outputs go to the output queue's partition of their first key."""
    await create(service, "in", partitions=2)
    await create(service, "out", partitions=3)
    await service.produce("in", [NewItem(b"job", key=key_in(1, 2))])
    [job] = await service.lease("in")
    assert token_queue(job.token) == "in~1"
    k = key_in(2, 3)
    ids = await service.complete("in", [job.token], Outputs("out", [NewItem(b"r", key=k)]))
    assert ids is not None and len(ids) == 1
    assert await available(engine, "out", 3) == [0, 0, 1]
    [out] = await service.lease("out")
    assert (out.id, out.payload) == (ids[0], b"r")
    assert (await service.stats("in")).completed == 1


async def test_a_batch_published_in_part_is_an_unknown_outcome(
    engine: Engine, service: QueueService
) -> None:
    """A batch over two partitions, one of which cannot take it (its manifest lost
    to a delete cut short): what landed stays, and the produce says the outcome is
    unknown; a batch that landed nowhere fails as its partition did."""
    await create(service, partitions=2)
    await engine.delete_queue("q~1")
    k0, k1 = key_in(0, 2), key_in(1, 2)
    with pytest.raises(OutcomeUnknown) as err:
        await service.produce("q", [NewItem(b"0", key=k0), NewItem(b"1", key=k1)])
    assert err.value.details["queue"] == "q"
    assert (await engine.stats("q")).available == 1
    with pytest.raises(QueueNotFound):
        await service.produce("q", [NewItem(b"1", key=k1)])


# -- lease and tokens ----------------------------------------------------------------------


async def test_a_lease_fills_its_batch_from_several_partitions(service: QueueService) -> None:
    await create(service, partitions=3)
    produced = []
    for b in range(3):
        produced += await service.produce("q", [NewItem(b"%d" % b), NewItem(b"%d" % b)])
    got = await service.lease("q", 5)
    assert len(got) == 5
    assert len({token_queue(i.token) for i in got}) >= 2
    rest = await service.lease("q", 5)
    assert len(rest) == 1
    assert sorted(i.id for i in got + rest) == sorted(produced)
    assert await service.lease("q", 5) == []


async def test_complete_takes_tokens_of_several_partitions_in_one_call(
    service: QueueService
) -> None:
    await create(service, partitions=3)
    for _ in range(3):
        await service.produce("q", [NewItem(b"x"), NewItem(b"y")])
    got = await service.lease("q", 6)
    assert len({token_queue(i.token) for i in got}) == 3
    tokens = [i.token for i in got]
    await service.complete("q", tokens[::2] + tokens[1::2])  # interleaved partitions
    stats = await service.stats("q")
    assert (stats.completed, stats.available, stats.in_flight) == (6, 0, 0)


def _tampered(token: str) -> str:
    return token[:-1] + ("0" if token[-1] != "0" else "1")


async def _bad_token(how: str, service: QueueService, good: list[str]) -> str:
    """A token that must be refused in a batch of ``q``'s tokens ``good``."""
    if how == "garbage":
        return "not-a-token"
    if how == "tampered":  # names partition q~1, its MAC broken
        assert token_queue(good[1]) == "q~1"
        return _tampered(good[1])
    if how == "other namespace":
        return TokenSigner([KEY]).sign(Delivery("elsewhere", "q~1", "018b5e3c2a00-0123456789",
                                                0, 1))
    if how == "other queue":
        await create(service, "other", partitions=2)
        await service.produce("other", [NewItem(b"o")])
        [o] = await service.lease("other")
        return o.token
    assert how == "repeated"
    return good[1]


async def bad_batch(service: QueueService, how: str) -> tuple[list[str], list[str]]:
    """Four good tokens of two partitions, and a batch of them with a bad one (``how``)
    at index 3."""
    mine, second = await two_by_two(service)
    good = [mine[0].token, second[0].token, mine[1].token, second[1].token]
    return good, [*good[:3], await _bad_token(how, service, good), good[3]]


BAD = pytest.mark.parametrize("how", ["garbage", "tampered", "other namespace", "other queue",
                                      "repeated"])


@BAD
async def test_a_bad_token_in_a_complete_is_named_by_its_index_and_nothing_is_done(
    service: QueueService, how: str
) -> None:
    good, batch = await bad_batch(service, how)
    with pytest.raises((InvalidToken, InvalidRequest)) as err:
        await service.complete("q", batch)
    assert err.value.details["field"] == "tokens[3]"
    assert "tokens[3]" in err.value.message
    stats = await service.stats("q")
    assert (stats.completed, stats.in_flight) == (0, 4)  # every token checked before any use
    await service.complete("q", good)
    assert (await service.stats("q")).completed == 4


@BAD
async def test_a_bad_token_in_a_retry_or_check_is_named_by_its_index(
    service: QueueService, how: str
) -> None:
    good, batch = await bad_batch(service, how)
    with pytest.raises((InvalidToken, InvalidRequest)) as err:
        await service.retry("q", [Retry(t) for t in batch])
    assert err.value.details["field"] == "items[3].token"
    stats = await service.stats("q")
    assert (stats.available, stats.in_flight) == (0, 4)  # nothing was retried
    with pytest.raises((InvalidToken, InvalidRequest)) as err:
        await service.check_tokens(batch, "q", "tokens[{n}]")
    assert err.value.details["field"] == "tokens[3]"
    await service.check_tokens(good, "q", "tokens[{n}]")


@pytest.mark.parametrize("stale", [[3], [1, 2]])
async def test_a_lost_lease_in_a_complete_is_named_by_its_index_in_the_batch(
    service: QueueService, stale: list[int]
) -> None:
    """LeaseLost's ``failed`` names the caller's entries (a worker marks those items
    lost and the others done), however the batch was split over partitions; the
    other completions land."""
    mine, second = await two_by_two(service)
    items = [mine[0], second[0], mine[1], second[1]]
    await service.retry("q", [Retry(items[i].token) for i in stale])  # their leases end
    with pytest.raises(LeaseLost) as err:
        await service.complete("q", [i.token for i in items])
    failed = err.value.details["failed"]
    assert [(f["index"], f["id"]) for f in failed] == [(i, items[i].id) for i in stale]
    stats = await service.stats("q")
    assert (stats.completed, stats.available, stats.in_flight) == (4 - len(stale),
                                                                   len(stale), 0)


async def test_a_retry_batchs_failures_are_named_by_the_callers_index(
    service: QueueService
) -> None:
    mine, second = await two_by_two(service)
    items = [mine[0], second[0], mine[1], second[1]]
    await service.complete("q", [items[1].token, items[2].token])
    outcome = await service.retry("q", [Retry(i.token, error="boom") for i in items])
    assert (outcome.total, outcome.retried) == (4, 2)
    assert [f["index"] for f in outcome.failed] == [1, 2]
    again = await service.lease("q", 4)
    assert sorted(i.id for i in again) == sorted([items[0].id, items[3].id])


async def test_renew_and_give_back_reach_each_tokens_partition(
    service: QueueService, clock: ManualClock
) -> None:
    await create(service, partitions=3)
    for b in range(3):
        await service.produce("q", [NewItem(b"%d" % b)])
    got = await service.lease("q", 3, lease_timeout=10)
    assert len({token_queue(i.token) for i in got}) == 3
    for i in got:
        assert await service.renew("q", i.token, 60) == clock.now_ms() + 60_000
        assert await service.first_leased("q", i.token) is not None
    clock.advance(30)  # past the first lease timeout, within the renewed one
    stats = await service.stats("q")
    assert (stats.in_flight, stats.available) == (3, 0)
    await service.give_back("q", got)
    stats = await service.stats("q")
    assert (stats.in_flight, stats.available) == (0, 3)
    again = await service.lease("q", 3)
    assert sorted((i.id, i.attempts) for i in again) == sorted((i.id, i.attempts) for i in got)


# -- the queue whole -----------------------------------------------------------------------


async def test_stats_sum_the_partitions(engine: Engine, service: QueueService) -> None:
    await create(service, partitions=3)
    for b in range(5):
        await service.produce("q", [NewItem(b"x")] * (b + 1))
    got = await service.lease("q", 9)
    await service.complete("q", [i.token for i in got[:4]])
    await service.retry("q", [Retry(got[4].token, retry_at_ms=engine.clock.now_ms() + 60_000)])
    whole = await service.stats("q")
    parts = [await engine.stats(partition_name("q", p)) for p in range(3)]
    assert whole.queue == "q"
    for f in STATS_SUMMED:
        assert getattr(whole, f) == sum(getattr(s, f) for s in parts), f
    assert (whole.available, whole.in_flight, whole.completed) == (6, 4, 4)
    assert whole.waiting_retry + whole.scheduled == 1
    assert sum(1 for s in parts if s.segments) >= 2


@pytest.mark.parametrize("limit", [1, 2, 3, 100])
async def test_browse_pages_through_every_partition(service: QueueService, limit: int) -> None:
    """Every item of every partition once, an empty partition in between included."""
    await create(service, partitions=4)
    produced = []
    for p, n in ((0, 3), (2, 1), (3, 4)):  # partition 1 stays empty
        produced += await service.produce(
            "q", [NewItem(b"%d" % p, key=key_in(p, 4, skip=j)) for j in range(n)])
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(20):
        page, cursor = await service.browse("q", start_after=cursor, limit=limit)
        assert len(page) <= limit
        seen += [i.id for i in page]
        if cursor is None:
            break
    assert cursor is None
    assert Counter(seen) == Counter(produced)


async def test_browse_refuses_a_cursor_of_no_partition(service: QueueService) -> None:
    await create(service, partitions=2)
    with pytest.raises(InvalidRequest) as err:
        await service.browse("q", start_after="@5")
    assert err.value.details["field"] == "start_after"


@BOTH
async def test_purge_empties_every_partition(engine: Engine, service: QueueService) -> None:
    await create(service, partitions=3)
    keys = [key_in(p, 3) for p in range(3)]
    for _ in range(3):
        await service.produce("q", [NewItem(b"x"), NewItem(b"y")])
    await service.produce("q", [NewItem(b"k", key=k) for k in keys])
    await service.lease("q", 4)
    await service.purge("q")
    for p in range(3):
        s = await engine.stats(partition_name("q", p))
        assert (s.available, s.in_flight) == (0, 0), p
    whole = await service.stats("q")
    assert (whole.available, whole.in_flight) == (0, 0)
    assert await service.lease("q", 10) == []
    await service.produce("q", [NewItem(b"after")])
    assert [i.payload for i in await service.lease("q", 10)] == [b"after"]


# -- changes of the queue ------------------------------------------------------------------


@BOTH
async def test_raising_partitions_makes_new_ones_with_the_queues_settings(
    engine: Engine, service: QueueService, clock: ManualClock
) -> None:
    await create(service, partitions=2, lease_timeout=7, max_attempts=3)
    info = await service.update_queue("q", partitions=4)
    assert info.config.partitions == 4
    assert (await service.queue("q")).config.partitions == 4
    assert await manifests(engine) == ["q", "q~1", "q~2", "q~3"]
    for p in (2, 3):
        c = (await engine.get_queue(f"q~{p}")).config
        assert (c.partitions, c.lease_timeout, c.max_attempts) == (1, 7, 3)
    await service.produce("q", [NewItem(b"3", key=key_in(3, 4))])
    [item] = await service.lease("q")
    assert token_queue(item.token) == "q~3"
    assert item.lease_deadline_ms == clock.now_ms() + 7_000
    for b in range(4):
        await service.produce("q", [NewItem(b"%d" % b)])
    assert all(n > 0 for n in await available(engine, "q", 4))
    assert await service.queue_names() == ["q"]


async def test_a_queue_of_one_partition_is_raised_with_its_items(
    engine: Engine, service: QueueService
) -> None:
    await create(service, partitions=1)
    ids = await service.produce("q", [NewItem(b"a"), NewItem(b"b")])
    info = await service.update_queue("q", partitions=3)
    assert (info.config.partitions, info.produced) == (3, 2)
    assert await manifests(engine) == ["q", "q~1", "q~2"]
    await service.produce("q", [NewItem(b"c", key=key_in(2, 3))])
    assert await available(engine, "q", 3) == [2, 0, 1]
    got = await service.lease("q", 10)
    assert sorted(i.payload for i in got) == [b"a", b"b", b"c"]
    assert set(ids) < {i.id for i in got}


async def test_raising_partitions_and_a_setting_at_once(
    engine: Engine, service: QueueService
) -> None:
    await create(service, partitions=2)
    await service.update_queue("q", partitions=3, lease_timeout=9)
    for p in range(3):
        c = (await engine.get_queue(partition_name("q", p))).config
        assert c.lease_timeout == 9, p
    assert (await engine.get_queue("q")).config.partitions == 3


async def test_lowering_partitions_is_refused(engine: Engine, service: QueueService) -> None:
    await create(service, partitions=3, lease_timeout=7)
    for changes in ({"partitions": 2}, {"partitions": 1, "lease_timeout": 5}):
        with pytest.raises(InvalidRequest) as err:
            await service.update_queue("q", **changes)
        assert err.value.details["field"] == "partitions"
    assert await manifests(engine) == ["q", "q~1", "q~2"]
    for p in range(3):
        assert (await engine.get_queue(partition_name("q", p))).config.lease_timeout == 7
    assert (await service.queue("q")).config.partitions == 3


async def test_a_settings_change_reaches_every_partition(
    engine: Engine, service: QueueService, clock: ManualClock
) -> None:
    await create(service, partitions=3)
    info = await service.update_queue("q", lease_timeout=12, max_attempts=4)
    assert (info.config.lease_timeout, info.config.max_attempts, info.config.partitions) == \
        (12, 4, 3)
    for p in range(3):
        c = (await engine.get_queue(partition_name("q", p))).config
        assert (c.lease_timeout, c.max_attempts) == (12, 4), p
    for b in range(3):
        await service.produce("q", [NewItem(b"%d" % b)])
    got = await service.lease("q", 3)
    assert len({token_queue(i.token) for i in got}) == 3
    assert {i.lease_deadline_ms for i in got} == {clock.now_ms() + 12_000}


# -- delete --------------------------------------------------------------------------------


@BOTH
async def test_delete_removes_every_partition(engine: Engine, service: QueueService) -> None:
    await create(service, partitions=3)
    await service.produce("q", [NewItem(b"k", key=key_in(p, 3)) for p in range(3)])
    await service.delete_queue("q")
    assert await manifests(engine) == []
    assert await service.queue_names() == []
    with pytest.raises(QueueNotFound):
        await service.queue("q")
    with pytest.raises(QueueNotFound):
        await service.stats("q")
    await create(service, partitions=3)
    assert (await service.stats("q")).available == 0


@BOTH
async def test_a_delete_cut_short_leaves_the_queue_to_delete_again(
    engine: Engine, service: QueueService
) -> None:
    """A delete removes the other partitions before partition 0: cut short after
    ``q~2`` went, the queue is still there (listed, its items in ``q~1`` and ``q``),
    and the delete repeated removes the rest; never a partition of a queue that is
    gone."""
    await create(service, partitions=3)
    await service.produce("q", [NewItem(b"x", key=key_in(p, 3)) for p in range(3)])
    await engine.delete_queue("q~2")  # the crash, after the first partition's delete
    restarted = QueueService(engine)  # as a node that starts after it
    assert await restarted.queue_names() == ["q"]
    assert (await engine.stats("q~1")).available == 1
    await restarted.delete_queue("q")
    assert await manifests(engine) == []
    assert await restarted.queue_names() == []


async def test_a_delete_of_a_dead_queue_is_refused_before_any_partition_goes(
    engine: Engine, service: QueueService
) -> None:
    await create(service, "dead", partitions=2)
    await create(service, "work", partitions=2, dead_queue="dead")
    with pytest.raises(QueueInUse) as err:
        await service.delete_queue("dead")
    assert err.value.details["used_by"] == ["work"]
    assert {"dead", "dead~1"} <= set(await manifests(engine))


async def test_a_partition_left_by_a_create_cut_short_is_kept_and_given_the_config(
    engine: Engine, service: QueueService
) -> None:
    """A create that made ``q~1`` and died before ``q``: the next create keeps the
    partition (nothing was ever published to it; another create at the same moment
    may be using it) and gives it the queue's settings."""
    await engine.create_queue("q~1", QueueConfig(lease_timeout=99))
    await create(service, partitions=3, lease_timeout=7)
    assert (await engine.get_queue("q~1")).config.lease_timeout == 7
    assert await manifests(engine) == ["q", "q~1", "q~2"]
    [info] = await service.queues()
    assert (info.name, info.config.partitions) == ("q", 3)


async def test_a_partition_left_by_a_raise_cut_short_is_kept(
    engine: Engine, service: QueueService
) -> None:
    await create(service, partitions=2, lease_timeout=5)
    await engine.create_queue("q~2", QueueConfig())  # a raise that died before partition 0
    assert (await service.queue("q")).config.partitions == 2
    await service.update_queue("q", partitions=3)
    assert (await engine.get_queue("q~2")).config.lease_timeout == 5
    assert (await service.queue("q")).config.partitions == 3


# -- long polls ----------------------------------------------------------------------------


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_long_poll_returns_soon_after_an_item_is_produced(
    store: Store, clock: ManualClock, keyed: bool
) -> None:
    """Woken by the produce, not by a look at the store: the engine looks only every
    4 s here, and a produce into any partition (a keyed one into partition 2) wakes
    the poll on the queue."""
    engine = await make_engine(store, clock, poll_interval=4.0, idle_poll_max=4.0).start()
    service = QueueService(engine)
    await create(service, partitions=3)
    poll = asyncio.create_task(service.lease("q", 10, wait=5))
    while service.waiting("q") < 1:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # past its first look at every partition
    assert not poll.done()
    began = time.monotonic()
    item = NewItem(b"late", key=key_in(2, 3)) if keyed else NewItem(b"late")
    [item_id] = await service.produce("q", [item])
    got = await asyncio.wait_for(poll, 5)
    assert time.monotonic() - began < 2
    assert [i.id for i in got] == [item_id]
    await engine.close()


async def test_a_long_poll_with_nothing_to_lease_ends_with_its_wait(
    service: QueueService
) -> None:
    await create(service, partitions=3)
    began = time.monotonic()
    assert await service.lease("q", 10, wait=0.3) == []
    assert 0.25 < time.monotonic() - began < 2


# -- dead letters --------------------------------------------------------------------------


@pytest.mark.parametrize("set_by", ["create", "update"])
async def test_dead_letters_name_the_queue_and_redrive_back_to_it(
    engine: Engine, service: QueueService, set_by: str
) -> None:
    await service.create_queue("dlq", QueueConfig())
    if set_by == "create":
        await create(service, partitions=3, max_attempts=1, dead_queue="dlq")
    else:  # the dead queue reaches partitions made before it was set
        await create(service, partitions=3)
        await service.update_queue("q", max_attempts=1, dead_queue="dlq")
    ids = await service.produce("q", [NewItem(b"%d" % p, key=key_in(p, 3)) for p in range(3)])
    got = await service.lease("q", 3)
    assert {token_queue(i.token) for i in got} == {"q", "q~1", "q~2"}
    outcome = await service.retry("q", [Retry(i.token, error="boom") for i in got])
    assert (outcome.retried, outcome.failed) == (3, [])
    assert (await service.stats("q")).dead_lettered == 3
    dead, _ = await service.browse("dlq")
    assert len(dead) == 3
    assert {dead_letter_source(i.meta) for i in dead} == {"q"}  # not "q~1" nor "q~2"
    assert {(i.meta or {}).get("source_id") for i in dead} == set(ids)
    assert await service.redrive("dlq", 10) == 3
    assert (await service.stats("dlq")).available == 0
    back = await service.lease("q", 10)
    assert sorted(i.payload for i in back) == [b"0", b"1", b"2"]


# -- one partition, and the pipeline's default ---------------------------------------------


@BOTH
async def test_a_queue_of_one_partition_is_as_before(
    engine: Engine, service: QueueService
) -> None:
    """Its manifest holds no ``partitions`` (okq versions before partitions read it),
    and everything happens in the queue itself."""
    await create(service, partitions=1)
    await engine.create_queue("plain")
    assert await manifests(engine) == ["plain", "q"]
    assert "partitions" not in await raw_config(engine, "q")
    assert await raw_config(engine, "q") == await raw_config(engine, "plain")
    for b in range(3):
        await service.produce("q", [NewItem(b"%d" % b)])
    got = await service.lease("q", 3)
    assert {token_queue(i.token) for i in got} == {"q"}
    await service.complete("q", [i.token for i in got])
    assert (await service.stats("q")).completed == 3
    assert (await service.queue("q")).config.partitions == 1


@BOTH
async def test_only_partition_0_records_the_partition_count(
    engine: Engine, service: QueueService
) -> None:
    await create(service, partitions=3)
    assert (await raw_config(engine, "q"))["partitions"] == 3
    for p in (1, 2):
        assert "partitions" not in await raw_config(engine, f"q~{p}")


async def test_a_pipelines_default_partitions(engine: Engine) -> None:
    """A queue created without saying gets the pipeline's default; one that says 1
    gets 1."""
    pipeline = build(engine, default_partitions=2, authorize=False)
    await pipeline.handle(ops.CreateQueue("a", QueueConfig()))
    await pipeline.handle(ops.CreateQueue("b", QueueConfig(lease_timeout=5)))
    await pipeline.handle(ops.CreateQueue("c", QueueConfig(partitions=1)))
    assert await manifests(engine) == ["a", "a~1", "b", "b~1", "c"]
    infos = {i.name: i.config.partitions for i in await pipeline.handle(ops.QueueInfos())}
    assert infos == {"a": 2, "b": 2, "c": 1}
    assert (await engine.get_queue("b~1")).config.lease_timeout == 5


async def test_a_queue_that_does_not_exist_is_not_found(service: QueueService) -> None:
    """The spread layer reads no partition count for a missing queue: it is not found."""
    for op in (service.produce("nope", [NewItem(b"x")]), service.lease("nope"),
               service.stats("nope"), service.purge("nope")):
        with pytest.raises(QueueNotFound):
            await op
    with pytest.raises(OkqError):
        await service.complete("nope", ["not-a-token"])


async def test_a_caller_cannot_name_a_partition(engine: Engine, service: QueueService) -> None:
    """Partitions are the engine's own names: through the pipeline an operation naming
    one, as its queue or its outputs' queue, is refused with the field named, and the
    partition is untouched."""
    await create(service, partitions=2)
    await service.produce("q", [NewItem(b"x", key=key_in(1, 2))])
    for op, field in ((ops.DeleteQueue("q~1"), "name"), (ops.Purge("q~1"), "queue_name"),
                      (ops.Lease("q~1", 10), "queue_name"),
                      (ops.CreateQueue("z~1", QueueConfig()), "name")):
        with pytest.raises(InvalidRequest) as err:
            await service.pipeline.handle(op)
        assert err.value.details["field"] == field
    (item,) = await service.lease("q", 10)
    with pytest.raises(InvalidRequest) as err:
        await service.pipeline.handle(ops.Complete("q", [item.token],
                                                   Outputs("q~1", [NewItem(b"y")])))
    assert err.value.details["field"] == "outputs.queue_name"
    assert (await engine.stats("q~1")).in_flight == 1
    assert "z~1" not in await manifests(engine)


# -- read-only partitions --------------------------------------------------------------------


async def test_a_read_only_partition_takes_no_items_and_is_drained(
    engine: Engine, service: QueueService
) -> None:
    """Partition 2 made read-only: batches with and without keys go to 0 and 1 only
    (a key that hashed to 2 goes to another), its items are still leased and
    completed, and made writable again it takes items again."""
    await create(service, partitions=3)
    old = key_in(2, 3)
    await service.produce("q", [NewItem(b"before", key=old)])
    await service.update_queue("q", read_only=[2])
    assert (await service.queue("q")).config.read_only == [2]
    assert (await engine.get_queue("q~2")).config.read_only == []  # the queue's setting
    for n in range(12):
        await service.produce("q", [NewItem(b"plain %d" % n)])
    keys = [f"k{n}" for n in range(40)]
    await service.produce("q", [NewItem(k.encode(), key=k) for k in keys])
    assert (await engine.stats("q~2")).available == 1  # only the item from before
    assert (await engine.stats("q")).available > 0  # partition 0
    assert (await engine.stats("q~1")).available > 0
    leased = await service.lease("q", 100)
    assert len(leased) == 1 + 12 + 40 and b"before" in {i.payload for i in leased}
    await service.complete("q", [i.token for i in leased])
    assert (await service.stats("q")).available == 0
    await service.update_queue("q", read_only=[])
    await service.produce("q", [NewItem(b"again", key=key_in(2, 3, skip=1))])
    assert (await engine.stats("q~2")).available == 1


@pytest.mark.parametrize("read_only", [[3], [0, 1, 2], [1, 1], [-1]])
async def test_read_only_must_leave_a_partition_taking_items(
    service: QueueService, read_only: list[int]
) -> None:
    await create(service, partitions=3)
    with pytest.raises(InvalidRequest) as err:
        await service.update_queue("q", read_only=read_only)
    assert err.value.details["field"] == "read_only"
    assert (await service.queue("q")).config.read_only == []


async def test_a_long_poll_returns_an_item_when_it_falls_due(store: Store) -> None:
    """An item produced for later is leased when it falls due, not at the next look:
    the engine looks every 4 s here, and the poll's wait ends at the item's due time
    (a partitioned long poll wakes for the first due time its partitions' walks saw)."""
    from okq.clock import SystemClock

    engine = await make_engine(store, SystemClock(), poll_interval=4.0,
                               idle_poll_max=4.0).start()
    try:
        service = QueueService(engine)
        await create(service, partitions=3)
        due = engine.clock.now_ms() + 1500
        [item_id] = await service.produce("q", [NewItem(b"later", enqueue_at_ms=due)])
        got = await service.lease("q", 10, wait=6)
        late = engine.clock.now_ms() - due
        assert [i.id for i in got] == [item_id]
        assert 0 <= late < 1000, f"leased {late} ms after it fell due"
    finally:
        await engine.close()
