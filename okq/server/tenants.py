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

from okq.engine import Engine
from okq.errors import Forbidden, Overloaded
from okq.service import Admission, QueueService
from okq.settings import Settings
from okq.store import Store
from okq.tokens import TokenSigner

log = logging.getLogger("okq.server")


class Tenants:
    """Queue services by namespace; the node's own is ``default``."""

    def __init__(self, settings: Settings, store: Store, keys: list[bytes],
                 default: QueueService, *, clock: Any = None) -> None:
        self.settings = settings
        self.store = store
        self.keys = keys
        self.clock = clock
        self.namespace = settings.namespace
        self.default = default
        self._services: dict[str, QueueService] = {}
        self._opening: dict[str, asyncio.Lock] = {}

    async def service(self, namespace: str) -> QueueService:
        """The service of ``namespace``, opened on first use."""
        if namespace == self.namespace:
            return self.default
        found = self._services.get(namespace)
        if found is not None:
            return found
        if self.settings.sequencer:
            raise Forbidden(f"this node runs in sequencer mode for namespace "
                            f"{self.namespace!r} only; namespace {namespace!r} needs nodes "
                            "of its own")
        lock = self._opening.setdefault(namespace, asyncio.Lock())
        async with lock:
            if namespace not in self._services:
                if len(self._services) + 1 >= self.settings.max_namespaces:
                    raise Overloaded(f"this node serves {self.settings.max_namespaces} "
                                     "namespaces already (--max-namespaces)", retry_after=60)
                engine = Engine(self.store, TokenSigner(self.keys), namespace=namespace,
                                clock=self.clock, options=self.settings.engine_options())
                await engine.start(self_check=False)  # the node's store passed at start
                self._services[namespace] = QueueService(
                    engine, Admission.from_settings(self.settings))
                log.info("serving namespace %r too", namespace)
        return self._services[namespace]

    def served(self) -> list[str]:
        return [self.namespace, *self._services]

    def stop_waiting(self) -> None:
        for service in self._services.values():
            service.engine.stop_waiting()

    async def close(self) -> None:
        """Close the engines opened for other namespaces (flushing their batches)."""
        for service in self._services.values():
            await service.engine.close()
        self._services.clear()
