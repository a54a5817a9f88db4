"""Where every object lives. All keys sit under a namespace prefix ``{ns}/``.

=============================================  ===========================================
key                                             object
=============================================  ===========================================
``{ns}/manifests/{queue}``                      the queue's manifest (CAS, the authority)
``{ns}/segments/{queue}/{segment}``             an immutable segment (create-only)
``{ns}/leases/{queue}/{segment}``               the segment's lease object: leases and
                                                completion tombstones of its items (CAS)
``{ns}/mchunks/{queue}/{chunk}``                a chunk of the manifest's segment list
                                                (create-only, never modified)
``{ns}/movetasks/{queue}/{seq}``                a message move task of the SQS API, by
                                                its dead-letter queue (create-only, then
                                                CAS)
``_auth/keys/{id}``                             an API key (its secret's hash, namespace,
                                                role, queue prefixes), outside every
                                                namespace: a namespace cannot start
                                                with ``_``
=============================================  ===========================================

Segment ids start with their creation time in hex milliseconds, so a listing
is in creation order and a garbage collector can read an orphan's age from its
name as well as from the store's ``LastModified``.
"""

from __future__ import annotations

import re
import secrets

from okq.errors import InvalidRequest

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: The separator of a partition's number from its queue's name (``orders~3``): no
#: name a user gives can hold it, so a partition is never mistaken for a queue.
PARTITION_SEP = "~"
#: A name the engine keeps objects under: a queue's (its partition 0) or one of its
#: other partitions' (``okq.partitions``).
QUEUE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(?:~[1-9][0-9]{0,2})?")
SEGMENT_RE = re.compile(r"[0-9a-f]{12}-[0-9a-f]{10}")


def check_name(value: str, field: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise InvalidRequest(
            f"{field} must be 1-128 characters of letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit; got {value!r}",
            field=field,
        )
    return value


def check_queue(value: str, field: str) -> str:
    """A queue's name or one of its partitions' (``check_name`` says what a user may
    name)."""
    if not isinstance(value, str) or not QUEUE_RE.fullmatch(value):
        return check_name(value, field)
    return value


def partition_name(queue: str, partition: int) -> str:
    """Where partition ``partition`` of ``queue`` keeps its objects: partition 0 is
    the queue's own name, so a queue of one partition is what it always was."""
    return f"{queue}{PARTITION_SEP}{partition}" if partition else queue


def split_partition(name: str) -> tuple[str, int]:
    """The queue and partition number a name of ``partition_name`` stands for."""
    queue, sep, number = name.partition(PARTITION_SEP)
    return (queue, int(number)) if sep and number.isdigit() else (name, 0)


def new_segment_id(now_ms: int) -> str:
    return f"{now_ms:012x}-{secrets.token_hex(5)}"


def segment_created_ms(segment_id: str) -> int:
    return int(segment_id.split("-", 1)[0], 16)


API_KEYS_PREFIX = "_auth/keys/"


def api_key_key(key_id: str) -> str:
    return f"{API_KEYS_PREFIX}{key_id}"


def presence_prefix(ns: str) -> str:
    """Where each node and compactor reports itself (``okq.presence``)."""
    return f"{ns}/presence/"


def manifests_prefix(ns: str) -> str:
    return f"{ns}/manifests/"


def segments_prefix(ns: str, queue: str | None = None) -> str:
    """Where the segments of a queue live (of every queue, without one)."""
    return f"{ns}/segments/" if queue is None else f"{ns}/segments/{queue}/"


def leases_prefix(ns: str, queue: str | None = None) -> str:
    """Where the lease objects of a queue live (of every queue, without one)."""
    return f"{ns}/leases/" if queue is None else f"{ns}/leases/{queue}/"


def chunks_prefix(ns: str, queue: str | None = None) -> str:
    """Where the manifest chunks of a queue live (of every queue, without one)."""
    return f"{ns}/mchunks/" if queue is None else f"{ns}/mchunks/{queue}/"


def chunk_key(ns: str, queue: str, chunk: str) -> str:
    return f"{ns}/mchunks/{queue}/{chunk}"


def manifest_key(ns: str, queue: str) -> str:
    return f"{ns}/manifests/{queue}"


def segment_key(ns: str, queue: str, segment: str) -> str:
    return f"{ns}/segments/{queue}/{segment}"


def lease_key(ns: str, queue: str, segment: str) -> str:
    return f"{ns}/leases/{queue}/{segment}"


def item_id(segment: str, index: int) -> str:
    return f"{segment}.{index}"


#: ".0", ".1", ...: what ``item_ids`` joins to a segment's id (formatting an int costs
#: more than the join).
_INDEX_SUFFIXES: list[str] = [f".{n}" for n in range(1024)]


def item_ids(segment: str, count: int) -> list[str]:
    """The ids of a segment's first ``count`` items: ``item_id(segment, n)`` for each."""
    while count > len(_INDEX_SUFFIXES):
        _INDEX_SUFFIXES.extend(f".{n}" for n in range(len(_INDEX_SUFFIXES),
                                                      2 * len(_INDEX_SUFFIXES)))
    return [segment + suffix for suffix in _INDEX_SUFFIXES[:count]]


def parse_item_id(value: str, field: str = "id") -> tuple[str, int]:
    seg, _, idx = value.rpartition(".")
    if not SEGMENT_RE.fullmatch(seg) or not (idx.isascii() and idx.isdigit()):
        raise InvalidRequest(f"{field} is not an okq item id: {value!r}", field=field)
    return seg, int(idx)


def move_tasks_prefix(ns: str, dead_queue: str | None = None) -> str:
    """Where the message move tasks of a dead-letter queue live (of every queue,
    without one)."""
    return f"{ns}/movetasks/" if dead_queue is None else f"{ns}/movetasks/{dead_queue}/"


def move_task_key(ns: str, dead_queue: str, seq: int) -> str:
    """A move task's key: tasks of one queue sort in the order they were started."""
    return f"{ns}/movetasks/{dead_queue}/{seq:010d}"
