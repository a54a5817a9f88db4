"""The node's cheap reading of the commonest produce and complete bodies: a msgpack
map of ``queue_name`` and ``items`` of ``{"bytes": ...}`` alone
(``okq.wire.plain_produce``), or of ``queue_name`` and ``tokens`` alone
(``plain_tokens``), and their replies. Any other body is left to the models (None),
which read it or explain what is wrong."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from okq.wire import plain_produce, plain_tokens


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


def test_a_complete_of_tokens_alone_is_read_plainly() -> None:
    assert plain_tokens(packed({"queue_name": "q", "tokens": ["a.1.1.m", "b"]})) == (
        "q", ["a.1.1.m", "b"])


@pytest.mark.parametrize("body", [
    {"queue_name": "q", "tokens": ["a"], "outputs": {"queue_name": "r", "items": []}},
    {"queue_name": "q", "tokens": []},
    {"queue_name": "q", "tokens": ["a", 7]},
    {"queue_name": "q", "tokens": "a"},
    {"queue_name": "not a name", "tokens": ["a"]},
    {"tokens": ["a"]},
])
def test_any_other_complete_is_left_to_the_model(body: Any) -> None:
    assert plain_tokens(packed(body)) is None


@pytest.mark.parametrize("output_ids", [None, [], ["018b5e3c2a00-0123456789.0"]])
def test_a_complete_reply_is_the_bytes_its_model_makes(output_ids: list[str] | None) -> None:
    from okq.server.codec import _plain
    from okq.wire import CompleteResponse, complete_reply_plain

    model = CompleteResponse.model_construct(queue_name="q", completed=3, output_ids=output_ids)
    assert complete_reply_plain("q", 3, output_ids) == packed(_plain(model.model_dump()))
