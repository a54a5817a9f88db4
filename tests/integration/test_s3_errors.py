"""S3 failures as one clear line, from both S3 clients (okq/store/s3errors.py): the
status, the operation, the key, the server's error code and message; no debug
dump, no endpoint; missing credentials say what to set. Against moto's server,
through the fault proxy (tests/s3proxy.py), and a loopback stand-in for the
instance metadata service (object_store reads AWS_METADATA_ENDPOINT, botocore
AWS_EC2_METADATA_SERVICE_ENDPOINT), so nothing leaves 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from okq.errors import StorageError
from okq.store import Store, open_store
from tests.s3proxy import Rule, S3Proxy
from tests.servers import BUCKET

pytestmark = pytest.mark.s3
CLIENTS = ["obstore", "aioboto3"]


def _one_line(err: StorageError, endpoint: str) -> str:
    text = str(err)
    assert "\n" not in text and "Debug" not in text and len(text) < 400, text
    assert endpoint.split("//")[1] not in text, text  # no endpoint
    return text


def _calls(store: Store) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    return [("GET", lambda: store.get("a/k")), ("PUT", lambda: store.put("a/k", b"x")),
            ("LIST", lambda: store.list("a/"))]


async def _every_call_fails(store: Store, endpoint: str) -> list[tuple[str, str]]:
    """Each call of ``_calls`` on ``store`` (closed after): its operation and the one
    line of the StorageError it must raise."""
    lines = []
    try:
        for op, call in _calls(store):
            with pytest.raises(StorageError) as caught:
                await call()
            lines.append((op, _one_line(caught.value, endpoint)))
    finally:
        await store.close()
    return lines


@pytest.mark.parametrize("client", CLIENTS)
async def test_server_errors_and_a_missing_bucket_are_one_line(
        client: str, moto_endpoint: str) -> None:
    with S3Proxy(moto_endpoint) as proxy:
        store = open_store(f"s3://{BUCKET}/errs?client={client}", endpoint_url=proxy.endpoint)
        try:
            for op, call in _calls(store):
                proxy.add(Rule(reply="error"))
                with pytest.raises(StorageError) as caught:
                    await call()
                line = _one_line(caught.value, proxy.endpoint)
                assert line == ("S3 500 InternalError: injected by the test proxy "
                                f"({op} {'a/' if op == 'LIST' else 'a/k'!r})"), line
        finally:
            await store.close()
    with S3Proxy(moto_endpoint) as proxy:  # a request that never answers
        store = open_store(f"s3://{BUCKET}/errs?client={client}", endpoint_url=proxy.endpoint,
                           timeout=0.5)
        try:
            proxy.add(Rule(hold=True, hold_timeout=10))
            with pytest.raises(StorageError) as caught:
                await store.get("a/k")
            assert _one_line(caught.value, proxy.endpoint) == \
                "S3 GET 'a/k' failed: no answer in time (--s3-timeout)"
        finally:
            proxy.clear()
            await store.close()
    store = open_store(f"s3://{BUCKET}/p?client={client}", endpoint_url="http://127.0.0.1:9")
    try:  # nothing listens there
        with pytest.raises(StorageError) as caught:
            await store.get("a/k")
        assert _one_line(caught.value, "http://127.0.0.1:9").startswith("S3 GET 'a/k' failed: ")
    finally:
        await store.close()
    store = open_store(f"s3://no-such-bucket/p?client={client}", endpoint_url=moto_endpoint)
    for op, line in await _every_call_fails(store, moto_endpoint):
        assert line.startswith(f"no bucket 'no-such-bucket': S3 404 NoSuchBucket ({op} "), line


@pytest.fixture
async def metadata_denies(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """No credentials in the environment, and an instance metadata service (on
    loopback) that answers 403, as the one of the issue did ("resolve_deny")."""

    async def deny(request: web.Request) -> web.Response:
        return web.Response(status=403, text="resolve_deny")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", deny)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_EC2_METADATA_DISABLED", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", url)
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", url)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/okq-test-credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/okq-test-config")
    yield
    await runner.cleanup()


@pytest.mark.parametrize("client", CLIENTS)
async def test_missing_credentials_say_what_to_set(
        client: str, moto_endpoint: str, metadata_denies: None) -> None:
    store = open_store(f"s3://{BUCKET}/creds?client={client}", endpoint_url=moto_endpoint)
    for _, line in await _every_call_fails(store, moto_endpoint):
        assert line.startswith("no S3 credentials"), line
        assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in line
        assert "api/token" not in line and "resolve_deny" not in line
