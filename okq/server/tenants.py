"""The namespaces a node serves: its own, and those its callers' keys act in.

Each namespace has its own engine (its own tokens' namespace, its own caches) over
the node's one store, opened the first time a request of that namespace arrives and
closed with the node. In sequencer mode a node serves its own namespace only:
roles and forwarding are per namespace, and a second namespace needs nodes of its
own (``--namespace``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from okq.admit import Admission
from okq.auth import NAMESPACE_HEADER
from okq.engine import Engine
from okq.errors import Forbidden, Overloaded
from okq.pipeline import Meters, Pipeline, build
from okq.settings import Settings
from okq.store import Store
from okq.tokens import TokenSigner

log = logging.getLogger("okq.server")


def admission(settings: Settings) -> Admission:
    """A node's admission limits (its ``--max-waiting``, ``--max-pending-produce``)."""
    return Admission(max_waiting=settings.max_waiting,
                     max_pending_produce=settings.max_pending_produce)


class Tenants:
    """Pipelines by namespace; the node's own is ``default``."""

    def __init__(self, settings: Settings, store: Store, keys: list[bytes],
                 default: Pipeline, meters: Meters, *, clock: Any = None) -> None:
        self.settings = settings
        self.store = store
        self.keys = keys
        self.clock = clock
        self.namespace = settings.namespace
        self.default = default
        self.meters = meters
        self._engines: dict[str, Engine] = {}
        self._services: dict[str, Pipeline] = {}
        self._opening: dict[str, asyncio.Lock] = {}

    async def pipeline(self, namespace: str) -> Pipeline:
        """The pipeline of ``namespace``, opened on first use."""
        if namespace == self.namespace:
            return self.default
        found = self._services.get(namespace)
        if found is not None:
            return found
        if self.settings.sequencer:
            raise Forbidden(f"this node runs in sequencer mode for namespace "
                            f"{self.namespace!r} only; namespace {namespace!r} needs nodes "
                            "of its own", field=NAMESPACE_HEADER, namespace=namespace)
        lock = self._opening.setdefault(namespace, asyncio.Lock())
        async with lock:
            if namespace not in self._services:
                if len(self._services) + 1 >= self.settings.max_namespaces:
                    raise Overloaded(f"this node serves {self.settings.max_namespaces} "
                                     "namespaces already (--max-namespaces)", retry_after=60)
                signer = TokenSigner(self.keys, self.settings.token_format)
                engine = Engine(self.store, signer, namespace=namespace,
                                clock=self.clock, options=self.settings.engine_options())
                await engine.start(self_check=False)  # the node's store passed at start
                self._engines[namespace] = engine
                self._services[namespace] = build(
                    engine, admission(self.settings), meters=self.meters,
                    default_partitions=self.settings.default_partitions)
                log.info("serving namespace %r too", namespace)
        return self._services[namespace]

    def served(self) -> list[str]:
        return [self.namespace, *self._services]

    def stop_waiting(self) -> None:
        for engine in self._engines.values():
            engine.stop_waiting()

    async def close(self) -> None:
        """Close the engines opened for other namespaces (flushing their batches)."""
        for engine in self._engines.values():
            await engine.close()
        self._services.clear()
        self._engines.clear()
