"""How a node reads a request's body (``okq.server.codec.read_bytes``): a body that is
all there already is taken from the stream's buffer, under the same size limit."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from okq.server.codec import read_bytes


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
    assert await read_bytes(request_with(chunks, 1000)) == b"".join(chunks)


async def test_a_whole_body_over_the_limit_is_refused() -> None:
    with pytest.raises(web.HTTPRequestEntityTooLarge):
        await read_bytes(request_with([b"x" * 600, b"y" * 600], 1000))
    assert await read_bytes(request_with([b"x" * 1000], 1000)) == b"x" * 1000
