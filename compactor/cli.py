"""``okq-compactor``: where the state lives, plus how and how often to compact.

Only the flags the compactor uses: the store and namespace settings shared with
``okq serve`` (same ``OKQ_*`` variables; the node-only ones are still read from
the environment but have no flag here), and the compactor's own durations,
which must be finite and positive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from compactor.core import Compactor, CompactorOptions, Report, children
from okq.clock import SystemClock
from okq.errors import ConditionalWritesUnsupported, OkqError, StorageError
from okq.flags import settings_from, settings_options
from okq.keys import NAME_RE, manifests_prefix
from okq.presence import Reporter
from okq.runtime import EngineOptions, Runtime
from okq.settings import Settings
from okq.store import CountingStore, Store, exit_past_native_threads, open_store
from okq.store.selfcheck import check_conditional_writes

if TYPE_CHECKING:  # aiohttp's server is loaded only when metrics are served
    from aiohttp import web

log = logging.getLogger("okq.compactor")


class Metrics:
    def __init__(self, store: CountingStore | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        if store is not None:
            r.register(_StoreCollector(store))
        self.counters = {
            name: Counter(f"okq_compactor_{name}", text, registry=r)
            for name, text in (
                ("segments_folded", "finished segments dropped from manifests"),
                ("segments_merged", "narrow segments merged into wider ones"),
                ("items_moved", "live items carried into merged segments"),
                ("items_expired", "items removed by retention"),
                ("items_expired_to_dead", "items past retention moved to a dead-letter queue"),
                ("objects_deleted", "objects deleted"),
                ("bytes_reclaimed", "bytes deleted"),
            )
        }
        self.passes = Counter("okq_compactor_passes", "completed passes", registry=r)
        self.lag = Gauge("okq_compactor_lag_seconds",
                         "seconds between the last two passes over a queue", ["queue"],
                         registry=r)
        self.duration = Gauge("okq_compactor_pass_seconds", "duration of the last pass",
                              registry=r)

    def record(self, report: Report) -> None:
        for name, counter in self.counters.items():
            counter.inc(getattr(report, name))
        for queue, lag in report.lag.items():
            self.lag.labels(queue).set(lag)
        self.duration.set(report.seconds)
        self.passes.inc()


class _StoreCollector(Collector):
    """The compactor's object-store requests, read at scrape time (same name as a
    node's: the bill of the fleet is the sum)."""

    def __init__(self, store: CountingStore) -> None:
        self.store = store

    def collect(self) -> Iterator[CounterMetricFamily]:
        ops = CounterMetricFamily("okq_store_requests", "object-store requests by operation",
                                  labels=["operation"])
        for op, n in sorted(self.store.requests.items()):
            ops.add_metric([op], n)
        yield ops


