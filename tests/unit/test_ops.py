"""Operations as data (okq/ops.py): every change's wire form and its result's come
back equal through msgpack, a foreign or malformed one is refused naming ``op``,
the pipeline's authorize layer reads what each operation names, and no front end
reaches below the pipeline."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import msgpack
import pytest

from okq import ops
from okq.admin import QueueInfo
from okq.auth import Principal
from okq.errors import Forbidden, InvalidRequest
from okq.leases import LeasedItem
from okq.model import QueueConfig
from okq.pipeline import Authorize
from okq.publisher import NewItem

LEASED = LeasedItem("0000000000aa-00000000aa.0", "jobs", "tok", 2, 1_700_000_000_000, b"\x00x",
                    1_699_999_000_000, None, {"k": "v"}, 1_699_999_500_000)

CHANGES: list[ops.Op[Any]] = [
    ops.Produce("jobs", [NewItem(b"a"), NewItem(b"\xff", 5, "key-1", {"m": 1})]),
    ops.Lease("jobs", 10, 30.0, 2.5),
    ops.GiveBack("jobs", [LEASED]),
    ops.Renew("jobs", "tok", None),
    ops.Complete("jobs", ["t1", "t2"]),
    ops.Complete("jobs", ["t1"], ops.Outputs("out", [NewItem(b"o")])),
    ops.RetryItems("jobs", [ops.Retry("t1"), ops.Retry("t2", 7, True, "boom", False)]),
    ops.Purge("jobs", 60.0),
    ops.UpdateQueue("jobs", {"lease_timeout": 5.0, "dead_queue": None}),
    ops.DeleteQueue("jobs"),
    ops.Redrive("dead", 50),
    ops.Redrive("dead", 50, "elsewhere"),
]


def through_the_wire(value: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(value))


@pytest.mark.parametrize("op", CHANGES, ids=lambda op: op.name)
def test_every_change_comes_back_equal_from_its_wire_form(op: ops.Op[Any]) -> None:
    again = ops.from_wire(through_the_wire(ops.to_wire(op)))
    assert type(again) is type(op)
    assert ops.to_wire(again) == ops.to_wire(op)
    assert again.queue == op.queue


def test_results_come_back_typed() -> None:
    lease = ops.Lease("jobs")
    assert lease.unpack_result(through_the_wire(lease.pack_result([LEASED]))) == [LEASED]
    retry = ops.RetryItems("jobs", [])
    outcome = ops.RetryOutcome(total=2, retried=1, failed=[{"index": 0, "reason": "gone"}])
    assert retry.unpack_result(through_the_wire(retry.pack_result(outcome))) == outcome
    update = ops.UpdateQueue("jobs", {})
    info = QueueInfo("jobs", QueueConfig(lease_timeout=5), 1, 2, 3, 4)
    assert update.unpack_result(through_the_wire(update.pack_result(info))) == info


@pytest.mark.parametrize("raw", [
    None, [], {"t": "launch", "v": 1}, {"t": "produce", "v": 99, "q": "jobs", "items": []},
    {"t": "produce", "v": 1, "q": "jobs"}, {"t": "lease", "v": 1, "q": "jobs", "n": "x"},
    {"t": "stats", "v": 1, "q": "jobs"},  # a read: never forwarded
])
def test_a_foreign_or_malformed_operation_is_refused(raw: Any) -> None:
    with pytest.raises(InvalidRequest) as err:
        ops.from_wire(raw)
    assert err.value.details["field"] == "op"


class Nowhere:
    def handle(self, op: ops.Op[Any], ctx: ops.Context) -> Any:
        raise AssertionError("authorize let it through")


@pytest.mark.parametrize(("op", "field"), [
    (ops.Complete("orders-1", ["t"], ops.Outputs("jobs", [NewItem(b"x")])),
     "outputs.queue_name"),
    (ops.CreateQueue("orders-1", QueueConfig(dead_queue="jobs")), "dead_queue"),
    (ops.UpdateQueue("orders-1", {"dead_queue": "jobs"}), "dead_queue"),
    (ops.Produce("jobs", [NewItem(b"x")]), "queue_name"),
])
def test_authorize_checks_every_queue_an_operation_names(op: ops.Op[Any], field: str) -> None:
    who = Principal("k", "admin", "default", ("orders-",))
    with pytest.raises(Forbidden) as err:
        Authorize(Nowhere()).handle(op, ops.Context(who))
    assert err.value.details["field"] == field


def test_authorize_checks_the_role() -> None:
    reader = Principal("k", "read-only", "default")
    with pytest.raises(Forbidden, match=r"a read-only key may not call queue\.produce"):
        Authorize(Nowhere()).handle(ops.Produce("jobs", [NewItem(b"x")]), ops.Context(reader))


FRONT_ENDS = [Path("okq/server/handlers.py"), Path("okq/server/middleware.py"),
              Path("okq/worker.py"), Path("okq/workerqueues.py"), *Path("okq/sqs").glob("*.py")]


@pytest.mark.parametrize("path", FRONT_ENDS, ids=str)
def test_front_ends_reach_the_engine_only_through_the_pipeline(path: Path) -> None:
    """No front end calls the engine or its parts: each hands operations to the
    pipeline (okq/pipeline.py), directly or through okq/service.py."""
    tree = ast.parse((Path(__file__).parents[2] / path).read_text())
    reached = [f"line {n.lineno}: .{n.attr}" for n in ast.walk(tree)
               if isinstance(n, ast.Attribute) and n.attr in ("engine", "runtime", "scheduler",
                                                              "deliveries", "admin")]
    assert reached == []


def test_a_redrive_names_its_destination_for_the_keys_prefixes() -> None:
    assert ops.Redrive("dead").named() == (("dead", "queue_name"),)
    assert ops.Redrive("dead", 5, "elsewhere").named() == (("dead", "queue_name"),
                                                          ("elsewhere", "destination"))
