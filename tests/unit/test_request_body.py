"""How the HTTP front ends read a request's body (``okq.httpbody.read_within``, for the
lease API's handlers and the SQS API): a body that is all there already is taken from
the stream's buffer, under the same size limit."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from okq.httpbody import read_within


def request_with(chunks: list[bytes], limit: int) -> web.Request:
    payload = StreamReader(mock.Mock(_reading_paused=False), 2**16,
                           loop=asyncio.get_running_loop())
    for chunk in chunks:
        payload.feed_data(chunk)
    payload.feed_eof()
    return make_mocked_request("POST", "/v1/queue.produce", payload=payload,
                               client_max_size=limit)


@pytest.mark.parametrize("chunks", [[b"one chunk"], [b"three ", b"chunks ", b"joined"], []])
async def test_a_body_that_is_all_there_is_read_from_the_buffer(chunks: list[bytes]) -> None:
    assert await read_within(request_with(chunks, 1000), 1) == b"".join(chunks)


async def test_a_whole_body_over_the_limit_is_refused() -> None:
    with pytest.raises(web.HTTPRequestEntityTooLarge):
        await read_within(request_with([b"x" * 600, b"y" * 600], 1000), 1)
    assert await read_within(request_with([b"x" * 1000], 1000), 1) == b"x" * 1000


def still_coming(first: bytes) -> tuple[web.Request, StreamReader]:
    payload = StreamReader(mock.Mock(_reading_paused=False), 2**16,
                           loop=asyncio.get_running_loop())
    payload.feed_data(first)
    return make_mocked_request("POST", "/", payload=payload, client_max_size=1000), payload


async def test_a_body_still_coming_is_waited_for_within_the_timeout() -> None:
    request, _ = still_coming(b"the first half, ")
    with pytest.raises(TimeoutError):
        await read_within(request, 0.05)
    request, payload = still_coming(b"the first half, ")

    def the_rest() -> None:
        payload.feed_data(b"then the rest")
        payload.feed_eof()

    asyncio.get_running_loop().call_later(0.05, the_rest)
    assert await read_within(request, 5) == b"the first half, then the rest"
