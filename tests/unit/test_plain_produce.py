"""The node's cheap reading of the commonest produce body (``okq.wire.plain_produce``):
a msgpack map of ``queue_name`` and ``items`` of ``{"bytes": ...}`` alone. Any other
body is left to the models (None), which read it or explain what is wrong."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from okq.wire import plain_produce


def packed(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def test_binary_payloads_and_nothing_else_are_read_plainly() -> None:
    body = {"queue_name": "jobs-1", "items": [{"bytes": b"a"}, {"bytes": b""}, {"bytes": b"\xff"}]}
    assert plain_produce(packed(body)) == ("jobs-1", [b"a", b"", b"\xff"])


@pytest.mark.parametrize("body", [
    {"queue_name": "q", "items": [{"bytes": b"a"}], "client_id": "c"},  # another key
    {"queue_name": "q", "items": [{"bytes": b"a", "key": "k"}]},  # an item's other field
    {"queue_name": "q", "items": [{"utf8": "text"}]},  # a text payload
    {"queue_name": "q", "items": [{"bytes": "not binary"}]},
    {"queue_name": "q", "items": []},  # no items: the model says why
    {"queue_name": "no spaces allowed", "items": [{"bytes": b"a"}]},
    {"queue_name": 7, "items": [{"bytes": b"a"}]},
    {"items": [{"bytes": b"a"}]},
    [1, 2, 3],
])
def test_any_other_body_is_left_to_the_models(body: Any) -> None:
    assert plain_produce(packed(body)) is None


@pytest.mark.parametrize("data", [b"", b"\xc1", b'{"queue_name": "q"}', packed({"a": 1})[:-1]])
def test_bytes_that_are_not_msgpack_are_left_to_the_models(data: bytes) -> None:
    assert plain_produce(data) is None
