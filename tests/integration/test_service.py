"""The queue service in library mode: admission, batch limits and the retry batch,
on an in-process engine (the HTTP node answers the same through its handlers)."""

from __future__ import annotations

import asyncio

import pytest

from okq import Engine, ManualClock, NewItem
from okq.errors import InvalidRequest, LeaseLost, Overloaded, TooLarge
from okq.service import Admission, Outputs, QueueService, Retry
from okq.settings import Settings
from okq.store import Store
from tests.engines import make_engine


@pytest.fixture
def kind() -> str:
    return "memory"  # the service's logic is above the store


async def service_on(engine: Engine, **admission: int) -> QueueService:
    await engine.create_queue("q")
    return QueueService(engine, Admission(**admission))


async def test_admission_defaults_are_the_nodes() -> None:
    assert Admission() == Admission(max_waiting=100, max_pending_produce=50_000)
    defaults = Settings.model_fields
    assert Admission() == Admission(defaults["max_waiting"].default,
                                    defaults["max_pending_produce"].default)


async def test_produce_is_shed_while_too_many_wait(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = await service_on(engine, max_pending_produce=5)
    monkeypatch.setattr(engine, "pending_produce", lambda queue: 6)
    with pytest.raises(Overloaded) as err:
        await service.produce("q", [NewItem(b"x")])
    assert err.value.details["queue"] == "q"
    monkeypatch.setattr(engine, "pending_produce", lambda queue: 5)
    assert len(await service.produce("q", [NewItem(b"x")])) == 1


async def test_long_polls_past_max_waiting_are_shed(engine: Engine) -> None:
    service = await service_on(engine, max_waiting=1)
    first = asyncio.create_task(service.lease("q", wait=30))
    while service.waiting("q") < 1:
        await asyncio.sleep(0.01)
    with pytest.raises(Overloaded, match="1 lease requests are already waiting"):
        await service.lease("q", wait=1)
    assert await service.lease("q") == []  # no wait: never shed
    await service.produce("q", [NewItem(b"x")])
    assert [i.payload for i in await asyncio.wait_for(first, 10)] == [b"x"]
    assert service.waiting("q") == 0


async def test_a_long_poll_over_max_wait_is_refused(store: Store, clock: ManualClock) -> None:
    engine = await make_engine(store, clock, max_wait=1.0).start()
    service = await service_on(engine)
    wording = r"request_timeout must be 0 to 1 seconds \(the node's --max-wait\)"
    with pytest.raises(InvalidRequest, match=wording) as err:
        await service.lease("q", wait=2)
    assert err.value.field == "request_timeout"


async def test_a_batch_over_max_batch_is_too_large(store: Store, clock: ManualClock) -> None:
    engine = await make_engine(store, clock, max_batch=2).start()
    service = await service_on(engine)
    with pytest.raises(TooLarge) as err:
        await service.produce("q", [NewItem(b"x")] * 3)
    assert err.value.details == {"field": "items", "limit": 2}
    with pytest.raises(TooLarge) as err:
        await service.lease("q", 3)
    assert err.value.details["field"] == "batch_size"


async def test_a_repeated_token_is_refused(engine: Engine) -> None:
    service = await service_on(engine)
    await service.produce("q", [NewItem(b"x")])
    [item] = await service.lease("q")
    with pytest.raises(InvalidRequest, match=r"tokens\[1\] repeats tokens\[0\]"):
        await service.complete("q", [item.token, item.token])
    with pytest.raises(InvalidRequest, match=r"items\[1\].token repeats items\[0\].token"):
        await service.retry("q", [Retry(item.token), Retry(item.token)])


async def test_a_retry_batch_reports_each_lost_lease(engine: Engine) -> None:
    service = await service_on(engine)
    await service.produce("q", [NewItem(b"a"), NewItem(b"b")])
    a, b = await service.lease("q", 2)
    await service.complete("q", [a.token])
    outcome = await service.retry("q", [Retry(a.token), Retry(b.token, error="boom")])
    assert (outcome.total, outcome.retried) == (2, 1)
    assert [f["index"] for f in outcome.failed] == [0]
    with pytest.raises(LeaseLost, match="1 of 2 retries refused: the lease was lost; "
                                        "the other 1 landed"):
        outcome.raise_if_failed()
    [again] = await service.lease("q")
    assert again.payload == b"b"


async def test_give_back_does_not_count_an_attempt(engine: Engine) -> None:
    service = await service_on(engine)
    await service.produce("q", [NewItem(b"x")])
    first = await service.lease("q")
    await service.give_back("q", first)
    [again] = await service.lease("q")
    assert again.attempts == first[0].attempts


async def test_complete_with_outputs_produces_them(engine: Engine) -> None:
    service = await service_on(engine)
    await engine.create_queue("out")
    await service.produce("q", [NewItem(b"x")])
    [item] = await service.lease("q")
    ids = await service.complete("q", [item.token], Outputs("out", [NewItem(b"y")]))
    assert ids is not None and len(ids) == 1
    [out] = await service.lease("out")
    assert out.payload == b"y"
    assert [i.name for i in await service.queues()] == ["out", "q"]
