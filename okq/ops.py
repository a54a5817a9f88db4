"""Operations as data: one frozen type per operation of a queue namespace.

Every front end (the HTTP API, the SQS API, a forward from another node, a
program in library mode, the worker) says what it wants as one of these and
hands it to the pipeline (``okq.pipeline``); each layer there reads what it
needs of it:

- ``right``: the ``/v1`` operation a key's role must allow (``okq.auth``);
- ``named()``: the queues it acts on, with the field that names each (a key's
  queue prefixes must cover them);
- ``change``: whether it changes state (sequencer mode runs it on the holder of
  its queue's role, ``okq.routing``);
- ``queue``: its queue (the routing key).

An operation that changes state has a versioned wire form (``to_wire`` /
``from_wire``: a tagged dict of msgpack-able values, ``{"t": name, "v": 1,
...}``), and so has its result (``pack_result`` / ``unpack_result``): a
forward carries the operation whole and brings its typed result back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from okq.admin import QueueInfo
from okq.auth import Principal, open_principal
from okq.errors import InvalidRequest
from okq.leases import LeasedItem
from okq.model import MoveTask, QueueConfig
from okq.opvalues import Outputs as Outputs  # the values operations carry, re-exported
from okq.opvalues import Retry as Retry
from okq.opvalues import RetryOutcome as RetryOutcome
from okq.opvalues import info_in, info_out, items_in, items_out, leased_in, leased_out
from okq.publisher import NewItem, Produced
from okq.views import BrowsedItem, QueueStats

R = TypeVar("R")

#: The version of every operation's wire form (and of its result's).
WIRE_VERSION = 1


class Op(Generic[R]):
    """An operation whose result is an ``R``."""

    __slots__ = ()
    #: The tag of its wire form.
    name: ClassVar[str]
    #: The ``/v1`` operation a key's role must allow (okq.auth.ALLOWED).
    right: ClassVar[str]
    #: Whether it changes state: sequencer mode runs it where its queue's role is held.
    change: ClassVar[bool] = False
    #: The field that names its queue, in the native API's words.
    queue_field: ClassVar[str] = "queue_name"
    #: The queue it acts on ('' for none: the whole namespace). An annotation only:
    #: each operation's own field (a default here would be every field's default).
    queue: str

    def named(self) -> tuple[tuple[str, str], ...]:
        """The queues it acts on, each with the field that names it."""
        return ((self.queue, self.queue_field),) if self.queue else ()

    # -- wire forms (operations that change state) -------------------------------------
    def pack(self) -> dict[str, Any]:
        raise InvalidRequest(f"{self.name} has no wire form", field="op")

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> Op[Any]:
        raise InvalidRequest(f"{cls.name} has no wire form", field="op")

    def pack_result(self, result: R) -> Any:
        return result

    def unpack_result(self, raw: Any) -> R:
        return raw  # type: ignore[no-any-return]


# -- who asks -------------------------------------------------------------------------------


def never_gone() -> bool:
    """A caller that cannot go away (library mode, background work)."""
    return False


@dataclass(slots=True)
class Context:
    """Who asks, and whether they are still there (``gone``: their connection closed).
    ``forwarded``: another node sent the operation here (sequencer mode); ``rid``
    names the request in the logs of both nodes."""

    principal: Principal
    gone: Callable[[], bool] = never_gone
    forwarded: bool = False
    rid: str = ""


#: Library mode and the node's own background work: every right in the namespace.
SYSTEM = Context(open_principal())


class Layer(Protocol):
    """A layer of the pipeline (``okq.pipeline``): acts on an operation, or passes it on."""

    def handle(self, op: Op[R], ctx: Context) -> Awaitable[R]: ...


# -- the lease API ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Produce(Op[list[str]]):
    """Publish items; their ids once durable."""

    name: ClassVar[str] = "produce"
    right: ClassVar[str] = "queue.produce"
    change: ClassVar[bool] = True
    queue: str
    items: Sequence[NewItem]

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue, "items": items_out(self.items)}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> Produce:
        return cls(str(raw["q"]), items_in(raw["items"]))

    def pack_result(self, result: list[str]) -> Any:
        if not isinstance(result, Produced):
            return {"ids": list(result), "dup": None, "seq": None}
        sequence = None if result.sequence is None else [
            None if at is None else list(at) for at in result.sequence]
        return {"ids": list(result), "dup": result.duplicates, "seq": sequence}

    def unpack_result(self, raw: Any) -> list[str]:
        ids = [str(i) for i in raw["ids"]]
        if raw["dup"] is None:
            return ids
        sequence = None if raw.get("seq") is None else [
            None if at is None else (int(at[0]), int(at[1])) for at in raw["seq"]]
        return Produced(ids, int(raw["dup"]), sequence)


@dataclass(frozen=True, slots=True)
class Lease(Op[list[LeasedItem]]):
    """Lease up to ``batch_size`` ready items, long-polling up to ``wait`` seconds."""

    name: ClassVar[str] = "lease"
    right: ClassVar[str] = "queue.lease"
    change: ClassVar[bool] = True
    queue: str
    batch_size: int = 1
    lease_timeout: float | None = None
    wait: float = 0.0

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue, "n": self.batch_size, "lt": self.lease_timeout,
                "wait": self.wait}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> Lease:
        return cls(str(raw["q"]), int(raw["n"]), raw["lt"], float(raw["wait"]))

    def pack_result(self, result: list[LeasedItem]) -> Any:
        return leased_out(result)

    def unpack_result(self, raw: Any) -> list[LeasedItem]:
        return leased_in(raw)


@dataclass(frozen=True, slots=True)
class GiveBack(Op[None]):
    """Release, uncounted, what a lease took for a caller that has gone."""

    name: ClassVar[str] = "give_back"
    right: ClassVar[str] = "queue.lease"
    change: ClassVar[bool] = True
    queue: str
    items: Sequence[LeasedItem]

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue, "items": leased_out(self.items)}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> GiveBack:
        return cls(str(raw["q"]), leased_in(raw["items"]))


@dataclass(frozen=True, slots=True)
class Renew(Op[int]):
    """Extend a lease from now; the new deadline (ms)."""

    name: ClassVar[str] = "renew"
    right: ClassVar[str] = "queue.renew"
    change: ClassVar[bool] = True
    queue: str
    token: str
    lease_timeout: float | None = None

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue, "token": self.token, "lt": self.lease_timeout}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> Renew:
        return cls(str(raw["q"]), str(raw["token"]), raw["lt"])


@dataclass(frozen=True, slots=True)
class Complete(Op[list[str] | None]):
    """Complete deliveries; with ``outputs`` (one token), produce them in the same
    step: their ids."""

    name: ClassVar[str] = "complete"
    right: ClassVar[str] = "queue.complete"
    change: ClassVar[bool] = True
    queue: str
    tokens: Sequence[str]
    outputs: Outputs | None = None

    def named(self) -> tuple[tuple[str, str], ...]:
        if self.outputs is None:
            return ((self.queue, "queue_name"),)
        return ((self.queue, "queue_name"), (self.outputs.queue, "outputs.queue_name"))

    def pack(self) -> dict[str, Any]:
        out: dict[str, Any] = {"q": self.queue, "tokens": list(self.tokens)}
        if self.outputs is not None:
            out["oq"], out["oitems"] = self.outputs.queue, items_out(self.outputs.items)
        return out

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> Complete:
        outputs = Outputs(str(raw["oq"]), items_in(raw["oitems"])) if "oq" in raw else None
        return cls(str(raw["q"]), [str(t) for t in raw["tokens"]], outputs)


@dataclass(frozen=True, slots=True)
class RetryItems(Op[RetryOutcome]):
    """Release deliveries, each on its own; a lost lease is reported, not raised."""

    name: ClassVar[str] = "retry"
    right: ClassVar[str] = "queue.retry"
    change: ClassVar[bool] = True
    queue: str
    retries: Sequence[Retry]

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue, "r": [dataclasses.astuple(r) for r in self.retries]}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> RetryItems:
        return cls(str(raw["q"]), [Retry(*r) for r in raw["r"]])

    def pack_result(self, result: RetryOutcome) -> Any:
        return dataclasses.asdict(result)

    def unpack_result(self, raw: Any) -> RetryOutcome:
        return RetryOutcome(**raw)


@dataclass(frozen=True, slots=True)
class CheckTokens(Op[None]):
    """Verify tokens of ``queue`` before acting on any (``pattern`` names the n-th:
    ``tokens[{n}]``)."""

    name: ClassVar[str] = "check_tokens"
    right: ClassVar[str] = "queue.complete"
    queue: str
    tokens: Sequence[str]
    pattern: str = "tokens[{n}]"


@dataclass(frozen=True, slots=True)
class FirstLeased(Op[int | None]):
    """When the token's item was first leased (ms), while its delivery is current."""

    name: ClassVar[str] = "first_leased"
    right: ClassVar[str] = "queue.renew"
    queue: str
    token: str


