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

The loop (leasing, renewing, finishing, stopping, waiting out a node or store
that is down) is ``okq.worker.Worker``, the same as the Python worker's; this
module adds the command as its handler. docs/API.md's table "Failures and
retries" says what each failure does to both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass

from okq.wire import LeasedItemOut
from okq.worker import DeadLetter, Failed, Outputs, Queues, Worker

log = logging.getLogger("okq.work")

STDERR_TAIL = 2048


@dataclass
class WorkOptions:
    queue: str
    out_queue: str | None
    argv: list[str]
    shell: bool = False
    concurrency: int = 1
    lease_timeout: float | None = None  # None: the queue's
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


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _stop_command(pid: int, talk: asyncio.Future[tuple[bytes, bytes]]) -> None:
    """Stop a command and everything it started (its own process group), so no child
    keeps the pipes open: SIGTERM, then SIGKILL after 5 s."""
    _signal_group(pid, signal.SIGTERM)
    done, _ = await asyncio.wait({talk}, timeout=5)
    if not done:
        _signal_group(pid, signal.SIGKILL)
        await asyncio.wait({talk}, timeout=5)
    if not talk.done():
        talk.cancel()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await talk


class ShellWorker(Worker):
    """The worker loop of ``okq.worker`` with a command as its handler."""

    fatal = (Exception,)  # a command that cannot run (not found, say) stops the worker
    unfinished = "worker stopped before the command finished"
    log = log

    def __init__(self, client: Queues, options: WorkOptions) -> None:
        super().__init__(client, options.queue, self._command,
                         concurrency=options.concurrency, lease_timeout=options.lease_timeout,
                         poll=options.poll, backoff_base=options.backoff_base,
                         backoff_max=options.backoff_max, grace=options.grace,
                         limit=options.limit)
        self.o = options

    def queues_used(self) -> list[str]:
        return [self.queue, *([self.o.out_queue] if self.o.out_queue else [])]

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def _command(self, item: LeasedItemOut) -> Outputs | None:
        """Run the command on one item: its exit status and stdout say how the item ends."""
        code, stdout, stderr = await self._run_command(item)
        if code != 0:
            tail = stderr[-STDERR_TAIL:].decode(errors="replace").strip()
            raise Failed(f"exit {code}: {tail}" if tail else f"exit {code}")
        if self.o.out_queue is None:
            return None
        lines = self._outputs(stdout)
        if isinstance(lines, str):
            raise DeadLetter(f"invalid output: {lines}")
        return Outputs(self.o.out_queue, lines)

    async def _run_command(self, item: LeasedItemOut) -> tuple[int, bytes, bytes]:
        """Run the command on the payload. Cancelled (the grace is over), stop it first."""
        pipe = asyncio.subprocess.PIPE
        if self.o.shell:
            proc = await asyncio.create_subprocess_shell(
                self.o.argv[0], stdin=pipe, stdout=pipe, stderr=pipe, start_new_session=True)
        else:
            proc = await asyncio.create_subprocess_exec(
                *self.o.argv, stdin=pipe, stdout=pipe, stderr=pipe, start_new_session=True)
        talk = asyncio.ensure_future(proc.communicate(item.bytes))
        try:
            stdout, stderr = await asyncio.shield(talk)
        except asyncio.CancelledError:
            await _stop_command(proc.pid, talk)
            raise
        return proc.returncode or 0, stdout, stderr

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
