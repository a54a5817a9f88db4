"""Shared fixtures: real S3 servers on loopback and fresh stores of every kind.

* ``moto_endpoint`` / ``seaweed_endpoint`` — session-scoped; each server starts
  the first time a test asks for it (never otherwise) and has the bucket
  ``okq-test`` ready.
* ``store_factory`` — ``await make(kind)`` returns a fresh, empty store of kind
  ``memory``, ``file``, ``moto`` or ``seaweed`` (or ``moto-obstore`` /
  ``seaweed-obstore``: the same servers through obstore); all are closed at teardown.

Under pytest-xdist (pyproject's addopts) each worker is its own session: it starts its
own servers on free ports, in its own temporary folders, and reports their start-up
times to the controller for the summary.
* ``any_store`` — one fresh store, parametrised over ``ALL_STORES``;
  ``atomic_store`` — the same over ``ATOMIC_STORES`` (see tests/stores.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from okq import Engine, ManualClock
from okq.store import (
    FileStore,
    MemoryStore,
    S3Store,
    Store,
    exit_past_native_threads,
    open_store,
)
from tests.engines import make_engine
from tests.servers import BUCKET, MotoServer, SeaweedServer, ensure_dummy_credentials
from tests.stores import ALL_STORES, ATOMIC_STORES, OBSTORE_STORES, S3_STORES, StoreFactory

# Tests that press Ctrl-C on a child (okq stats --watch, the README's worker)
# need it to get SIGINT as from a terminal. A shell that runs the suite in the
# background without job control (`.ci/run &` in a script) starts it with SIGINT
# ignored, and every child would inherit that: Python then installs no
# KeyboardInterrupt for it. A handler here (not "ignore") is reset to the default
# in every process the tests start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: Start-up times of the servers this session started, for the summary.
_STARTUP: dict[str, float] = {}

#: Each S3 request's bound for the stores ``store_factory`` opens: generous, since the
#: suite's workers share the machine's cores with the servers (a SeaweedFS PUT under
#: twenty racing writers once took over okq's default 10 s on a loaded 2-core machine).
#: The tests of timeouts themselves open their own stores with their own bounds.
TEST_S3_TIMEOUT = 30.0


#: The session's bytecode cache, when :func:`_cache_bytecode` made one.
_BYTECODE: list[str] = []


def _cache_bytecode() -> None:
    """With ``PYTHONDONTWRITEBYTECODE`` set, every process the suite starts (four
    workers, each ``okq serve``, the compactor, workers, examples) would compile okq
    and the tests from source again: about 6 s of CPU per worker collecting, 0.4 s per
    node start. Instead the session caches bytecode in a temporary folder of its own
    (``PYTHONPYCACHEPREFIX``), removed when it ends: still nothing written beside the
    sources, as the setting asks. A prefix already chosen is kept; the workers, whose
    environment is the controller's, find this one set."""
    if not sys.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX") \
            or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    folder = tempfile.mkdtemp(prefix="okq-test-bytecode-")
    _BYTECODE.append(folder)
    os.environ["PYTHONPYCACHEPREFIX"] = folder
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = folder
    sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    _cache_bytecode()
    # Always list skips and xfails with their reasons: a store left out of a
    # test (moto from the atomicity tests) must say why in the output.
    chars = config.option.reportchars or ""
    if not any(c in chars for c in "aAN"):  # -ra/-rA already list them; -rN lists none
        chars += "".join(c for c in "sx" if c not in chars)
    config.option.reportchars = chars


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for name, seconds in _STARTUP.items():
        terminalreporter.write_line(f"okq test servers: {name} started in {seconds:.2f}s")


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its servers' start-up times go home
        workeroutput["okq_startup"] = dict(_STARTUP)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: note each worker's server start-up times for the summary."""
    started: dict[str, float] = getattr(node, "workeroutput", {}).get("okq_startup", {})
    for name, seconds in started.items():
        _STARTUP[f"{name} ({node.gateway.id})"] = seconds


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # Tests that ran obstore in this process: leave past its runtime's threads, as
    # okq's own commands do (okq.store.exit_past_native_threads), with pytest's status.
    for folder in _BYTECODE:
        shutil.rmtree(folder, ignore_errors=True)
    if _EXIT_STATUS:
        exit_past_native_threads(_EXIT_STATUS[-1])