# -- queues and views ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Purge(Op[None]):
    """Drop every item; PurgeInProgress when purged less than ``not_within`` s ago."""

    name: ClassVar[str] = "purge"
    right: ClassVar[str] = "queue.purge"
    change: ClassVar[bool] = True
    queue: str
    not_within: float = 0.0

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue, "nw": self.not_within}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> Purge:
        return cls(str(raw["q"]), float(raw.get("nw", 0.0)))


@dataclass(frozen=True, slots=True)
class CreateQueue(Op[QueueInfo]):
    name: ClassVar[str] = "create_queue"
    right: ClassVar[str] = "queues.create"
    queue_field: ClassVar[str] = "name"
    queue: str
    config: QueueConfig

    def named(self) -> tuple[tuple[str, str], ...]:
        dead = self.config.dead_queue
        return ((self.queue, "name"),) + (((dead, "dead_queue"),) if dead else ())


@dataclass(frozen=True, slots=True)
class GetQueue(Op[QueueInfo]):
    """A queue's info; ``max_age`` lets it come from the manifest cache."""

    name: ClassVar[str] = "get_queue"
    right: ClassVar[str] = "queues.info"
    queue_field: ClassVar[str] = "name"
    queue: str
    max_age: float = 0.0


@dataclass(frozen=True, slots=True)
class UpdateQueue(Op[QueueInfo]):
    """Change settings; those not named keep their values."""

    name: ClassVar[str] = "update_queue"
    right: ClassVar[str] = "queues.update"
    change: ClassVar[bool] = True
    queue_field: ClassVar[str] = "name"
    queue: str
    changes: dict[str, Any]

    def named(self) -> tuple[tuple[str, str], ...]:
        dead = self.changes.get("dead_queue")
        return ((self.queue, "name"),) + (((dead, "dead_queue"),) if dead else ())

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue, "changes": self.changes}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> UpdateQueue:
        return cls(str(raw["q"]), dict(raw["changes"]))

    def pack_result(self, result: QueueInfo) -> Any:
        return info_out(result)

    def unpack_result(self, raw: Any) -> QueueInfo:
        return info_in(raw)


