"""How the client commands show things on a terminal: payloads, and the tables of
queues, counts and items."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from okq import wire as s



def show_payload(item: s.LeasedItemOut | s.ItemOut) -> str:
    if item.utf8 is not None:
        return item.utf8 if len(item.utf8) <= 60 else item.utf8[:57] + "..."
    return f"<{len(item.bytes)} bytes>"


def info_table(infos: list[s.QueueInfoOut]) -> Table:
    t = Table("queue", "lease timeout", "retention", "max attempts", "dead queue", "partitions",
              "produced")
    for i in infos:
        t.add_row(i.name + (" (fifo)" if i.fifo else ""), f"{i.lease_timeout:g}s",
                  f"{i.retention:g}s",
                  str(i.max_attempts or "unlimited"), i.dead_queue or "-",
                  str(i.partitions) + (f" ({len(i.read_only)} read-only)" if i.read_only
                                       else ""),
                  str(i.produced))
    return t


def keys_table(keys: list[s.KeyOut]) -> Table:
    t = Table("id", "role", "namespace", "queues", "name", "created")
    for k in keys:
        t.add_row(k.id, k.role, k.namespace, ", ".join(f"{p}*" for p in k.prefixes) or "all",
                  k.name or "-", f"{k.created_at:%Y-%m-%d %H:%M:%S}")
    return t


STAT_COLUMNS = ("available", "in_flight", "scheduled", "waiting_retry", "dead", "completed")


def stats_table(rows: list[s.StatsResponse]) -> Table:
    t = Table("queue", *(c.replace("_", " ") for c in STAT_COLUMNS), "oldest")
    for r in rows:
        t.add_row(r.queue_name, *(str(getattr(r, c)) for c in STAT_COLUMNS),
                  f"{r.oldest_age:.1f}s")
    return t


def stats_line(r: s.StatsResponse) -> str:
    """One queue's counts on one line: ``12:00:01 jobs available=3 in_flight=1 ...``."""
    counts = " ".join(f"{c}={getattr(r, c)}" for c in STAT_COLUMNS)
    return f"{datetime.now():%H:%M:%S} {r.queue_name} {counts} oldest={r.oldest_age:.1f}s"


def dead_attempts(item: s.ItemOut) -> int:
    """The deliveries a dead letter had: those in the queue it came from (its meta's
    ``attempts``, recorded when it was dead-lettered), plus any in the dead-letter
    queue itself (the item's own ``attempts``, which start again at 0 there)."""
    source = (item.meta or {}).get("attempts")
    return item.attempts + (source if isinstance(source, int) else 0)


def items_table(items: list[s.ItemOut], dead: bool = False) -> Table:
    cols = ["id", "state", "attempts", "produced"] + (["from", "error"] if dead else []) + [
        "payload"]
    t = Table(*cols)
    for i in items:
        meta = i.meta or {}
        row = [i.id, i.state, str(dead_attempts(i) if dead else i.attempts),
               f"{i.produced_at:%Y-%m-%d %H:%M:%S}"]
        if dead:
            row += [str(meta.get("source_queue", "-")), str(meta.get("error") or "-")]
        t.add_row(*row, show_payload(i))
    return t