#: The files that take a minute or more on one worker (``--durations``, 4 workers on 2
#: cores), the longest first: xdist hands files out in collection order
#: (``--no-loadscope-reorder``), so these go first and none of them is left to run alone
#: at the end. A worker whose file has two tests or fewer left is sent the next file at
#: once, behind it: each campaign file (one test each, mostly waiting on its fleet) takes
#: a CLI file along.
LONG_FILES = (
    "acceptance/test_campaign.py",
    "acceptance/test_fleet.py",
    "acceptance/cli/test_connect_and_queues.py",
    "acceptance/test_campaign_direct.py",
    "acceptance/cli/test_lease_and_stats.py",
    "acceptance/cli/test_errors.py",
    "acceptance/cli/test_produce.py",
    "acceptance/test_node.py",
    "acceptance/test_sqs_boto3.py",
    "integration/test_engine_property.py",
    "acceptance/test_shell_worker.py",
    "acceptance/test_schemathesis_auth.py",
    "acceptance/cli/test_export_import.py",
    "integration/test_engine.py",
    "acceptance/test_sqs_clients.py",
    "acceptance/test_sqs_fifo.py",
    "acceptance/test_sqs_fifo_clients.py",
    "acceptance/test_ordered_node.py",
    "acceptance/test_compactor_cli.py",
    "acceptance/test_access.py",
    "acceptance/test_compactor_process.py",
    "acceptance/test_examples.py",
    "acceptance/test_testing_install.py",
    "integration/test_store_conformance.py",
    "acceptance/test_readme.py",
    "acceptance/test_schemathesis.py",
    "integration/test_compactor.py",
    "test_static.py",
)


def _start_rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
    return LONG_FILES.index(path) if path in LONG_FILES else len(LONG_FILES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: each file's own order is kept


def _store_params(kinds: list[str]) -> list[object]:
    return [
        pytest.param(kind, id=kind, marks=[pytest.mark.s3] if kind in S3_STORES else [])
        for kind in kinds
    ]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    ensure_dummy_credentials()
    began = time.monotonic()
    with MotoServer(BUCKET) as server:
        _STARTUP["moto"] = time.monotonic() - began
        yield server.endpoint


@pytest.fixture(scope="session")
def seaweed_endpoint() -> Iterator[str]:
    ensure_dummy_credentials()
    with SeaweedServer(BUCKET) as server:
        _STARTUP["SeaweedFS"] = server.startup_seconds
        yield server.endpoint


@pytest.fixture
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    opened: list[Store] = []

    async def make(kind: str) -> Store:
        name = uuid.uuid4().hex
        store: Store
        if kind == "memory":
            store = MemoryStore(f"memory://{name}")
        elif kind == "file":
            store = FileStore(tmp_path / f"store-{name}")
        elif kind in S3_STORES:
            endpoint = request.getfixturevalue(f"{kind}_endpoint")
            store = S3Store(f"s3://{BUCKET}/{name}", endpoint_url=endpoint, region="us-east-1",
                            timeout=TEST_S3_TIMEOUT)
        elif kind in OBSTORE_STORES:  # "moto-obstore": moto's server, obstore's client
            server, _, client = kind.partition("-")
            endpoint = request.getfixturevalue(f"{server}_endpoint")
            store = open_store(f"s3://{BUCKET}/{name}?client={client}", endpoint_url=endpoint,
                               region="us-east-1", timeout=TEST_S3_TIMEOUT)
        else:
            kinds = ALL_STORES + OBSTORE_STORES
            raise ValueError(f"unknown store kind {kind!r}; expected one of {kinds}")
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        await store.close()


@pytest.fixture(params=_store_params(ALL_STORES))
async def any_store(request: pytest.FixtureRequest, store_factory: StoreFactory) -> Store:
    return await store_factory(request.param)


@pytest.fixture(params=_store_params(ATOMIC_STORES))
async def atomic_store(request: pytest.FixtureRequest, store_factory: StoreFactory) -> Store:
    return await store_factory(request.param)


# -- fixtures for modules parametrised by ``kind`` ------------------------------------


@pytest.fixture
async def store(kind: str, store_factory: StoreFactory) -> Store:
    """A fresh store of the module's ``kind`` (modules parametrise ``kind``)."""
    return await store_factory(kind)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def engine(store: Store, clock: ManualClock) -> Engine:
    """An engine on ``store`` and ``clock``, started (its self-check passed)."""
    return await make_engine(store, clock).start()