@dataclass(frozen=True, slots=True)
class DeleteQueue(Op[None]):
    name: ClassVar[str] = "delete_queue"
    right: ClassVar[str] = "queues.delete"
    change: ClassVar[bool] = True
    queue_field: ClassVar[str] = "name"
    queue: str

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> DeleteQueue:
        return cls(str(raw["q"]))


@dataclass(frozen=True, slots=True)
class QueueNames(Op[list[str]]):
    """The names of the namespace's queues (one LIST); those a key covers."""

    name: ClassVar[str] = "queue_names"
    right: ClassVar[str] = "queues.list"
    queue: str = ""  # the whole namespace


@dataclass(frozen=True, slots=True)
class QueueInfos(Op[list[QueueInfo]]):
    """Every queue of the namespace a key covers; one deleted while listing is left out."""

    name: ClassVar[str] = "queue_infos"
    right: ClassVar[str] = "queues.list"
    queue: str = ""  # the whole namespace


@dataclass(frozen=True, slots=True)
class Stats(Op[QueueStats]):
    name: ClassVar[str] = "stats"
    right: ClassVar[str] = "queue.stats"
    queue: str


@dataclass(frozen=True, slots=True)
class Browse(Op[tuple[list[BrowsedItem], str | None]]):
    name: ClassVar[str] = "browse"
    right: ClassVar[str] = "items.list"
    queue: str
    start_after: str | None = None
    limit: int = 100


