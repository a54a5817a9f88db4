"""One mutable object, written by one serialised, batching writer per process.

An engine never races itself on a key: every change to an object goes through
its :class:`Cell`, which gathers the changes submitted while the previous write
was in flight and applies them all in one compare-and-swap (group commit).

A change (okq/changes.py) is a function ``fn(obj, now) -> result`` that mutates
a fresh copy of the object, or returns :class:`~okq.changes.Unchanged` when
there is nothing to do; it may raise an :class:`~okq.errors.OkqError` to refuse
itself, which fails that change alone (it must raise before it mutates
anything: the transitions in okq/leases.py check first, then write). On
CASConflict the cell re-reads and re-applies the whole batch. A batch that
writes nothing (every change refused or unchanged) is decided again on a fresh
read when the cached copy may be stale, so no refusal rests on an old copy. On
any other StorageError the write is ambiguous: the cell re-reads and checks for
its own nonce, so a landed write is never applied twice.

A change may come with a follow-up, ``then(result)``: work on its result that
need not wait for the write (a lease's tokens and items). It runs while the
write that carries the result is on its way to the store, and the caller gets
what it returns once that write landed, never sooner. A write that did not land
is applied again, and the follow-up runs again on the new result.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from okq.batcher import Batcher
from okq.changes import Change, Then, Unchanged
from okq.clock import Clock
from okq.errors import CASConflict, ObjectNotFound, OkqError, StorageError
from okq.model import new_nonce
from okq.store.base import Store

log = logging.getLogger("okq.cell")


class Versioned(Protocol):
    ver: int
    nonce: str


T = TypeVar("T", bound=Versioned)


class Cell(Generic[T]):
    GIVE_UP_AFTER = 30.0  # seconds of lost races before a batch fails
    LOAD_ATTEMPTS = 5  # reads of an object whose references vanish before it fails

    def __init__(
        self,
        store: Store,
        key: str,
        clock: Clock,
        encode: Callable[[T], bytes],
        decode: Callable[[bytes], T],
        initial: Callable[[], T] | None = None,
        on_conflict: Callable[[], None] | None = None,
        *,
        copy: Callable[[T], T] | None = None,
        load: Callable[[bytes], Awaitable[None]] | None = None,
        prepare: Callable[[T], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.clock = clock
        self.encode = encode
        self.decode = decode
        self.initial = initial  # when given, a missing object is created with this
        self.on_conflict = on_conflict
        # How a write copies the readers' decoded object instead of decoding the
        # bytes again (a copy a change may mutate without the view seeing it).
        self.copy = copy
        # For an object that references others (a manifest its chunks): ``load``
        # reads what new bytes reference before they are decoded (ObjectNotFound:
        # gone, the object moved on: read it again), ``prepare`` writes what a new
        # version will reference before it is written.
        self.load = load
        self.prepare = prepare
        self.etag: str | None = None
        self.data: bytes | None = None
        self.fetched_ms: int | None = None  # None: nothing cached
        self.conflict_ms = 0  # last time a write lost a race
        self.reads = 0  # GETs issued: lets a caller tell whether a read was fresh
        self.ambiguous = 0  # writes that failed ambiguously (they may have landed)
        self._view: T | None = None  # decoded self.data, for readers
        self._view_of: bytes | None = None
        self._shared_read: asyncio.Future[None] | None = None
        self._batcher: Batcher[tuple[Change, Then | None], Any] = Batcher(
            self._write, name=f"cell {key}")

    # -- reading -----------------------------------------------------------
    async def refresh(self) -> None:
        for attempt in range(self.LOAD_ATTEMPTS):
            self.reads += 1
            try:
                blob = await self.store.get(self.key)
            except ObjectNotFound:
                self.etag, self.data = None, None
                break
            if blob.etag == self.etag and self.data is not None:
                break  # unchanged: keep the decoded view
            if self.load is not None:
                try:
                    await self.load(blob.data)
                except ObjectNotFound:
                    # What these bytes reference is collected only once a newer
                    # version stopped referencing it: read the newer one.
                    if attempt + 1 == self.LOAD_ATTEMPTS:
                        raise StorageError(f"{self.key!r} kept referencing objects that "
                                           f"are gone ({self.LOAD_ATTEMPTS} reads)") from None
                    continue
            self.etag, self.data = blob.etag, blob.data
            break
        self.fetched_ms = self.clock.now_ms()

    async def read(self, max_age_ms: int = 0) -> T | None:
        """A decoded copy no older than ``max_age_ms`` (by this process's clock);
        0 always reads the store.

        Readers that accept an old copy share one GET when several find the cache
        too old at once. A read with ``max_age_ms=0`` (and every writer) reads on
        its own: it must see what happened before it was asked.
        """
        if max_age_ms <= 0:
            await self.refresh()
        elif self.fetched_ms is None or self.clock.now_ms() - self.fetched_ms > max_age_ms:
            if self._shared_read is None or self._shared_read.done():
                self._shared_read = asyncio.ensure_future(self.refresh())
            await asyncio.shield(self._shared_read)
        return self.view()

    def view(self) -> T | None:
        """The cached object, decoded once per version and shared by readers: it
        must not be mutated (writers get fresh copies from :meth:`cached`)."""
        if self.data is None or self._view_of is not self.data:
            self._view, self._view_of = self.cached(), self.data
        return self._view

    def cached(self) -> T | None:
        if self.data is None:
            known_absent = self.fetched_ms is not None
            return self.initial() if self.initial is not None and known_absent else None
        return self.decode(self.data)

    def forget(self) -> None:
        self.fetched_ms = None

    # -- writing -----------------------------------------------------------
    async def update(self, fn: Change, then: Then | None = None) -> Any:
        """Apply ``fn`` in the next group write; return its result once it landed,
        or what ``then`` made of it while the write was on its way (module docstring)."""
        return await self._batcher.submit((fn, then))

    async def _write(self, batch: list[tuple[Change, Then | None]]) -> list[Any]:
        """Apply the batch and write it in one conditional PUT; the results, an
        exception for each change that refused itself."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.GIVE_UP_AFTER
        attempt = 0
        fresh = False  # whether the copy the batch was applied to was read in this write
        while loop.time() < give_up:
            if attempt:  # lost a race: back off with jitter so writers spread out
                await asyncio.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))
            attempt += 1
            if self.fetched_ms is None:
                await self.refresh()
                fresh = True
            # The version the batch is applied to, and its ETag, taken together: a
            # reader's refresh while the write awaits (``prepare`` writes chunks)
            # moves self.etag on, and a conditional PUT on that newer ETag of a
            # change made to the older copy would replace what came between.
            base = self.etag
            obj = self._working_copy()
            if obj is None:
                raise ObjectNotFound(f"no object {self.key!r}", key=self.key)
            results = self._apply(obj, batch)
            if all(isinstance(r, BaseException | Unchanged) for r in results):
                # Nothing to write. A refusal or a no-op decided on a cached copy
                # could be wrong (another process may have changed the object):
                # decide again on a fresh read before answering.
                if not fresh:
                    await self.refresh()
                    fresh, attempt = True, attempt - 1
                    continue
                return _answers(results, batch)
            answers = await self._put(obj, base, partial(_answers, results, batch),
                                      any(then is not None for _, then in batch))
            if answers is not None:
                return answers
        raise StorageError(
            f"gave up writing {self.key!r}: {attempt} attempts lost their races in "
            f"{self.GIVE_UP_AFTER:.0f} s"
        )

    def _working_copy(self) -> T | None:
        """A copy of the cached object for a batch to change: a copy of the readers'
        view when the cell knows how to copy one, else a fresh decode."""
        if self.copy is not None and self.data is not None:
            view = self.view()
            if view is not None:
                return self.copy(view)
        return self.cached()

    def _apply(self, obj: T, batch: list[tuple[Change, Then | None]]) -> list[Any]:
        now = self.clock.now_ms()
        results: list[Any] = []
        for fn, _ in batch:
            try:
                results.append(fn(obj, now))
            except OkqError as exc:
                results.append(exc)
        return results

    async def _put(self, obj: T, base: str | None, answers: Callable[[], list[Any]],
                   meanwhile: bool) -> list[Any] | None:
        """Write ``obj``, a change of the version whose ETag is ``base`` (None: of no
        object), conditionally on that version still being the current one; when it
        landed, ``answers()``, called while the write is on its way if ``meanwhile``
        (else after it); None when it did not land."""
        obj.ver += 1
        obj.nonce = new_nonce()
        if self.prepare is not None:
            await self.prepare(obj)
        data = self.encode(obj)
        if base is None:
            write = self.store.put(self.key, data, if_none_match=True)
        else:
            write = self.store.put(self.key, data, if_match=base)
        made: list[list[Any]] = []  # the answers, once the callback made them
        handle = None
        if meanwhile:
            # Called back once this task first waits inside the write (for the disk
            # or the network): the follow-ups run while the write is on its way,
            # and are answered only after it.
            handle = asyncio.get_running_loop().call_soon(lambda: made.append(answers()))
        try:
            etag = await write
        except CASConflict:
            if handle is not None:
                handle.cancel()
            self.conflict_ms = self.clock.now_ms()
            if self.on_conflict:
                self.on_conflict()
            self.forget()
            return None
        except StorageError as exc:
            log.warning("ambiguous write to %s: %s; re-reading", self.key, exc)
            self.ambiguous += 1
            if not await self._landed(obj.nonce):
                return None
            return _called(handle, made, answers)
        except BaseException:
            if handle is not None:
                handle.cancel()
            raise
        self.etag, self.data, self.fetched_ms = etag, data, self.clock.now_ms()
        # What landed is what readers see next: no decode of our own write. The next
        # batch changes a copy of its own, so this one is never changed.
        self._view, self._view_of = obj, data
        return _called(handle, made, answers)

    async def _landed(self, nonce: str) -> bool:
        for delay in (0.05, 0.2, 0.5, 1.0, 2.0):
            try:
                await self.refresh()
            except StorageError:
                await asyncio.sleep(delay)
                continue
            current = self.cached()
            return current is not None and current.nonce == nonce
        self.forget()
        raise StorageError(f"cannot tell whether a write to {self.key!r} landed")

    async def close(self) -> None:
        await self._batcher.close()


def _called(handle: asyncio.Handle | None, made: list[list[Any]],
            answers: Callable[[], list[Any]]) -> list[Any]:
    """The answers of a write that landed: those the callback ``handle`` made while
    the write was on its way, else made now (no callback, or a write that landed
    before the loop came round to it)."""
    if made:
        return made[0]
    if handle is not None:
        handle.cancel()
    return answers()


def _answers(results: list[Any], batch: list[tuple[Change, Then | None]]) -> list[Any]:
    """What each change's caller gets: its result, or the value of its Unchanged;
    passed through its follow-up, if it has one (an error there fails that change
    alone)."""
    out: list[Any] = []
    for r, (_, then) in zip(results, batch, strict=True):
        value = r.value if isinstance(r, Unchanged) else r
        if then is not None and not isinstance(value, BaseException):
            try:
                value = then(value)
            except Exception as exc:
                value = exc
        out.append(value)
    return out
