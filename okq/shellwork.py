"""``okq work``: turn any shell command into a worker.

Each leased item's payload goes to the command's stdin. While it runs, the
lease is renewed at half its timeout. Exit 0 completes the item and, with an
output queue, produces each non-empty stdout line to it in the same step (the
outputs appear if and only if the completion commits). A non-zero exit
retries the item after a backoff, recording the tail of stderr as its error;
the queue's max_attempts then dead-letters it. Output that is too large goes
straight to the dead-letter queue with the reason. On SIGTERM or SIGINT the
worker stops leasing, lets running commands finish for up to ``grace``
seconds, then terminates them and releases their items.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
from dataclasses import dataclass, field

from okq.client import Client, backoff_until, keep_renewed
from okq.errors import InvalidRequest, LeaseLost, OkqError, TooLarge
from okq.server.schemas import LeasedItemOut

log = logging.getLogger("okq.work")

STDERR_TAIL = 2048


@dataclass
class WorkOptions:
    queue: str
    out_queue: str | None
    argv: list[str]
    shell: bool = False
    concurrency: int = 1
    lease_timeout: float = 60.0
    poll: float = 2.0  # long-poll length: also how long an idle worker takes to stop
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    grace: float = 30.0
    max_output_lines: int = 1000
    max_line_bytes: int = 1 << 20
    max_output_bytes: int = 4 << 20
    #: stop once this many items are finished: completed or dead-lettered (a retry is
    #: not a finish; the item comes back). For scripts and tests.
    limit: int | None = None


@dataclass
class WorkStats:
    completed: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    outputs: int = 0
    errors: list[str] = field(default_factory=list)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class ShellWorker:
    def __init__(self, client: Client, options: WorkOptions) -> None:
        self.client = client
        self.o = options
        self.stats = WorkStats()
        self._stopping = asyncio.Event()
        self._killing = asyncio.Event()
        self._claimed = 0  # slots leasing or running an item
        self.max_attempts = 0  # the queue's, read at start: to count dead letters

    def stop(self) -> None:
        self._stopping.set()

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def run(self) -> WorkStats:
        self.max_attempts = (await self.client.queue_info(self.o.queue)).max_attempts
        slots = [asyncio.create_task(self._slot()) for _ in range(self.o.concurrency)]
        stopper = asyncio.create_task(self._grace_timer())
        try:
            await asyncio.gather(*slots)
        finally:
            stopper.cancel()
        return self.stats

    async def _grace_timer(self) -> None:
        await self._stopping.wait()
        await asyncio.sleep(self.o.grace)
        self._killing.set()

    @property
    def finished(self) -> int:
        """Items done with for good: what ``limit`` counts."""
        return self.stats.completed + self.stats.dead

    def _want_more(self) -> bool:
        """Lease only while the items claimed could still fall short of the limit.

        A slot that stops here never strands the limit: each claimed item either
        finishes or comes back to its own slot, which then leases again."""
        if self._stopping.is_set():
            return False
        return self.o.limit is None or self.finished + self._claimed < self.o.limit

    async def _slot(self) -> None:
        while self._want_more():
            self._claimed += 1
            try:
                item = await self._lease()
                if item is not None:
                    await self._handle(item)
            finally:
                self._claimed -= 1

    async def _lease(self) -> LeasedItemOut | None:
        lease = asyncio.ensure_future(self.client.lease(
            self.o.queue, 1, lease_timeout=self.o.lease_timeout, request_timeout=self.o.poll))
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({lease, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        try:
            items = await lease
        except OkqError as exc:
            log.warning("lease from %s failed: %s", self.o.queue, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1 + random.random())
            return None
        if items and self._stopping.is_set():  # leased as we were told to stop
            await self._release(items[0], "worker stopping")
            return None
        return items[0] if items else None

    async def _handle(self, item: LeasedItemOut) -> None:
        renewer = asyncio.create_task(
            keep_renewed(self.client, self.o.queue, item, self.o.lease_timeout))
        try:
            result = await self._run_command(item)
        finally:
            renewer.cancel()
        if result is None:
            await self._release(item, "worker stopped before the command finished")
            return
        code, stdout, stderr = result
        if code != 0:
            tail = stderr[-STDERR_TAIL:].decode(errors="replace").strip()
            await self._retry(item, f"exit {code}: {tail}" if tail else f"exit {code}")
            return
        await self._succeed(item, stdout)

    async def _run_command(self, item: LeasedItemOut) -> tuple[int, bytes, bytes] | None:
        """Run the command on the payload; None when it was stopped after the grace."""
        pipe = asyncio.subprocess.PIPE
        if self.o.shell:
            proc = await asyncio.create_subprocess_shell(
                self.o.argv[0], stdin=pipe, stdout=pipe, stderr=pipe, start_new_session=True)
        else:
            proc = await asyncio.create_subprocess_exec(
                *self.o.argv, stdin=pipe, stdout=pipe, stderr=pipe, start_new_session=True)
        talk = asyncio.ensure_future(proc.communicate(item.bytes))
        kill = asyncio.ensure_future(self._killing.wait())
        await asyncio.wait({talk, kill}, return_when=asyncio.FIRST_COMPLETED)
        kill.cancel()
        if talk.done():
            stdout, stderr = talk.result()
            return proc.returncode or 0, stdout, stderr
        # Past the grace: stop the command and everything it started (its own
        # process group), so no child keeps the pipes open.
        _signal_group(proc.pid, signal.SIGTERM)
        done, _ = await asyncio.wait({talk}, timeout=5)
        if not done:
            _signal_group(proc.pid, signal.SIGKILL)
            await asyncio.wait({talk}, timeout=5)
        if not talk.done():
            talk.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await talk
        return None

    def _outputs(self, stdout: bytes) -> list[bytes] | str:
        """Output lines, or the reason they cannot be produced."""
        lines = [line for line in stdout.splitlines() if line.strip()]
        if len(lines) > self.o.max_output_lines:
            return f"output has {len(lines)} lines; the limit is {self.o.max_output_lines}"
        if len(stdout) > self.o.max_output_bytes:
            return f"output is {len(stdout)} bytes; the limit is {self.o.max_output_bytes}"
        long = next((n for n, line in enumerate(lines) if len(line) > self.o.max_line_bytes),
                    None)
        if long is not None:
            return f"output line {long + 1} is over {self.o.max_line_bytes} bytes"
        return lines

    async def _succeed(self, item: LeasedItemOut, stdout: bytes) -> None:
        try:
            if self.o.out_queue is None:
                await self.client.complete(self.o.queue, [item.token])
                self.stats.completed += 1
                return
            lines = self._outputs(stdout)
            if isinstance(lines, str):
                await self._dead(item, f"invalid output: {lines}")
                return
            if lines:
                try:
                    await self.client.complete_and_produce(self.o.queue, item.token,
                                                           self.o.out_queue, lines)
                except (TooLarge, InvalidRequest) as exc:  # the node's limits refuse it
                    await self._dead(item, f"invalid output: {exc.message}")
                    return
            else:
                await self.client.complete(self.o.queue, [item.token])
            self.stats.completed += 1
            self.stats.outputs += len(lines)
        except LeaseLost:
            log.warning("lease of %s was lost before completion; it will be redelivered",
                        item.id)
        except OkqError as exc:
            self.stats.errors.append(str(exc))
            log.error("completing %s failed: %s", item.id, exc)

    async def _dead(self, item: LeasedItemOut, reason: str) -> None:
        await self.client.retry(self.o.queue, item.token, dead=True, error=reason)
        self.stats.dead += 1

    async def _retry(self, item: LeasedItemOut, error: str) -> None:
        retry_at = backoff_until(item.attempts, self.o.backoff_base, self.o.backoff_max)
        try:
            await self.client.retry(self.o.queue, item.token, retry_at=retry_at, error=error)
        except LeaseLost:
            return
        except OkqError as exc:
            self.stats.errors.append(str(exc))
            return
        if self.max_attempts and item.attempts >= self.max_attempts:
            self.stats.dead += 1  # the queue dead-lettered it: out of attempts
        else:
            self.stats.retried += 1

    async def _release(self, item: LeasedItemOut, why: str) -> None:
        """Give the item back uncounted: its command never finished here."""
        try:
            await self.client.retry(self.o.queue, item.token, error=why, count_attempt=False)
            self.stats.released += 1
        except OkqError as exc:
            log.warning("releasing %s failed: %s; it returns when its lease expires",
                        item.id, exc)
