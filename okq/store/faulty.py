"""A wrapper that injects faults: errors, latency, ambiguous writes and crashes.

Modes:

* ``error`` — the request fails before reaching the store (StorageError);
* ``ambiguous`` — the request reaches the store and lands, then the caller sees
  a StorageError, as after a timeout on the way back;
* ``crash`` — raises :class:`SimulatedCrash`, a BaseException that okq's code
  does not catch, standing for the process dying at that call (before it);
* ``latency`` — the call is delayed by ``delay`` seconds, then proceeds.

Rules match an operation name (``get``, ``head``, ``put``, ``delete``,
``list`` or ``*``) and a key predicate (a substring, or a callable). Random
faults with a seed give reproducible chaos. Every call is logged in ``calls``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from okq.errors import StorageError
from okq.store.base import Blob, ListPage, ObjectInfo, Store

Mode = Literal["error", "ambiguous", "crash", "latency"]
T = TypeVar("T")


class SimulatedCrash(BaseException):
    """The process 'died' at this store call."""


@dataclass
class Rule:
    op: str
    match: Callable[[str], bool]
    mode: Mode
    times: int
    delay: float = 0.0

    def applies(self, op: str, key: str) -> bool:
        return self.times != 0 and self.op in (op, "*") and self.match(key)


class FaultyStore:
    def __init__(
        self,
        inner: Store,
        *,
        seed: int | None = None,
        error_rate: float = 0.0,
        ambiguous_rate: float = 0.0,
        max_latency: float = 0.0,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.rules: list[Rule] = []
        self.calls: list[tuple[str, str]] = []
        self.injected: list[tuple[str, str, Mode]] = []
        self._rng = random.Random(seed)
        self.error_rate = error_rate
        self.ambiguous_rate = ambiguous_rate
        self.max_latency = max_latency

    def inject(
        self,
        op: str,
        mode: Mode,
        *,
        key: str | Callable[[str], bool] = "",
        times: int = 1,
        delay: float = 0.0,
    ) -> Rule:
        """Add a rule; ``times=-1`` keeps it forever."""
        match = key if callable(key) else (lambda k, s=key: s in k)
        rule = Rule(op, match, mode, times, delay)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()
        self.error_rate = self.ambiguous_rate = self.max_latency = 0.0

    def _pick(self, op: str, key: str) -> Rule | None:
        for rule in self.rules:
            if rule.applies(op, key):
                if rule.times > 0:
                    rule.times -= 1
                return rule
        return None

    async def _call(self, op: str, key: str, write: bool, fn: Callable[[], Awaitable[T]]) -> T:
        self.calls.append((op, key))
        if self.max_latency:
            await asyncio.sleep(self._rng.uniform(0, self.max_latency))
        rule = self._pick(op, key)
        mode: Mode | None = rule.mode if rule else None
        if mode is None and self.error_rate and self._rng.random() < self.error_rate:
            mode = "error"
        if mode is None and write and self.ambiguous_rate:
            if self._rng.random() < self.ambiguous_rate:
                mode = "ambiguous"
        if mode is not None:
            self.injected.append((op, key, mode))
        if mode == "latency" and rule is not None:
            await asyncio.sleep(rule.delay)
        elif mode == "crash":
            raise SimulatedCrash(f"crash injected at {op} {key}")
        elif mode == "error":
            raise StorageError(f"injected error at {op} {key}", key=key, injected=True)
        elif mode == "ambiguous" and write:
            await fn()
            raise StorageError(f"injected ambiguous {op} {key} (it landed)", key=key)
        return await fn()

    async def get(self, key: str) -> Blob:
        return await self._call("get", key, False, lambda: self.inner.get(key))

    async def head(self, key: str) -> ObjectInfo:
        return await self._call("head", key, False, lambda: self.inner.head(key))

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        return await self._call(
            "put",
            key,
            True,
            lambda: self.inner.put(key, data, if_match=if_match, if_none_match=if_none_match),
        )

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        await self._call("delete", key, True, lambda: self.inner.delete(key, if_match=if_match))

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> ListPage:
        return await self._call(
            "list",
            prefix,
            False,
            lambda: self.inner.list(prefix, start_after=start_after, limit=limit),
        )

    async def close(self) -> None:
        await self.inner.close()
