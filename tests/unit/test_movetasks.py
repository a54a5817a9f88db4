"""The pure changes of a message move task (okq/movetasks.py) and its codec."""

from __future__ import annotations

import pytest

from okq.errors import FormatError, TaskLost
from okq.model import MoveTask, decode_move_task, encode_move_task
from okq.movetasks import beat, cancel, claim, finish

NOW = 1_700_000_000_000
TTL = 10_000


def task(**fields: object) -> MoveTask:
    base = MoveTask("dlq", 3, "arn:aws:sqs:us-east-1:default:dlq", None, None, 5, 7, NOW,
                    owner="a", beat_ms=NOW + TTL, hold_ms=NOW + 70_000)
    for name, value in fields.items():
        setattr(base, name, value)
    return base


def test_codec_round_trip_and_refusal() -> None:
    t = task(moved=2, failure="x", destination_arn="arn:aws:sqs:us-east-1:default:t",
             target="t", ver=4, nonce="n")
    assert decode_move_task(encode_move_task(t)) == t
    with pytest.raises(FormatError):
        decode_move_task(encode_move_task(t)[:-3])


def test_a_claim_is_taken_only_once_it_lapsed() -> None:
    with pytest.raises(TaskLost, match="another node runs"):
        claim("b", TTL, NOW)(task(), NOW + TTL - 1)
    took = claim("b", TTL, NOW + 99_000)(task(), NOW + TTL)
    assert (took.owner, took.beat_ms, took.hold_ms) == ("b", NOW + 2 * TTL, NOW + 99_000)
    assert claim("a", TTL, 0)(task(), NOW).hold_ms == NOW + 70_000  # the longer hold stays
    for status in ("CANCELLED", "COMPLETED", "FAILED"):
        with pytest.raises(TaskLost):
            claim("b", TTL, 0)(task(status=status), NOW + TTL)
    assert claim("b", TTL, 0)(task(status="CANCELLING"), NOW + TTL).owner == "b"


def test_a_beat_counts_and_renews_only_for_the_owner_of_an_active_task() -> None:
    t = beat("a", TTL, 4, NOW + 80_000)(task(moved=1), NOW + 5)
    assert (t.moved, t.beat_ms, t.hold_ms) == (5, NOW + 5 + TTL, NOW + 80_000)
    with pytest.raises(TaskLost):
        beat("b", TTL, 1)(task(), NOW)
    with pytest.raises(TaskLost):
        beat("a", TTL, 1)(task(status="CANCELLED"), NOW)


def test_finish_and_cancel() -> None:
    done = finish("a", "COMPLETED", 2)(task(moved=1), NOW)
    assert (done.status, done.moved) == ("COMPLETED", 3)
    with pytest.raises(TaskLost):
        finish("b", "COMPLETED", 0)(task(), NOW)
    assert cancel(task(), NOW).status == "CANCELLING"  # its runner ends it
    assert cancel(task(), NOW + TTL).status == "CANCELLED"  # no runner holds it
    with pytest.raises(TaskLost, match="CANCELLING, not RUNNING"):
        cancel(task(status="CANCELLING"), NOW)
