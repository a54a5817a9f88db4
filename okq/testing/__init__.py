"""okq's pytest plugin: a real okq node for a project's own tests (docs/TESTING.md).

Installed with ``pip install 'okq[testing]'``; pytest loads it by its entry point
(``pytest11``), in every pytest run of the environment. Its fixtures:

* ``okq_store_kind`` — ``memory`` (default), ``file`` or ``moto``: the
  ``--okq-store`` option, else the ``okq_store`` ini option;
* ``okq_server`` — one node per session (``okq.testing.node.OkqNode``), served
  from a thread of the test process on that store; ``.url`` is its address;
* ``okq_client`` — an async ``okq.client.Client`` of it, closed after the test;
* ``okq_sync_client`` — a ``okq.client.SyncClient`` of it, closed after the test;
* ``okq_queue`` — ``okq_queue("jobs", max_attempts=3, dead_queue=...)`` creates a
  queue with a unique name (``jobs-<hex>``) and returns the name; deleted after;
* ``okq_sqs`` — a boto3 SQS client pointed at the node's SQS API;
* ``okq_drain`` — ``await okq_drain(queue, handler)`` runs an ``okq.worker.Worker``
  until the queue drains and returns what it did (``okq.testing.drain.Drained``).

Loading it costs an import of pytest's own: okq's modules, aiohttp, moto and boto3
are imported by the fixtures, when a test first asks for one.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

try:
    import pytest_asyncio
except ImportError:  # okq without its testing extra: the async fixtures say what to install
    pytest_asyncio = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from okq.client import Client, SyncClient
    from okq.testing.drain import Drained
    from okq.testing.node import OkqNode
    from okq.worker import Handler

__all__ = ["STORE_KINDS"]

#: What ``--okq-store`` takes (okq.testing.node.STORE_KINDS, not imported here).
STORE_KINDS = ("memory", "file", "moto")
DEFAULT_KIND = "memory"
NO_ASYNCIO = "okq's async fixtures need pytest-asyncio: pip install 'okq[testing]'"

QueueFactory = Callable[..., str]
Drain = Callable[..., Awaitable["Drained"]]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("okq", "okq's test node (okq.testing)")
    group.addoption("--okq-store", choices=STORE_KINDS, default=None,
                    help="the store of the okq_server fixture's node: memory (default), file "
                         "(a temporary folder) or moto (moto's S3 server, started in-process)")
    parser.addini("okq_store", f"okq_server's store, as --okq-store: {', '.join(STORE_KINDS)}",
                  default="")


def asked_kind(config: pytest.Config) -> str:
    """The store kind the command line, else the ini file, asks for ("" for none)."""
    return str(config.getoption("okq_store", None) or config.getini("okq_store")).strip()


def chosen_kind(config: pytest.Config) -> str:
    """The store kind asked for, or the default; a kind okq has not is a usage error."""
    kind = asked_kind(config) or DEFAULT_KIND
    if kind not in STORE_KINDS:
        raise pytest.UsageError(f"okq_store = {kind!r}: expected one of {', '.join(STORE_KINDS)}")
    return kind


def pytest_report_header(config: pytest.Config) -> str | None:
    if not asked_kind(config):
        return None  # nothing asked for: say nothing (okq's own suite, most runs)
    return f"okq: okq_server on the {chosen_kind(config)} store"


def _async_fixture(fn: Callable[..., Any]) -> Any:
    """``pytest_asyncio.fixture``, or without pytest-asyncio a fixture that says so."""
    if pytest_asyncio is not None:
        return pytest_asyncio.fixture(fn)

    @pytest.fixture(name=fn.__name__)
    def missing() -> None:
        pytest.fail(NO_ASYNCIO, pytrace=False)

    return missing


# -- the node ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def okq_store_kind(pytestconfig: pytest.Config) -> str:
    """The store kind of ``okq_server``: override it to choose in code."""
    return chosen_kind(pytestconfig)


@pytest.fixture(scope="session")
def okq_server(okq_store_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OkqNode]:
    """One okq node for the session, on ``okq_store_kind``'s store, on a free loopback port."""
    from okq.testing.node import OkqNode

    folder = tmp_path_factory.mktemp("okq-store") if okq_store_kind == "file" else None
    with OkqNode(okq_store_kind, folder) as node:
        yield node


# -- clients -----------------------------------------------------------------------------


@_async_fixture
async def okq_client(okq_server: OkqNode) -> AsyncIterator[Client]:
    """An async client of the node, closed after the test."""
    from okq.client import Client

    async with Client(okq_server.url) as client:
        yield client


@pytest.fixture
def okq_sync_client(okq_server: OkqNode) -> Iterator[SyncClient]:
    """A blocking client of the node (okq's ``SyncClient``), closed after the test."""
    from okq.client import SyncClient

    with SyncClient(okq_server.url) as client:
        yield client


@pytest.fixture(scope="session")
def okq_sqs(okq_server: OkqNode) -> Iterator[Any]:
    """A boto3 SQS client of the node's SQS API, signed with its key (one per session)."""
    import boto3

    client = boto3.client("sqs", endpoint_url=okq_server.url, region_name=okq_server.sqs_region,
                          aws_access_key_id=okq_server.sqs_access_key,
                          aws_secret_access_key=okq_server.sqs_secret)
    yield client
    client.close()


# -- queues and workers ------------------------------------------------------------------


@pytest.fixture
def okq_queue(okq_server: OkqNode) -> Iterator[QueueFactory]:
    """``okq_queue(prefix="q", **settings) -> name``: a new queue named ``prefix-<hex>``,
    with the settings ``queues.create`` takes (``max_attempts``, ``dead_queue``,
    ``lease_timeout``, ``retention``, ...). A plain function, for sync and async tests
    alike. The queues are deleted after the test, the last made first."""
    from okq.errors import OkqError

    made: list[str] = []
    admin = okq_server.admin()

    def make(prefix: str = "q", **settings: Any) -> str:
        name = f"{prefix}-{secrets.token_hex(4)}"
        admin.create_queue(name, **settings)
        made.append(name)
        return name

    yield make
    for name in reversed(made):
        try:
            admin.delete_queue(name)
        except OkqError:
            pass  # the test deleted it, or it is someone's dead-letter queue still


@pytest.fixture
def okq_drain(okq_server: OkqNode) -> Drain:
    """``await okq_drain(queue, handler, concurrency=4, timeout=30, backoff=0,
    lease_timeout=None)``: run an ``okq.worker.Worker`` with ``handler`` until the
    queue has nothing available, in flight, scheduled or waiting for a retry; return
    what it did (``okq.testing.drain.Drained``). A sync test runs it with
    ``asyncio.run(okq_drain(...))``."""
    from okq.testing.drain import drain

    async def run(queue: str, handler: Handler, **options: Any) -> Drained:
        return await drain(okq_server.url, queue, handler, **options)

    return run
