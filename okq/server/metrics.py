"""Prometheus metrics of one node (prometheus-client, one registry per app)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from okq.engine import Engine, QueueStats
from okq.errors import OkqError, QueueNotFound
from okq.sequencer import Sequencer
from okq.service import QueueService
from okq.sqs.http import SqsFrontEnd
from okq.store import CountingStore

log = logging.getLogger("okq.server")

#: Seconds a scrape waits for the depth gauges' refresh before answering with
#: the figures it has (the refresh goes on and serves the next scrape).
DEPTH_WAIT = 5.0
#: Stats calls of one refresh at once.
DEPTH_CONCURRENCY = 8

disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # process_cpu_seconds_total and memory: a sequencer holder's core is the
        # first limit of a fleet (docs/OPERATIONS.md, "Sizing").
        ProcessCollector(registry=r)
        self.requests = Counter(
            "okq_http_requests", "HTTP requests by endpoint and status",
            ["endpoint", "status"], registry=r,
        )
        self.latency = Histogram(
            "okq_http_request_seconds", "HTTP request latency by endpoint", ["endpoint"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.batch = Histogram(
            "okq_batch_items", "items per produce, lease and complete call", ["operation"],
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000), registry=r,
        )
        self.items = Counter(
            "okq_items", "items by operation (produced, leased, completed, retried)",
            ["operation"], registry=r,
        )
        self.queue_stats: dict[str, QueueStats] = {}
        self._counted: dict[tuple[str, int], Any] = {}
        self._timed: dict[str, Any] = {}

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        """Count a request and its latency, through the labelled children kept here:
        ``labels`` checks the labels and takes a lock on every call."""
        counted = self._counted.get((endpoint, status))
        if counted is None:
            counted = self._counted[(endpoint, status)] = self.requests.labels(endpoint,
                                                                               str(status))
        timed = self._timed.get(endpoint)
        if timed is None:
            timed = self._timed[endpoint] = self.latency.labels(endpoint)
        counted.inc()
        timed.observe(seconds)

    def watch(self, engine: Engine, store: CountingStore,
              sequencer: Sequencer | None = None) -> None:
        self.registry.register(_EngineCollector(engine, store, self, sequencer))

    def watch_sqs(self, front: SqsFrontEnd) -> None:
        self.registry.register(_SqsCollector(front))


class _SqsCollector(Collector):
    """The SQS API's answers, read off its front end at scrape time."""

    def __init__(self, front: SqsFrontEnd) -> None:
        self.front = front

    def collect(self) -> Iterator[CounterMetricFamily]:
        answers = CounterMetricFamily("okq_sqs_requests", "SQS API requests by action and "
                                      "answer (OK or SQS's error code)", labels=["action", "code"])
        for (action, code), n in sorted(self.front.answers.items()):
            answers.add_metric([action, code], n)
        yield answers
        stale = CounterMetricFamily(
            "okq_sqs_stale_deletes", "DeleteMessage entries answered with success although "
            "their lease was lost: nothing was deleted (docs/SQS.md)")
        stale.add_metric([], self.front.stale_deletes)
        yield stale


class _EngineCollector(Collector):
    """Reads the engine's and store's own counters at scrape time."""

    def __init__(self, engine: Engine, store: CountingStore, metrics: Metrics,
                 sequencer: Sequencer | None) -> None:
        self.engine = engine
        self.store = store
        self.metrics = metrics
        self.sequencer = sequencer

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        ops = CounterMetricFamily(
            "okq_store_requests", "object-store requests by operation", labels=["operation"]
        )
        for op, n in sorted(self.store.requests.items()):
            ops.add_metric([op], n)
        yield ops
        sent = CounterMetricFamily("okq_store_bytes_sent", "bytes written to the store")
        sent.add_metric([], sum(self.store.bytes_in.values()))
        yield sent
        cas = CounterMetricFamily("okq_cas_conflicts", "conditional writes that lost a race")
        cas.add_metric([], self.engine.cas_conflicts)
        yield cas
        depth = GaugeMetricFamily("okq_queue_items", "items by queue and state",
                                  labels=["queue", "state"])
        for name, s in sorted(self.metrics.queue_stats.items()):
            for state in ("available", "in_flight", "scheduled", "waiting_retry", "dead"):
                depth.add_metric([name, state], getattr(s, state))
        yield depth
        if self.sequencer is not None:
            yield from _sequencer_metrics(self.sequencer)


def _sequencer_metrics(seq: Sequencer) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    roles = GaugeMetricFamily("okq_sequencer_roles", "sequencer roles (shards) this node holds")
    roles.add_metric([], len(seq.held()))
    yield roles
    forwards = CounterMetricFamily(
        "okq_sequencer_forwards",
        "changes sent to a sequencer by outcome: ok, error (an okq error answered), "
        "unreachable (port refused), unknown (no answer), direct (written here instead)",
        labels=["outcome"])
    for outcome, n in sorted(seq.forwards.items()):
        forwards.add_metric([outcome], n)
    yield forwards
    claims = CounterMetricFamily("okq_sequencer_claims", "sequencer roles this node claimed")
    claims.add_metric([], seq.claims)
    yield claims


class DepthGauges:
    """Keeps ``okq_queue_items`` fresh: a scrape of ``/metrics`` refreshes the
    counts of the queues this node knows (those it served, those it gauges),
    at most once per ``interval`` seconds and for at most ``max_queues`` queues;
    one stats call each (docs/OPERATIONS.md, "What to watch", states the cost).
    Nobody scraping: nothing refreshed, nothing spent."""

    def __init__(self, service: QueueService, served: Callable[[], list[str]],
                 metrics: Metrics, interval: float, max_queues: int) -> None:
        self.service, self.served, self.metrics = service, served, metrics
        self.interval, self.max_queues = interval, max_queues
        self.refreshed: float | None = None  # monotonic time of the last refresh
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """Refresh if due, waiting up to ``DEPTH_WAIT`` seconds for it."""
        now = time.monotonic()
        due = self.refreshed is None or now - self.refreshed >= self.interval
        if self.interval <= 0 or (not due and self._task is None):
            return
        if self._task is None:
            self.refreshed = now
            self._task = asyncio.create_task(self._refresh_all())
            self._task.add_done_callback(self._done)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), DEPTH_WAIT)
        except TimeoutError:
            pass

    def _done(self, task: asyncio.Task[None]) -> None:
        self._task = None

    def queues(self) -> list[str]:
        known = set(self.served()) | set(self.metrics.queue_stats)
        return sorted(known)[: self.max_queues]

    async def _refresh_all(self) -> None:
        gate = asyncio.Semaphore(DEPTH_CONCURRENCY)

        async def one(queue: str) -> None:
            async with gate:
                await self._refresh(queue)

        await asyncio.gather(*(one(q) for q in self.queues()))

    async def _refresh(self, queue: str) -> None:
        try:
            self.metrics.queue_stats[queue] = await self.service.stats(queue)
        except QueueNotFound:
            self.metrics.queue_stats.pop(queue, None)  # deleted: no gauge
        except OkqError as exc:  # keep the last figures; the store's health shows
            log.debug("queue depth of %s not refreshed: %s", queue, exc)