@dataclass(frozen=True, slots=True)
class Redrive(Op[int]):
    """Move dead letters back to the queues they came from; how many moved."""

    name: ClassVar[str] = "redrive"
    right: ClassVar[str] = "dead.redrive"
    change: ClassVar[bool] = True
    queue: str
    limit: int = 1000
    destination: str | None = None  # every dead letter goes there instead of its source

    def named(self) -> tuple[tuple[str, str], ...]:
        to = ((self.destination, "destination"),) if self.destination else ()
        return ((self.queue, "queue_name"), *to)

    def pack(self) -> dict[str, Any]:
        return {"q": self.queue, "limit": self.limit, "to": self.destination}

    @classmethod
    def unpack(cls, raw: dict[str, Any]) -> Redrive:
        to = raw.get("to")
        return cls(str(raw["q"]), int(raw["limit"]), str(to) if to else None)


# -- the SQS API's message move tasks (records in the bucket, okq/movetasks.py) --------------


@dataclass(frozen=True, slots=True)
class StartMoveTask(Op[bool]):
    """Record a new move task of its dead-letter queue; False when one was started
    at the same moment."""

    name: ClassVar[str] = "start_move_task"
    right: ClassVar[str] = "dead.redrive"
    queue: str  # the task's dead-letter queue
    task: MoveTask


@dataclass(frozen=True, slots=True)
class MoveTasksOf(Op[list[MoveTask]]):
    """A dead-letter queue's move tasks, newest first."""

    name: ClassVar[str] = "move_tasks_of"
    right: ClassVar[str] = "queues.info"
    queue: str


@dataclass(frozen=True, slots=True)
class UpdateMoveTask(Op[MoveTask]):
    """Apply ``apply`` to a move task by compare-and-swap (a cancel, a runner's claim
    or beat: ``okq.movetasks``); the task as written."""

    name: ClassVar[str] = "update_move_task"
    right: ClassVar[str] = "dead.redrive"
    queue: str
    seq: int
    apply: Callable[[MoveTask, int], MoveTask]


@dataclass(frozen=True, slots=True)
class ActiveMoveTasks(Op[list[MoveTask]]):
    """Every move task of the namespace that still has a runner to come."""

    name: ClassVar[str] = "active_move_tasks"
    right: ClassVar[str] = "queues.info"
    queue: str = ""  # the whole namespace


# -- the wire --------------------------------------------------------------------------------

#: Every operation with a wire form, by its tag.
WIRE: dict[str, type[Op[Any]]] = {
    cls.name: cls for cls in (Produce, Lease, GiveBack, Renew, Complete, RetryItems, Purge,
                              UpdateQueue, DeleteQueue, Redrive)
}


def to_wire(op: Op[Any]) -> dict[str, Any]:
    """The operation as a tagged dict of msgpack-able values."""
    return {"t": op.name, "v": WIRE_VERSION, **op.pack()}


def from_wire(raw: Any) -> Op[Any]:
    """The operation ``to_wire`` described; InvalidRequest for anything else."""
    if not isinstance(raw, dict):
        raise InvalidRequest("malformed operation: not a map", field="op")
    cls = WIRE.get(str(raw.get("t")))
    if cls is None:
        raise InvalidRequest(f"unknown operation {raw.get('t')!r}", field="op")
    if raw.get("v") != WIRE_VERSION:
        raise InvalidRequest(f"{cls.name} of version {raw.get('v')!r} unknown here", field="op")
    try:
        return cls.unpack(raw)
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise InvalidRequest(f"malformed {cls.name} operation: {exc}", field="op") from None
