"""The discrete-event core: a clock and a heap of timed callbacks, futures, tasks
written as generators, and CPU: processes on machines.

A task is a generator that yields futures and is resumed with each one's value
(``x = yield fut``); ``yield from`` composes them. A process runs CPU work one job
at a time per thread, each job holding one of its machine's cores; a machine with
``cores=None`` has a core for every job asked of it. Jobs are not preempted: a
process whose job ends goes to the back of its machine's line, so processes that
share a machine take turns, which is near enough to the kernel's sharing for jobs
of tens of microseconds to a few milliseconds.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Generator, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Callback = Callable[[Any], None]


class Future(Generic[T]):
    """A value that arrives once; callbacks run when it does (or at once if it has)."""

    __slots__ = ("_callbacks", "done", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self._callbacks: list[Callback] = []

    def set(self, value: T) -> None:
        """Resolve it; a second ``set`` is ignored (a timer racing a wake-up)."""
        if self.done:
            return
        self.done, self.value = True, value
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(value)

    def then(self, callback: Callback) -> None:
        if self.done:
            callback(self.value)
        else:
            self._callbacks.append(callback)


Proc = Generator[Future[Any], Any, T]


class Task(Future[T]):
    """A generator run by the simulator; resolves with its return value."""

    __slots__ = ("_gen", "_sim")

    def __init__(self, sim: Sim, gen: Proc[T]) -> None:
        super().__init__()
        self._sim, self._gen = sim, gen
        sim.soon(self._step, None)

    def _step(self, value: Any) -> None:
        try:
            fut = self._gen.send(value)
        except StopIteration as stop:
            self.set(stop.value)
            return
        fut.then(self._resume)

    def _resume(self, value: Any) -> None:
        self._sim.soon(self._step, value)  # never deeper than one frame


class Sim:
    """The clock (seconds), the timed callbacks, and the seeded random source."""

    def __init__(self, seed: int) -> None:
        self.now = 0.0
        self.rng = random.Random(seed)
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._ready: deque[tuple[Callback, Any]] = deque()
        self._seq = itertools.count()
        self.events = 0

    def soon(self, fn: Callback, arg: Any) -> None:
        self._ready.append((fn, arg))

    def at(self, delay: float, fn: Callback, arg: Any = None) -> None:
        heapq.heappush(self._heap, (self.now + max(0.0, delay), next(self._seq), fn, arg))

    def sleep(self, delay: float) -> Future[None]:
        fut: Future[None] = Future()
        self.at(delay, fut.set, None)
        return fut

    def spawn(self, gen: Proc[T]) -> Task[T]:
        return Task(self, gen)

    def gather(self, futures: Iterable[Future[Any]]) -> Future[list[Any]]:
        """A future of every value, once all have arrived."""
        futs = list(futures)
        out: Future[list[Any]] = Future()
        left = [len(futs)]
        if not futs:
            out.set([])

        def one(_: Any) -> None:
            left[0] -= 1
            if not left[0]:
                out.set([f.value for f in futs])

        for f in futs:
            f.then(one)
        return out

    def run(self, until: Future[Any] | None = None, limit: float = math.inf) -> None:
        """Run until ``until`` resolves, nothing is left to do, or the clock passes
        ``limit`` seconds."""
        heap, ready = self._heap, self._ready
        while until is None or not until.done:
            while ready:
                fn, arg = ready.popleft()
                fn(arg)
                self.events += 1
                if until is not None and until.done:
                    return
            if not heap or heap[0][0] > limit:
                return
            self.now, _, fn, arg = heapq.heappop(heap)
            fn(arg)
            self.events += 1


class Mutex:
    """A FIFO lock for tasks: ``yield lock.acquire()`` ... ``lock.release()``."""

    def __init__(self) -> None:
        self.held = False
        self._line: deque[Future[None]] = deque()

    def acquire(self) -> Future[None]:
        fut: Future[None] = Future()
        if self.held:
            self._line.append(fut)
        else:
            self.held = True
            fut.set(None)
        return fut

    def release(self) -> None:
        if self._line:
            self._line.popleft().set(None)
        else:
            self.held = False


class Machine:
    """``cores`` cores shared by its processes (None: as many as they ask for)."""

    def __init__(self, sim: Sim, cores: int | None) -> None:
        self.sim, self.cores = sim, cores
        self.busy = 0
        self.busy_seconds = 0.0
        self._line: deque[Process] = deque()

    def want(self, proc: Process) -> None:
        if not proc.lined and proc.can_start():
            proc.lined = True
            self._line.append(proc)
        self._dispatch()

    def _dispatch(self) -> None:
        while self._line and (self.cores is None or self.busy < self.cores):
            proc = self._line.popleft()
            proc.lined = False
            if not proc.can_start():
                continue
            seconds, fut = proc.jobs.popleft()
            self.busy += 1
            proc.running += 1
            proc.cpu_seconds += seconds
            self.busy_seconds += seconds
            self.sim.at(seconds, self._finish, (proc, fut))
            if proc.can_start():
                proc.lined = True
                self._line.append(proc)

    def _finish(self, job: tuple[Process, Future[None]]) -> None:
        proc, fut = job
        self.busy -= 1
        proc.running -= 1
        fut.set(None)
        self.want(proc)


class Process:
    """An OS process: CPU work in FIFO order on up to ``threads`` cores at once."""

    def __init__(self, name: str, machine: Machine, threads: int = 1) -> None:
        self.name, self.machine, self.threads = name, machine, threads
        self.jobs: deque[tuple[float, Future[None]]] = deque()
        self.running = 0
        self.lined = False
        self.cpu_seconds = 0.0

    def can_start(self) -> bool:
        return bool(self.jobs) and self.running < self.threads

    def cpu(self, microseconds: float) -> Future[None]:
        """A future resolved once ``microseconds`` of CPU work have run."""
        fut: Future[None] = Future()
        self.jobs.append((microseconds / 1e6, fut))
        self.machine.want(self)
        return fut


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (as bench_fleet.py computes it); NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]
