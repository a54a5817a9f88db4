"""API keys as a node reads them from a request (okq/auth.py)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp.test_utils import TestServer

from okq.auth import KeyRing
from okq.errors import Unauthorized
from okq.server.app import create_app
from okq.settings import Settings
from okq.store import MemoryStore

OPERATOR = "operator-key-for-these-tests"


async def test_a_key_that_is_not_utf8_is_unauthorized() -> None:
    """aiohttp hands a header's bytes that are not UTF-8 over as lone surrogates."""
    ring = KeyRing(MemoryStore(), frozenset({OPERATOR}), required=True)
    with pytest.raises(Unauthorized) as err:
        await ring.principal("okq_\udcff\udcfe")
    assert err.value.details == {"field": "Authorization"}
    assert (await ring.principal(OPERATOR)).role == "admin"  # a real key still works


async def _raw_post(port: int, path: str, headers: bytes) -> tuple[int, bytes]:
    """POST over a socket, headers sent as raw bytes; the status and the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: okq\r\n" + headers +
                 b"Content-Type: application/json\r\nContent-Length: 2\r\n"
                 b"Connection: close\r\n\r\n{}")
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize("operator_keys", [OPERATOR, None])
async def test_a_bearer_key_that_is_not_utf8_is_a_401_over_http(
        operator_keys: str | None, caplog: pytest.LogCaptureFixture) -> None:
    """Every /v1 endpoint, with or without keys required: okq's 401 body, no
    traceback in the log."""
    settings = Settings(store="memory://", self_check=False, signing_keys="k" * 32,
                        api_keys=operator_keys)
    server = TestServer(create_app(settings, MemoryStore()), host="127.0.0.1")
    await server.start_server()
    try:
        with caplog.at_level(logging.WARNING):
            for path in ("/v1/queue.produce", "/v1/queues.list", "/v1/keys.create"):
                status, body = await _raw_post(
                    server.port, path, b"Authorization: Bearer okq_\xff\xfe\xe9\r\n")
                assert status == 401, (path, status, body)
                error = json.loads(body)
                assert error["code"] == "unauthorized", body
                assert error["details"] == {"field": "Authorization"}, body
    finally:
        await server.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
