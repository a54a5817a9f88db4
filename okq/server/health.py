"""What ``GET /health`` answers from: the node's own recent store requests.

A probe every few seconds from a load balancer or Kubernetes must not cost more
than the queues it watches. :class:`StoreWatch` sits between the node's parts and
its store and notes when the store last answered (any answer: an object, a 404,
a lost condition) and when a request last failed (a storage error, a timeout).
:class:`Health` answers from those notes, and asks the store itself (one HEAD of
a key that does not exist, GET-class price) only when the node has heard
nothing from it for ``quiet`` seconds, or its last word was a failure older than
``recheck`` seconds. Concurrent probes share that one request.

What a 200 proves: the event loop answers, and the store answered one of this
node's requests within ``quiet`` seconds, with no failure since. It does not
prove that every key or every namespace is readable (docs/OPERATIONS.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from okq.errors import CASConflict, ObjectNotFound, OkqError
from okq.store.base import Blob, ListPage, ObjectInfo, Store

R = TypeVar("R")

#: Seconds without a word from the store before a probe asks it directly.
QUIET = 30.0
#: Seconds a failure is answered from the notes before the store is asked again.
RECHECK = 2.0
#: Seconds a probe's own store request may take before it counts as a failure:
#: under the 2 s timeout of deploy/helm's probes.
PROBE_TIMEOUT = 1.5
#: The key a probe reads: never written, so the answer is a 404 (an answer).
PROBE_KEY = "health/probe"


class StoreWatch:
    """A store wrapper that notes the last answer and the last failure (monotonic)."""

    def __init__(self, inner: Store, now: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.url = inner.url
        self.now = now
        self.answered: float | None = None
        self.failed: float | None = None
        self.failure = ""  # the failure's kind (its class name), never its text

    async def _watch(self, call: Awaitable[R]) -> R:
        try:
            result = await call
        except (ObjectNotFound, CASConflict):
            self.answered = self.now()  # the store answered: no such key, lost condition
            raise
        except (OkqError, TimeoutError, OSError) as exc:
            self.note_failure(exc)
            raise
        self.answered = self.now()
        return result

    def note_failure(self, exc: BaseException) -> None:
        self.failed, self.failure = self.now(), type(exc).__name__

    async def get(self, key: str) -> Blob:
        return await self._watch(self.inner.get(key))

    async def head(self, key: str) -> ObjectInfo:
        return await self._watch(self.inner.head(key))

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: bool = False, want_etag: bool = True) -> str:
        return await self._watch(self.inner.put(key, data, if_match=if_match,
                                                if_none_match=if_none_match,
                                                want_etag=want_etag))

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        await self._watch(self.inner.delete(key, if_match=if_match))

    async def list(self, prefix: str, *, start_after: str | None = None,
                   limit: int = 1000) -> ListPage:
        return await self._watch(self.inner.list(prefix, start_after=start_after, limit=limit))

    async def close(self) -> None:
        await self.inner.close()


@dataclass(frozen=True)
class Verdict:
    ok: bool
    #: seconds since the store last answered this node (None: never)
    heard_s: float | None
    failure: str = ""


class Health:
    """The node's answer to ``/health``, from a :class:`StoreWatch`'s notes."""

    def __init__(self, watch: StoreWatch, namespace: str, *, quiet: float = QUIET,
                 recheck: float = RECHECK, timeout: float = PROBE_TIMEOUT) -> None:
        self.watch = watch
        self.key = f"{namespace}/{PROBE_KEY}"
        self.quiet, self.recheck, self.timeout = quiet, recheck, timeout
        self._probe: asyncio.Task[None] | None = None

    async def check(self) -> Verdict:
        if self._needs_probe():
            await self._probe_once()
        return self._verdict()

    def _needs_probe(self) -> bool:
        w, now = self.watch, self.watch.now()
        if w.failed is not None and (w.answered is None or w.failed >= w.answered):
            return now - w.failed > self.recheck
        return w.answered is None or now - w.answered > self.quiet

    async def _probe_once(self) -> None:
        """One store request, shared by every probe that arrives while it runs."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._ask())
        await asyncio.shield(self._probe)

    async def _ask(self) -> None:
        try:
            await asyncio.wait_for(self.watch.head(self.key), self.timeout)
        except ObjectNotFound:
            pass  # the expected answer: the store is there
        except TimeoutError as exc:
            self.watch.note_failure(exc)  # the request was cancelled before it failed
        except (OkqError, OSError):
            pass  # noted by the watch

    def _verdict(self) -> Verdict:
        w = self.watch
        heard = None if w.answered is None else round(w.now() - w.answered, 3)
        failing = w.failed is not None and (w.answered is None or w.failed >= w.answered)
        return Verdict(not failing and w.answered is not None, heard,
                       w.failure if failing else "")


def store_kind(url: str) -> str:
    """The store's scheme only (``s3``, ``file``, ``memory``): its endpoint, bucket
    and path are not told to an unauthenticated caller."""
    return url.split("://", 1)[0]