class Seconds(click.types.FloatParamType):
    """A finite, positive number of seconds (shown as FLOAT): NaN, infinities,
    negatives and zero are refused at parse time, naming the flag (exit code 2).
    Zero is no duration here: no pause between passes, no age, no grace."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        seconds = float(super().convert(value, param, ctx))
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        if seconds <= 0:
            self.fail(f"{value!r} is not a positive number of seconds", param, ctx)
        return seconds


SECONDS = Seconds()
#: The Settings fields the compactor uses; the rest are the node's.
SETTINGS = ("store", "endpoint_url", "s3_timeout", "namespace", "self_check", "log_level",
            "report_interval", "manifest_chunk")
PUBLISH_DEADLINE = EngineOptions().publish_timeout


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@settings_options(SETTINGS)
@click.option("--all-namespaces", is_flag=True,
              help="compact every namespace found in the store, not only --namespace")
@click.option("--once", is_flag=True, help="run one pass and exit")
@click.option("--interval", type=SECONDS, default=30.0, show_default=True,
              help="seconds between passes")
@click.option("--safety-age", type=SECONDS, default=3600.0, show_default=True,
              help="seconds an unreferenced object must have aged before it is deleted: "
              f"more than the nodes' publish deadline ({PUBLISH_DEADLINE:g} s) plus their "
              "clock error")
@click.option("--lease-grace", type=SECONDS, default=60.0, show_default=True,
              help="seconds a collected segment's lease object outlives it (longer than "
              "any node's request)")
@click.option("--gc-every", type=click.IntRange(1, 100_000), default=10, show_default=True,
              help="passes between garbage sweeps (LISTs of every queue's objects, billed "
              "like PUTs; garbage waits --safety-age anyway)")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="serve Prometheus metrics on this port (default: none)")
@click.option("--metrics-host", default=None,
              help="address for --metrics-port [env OKQ_HOST; default: 127.0.0.1]")
def main(once: bool, interval: float, safety_age: float, lease_grace: float, gc_every: int,
         all_namespaces: bool, metrics_port: int | None, metrics_host: str | None,
         **flags: Any) -> None:
    """Compact okq queues: fold tombstones, merge segments, enforce retention, collect
    garbage."""
    settings = settings_from(flags)
    _check_safety_age(safety_age, settings)
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if safety_age < 120:
        log.warning("a safety age under 120 s can abort produces of nodes whose clocks lag")
    try:
        options = CompactorOptions(safety_age=safety_age, lease_grace=lease_grace,
                                   gc_every=1 if once else gc_every)
        asyncio.run(run(settings, options, once, interval, metrics_port, all_namespaces,
                        metrics_host))
    except (OkqError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    exit_past_native_threads(0)  # everything is closed: see its docstring


def _check_safety_age(safety_age: float, settings: Settings) -> None:
    """An unreferenced segment younger than the nodes' publish deadline may still be
    published: collecting it would abort that produce, so refuse such an age."""
    deadline = settings.engine_options().publish_timeout
    if safety_age <= deadline:
        raise click.BadParameter(
            f"{safety_age:g} s is not above the nodes' publish deadline ({deadline:g} s): "
            "an unreferenced segment that young may still be published",
            param_hint="'--safety-age'")


async def run(settings: Settings, options: CompactorOptions, once: bool, interval: float,
              metrics_port: int | None, all_namespaces: bool = False,
              metrics_host: str | None = None) -> None:
    store = CountingStore(open_store(settings.store, endpoint_url=settings.endpoint_url,
                                     timeout=settings.s3_timeout))
    compactors: dict[str, Compactor] = {}
    reporters = _Reporters(store, settings.report_interval if not once else 0.0, interval)

    def compactor_for(ns: str) -> Compactor:
        if ns not in compactors:
            rt = Runtime(store, ns, SystemClock(), settings.engine_options())
            compactors[ns] = Compactor(rt, options=options)
            reporters.start(ns)
        return compactors[ns]

    if settings.self_check:
        await _self_check(store, once)
    metrics = Metrics(store)
    host = metrics_host or settings.host
    runner = await _serve_metrics(metrics, host, metrics_port) if metrics_port else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            try:
                names = await namespaces(store) if all_namespaces else [settings.namespace]
                for ns in names:
                    report = await compactor_for(ns).run_once()
                    metrics.record(report)
                    reporters.passed(ns, report)
                    _log_pass(ns, report)
            except StorageError as exc:
                if once:
                    raise
                # A pass is safe to cut short anywhere (every step is a CAS or an
                # idempotent delete): the next one takes up where this one stopped.
                log.warning("pass cut short by the store (%s); the next pass in %gs",
                            exc, interval)
            if once:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
    finally:
        await reporters.stop()
        for c in compactors.values():
            await c.rt.close()
        await store.close()
        if runner is not None:
            await runner.cleanup()


class _Reporters:
    """The compactor's presence report in each namespace it compacts (``okq.presence``):
    its last pass, how long it took, and the longest gap between two passes over a
    queue (its lag)."""

    def __init__(self, store: CountingStore, every: float, interval: float) -> None:
        self.store, self.every, self.interval = store, every, interval
        self.id = f"compactor-{secrets.token_hex(4)}"
        self.running: dict[str, Reporter] = {}
        self.last: dict[str, dict[str, Any]] = {}

    def start(self, ns: str) -> None:
        if self.every > 0:
            self.running[ns] = Reporter(self.store, ns, self.id, "compactor",
                                        interval=self.every, info=lambda: self.last.get(ns, {}))
            self.running[ns].start()

    def passed(self, ns: str, report: Report) -> None:
        passes = self.last.get(ns, {}).get("passes", 0) + 1
        self.last[ns] = {"last_pass_ms": int(time.time() * 1000), "passes": passes,
                         "pass_seconds": round(report.seconds, 3), "queues": report.queues,
                         "interval": self.interval,
                         "lag": round(max(report.lag.values(), default=0.0), 3)}

    async def stop(self) -> None:
        for reporter in self.running.values():
            await reporter.stop()


def _log_pass(ns: str, report: Report) -> None:
    log.info(
        "pass over namespace %s: %d queues, %d segments folded, %d merged into "
        "%d, %d items moved, %d expired, %d objects (%d bytes) deleted in %.2fs",
        ns, report.queues, report.segments_folded,
        report.segments_merged, report.merged_into, report.items_moved,
        report.items_expired, report.objects_deleted, report.bytes_reclaimed,
        report.seconds,
    )


async def _self_check(store: Store, once: bool, attempts: int = 10) -> None:
    """The store's conditional writes, checked at start. A store that ignores them is
    refused at once; one that fails to answer is asked again, a few times, before the
    compactor gives up (a compactor started beside a store that is restarting)."""
    for attempt in range(attempts):
        try:
            await check_conditional_writes(store)
            return
        except ConditionalWritesUnsupported:
            raise
        except StorageError as exc:
            if once or attempt == attempts - 1:
                raise
            log.warning("store self-check failed (%s); trying again in 2s", exc)
            await asyncio.sleep(2)


async def namespaces(store: Store) -> list[str]:
    """Namespaces that hold at least one queue manifest."""
    found = []
    async for name in children(store, ""):
        if NAME_RE.fullmatch(name):
            page = await store.list(manifests_prefix(name), limit=1)
            if page.items:
                found.append(name)
    return found


async def _serve_metrics(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry),
                            content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
