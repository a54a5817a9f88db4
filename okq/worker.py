"""One worker loop over one queue protocol, over HTTP or in this process.

``Queues`` is what a worker needs from okq: lease, renew, complete (and
complete-and-produce), retry, and a queue's ``max_attempts``. The HTTP
``okq.client.Client`` has these calls as they are; ``EngineQueues(engine)``
gives them to an ``Engine`` in this process (library mode). Both hand the
handler the same item: ``okq.wire.LeasedItemOut``.

``Worker`` is the loop: lease up to ``concurrency`` items at a time, run the
handler on each while its lease is renewed every half lease timeout (the
queue's, unless the worker is given its own), complete what returns, retry what
raises after a backoff (the queue's ``max_attempts`` then dead-letters it), stop
gracefully. A failure that trying again may outlast (``okq.retrying.retryable``:
no node answering, overload, the store failing) never stops it: it waits with
exponential backoff and goes on, at start as while running. The Python worker and ``okq work``
(``okq.shellwork``) both run on it. A handler finishes its item by how it ends:

- returns ``None``: the item is completed (items whose handlers return in the same
  turn of the event loop are completed together, in one call);
- returns ``Outputs(queue, items)``: completed, and ``items`` produced to
  ``queue`` in the same step (they appear if and only if the completion commits);
- raises ``Failed(error)``: retried after a backoff, ``error`` recorded as it is;
- raises ``DeadLetter(reason)``: dead-lettered now, with ``reason``;
- raises another exception: retried after a backoff, ``"Type: message"`` recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import ClassVar

from okq.batcher import TurnBatcher
from okq.errors import InvalidRequest, LeaseLost, OkqError, TooLarge
from okq.retrying import jittered, retryable
from okq.wire import LeasedItemOut
from okq.workerqueues import EngineQueues, Queues, QueueSettings

__all__ = [
    "DeadLetter",
    "EngineQueues",
    "Failed",
    "Outputs",
    "QueueSettings",
    "Queues",
    "Worker",
]

log = logging.getLogger("okq.worker")


# -- what a handler returns or raises --------------------------------------------------


@dataclass(frozen=True)
class Outputs:
    """Return it from a handler to produce ``items`` to ``queue`` with the completion."""

    queue: str
    items: Sequence[bytes]


class Failed(Exception):
    """Raise it from a handler to retry the item with backoff, recording ``error`` as
    it is (another exception is recorded as ``"Type: message"``)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class DeadLetter(Exception):
    """Raise it from a handler to dead-letter the item now, with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Handler = Callable[[LeasedItemOut], Awaitable[Outputs | None]]


# -- renewing and backing off -----------------------------------------------------------


def backoff_until(attempts: int, base: float, cap: float) -> datetime:
    """When to retry after ``attempts`` deliveries: ``base * 2**(attempts-1)`` seconds,
    capped, with jitter (50-100 %)."""
    return datetime.now(UTC) + timedelta(seconds=jittered(base, cap, attempts))


async def keep_renewed(client: Queues, queue: str, item: LeasedItemOut,
                       lease_timeout: float | None, every: float,
                       first: float | None = None) -> None:
    """Renew a lease every ``every`` seconds (half its lease timeout) until cancelled
    or the lease is lost, the first time after ``first`` seconds (``every`` unless
    given); ``lease_timeout`` None renews for the queue's."""
    wait = every if first is None else first
    while True:
        await asyncio.sleep(wait)
        wait = every
        try:
            await client.renew(queue, item.token, lease_timeout)
        except LeaseLost:
            log.warning("lease of %s was lost while it was being worked on", item.id)
            return
        except OkqError as exc:
            log.warning("renewing %s failed: %s; will try again", item.id, exc)


# -- the loop ----------------------------------------------------------------------------


@dataclass
class WorkStats:
    completed: int = 0
    retried: int = 0
    dead: int = 0  # dead-lettered: by the handler, or by the queue's max_attempts
    released: int = 0  # given back uncounted: the worker stopped before finishing them
    outputs: int = 0
    failed: int = 0  # handler failures (each then retried or dead-lettered)
    errors: list[str] = field(default_factory=list)

    @property
    def finished(self) -> int:
        """Items done with for good: completed or dead-lettered (what ``limit`` counts)."""
        return self.completed + self.dead


