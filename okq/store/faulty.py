"""A wrapper that injects faults: errors, latency, ambiguous writes and crashes.

Modes:

* ``error`` — the request fails before reaching the store (StorageError);
* ``ambiguous`` — the request reaches the store and lands, then the caller sees
  a StorageError, as after a timeout on the way back;
* ``overtaken`` — like ``ambiguous``, but between the landing and the error the
  rule's ``then`` hook runs: an async callable given the key, standing for
  another writer (another engine, a compactor) that writes the same object
  before the caller can re-read it. The caller's re-read then finds someone
  else's version on top of its own landed write: the case where "my nonce is
  not there" does not mean "my write did not land". A write that does not
  land (it lost its condition) leaves the rule armed for the next one;
* ``crash`` — raises :class:`SimulatedCrash`, a BaseException that okq's code
  does not catch, standing for the process dying at that call (before it);
* ``latency`` — the call is delayed by ``delay`` seconds, then proceeds.

Rules match an operation name (``get``, ``head``, ``put``, ``delete``,
``list`` or ``*``) and a key predicate (a substring, or a callable). Random
faults with a seed give reproducible chaos. Every call is logged in ``calls``.

``ambiguous`` and ``overtaken`` apply to writes (put, delete) only; a read that
matches such a rule proceeds normally (and spends the rule). A rule does not
fire again while its own hook runs, so a hook may write through this same store
without overtaking itself; an exception raised by the hook reaches the caller
instead of the StorageError (a test's own failure is never mistaken for a
store fault).

Example: a manifest write that lands, is overwritten by another engine's
produce, and times out for its writer::

    store.inject("put", "overtaken", key="/manifests/q",
                 then=lambda key: other_engine.produce("q", [b"x"]))
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from okq.errors import StorageError
from okq.store.base import Blob, ListPage, ObjectInfo, Store

Mode = Literal["error", "ambiguous", "overtaken", "crash", "latency"]
#: What an ``overtaken`` rule runs between the landed write and the error.
Hook = Callable[[str], Awaitable[Any]]
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
    then: Hook | None = None
    running: bool = False  # its hook is running: the rule does not fire again meanwhile

    def applies(self, op: str, key: str) -> bool:
        return (
            self.times != 0 and not self.running and self.op in (op, "*") and self.match(key)
        )


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
        then: Hook | None = None,
    ) -> Rule:
        """Add a rule; ``times=-1`` keeps it forever. ``then`` is required by
        ``overtaken`` (and accepted by no other mode)."""
        if (mode == "overtaken") != (then is not None):
            raise ValueError("the overtaken mode, and only it, takes a then= hook")
        match = key if callable(key) else (lambda k, s=key: s in k)
        rule = Rule(op, match, mode, times, delay, then)
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

    def _mode(self, op: str, key: str, write: bool) -> tuple[Mode | None, Rule | None]:
        """The fault for this call, if any: a matching rule's, else a random one."""
        rule = self._pick(op, key)
        mode: Mode | None = rule.mode if rule else None
        if mode is None and self.error_rate and self._rng.random() < self.error_rate:
            mode = "error"
        if mode is None and write and self.ambiguous_rate:
            if self._rng.random() < self.ambiguous_rate:
                mode = "ambiguous"
        if mode is not None:
            self.injected.append((op, key, mode))
        return mode, rule

    async def _call(self, op: str, key: str, write: bool, fn: Callable[[], Awaitable[T]]) -> T:
        self.calls.append((op, key))
        if self.max_latency:
            await asyncio.sleep(self._rng.uniform(0, self.max_latency))
        mode, rule = self._mode(op, key, write)
        if mode == "latency" and rule is not None:
            await asyncio.sleep(rule.delay)
        elif mode == "crash":
            raise SimulatedCrash(f"crash injected at {op} {key}")
        elif mode == "error":
            raise StorageError(f"injected error at {op} {key}", key=key, injected=True)
        elif mode == "ambiguous" and write:
            await fn()
            raise StorageError(f"injected ambiguous {op} {key} (it landed)", key=key)
        elif mode == "overtaken" and write and rule is not None and rule.then is not None:
            try:
                await fn()
            except BaseException:
                self._unspend(rule)  # it did not land: nothing to overtake yet
                raise
            await self._overtake(rule, rule.then, key)
            raise StorageError(
                f"injected overtaken {op} {key} (it landed, then another writer wrote)", key=key
            )
        return await fn()

    def _unspend(self, rule: Rule) -> None:
        """Give an ``overtaken`` rule back the use a write that did not land took
        (a lost condition, say): the fault is "it landed, then ...", so it waits
        for a write that lands."""
        if rule.times >= 0:
            rule.times += 1
        self.injected.pop()

    @staticmethod
    async def _overtake(rule: Rule, hook: Hook, key: str) -> None:
        """Run the rule's hook (the other writer), the rule held back meanwhile."""
        rule.running = True
        try:
            await hook(key)
        finally:
            rule.running = False

    async def get(self, key: str) -> Blob:
        return await self._call("get", key, False, lambda: self.inner.get(key))

    async def head(self, key: str) -> ObjectInfo:
        return await self._call("head", key, False, lambda: self.inner.head(key))

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        return await self._call(
            "put",
            key,
            True,
            lambda: self.inner.put(key, data, if_match=if_match, if_none_match=if_none_match,
                                   want_etag=want_etag),
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
