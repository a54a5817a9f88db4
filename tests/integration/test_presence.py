"""Presence reports (okq/presence.py): what a process writes, what a reader makes of
it, and the price of a request rate, on the memory store."""

from __future__ import annotations

import time

import pytest

from okq.errors import FormatError
from okq.presence import FORGET_AFTER, Report, Reporter, dollars_per_month, read_reports
from okq.store import CountingStore, MemoryStore


def test_the_price_of_a_request_rate_is_s3_standard_per_30_day_month() -> None:
    # 1 PUT/s and 10 GET/s for 30 days: 2,592,000 * ($0.005 + 10 * $0.0004) / 1,000
    assert dollars_per_month({"put": 1.0, "get": 10.0, "delete": 5.0}) == pytest.approx(23.328)
    assert dollars_per_month({}) == 0.0


def test_a_report_round_trips_and_a_foreign_object_is_refused() -> None:
    r = Report("n1", "node", "http://a:1", 1, 2, 60.0, {"get": 3}, {"get": 0.5}, {"roles": [0]})
    assert Report.decode(r.encode()) == r
    with pytest.raises(FormatError):
        Report.decode(b"\x81\xa1f\xa6apikey")


async def test_a_reporter_writes_its_rates_and_deletes_its_report_at_a_clean_stop() -> None:
    store = CountingStore(MemoryStore())
    reporter = Reporter(store, "ns", "n1", "node", interval=60, url="http://a:1",
                        info=lambda: {"roles": [0]})
    store.requests["get"] += 30  # as if the node had made 30 GETs since it started
    await reporter.write()
    [seen] = await read_reports(store, "ns")
    assert (seen.id, seen.kind, seen.url, seen.info) == ("n1", "node", "http://a:1",
                                                         {"roles": [0]})
    assert seen.requests["get"] == 30 and seen.per_s["get"] > 0
    assert seen.live(int(time.time() * 1000))
    reporter.start()
    await reporter.stop()
    assert await read_reports(store, "ns") == []
    assert await read_reports(store, "other") == []


async def test_a_report_left_for_a_day_is_gone_and_then_forgotten() -> None:
    store = MemoryStore()
    now = int(time.time() * 1000)
    old = Report("gone", "node", at_ms=now - 200_000, interval=60)
    ancient = Report("ancient", "node", at_ms=now - int(FORGET_AFTER * 1000) - 1, interval=60)
    for r in (old, ancient):
        await store.put(f"ns/presence/{r.id}", r.encode())
    [seen] = await read_reports(store, "ns")
    assert seen.id == "gone" and not seen.live(now)
    assert [i.key for i in (await store.list("ns/presence/")).items] == ["ns/presence/gone"]
