"""One worker loop, two homes: the same ``okq.worker.Worker`` run against an engine
in this process (``EngineQueues``, library mode, on the memory and the file store)
and against a live ``okq serve`` node (the HTTP ``Client``).

The one test leases, renews past the lease timeout, completes, retries a failing
item with backoff until max_attempts dead-letters it, and stops gracefully:
what finishes within the grace completes, what does not goes back uncounted.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from okq import QueueConfig, SystemClock
from okq.client import Client
from okq.store import FileStore, MemoryStore, Store
from okq.wire import LeasedItemOut
from okq.worker import EngineQueues, Queues, Worker
from tests.acceptance.test_readme import env_with_venv, readme_block
from tests.engines import make_engine
from tests.nodes import okq_node


@dataclass
class Home:
    """Where the worker runs: its ``Queues``, and the setup calls of the same place."""

    queues: Queues
    create: Callable[..., Awaitable[object]]
    produce: Callable[[str, list[str]], Awaitable[object]]
    stats: Callable[[str], Awaitable[Any]]


async def _in_process(store: Store) -> AsyncIterator[Home]:
    async with make_engine(store, SystemClock()) as engine:

        async def create(name: str, **settings: Any) -> object:
            return await engine.create_queue(name, QueueConfig(**settings))

        async def produce(queue: str, texts: list[str]) -> object:
            return await engine.produce(queue, [t.encode() for t in texts])

        yield Home(EngineQueues(engine), create, produce, engine.stats)
    await store.close()


@pytest.fixture(params=["engine-memory", "engine-file", "node"])
async def home(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Home]:
    if request.param == "engine-memory":
        async for h in _in_process(MemoryStore(f"memory://{tmp_path.name}")):
            yield h
    elif request.param == "engine-file":
        async for h in _in_process(FileStore(tmp_path / "store")):
            yield h
    else:
        with okq_node(f"file://{tmp_path / 'data'}", tmp_path) as node:
            async with Client(node.url) as c:
                yield Home(c, c.create_queue, c.produce, c.stats)


async def until(what: str, cond: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_one_worker_loop_in_process_and_over_http(home: Home) -> None:
    await home.create("wl-dead")
    await home.create("wl", lease_timeout=1, max_attempts=3, dead_queue="wl-dead")
    await home.produce("wl", ["slow", "ok-1", "ok-2", "bad"])
    seen: dict[str, list[tuple[int, float]]] = defaultdict(list)

    async def handler(item: LeasedItemOut) -> None:
        seen[item.utf8 or ""].append((item.attempts, time.monotonic()))
        if item.utf8 == "slow":
            await asyncio.sleep(2.5)  # past the 1 s lease: renewals at half of it keep it
        if item.utf8 == "bad":
            raise RuntimeError("bad input")

    worker = Worker(home.queues, "wl", handler, concurrency=4, lease_timeout=1, poll=0.5,
                    backoff_base=0.4, backoff_max=1)
    run = asyncio.create_task(worker.run())
    await until("four items finished", lambda: worker.stats.finished == 4)
    worker.stop()
    stats = await asyncio.wait_for(run, 15)

    assert (stats.completed, stats.dead, stats.retried, stats.failed, stats.released) == \
        (3, 1, 2, 3, 0)
    assert stats.errors == []
    assert [a for a, _ in seen["slow"]] == [1]  # renewed past its lease: never redelivered
    assert [a for a, _ in seen["ok-1"]] == [a for a, _ in seen["ok-2"]] == [1]
    bad = seen["bad"]
    assert [a for a, _ in bad] == [1, 2, 3]  # the third attempt dead-letters it
    # backed off: 0.4 s then 0.8 s, each with jitter down to half
    assert bad[1][1] - bad[0][1] >= 0.2 - 0.05
    assert bad[2][1] - bad[1][1] >= 0.4 - 0.05
    st = await home.stats("wl")
    assert (st.available, st.in_flight, st.waiting_retry, st.completed, st.dead_lettered) == \
        (0, 0, 0, 3, 1)
    assert (await home.stats("wl-dead")).available == 1

    # A graceful stop: what finishes within the grace completes; what does not is
    # cancelled and given back without spending an attempt.
    await home.produce("wl", ["quick", "hang"])
    started: list[str] = []

    async def slow_handler(item: LeasedItemOut) -> None:
        started.append(item.utf8 or "")
        await asyncio.sleep(0.5 if item.utf8 == "quick" else 3600)

    worker = Worker(home.queues, "wl", slow_handler, concurrency=2, lease_timeout=1,
                    poll=0.5, grace=1.5)
    run = asyncio.create_task(worker.run())
    await until("both started", lambda: len(started) == 2)
    began = time.monotonic()
    worker.stop()
    stats = await asyncio.wait_for(run, 15)
    assert time.monotonic() - began < 5
    assert (stats.completed, stats.released, stats.retried, stats.failed) == (1, 1, 0, 0)
    [hang] = await home.queues.lease("wl", 2, request_timeout=2)
    assert (hang.utf8, hang.attempts) == ("hang", 1)  # the stopped run spent no attempt
    await home.queues.complete("wl", [hang.token])


def test_readme_worker_in_library_mode(tmp_path: Path) -> None:
    """The README's library-mode worker runs as written, in the folder where the
    library example ran before it (the queue exists then) and in a fresh one."""
    first = readme_block("## Library mode", "python")
    worker = readme_block("The same `Worker` runs", "python")
    for folder, scripts in (("after", [first, worker]), ("fresh", [worker])):
        (tmp_path / folder).mkdir()
        for script in scripts:
            proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                                  text=True, timeout=60, cwd=tmp_path / folder,
                                  env=env_with_venv())
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout.splitlines() == ["sending to: ada@example.com"], proc.stdout


async def test_a_failure_is_logged_as_the_queue_answered_its_retry(
        caplog: pytest.LogCaptureFixture) -> None:
    """Whether a failed item was dead-lettered is what its retry was answered, by the
    queue's settings when it failed: here max_attempts rose from 1, which the worker
    read as it started, to 2, so the first failure is retried and the second is the
    dead letter."""
    async with make_engine(MemoryStore(), SystemClock()) as engine:
        await engine.create_queue("lf", QueueConfig(max_attempts=1))
        failed: list[int] = []

        async def handler(item: LeasedItemOut) -> None:
            failed.append(item.attempts)
            raise RuntimeError("bad input")

        worker = Worker(EngineQueues(engine), "lf", handler, poll=0.2, backoff_base=0.05,
                        backoff_max=0.05)
        run = asyncio.create_task(worker.run())
        await until("the worker started", lambda: worker.renew_every > 0)
        await engine.update_queue("lf", max_attempts=2)
        await engine.produce("lf", [b"first"])
        await until("its dead letter", lambda: worker.stats.dead == 1)
        worker.stop()
        await asyncio.wait_for(run, 15)
    assert failed == [1, 2]
    assert (worker.stats.retried, worker.stats.dead) == (1, 1)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records
             if r.name == "okq.worker" and "handler failed" in r.getMessage()]
    assert [level for level, _ in lines] == ["WARNING", "ERROR"]
    assert lines[0][1].endswith("it will be retried")
    assert lines[1][1].endswith("dead-lettered: out of attempts")