class Worker:
    """Lease items and run ``handler`` on each, at most ``concurrency`` at a time.

    ``client`` is a ``Client`` (over HTTP) or ``EngineQueues(engine)`` (library
    mode). Items are leased for ``lease_timeout`` seconds, the queue's own by
    default (read as the worker starts). While a handler runs its lease is renewed
    every half lease timeout. A
    handler that returns completes the item; one that raises retries it after a
    backoff (``backoff_base * 2**(attempts-1)``, capped, with jitter), recording the
    error; the queue's max_attempts then dead-letters it (``Outputs``, ``Failed``
    and ``DeadLetter`` say more: see the module). With ``limit`` the worker stops
    once that many items are finished: completed or dead-lettered (a retry is not
    a finish: the item comes back).

    ``stop()`` stops leasing and waits for running handlers (for ``grace`` seconds
    at most, if given: then they are cancelled and their items released without
    counting an attempt); an item leased as it stops is released at once.
    Cancelling ``run()`` (Ctrl-C under ``asyncio.run``) stops at once instead:
    running handlers are cancelled and their items released without counting an
    attempt, then the cancellation goes on. An item whose release cannot reach
    okq, or that a lease request cut short had just leased, returns when its lease
    times out. A retryable error (``okq.retrying.retryable``: no node answering,
    overload, the store failing) while it reads the queue's settings or leases is
    waited out, backing off from ``wait_base`` up to ``wait_max`` seconds; an error
    the worker cannot outlast (any other, such as ``QueueNotFound`` or
    ``Unauthorized``, or a handler exception in ``fatal``) stops it the same way
    and is raised by ``run()``. A handler's exception is logged with the item's id
    and attempt: a warning while the item will be tried again, an error when it
    is dead-lettered.
    """

    #: how long a worker waits after its n-th failure in a row to read or lease:
    #: ``jittered(wait_base, wait_max, n)`` seconds
    wait_base: ClassVar[float] = 0.5
    wait_max: ClassVar[float] = 10.0
    #: handler exceptions that stop the worker rather than fail the item
    fatal: ClassVar[tuple[type[Exception], ...]] = ()
    #: the error recorded on an item released because the worker stopped
    unfinished: ClassVar[str] = "worker stopping"
    log: ClassVar[logging.Logger] = log

    def __init__(
        self,
        client: Queues,
        queue: str,
        handler: Handler,
        *,
        concurrency: int = 4,
        lease_timeout: float | None = None,
        poll: float = 10.0,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        grace: float | None = None,
        limit: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.lease_timeout = lease_timeout
        self.poll = poll  # long-poll length: also how long an idle worker takes to stop
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.grace = grace
        self.limit = limit
        self.stats = WorkStats()
        self.renew_every = 0.0  # half the lease timeout: the worker's, or the queue's
        self._failures = 0  # reads or leases failed in a row
        self._stop = asyncio.Event()
        self._running: dict[asyncio.Task[None], LeasedItemOut] = {}
        self._fatal: BaseException | None = None
        #: items finished in one turn of the event loop are completed in one call
        self._completions: TurnBatcher[str, None] = TurnBatcher(
            self._complete_tokens, name="okq-worker-complete", size=lambda: self.concurrency)

    @property
    def completed(self) -> int:
        return self.stats.completed

    @property
    def failed(self) -> int:
        return self.stats.failed

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> WorkStats:
        """Run until ``stop()`` (or the limit); then finish what is running. Cancelled,
        release what is running and re-raise (see the class docstring)."""
        timer = None if self.grace is None else asyncio.create_task(self._grace(self.grace))
        try:
            await self._start()
            await self._lease_until_stopped()
            await self._wait_running()
            if self._fatal is not None:
                raise self._fatal
        except BaseException:
            await self._abort()
            raise
        finally:
            if timer is not None:
                timer.cancel()
            await self._completions.close()
        return self.stats

    # -- starting and waiting out failures ------------------------------------------------

    def queues_used(self) -> list[str]:
        """The queues whose existence the worker checks as it starts."""
        return [self.queue]

    async def _start(self) -> None:
        """Read the queue's settings (and check the queues exist), waiting out failures
        that may pass: a worker started while its node is down waits for it."""
        while not self._stop.is_set():
            try:
                infos = [await self.client.queue_info(q) for q in self.queues_used()]
            except OkqError as exc:
                if not retryable(exc):
                    raise
                await self._wait_out("reading the settings of", exc)
                continue
            self._failures = 0
            self.renew_every = (self.lease_timeout or infos[0].lease_timeout) / 2
            return

    async def _wait_out(self, doing: str, exc: OkqError) -> None:
        """Back off after a retryable failure, or until the worker is stopped."""
        self._failures += 1
        delay = jittered(self.wait_base, self.wait_max, self._failures)
        self.log.warning("%s %s failed: %s; trying again in %.1f s", doing, self.queue, exc,
                         delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)

    # -- leasing -------------------------------------------------------------------------

    def _room(self) -> int:
        """How many items to lease now: the free slots, no more than the limit needs."""
        room = self.concurrency - len(self._running)
        if self.limit is not None:
            room = min(room, self.limit - self.stats.finished - len(self._running))
        return max(room, 0)

    async def _lease_until_stopped(self) -> None:
        while not self._stop.is_set():
            room = self._room()
            if room == 0:
                if not self._running:
                    return  # the limit is reached
                await self._until_one_ends()
                continue
            for item in await self._lease(room):
                if self._stop.is_set():  # stopping: give it back at once
                    await self._release(item, "worker stopping")
                    continue
                task = asyncio.create_task(self._process(item))
                self._running[task] = item
                task.add_done_callback(self._forget)

    async def _until_one_ends(self) -> None:
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({stop, *self._running}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()

    async def _lease(self, n: int) -> list[LeasedItemOut]:
        lease = asyncio.ensure_future(self.client.lease(
            self.queue, n, lease_timeout=self.lease_timeout, request_timeout=self.poll))
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({lease, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            lease.cancel()  # never leave the request behind as an orphan task
            await asyncio.wait({lease})
            if not lease.cancelled() and lease.exception() is None:  # it had answered
                await asyncio.gather(*(self._release(i, "worker stopping")
                                       for i in lease.result()))
            raise
        finally:
            stop.cancel()
        try:
            items = await lease
        except OkqError as exc:
            if not retryable(exc):
                raise
            await self._wait_out("leasing from", exc)
            return []
        self._failures = 0
        return items

    # -- stopping ------------------------------------------------------------------------

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        if not task.cancelled() and task.exception() is not None and self._fatal is None:
            self._fatal = task.exception()  # raised by run(), after the others stopped
            self._stop.set()

    async def _wait_running(self) -> None:
        while self._running and self._fatal is None:
            await asyncio.wait(list(self._running), return_when=asyncio.FIRST_EXCEPTION)

    async def _grace(self, grace: float) -> None:
        """Once stopped, cancel the handlers still running after ``grace`` seconds."""
        await self._stop.wait()
        await asyncio.sleep(grace)
        for task in list(self._running):
            _cancel_once(task)

    async def _abort(self) -> None:
        """Cancel the running handlers; each gives its item back uncounted."""
        self._stop.set()
        running = list(self._running)
        for task in running:
            _cancel_once(task)
        if running:
            await asyncio.wait(running)

    # -- one item ------------------------------------------------------------------------

    async def _process(self, item: LeasedItemOut) -> None:
        try:
            await self._work(item)
        except BaseException:  # cancelled, or a fatal error: the item goes back
            await self._release(item, self.unfinished)
            raise

    async def _work(self, item: LeasedItemOut) -> None:
        # Most handlers end long before the first renewal is due: a timer, cancelled
        # then, costs a fraction of a renewing task made and cancelled per item.
        renewing: list[asyncio.Task[None]] = []

        def renew() -> None:
            renewing.append(asyncio.create_task(keep_renewed(
                self.client, self.queue, item, self.lease_timeout, self.renew_every, 0.0)))

        timer = asyncio.get_running_loop().call_later(self.renew_every, renew)
        try:
            try:
                outputs = await self.handler(item)
            finally:
                timer.cancel()
                for task in renewing:
                    task.cancel()
        except DeadLetter as exc:
            self.stats.failed += 1
            self.log.warning("handler dead-lettered %s (attempt %d): %s", item.id,
                             item.attempts, exc.reason)
            await self._dead(item, exc.reason)
        except Failed as exc:
            self.stats.failed += 1
            self._failed(item, exc.error, None, await self._retry(item, exc.error))
        except self.fatal:
            raise
        except Exception as exc:  # the handler's failure is the item's failure
            self.stats.failed += 1
            error = f"{type(exc).__name__}: {exc}"
            self._failed(item, error, exc, await self._retry(item, error))
        else:
            await self._complete(item, outputs)

    def _failed(self, item: LeasedItemOut, error: str, exc: Exception | None,
                dead: bool | None) -> None:
        """Log a handler's failure in one line (with the traceback of an exception),
        as the retry that recorded the whole error on the item was answered: a warning
        while the item has attempts left, an error when the queue dead-lettered it
        (out of attempts by its settings now, not as the worker started)."""
        then = ("dead-lettered: out of attempts" if dead else "it will be retried"
                if dead is not None else "it returns when its lease ends")
        self.log.log(logging.ERROR if dead else logging.WARNING,
                     "handler failed on %s (attempt %d): %s; %s", item.id, item.attempts,
                     one_line(error), then, exc_info=exc)

    async def _complete(self, item: LeasedItemOut, outputs: Outputs | None) -> None:
        try:
            if outputs is None or not outputs.items:
                await self._completions.submit(item.token)
            else:
                try:
                    await self.client.complete_and_produce(self.queue, item.token,
                                                           outputs.queue, outputs.items)
                except (TooLarge, InvalidRequest) as exc:  # okq's limits refuse them
                    await self._dead(item, f"invalid output: {exc.message}")
                    return
                self.stats.outputs += len(outputs.items)
            self.stats.completed += 1
        except LeaseLost:
            self.log.warning("lease of %s was lost before completion; it will be redelivered",
                             item.id)
        except OkqError as exc:
            self._error("completing", item, exc)

    async def _complete_tokens(self, tokens: list[str]) -> list[BaseException | None]:
        """Complete the items finished together in one call; a lease lost fails its
        item alone (the node applies each token on its own and names the lost)."""
        try:
            await self.client.complete(self.queue, tokens)
        except LeaseLost as exc:
            lost = {f.get("index") for f in exc.details.get("failed") or ()}
            if not lost:
                raise
            return [exc if n in lost else None for n in range(len(tokens))]
        return [None] * len(tokens)

    async def _dead(self, item: LeasedItemOut, reason: str) -> None:
        try:
            await self.client.retry(self.queue, item.token, dead=True, error=reason)
            self.stats.dead += 1
        except LeaseLost:
            self.log.warning("lease of %s was lost before it was dead-lettered; it will be "
                             "redelivered", item.id)
        except OkqError as exc:
            self._error("dead-lettering", item, exc)

    async def _retry(self, item: LeasedItemOut, error: str) -> bool | None:
        """Give a failed item back, ready after its backoff; whether the queue
        dead-lettered it instead (out of attempts), None when the retry failed."""
        retry_at = backoff_until(item.attempts, self.backoff_base, self.backoff_max)
        try:
            dead = await self.client.retry(self.queue, item.token, retry_at=retry_at,
                                           error=error)
        except LeaseLost:
            return None  # it comes back anyway
        except OkqError as exc:
            self._error("retrying", item, exc)
            return None
        if dead:
            self.stats.dead += 1  # the queue dead-lettered it: out of attempts
        else:
            self.stats.retried += 1
        return dead

    async def _release(self, item: LeasedItemOut, why: str) -> None:
        """Give an item back uncounted; one that cannot be returns at its lease timeout
        (a lease already lost, or completed just before a cancellation, is fine)."""
        try:
            await self.client.retry(self.queue, item.token, error=why, count_attempt=False)
            self.stats.released += 1
        except LeaseLost:
            pass
        except OkqError as exc:
            self.log.warning("releasing %s failed: %s; it returns when its lease expires",
                             item.id, exc)

    def _error(self, doing: str, item: LeasedItemOut, exc: OkqError) -> None:
        self.stats.errors.append(str(exc))
        self.log.error("%s %s failed: %s", doing, item.id, exc)


def one_line(error: str) -> str:
    """An error in one line: a several-line one (a command's stderr) as its first
    line's lead ("exit 1") and its last line, where the cause usually is."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if len(lines) <= 1:
        return error.strip()
    return f"{lines[0].split(': ', 1)[0]}: ... {lines[-1]}"


def _cancel_once(task: asyncio.Task[None]) -> None:
    """Cancel a task unless it is done or already cancelled: a second cancellation
    would cut short the release it makes on the first."""
    if not task.done() and not task.cancelling():
        task.cancel()
