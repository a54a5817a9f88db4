"""Who works on a namespace, and what it costs: one small report object per process.

Every node and every compactor writes ``{ns}/presence/{id}`` (msgpack, one PUT, no
condition: nobody else writes that key) when it starts and then every
``interval`` seconds, and deletes it when it stops cleanly. A report says what the
process is, where it is reached, its object-store requests so far and per second
over its last interval, and a few facts of its own (a node's sequencer roles, a
compactor's last pass). Any node reads them all (one LIST and a GET each) to show
the fleet (``/v1/fleet.status``, the console's fleet page): the same answer
whichever node serves it, with no node asking another.

The reports are an operator's view, never an input to a queue's state. A process
killed without a clean stop leaves its report behind: readers show a report older
than three of its intervals as gone and delete one older than ``FORGET_AFTER``
(S3 does not bill a DELETE).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from okq.errors import FormatError, ObjectNotFound, StorageError
from okq.keys import presence_prefix
from okq.model import pack_object, unpack_object
from okq.store import CountingStore, Store, list_all

log = logging.getLogger("okq.presence")

#: S3 Standard (us-east-1) request prices in dollars per request; DELETE is free.
PRICES = {"get": 0.0004 / 1000, "head": 0.0004 / 1000, "put": 0.005 / 1000,
          "list": 0.005 / 1000, "delete": 0.0}
MONTH_S = 30 * 86_400
#: A report not rewritten for this long belongs to a process that is gone for good.
FORGET_AFTER = 86_400.0
#: Reports read at once.
READS = 16


def dollars_per_month(per_s: dict[str, float]) -> float:
    """What requests at these rates (by operation) cost in a 30-day month."""
    return sum(PRICES.get(op, PRICES["get"]) * rate for op, rate in per_s.items()) * MONTH_S


@dataclass
class Report:
    id: str
    kind: str  # "node" or "compactor"
    url: str = ""
    started_ms: int = 0
    at_ms: int = 0  # when it was written, by its writer's clock
    interval: float = 60.0
    requests: dict[str, int] = field(default_factory=dict)  # so far, by operation
    per_s: dict[str, float] = field(default_factory=dict)  # over the last interval
    info: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return pack_object("presence", {
            "id": self.id, "kind": self.kind, "url": self.url, "started": self.started_ms,
            "at": self.at_ms, "interval": self.interval, "requests": self.requests,
            "per_s": self.per_s, "info": self.info})

    @classmethod
    def decode(cls, data: bytes) -> Report:
        raw = unpack_object("presence", data)
        try:
            return cls(str(raw["id"]), str(raw["kind"]), str(raw["url"]), int(raw["started"]),
                       int(raw["at"]), float(raw["interval"]),
                       {str(k): int(v) for k, v in raw["requests"].items()},
                       {str(k): float(v) for k, v in raw["per_s"].items()}, dict(raw["info"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FormatError(f"malformed presence report: {exc}", data=data) from None

    def age(self, now_ms: int) -> float:
        return max(0.0, (now_ms - self.at_ms) / 1000)

    def live(self, now_ms: int) -> bool:
        """Rewritten within three of its intervals (a missed write or two is no death)."""
        return self.age(now_ms) <= 3 * self.interval + 5


class Reporter:
    """Writes this process's report every ``interval`` seconds while it runs.

    ``info`` is called at each write for the process's own facts."""

    def __init__(self, store: CountingStore, ns: str, report_id: str, kind: str, *,
                 interval: float, url: str = "",
                 info: Callable[[], dict[str, Any]] | None = None) -> None:
        self.store = store
        self.key = presence_prefix(ns) + report_id
        self.report = Report(report_id, kind, url, int(time.time() * 1000), interval=interval)
        self.info = info or dict
        self._task: asyncio.Task[None] | None = None
        self._last: tuple[float, dict[str, int]] = (time.monotonic(), dict(store.requests))

    def start(self) -> None:
        if self.report.interval > 0:
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Stop writing and delete the report: a clean stop leaves nothing behind."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(StorageError, OSError):
            await self.store.delete(self.key)

    async def _loop(self) -> None:
        await asyncio.sleep(min(1.0, self.report.interval))  # a node learns its URL first
        while True:
            try:
                await self.write()
            except (StorageError, OSError) as exc:
                log.info("could not write presence report %s: %s", self.key, exc)
            await asyncio.sleep(self.report.interval)

    async def write(self) -> None:
        now, counts = time.monotonic(), dict(self.store.requests)
        then, before = self._last
        took = max(now - then, 1e-3)
        r = self.report
        r.at_ms, r.requests, r.info = int(time.time() * 1000), counts, self.info()
        r.per_s = {op: round((n - before.get(op, 0)) / took, 4) for op, n in counts.items()}
        self._last = (now, counts)
        await self.store.put(self.key, r.encode())


async def read_reports(store: Store, ns: str) -> list[Report]:
    """Every report of the namespace, oldest process first; a report left by a
    process gone for longer than ``FORGET_AFTER`` is deleted instead."""
    prefix = presence_prefix(ns)
    keys = [info.key async for info in list_all(store, prefix)]
    gate = asyncio.Semaphore(READS)

    async def one(key: str) -> Report | None:
        async with gate:
            try:
                return Report.decode((await store.get(key)).data)
            except (ObjectNotFound, FormatError):
                return None

    now_ms = int(time.time() * 1000)
    out = []
    for key, report in zip(keys, await asyncio.gather(*(one(k) for k in keys)), strict=True):
        if report is None:
            continue
        if report.age(now_ms) > FORGET_AFTER:
            with contextlib.suppress(ObjectNotFound, StorageError):
                await store.delete(key)
            continue
        out.append(report)
    return sorted(out, key=lambda r: (r.kind != "node", r.started_ms, r.id))
