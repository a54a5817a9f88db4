"""``okq-compactor``: the same Settings as a node, plus how often to run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

import click
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import ValidationError

from compactor.core import Compactor, CompactorOptions, Report, children
from okq.cli import _settings_options
from okq.engine import Engine, generate_key
from okq.errors import OkqError
from okq.keys import NAME_RE
from okq.settings import Settings
from okq.store import Store, open_store
from okq.tokens import TokenSigner

log = logging.getLogger("okq.compactor")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
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


@click.command()
@_settings_options
@click.option("--once", is_flag=True, help="run one pass and exit")
@click.option("--interval", type=float, default=30.0, show_default=True,
              help="seconds between passes")
@click.option("--safety-age", type=float, default=3600.0, show_default=True,
              help="seconds an unreferenced object must have aged before it is deleted")
@click.option("--lease-grace", type=float, default=60.0, show_default=True,
              help="seconds a collected segment's lease object outlives it (longer than "
              "any node's request)")
@click.option("--all-namespaces", is_flag=True,
              help="compact every namespace found in the store, not only --namespace")
@click.option("--metrics-port", type=int, default=None,
              help="serve Prometheus metrics on this port (default: none)")
def main(once: bool, interval: float, safety_age: float, lease_grace: float,
         all_namespaces: bool, metrics_port: int | None, **flags: Any) -> None:
    """Compact okq queues: fold tombstones, merge segments, enforce retention, collect
    garbage."""
    try:
        settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise click.UsageError(f"--{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if safety_age < 120:
        log.warning("a safety age under 120 s can abort produces of nodes whose clocks lag")
    try:
        options = CompactorOptions(safety_age=safety_age, lease_grace=lease_grace)
        asyncio.run(run(settings, options, once, interval, metrics_port, all_namespaces))
    except (OkqError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


async def run(settings: Settings, options: CompactorOptions, once: bool, interval: float,
              metrics_port: int | None, all_namespaces: bool = False) -> None:
    store = open_store(settings.store, endpoint_url=settings.endpoint_url)
    signer = TokenSigner([generate_key()])  # the compactor mints no lease tokens
    engines: dict[str, Compactor] = {}

    def compactor_for(ns: str) -> Compactor:
        if ns not in engines:
            engine = Engine(store, signer, namespace=ns, options=settings.engine_options())
            engines[ns] = Compactor(engine, options=options)
        return engines[ns]

    await compactor_for(settings.namespace).engine.start(self_check=settings.self_check)
    metrics = Metrics()
    runner = await _serve_metrics(metrics, settings.host, metrics_port) if metrics_port else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            names = await namespaces(store) if all_namespaces else [settings.namespace]
            for ns in names:
                report = await compactor_for(ns).run_once()
                metrics.record(report)
                log.info(
                    "pass over namespace %s: %d queues, %d segments folded, %d merged into "
                    "%d, %d items moved, %d expired, %d objects (%d bytes) deleted in %.2fs",
                    ns, report.queues, report.segments_folded,
                    report.segments_merged, report.merged_into, report.items_moved,
                    report.items_expired, report.objects_deleted, report.bytes_reclaimed,
                    report.seconds,
                )
            if once:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
    finally:
        for c in engines.values():
            await c.engine.close()
        await store.close()
        if runner is not None:
            await runner.cleanup()


async def namespaces(store: Store) -> list[str]:
    """Namespaces that hold at least one queue manifest."""
    found = []
    async for name in children(store, ""):
        if NAME_RE.fullmatch(name):
            page = await store.list(f"{name}/manifests/", limit=1)
            if page.items:
                found.append(name)
    return found


async def _serve_metrics(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry),
                            content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
