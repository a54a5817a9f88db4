"""The values operations carry (``okq.ops``), and their wire forms: items to
produce, items leased, queue infos as msgpack-able lists and maps; a completion's
outputs, a retry, a retry batch's outcome."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from okq.admin import QueueInfo
from okq.errors import LeaseLost
from okq.leases import LeasedItem
from okq.model import QueueConfig
from okq.publisher import NewItem


@dataclass(frozen=True)
class Outputs:
    """Items produced to ``queue`` in the same step as a completion."""

    queue: str
    items: Sequence[NewItem]


@dataclass(frozen=True)
class Retry:
    """One delivery to release: ready again at ``retry_at_ms`` (now by default), or
    dead-lettered; ``count_attempt=False`` gives it back without counting a try."""

    token: str
    retry_at_ms: int | None = None
    dead: bool = False
    error: str | None = None
    count_attempt: bool = True


@dataclass
class RetryOutcome:
    """What a retry batch did: how many landed, and each refusal by its index."""

    total: int
    retried: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)  # {"index", "reason"}
    # Of those retried, how many were dead-lettered (``dead``, or out of attempts).
    dead_lettered: int = 0

    def raise_if_failed(self) -> None:
        """LeaseLost naming the refused items, when any was refused."""
        if self.failed:
            landed = f"; the other {self.retried} landed" if self.retried else ""
            raise LeaseLost(f"{len(self.failed)} of {self.total} retries refused: the lease "
                            f"was lost{landed}", failed=self.failed)


# -- conversions of the values operations carry --------------------------------------------

LEASED_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(LeasedItem)))


def items_out(items: Sequence[NewItem]) -> list[list[Any]]:
    return [[i.payload, i.enqueue_at_ms, i.key, i.meta] for i in items]


def items_in(raw: list[list[Any]]) -> list[NewItem]:
    return [NewItem(bytes(p), at, key, meta) for p, at, key, meta in raw]


def leased_out(items: Sequence[LeasedItem]) -> list[list[Any]]:
    """Leased items as plain lists (``dataclasses.asdict`` deep-copies: slow)."""
    return [list(LEASED_FIELDS(i)) for i in items]


def leased_in(raw: list[list[Any]]) -> list[LeasedItem]:
    return [LeasedItem(*fields) for fields in raw]


def info_out(info: QueueInfo) -> dict[str, Any]:
    return {"name": info.name, "config": info.config.model_dump(),
            "created_ms": info.created_ms, "segments": info.segments,
            "produced": info.produced, "purged_ms": info.purged_ms}


def info_in(raw: dict[str, Any]) -> QueueInfo:
    return QueueInfo(name=raw["name"], config=QueueConfig.model_validate(raw["config"]),
                     created_ms=raw["created_ms"], segments=raw["segments"],
                     produced=raw["produced"], purged_ms=raw.get("purged_ms", 0))
