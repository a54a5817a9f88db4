"""The SQS actions, each over okq's queue service (``okq.service.QueueService``).

Every action takes its parameters in the JSON protocol's shape and returns its
reply in that shape (``okq.sqs.protocol`` turns both into the query protocol's when
a client speaks it). okq's errors become SQS's in one place, :func:`sqs_errors`.

Semantics decided here (docs/SQS.md says why):

- a receipt handle is an okq lease token; a handle that is malformed, forged or of
  another queue is ``ReceiptHandleIsInvalid``;
- ``DeleteMessage`` with a well-formed handle whose lease is no longer held (it
  expired and the message was received again, or it was deleted already) succeeds
  without deleting, as SQS documents for a stale handle; the completion is not
  accepted (okq's commit-once fencing holds) and the node counts it in
  ``okq_sqs_stale_deletes_total`` and answers it with ``x-okq-stale-receipt``;
- ``ChangeMessageVisibility`` on a lease no longer held is ``MessageNotInflight``
  while the message is still in the queue (received again since, or released), and
  ``InvalidParameterValue`` once it has left it (deleted, dead-lettered, purged), as
  at SQS; to 0 it releases the message at once (its receive still counts, as in
  SQS); past 12 hours of invisibility since the first receive it is refused
  (``InvalidParameterValue``).
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from okq.admin import QueueInfo
from okq.errors import (
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    ObjectNotFound,
    OkqError,
    Overloaded,
    PurgeInProgress,
    QueueExists,
    QueueInUse,
    QueueNotFound,
    StorageError,
    TaskLost,
    TooLarge,
)
from okq.leases import left_queue
from okq.model import MoveTask, QueueConfig, dead_letter_source, item_origin
from okq.movetasks import ACTIVE, cancel
from okq.publisher import NewItem
from okq.scheduler import LeasedItem
from okq.service import QueueService, Retry
from okq.sqs import messages as msg
from okq.sqs import queues as qa
from okq.sqs.errors import SqsError, invalid, invalid_value, missing, no_queue
from okq.sqs.moves import Moves
from okq.sqs.queues import SQS_NAME, Names

MAX_BATCH = 10
#: The longest a message stays invisible in all, counted from its first receive.
MAX_VISIBILITY_MS = 43_200_000
#: The shortest time between two purges of a queue.
PURGE_INTERVAL_MS = 60_000
MAX_BATCH_BYTES = 1_048_576
_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
_DEDUP_ID = re.compile(r"[!-~]{1,128}")
#: Seconds a receive or send may take the queue's settings from the manifest cache.
SETTINGS_MAX_AGE = 1.0
SYSTEM_ATTRIBUTES = ("ApproximateReceiveCount", "SentTimestamp",
                     "ApproximateFirstReceiveTimestamp", "SenderId", "AWSTraceHeader",
                     "MessageGroupId", "MessageDeduplicationId", "DeadLetterQueueSourceArn")


@dataclass
class Call:
    """One request: who asked, how its queues are named, and the service it acts on."""

    service: QueueService
    names: Names
    access_key: str | None
    stale_deletes: int = 0  # deletes answered with success although the lease was lost
    trace: str | None = None  # the request's X-Amzn-Trace-Id: a send's AWSTraceHeader
    gone: Callable[[], bool] = field(default=lambda: False)  # the client hung up


@contextmanager
def sqs_errors() -> Iterator[None]:
    """okq's errors as SQS's."""
    try:
        yield
    except (LeaseLost, PurgeInProgress):
        raise  # each action decides what these answer
    except QueueNotFound:
        raise no_queue() from None
    except Overloaded as exc:
        raise SqsError("RequestThrottled", exc.message) from None
    except (TooLarge, InvalidRequest, QueueInUse) as exc:
        raise invalid(exc.message) from None
    except InvalidToken as exc:
        raise SqsError("ReceiptHandleIsInvalid", f"The receipt handle is not valid: "
                       f"{exc.message}") from None
    except StorageError as exc:
        raise SqsError("ServiceUnavailable", exc.message) from None
    except OkqError as exc:
        raise SqsError("InternalFailure", exc.message) from None


def _int(params: dict[str, Any], name: str, low: int, high: int,
         default: int | None = None) -> int:
    value = params.get(name)
    if value is None:
        if default is None:
            raise missing(name)
        return default
    try:
        n = int(value)
        if isinstance(value, float | bool) or (isinstance(value, str) and n != float(value)):
            raise ValueError
    except (TypeError, ValueError):
        raise invalid_value(name, value, "it must be an integer") from None
    if not low <= n <= high:
        raise invalid_value(name, value, f"it must be from {low} to {high}")
    return n


def _str(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if value is None or value == "":
        raise missing(name)
    if not isinstance(value, str):
        raise invalid_value(name, value, "it must be a string")
    return value


def _names_list(params: dict[str, Any], name: str) -> list[str]:
    value = params.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid_value(name, value, "it must be a list of names")
    return value


def _page(names: list[str], params: dict[str, Any]) -> tuple[list[str], str | None]:
    """A page of sorted ``names`` after ``NextToken``, ``MaxResults`` long."""
    limit = _int(params, "MaxResults", 1, 1000) if params.get("MaxResults") is not None \
        else None
    token = params.get("NextToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(str(token).encode()).decode()
        except (ValueError, UnicodeDecodeError):
            raise invalid_value("NextToken", token, "it is not a token this API gave") from None
        names = [n for n in names if n > after]
    if limit is None:
        return names[:1000], None
    page = names[:limit]
    more = len(names) > limit
    return page, base64.urlsafe_b64encode(page[-1].encode()).decode() if more else None


class SqsApi:
    """The SQS actions. ``moves`` runs the message move tasks this node holds."""

    def __init__(self, max_item_bytes: int, moves: Moves | None = None) -> None:
        self.max_message_bytes = min(max_item_bytes, 1_048_576)
        self.moves = moves or Moves()

    def knows(self, name: str) -> bool:
        return name.isalpha() and hasattr(self, f"do_{name}")

    def action(self, name: str) -> Callable[[Call, dict[str, Any]], Awaitable[dict[str, Any]]]:
        handler = getattr(self, f"do_{name}", None) if self.knows(name) else None
        if handler is None:
            raise SqsError("InvalidAction", f"The action {name} is not valid for this endpoint.")

        async def run(call: Call, params: dict[str, Any]) -> dict[str, Any]:
            # a namespace served here is swept for move tasks whose node stopped
            self.moves.serve(call.names.namespace, call.service)
            return await handler(call, params)  # type: ignore[no-any-return]

        return run

    # -- queues --------------------------------------------------------------------------
    def queue_of(self, call: Call, params: dict[str, Any]) -> str:
        """The queue a ``QueueUrl`` names (any host: the path is /<namespace>/<queue>),
        or a bare queue name, which SQS also accepts as a QueueUrl."""
        url = _str(params, "QueueUrl")
        path = re.sub(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/]*", "", url).strip("/").split("/")
        if len(path) == 1 and path[0] and "/" not in url:
            return path[0]
        if len(path) != 2 or path[0] != call.names.namespace or not path[1]:
            raise no_queue()
        return path[1]

    async def info(self, call: Call, queue: str, max_age: float = 0) -> QueueInfo:
        with sqs_errors():
            return await call.service.queue(queue, max_age)

    async def do_CreateQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        name = qa.check_queue_name(_str(params, "QueueName"))
        attributes = params.get("Attributes") or {}
        changes = qa.changes(attributes, call.names, creating=True)
        tags = qa.tag_changes({}, params.get("tags"), None) if params.get("tags") else {}
        await self._check_redrive(call, name, changes)
        kept = {k: v for k, v in {**changes.pop("attributes", {}), **tags}.items()
                if v is not None}
        config = QueueConfig.model_validate({**changes, "attributes": kept})
        exists = False
        with sqs_errors():
            try:
                await call.service.create_queue(name, config)
            except QueueExists:
                exists = True
        if exists:
            await self._same_queue(call, name, attributes)
        return {"QueueUrl": call.names.url(name)}

    async def _same_queue(self, call: Call, name: str, attributes: dict[str, Any]) -> None:
        """An existing queue is answered with its URL if the attributes asked agree."""
        info = await self.info(call, name)
        have = qa.render(info, call.names, [a for a in attributes if a in qa.ALL], None)
        for key, value in attributes.items():
            if key in qa.FIFO_ONLY:
                continue
            if not qa.same_value(key, have.get(key, qa.KEPT.get(key, ("",))[0]), str(value)):
                raise SqsError("QueueNameExists", f"A queue already exists with the same name "
                               f"and a different value for attribute {key}")

    async def _check_redrive(self, call: Call, source: str, changes: dict[str, Any]) -> None:
        """A redrive policy's dead-letter queue must exist and allow this source."""
        dead = changes.get("dead_queue")
        if dead is None:
            return
        if dead == source:
            raise invalid("Value for parameter RedrivePolicy is invalid. Reason: a queue "
                          "cannot be its own dead-letter queue.")
        try:
            info = await self.info(call, dead)
        except SqsError:
            raise invalid("Value for parameter RedrivePolicy is invalid. Reason: Dead-letter "
                          "target does not exist.") from None
        if not qa.redrive_allowed(info, call.names.arn(source)):
            raise invalid("Value for parameter RedrivePolicy is invalid. Reason: the "
                          "dead-letter queue's RedriveAllowPolicy does not allow this queue.")

    async def do_GetQueueUrl(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        name = _str(params, "QueueName")
        owner = params.get("QueueOwnerAWSAccountId")
        if owner not in (None, "", call.names.namespace):
            raise no_queue()
        await self.info(call, name)
        return {"QueueUrl": call.names.url(name)}

    async def do_ListQueues(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        prefix = params.get("QueueNamePrefix") or ""
        if not isinstance(prefix, str):
            raise invalid_value("QueueNamePrefix", prefix, "it must be a string")
        with sqs_errors():
            names = sorted(n for n in await call.service.queue_names()
                           if n.startswith(prefix))
        page, token = _page(names, params)
        out: dict[str, Any] = {"QueueUrls": [call.names.url(n) for n in page]} if page else {}
        if token:
            out["NextToken"] = token
        return out

    async def do_DeleteQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        with sqs_errors():
            await call.service.delete_queue(queue)
        return {}

    async def do_PurgeQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        """SQS allows one purge per queue in 60 s. The last purge's time is in the
        queue's manifest and checked inside the purge's own CAS, so every node of a
        fleet refuses alike, and two purges racing through two nodes cannot both run."""
        queue = self.queue_of(call, params)
        try:
            with sqs_errors():
                await call.service.purge(queue, not_within=PURGE_INTERVAL_MS / 1000)
        except PurgeInProgress:
            raise SqsError("PurgeQueueInProgress", f"Only one PurgeQueue operation on {queue} "
                           f"is allowed every {PURGE_INTERVAL_MS // 1000} seconds.") from None
        return {}

    async def do_GetQueueAttributes(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        asked = _names_list(params, "AttributeNames")
        wanted = list(qa.ALL) if "All" in asked else list(dict.fromkeys(asked))
        unknown = [a for a in wanted if a not in qa.ALL]
        if unknown:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {unknown[0]}.")
        info = await self.info(call, queue)
        counts = None
        if any(a in qa.COUNTS for a in wanted):
            with sqs_errors():
                st = await call.service.stats(queue)
            counts = {"ApproximateNumberOfMessages": st.available,
                      "ApproximateNumberOfMessagesNotVisible": st.in_flight,
                      "ApproximateNumberOfMessagesDelayed": st.scheduled + st.waiting_retry}
        attributes = qa.render(info, call.names, wanted, counts)
        return {"Attributes": attributes} if attributes else {}

    async def do_SetQueueAttributes(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        attributes = params.get("Attributes")
        if not attributes:
            raise missing("Attributes")
        changes = qa.changes(attributes, call.names, creating=False)
        await self.info(call, queue)
        await self._check_redrive(call, queue, changes)
        changes.setdefault("attributes", {})["LastModifiedTimestamp"] = str(int(time.time()))
        with sqs_errors():
            await call.service.update_queue(queue, **changes)
        return {}

    async def do_ListDeadLetterSourceQueues(self, call: Call,
                                            params: dict[str, Any]) -> dict[str, Any]:
        dead = self.queue_of(call, params)
        await self.info(call, dead)
        with sqs_errors():
            sources = sorted(i.name for i in await call.service.queues()
                             if i.config.dead_queue == dead)
        page, token = _page(sources, params)
        out: dict[str, Any] = {"queueUrls": [call.names.url(n) for n in page]}
        if token:
            out["NextToken"] = token
        return out

    async def do_TagQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        return await self._retag(call, params, "Tags")

    async def do_UntagQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        return await self._retag(call, params, "TagKeys")

    async def _retag(self, call: Call, params: dict[str, Any], member: str) -> dict[str, Any]:
        """Add ``Tags`` or remove ``TagKeys``: one change of the queue's attributes."""
        queue = self.queue_of(call, params)
        if not params.get(member):
            raise missing(member)
        info = await self.info(call, queue)
        add, remove = (params[member], None) if member == "Tags" else (None, params[member])
        changes = qa.tag_changes(qa.tags(info), add, remove)
        with sqs_errors():
            await call.service.update_queue(queue, attributes=changes)
        return {}

    async def do_ListQueueTags(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        info = await self.info(call, self.queue_of(call, params))
        tags = qa.tags(info)
        return {"Tags": tags} if tags else {}

    async def do_AddPermission(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        raise SqsError("UnsupportedOperation", "okq keeps no SQS access policies: an access "
                       "key acts in its own namespace (docs/SQS.md)")

    do_RemovePermission = do_AddPermission

    # -- messages -----------------------------------------------------------------------
    async def do_SendMessage(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        info = await self.info(call, queue, SETTINGS_MAX_AGE)
        item, reply, _ = self._new_item(call, info, params)
        with sqs_errors():
            ids = await call.service.produce(queue, [item])
        return {**reply, "MessageId": msg.message_id(ids[0])}

    async def do_SendMessageBatch(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        entries = _entries(params, "SendMessageBatchRequestEntry")
        info = await self.info(call, queue, SETTINGS_MAX_AGE)
        items: list[NewItem] = []
        replies: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        size = 0
        for entry in entries:
            try:
                item, reply, item_size = self._new_item(call, info, entry)
            except SqsError as err:
                failed.append(_failure(entry["Id"], err))
                continue
            size += item_size
            items.append(item)
            replies.append({"Id": entry["Id"], **reply})
        if size > MAX_BATCH_BYTES:
            raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than "
                           f"{MAX_BATCH_BYTES} bytes. You have sent {size} bytes.")
        if items:
            with sqs_errors():
                ids = await call.service.produce(queue, items)
            for reply, item_id in zip(replies, ids, strict=True):
                reply["MessageId"] = msg.message_id(item_id)
        return {"Successful": replies, "Failed": failed}

    def _new_item(self, call: Call, info: QueueInfo,
                  params: dict[str, Any]) -> tuple[NewItem, dict[str, Any], int]:
        """The item a send produces, its reply without the MessageId, and its size as
        SQS counts it (body and message attributes)."""
        kept = info.config.attributes
        limit = min(int(kept.get("MaximumMessageSize", self.max_message_bytes)),
                    self.max_message_bytes)
        body = msg.check_body(params.get("MessageBody"), limit)
        attributes = msg.parse_attributes(params.get("MessageAttributes"))
        system = msg.parse_attributes(params.get("MessageSystemAttributes"), system=True)
        size = len(body.encode()) + sum(a.size(n) for n, a in attributes.items())
        if size > limit:
            raise invalid(f"One or more parameters are invalid. Reason: Message must be "
                          f"shorter than {limit} bytes.")
        delay = _int(params, "DelaySeconds", 0, 900, int(kept.get("DelaySeconds", "0")))
        meta: dict[str, Any] = {}
        if call.access_key:
            meta["sender"] = call.access_key
        if attributes:
            meta["attrs"] = {k: a.keep() for k, a in attributes.items()}
        if system or call.trace:  # the message's own AWSTraceHeader wins over the header
            meta["trace"] = system["AWSTraceHeader"].value if system else call.trace
        key = None
        for param, short in (("MessageGroupId", "group"), ("MessageDeduplicationId", "dedup")):
            value = params.get(param)
            if value is not None:
                if not isinstance(value, str) or not _DEDUP_ID.fullmatch(value):
                    raise invalid_value(param, value, "1 to 128 printable ASCII characters")
                meta[short] = value
        key = meta.get("dedup")
        enqueue_at = call.service.now_ms() + delay * 1000 if delay else None
        item = NewItem(body.encode(), enqueue_at, key, {msg.META_KEY: meta} if meta else None)
        reply: dict[str, Any] = {"MD5OfMessageBody": msg.md5_of_body(body)}
        if attributes:
            reply["MD5OfMessageAttributes"] = msg.md5_of_attributes(attributes)
        if system:
            reply["MD5OfMessageSystemAttributes"] = msg.md5_of_attributes(system)
        return item, reply, size

    async def do_ReceiveMessage(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        info = await self.info(call, queue, SETTINGS_MAX_AGE)
        count = _int(params, "MaxNumberOfMessages", 1, MAX_BATCH, 1)
        default_wait = int(info.config.attributes.get("ReceiveMessageWaitTimeSeconds", "0"))
        wait = _int(params, "WaitTimeSeconds", 0, 20, default_wait)
        visibility = _int(params, "VisibilityTimeout", 0, 43_200, -1)
        system = _names_list(params, "AttributeNames") + \
            _names_list(params, "MessageSystemAttributeNames")
        wanted = _names_list(params, "MessageAttributeNames")
        with sqs_errors():
            items = await call.service.lease(
                queue, count, lease_timeout=None if visibility < 0 else visibility,
                wait=wait)
        if items and call.gone():
            await call.service.give_back(queue, items)
            items = []
        messages = [self._message(call, i, system, wanted) for i in items]
        return {"Messages": messages} if messages else {}

    def _message(self, call: Call, item: LeasedItem, system: list[str],
                 wanted: list[str]) -> dict[str, Any]:
        body = item.payload.decode("utf-8", "replace")
        kept = msg.stored(item.meta)
        origin = item_origin(item.meta)  # a moved message keeps its first id
        out: dict[str, Any] = {"MessageId": msg.message_id(origin[0] if origin else item.id),
                               "ReceiptHandle": item.token,
                               "MD5OfBody": msg.md5_of_body(body), "Body": body}
        attributes = self._system_attributes(call, item, kept, system)
        if attributes:
            out["Attributes"] = attributes
        chosen = msg.select(msg.stored_attributes(kept), wanted)
        if chosen:
            out["MD5OfMessageAttributes"] = msg.md5_of_attributes(chosen)
            out["MessageAttributes"] = {k: a.reply() for k, a in chosen.items()}
        return out

    def _system_attributes(self, call: Call, item: LeasedItem, kept: dict[str, Any],
                           names: list[str]) -> dict[str, str]:
        if not names:
            return {}
        every = "All" in names
        first = item.first_leased_ms or item.lease_deadline_ms
        source = dead_letter_source(item.meta)
        origin = item_origin(item.meta)
        known = {
            "ApproximateReceiveCount": str(item.attempts),
            "SentTimestamp": str(origin[1] if origin else item.produced_ms),
            "ApproximateFirstReceiveTimestamp": str(first),
            "SenderId": kept.get("sender"),
            "AWSTraceHeader": kept.get("trace"),
            "MessageGroupId": kept.get("group"),
            "MessageDeduplicationId": kept.get("dedup"),
            "DeadLetterQueueSourceArn": call.names.arn(source) if source else None,
        }
        return {k: str(v) for k, v in known.items()
                if v is not None and (every or k in names)}

    async def do_DeleteMessage(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        handle = _str(params, "ReceiptHandle")
        self._check_handle(call, queue, handle)
        await self._delete(call, queue, [handle])
        return {}

    def _check_handle(self, call: Call, queue: str, handle: str) -> None:
        try:
            call.service.check_tokens([handle], queue, "ReceiptHandle")
        except (InvalidToken, InvalidRequest):
            raise SqsError("ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is '
                           "not a valid receipt handle.") from None

    async def _delete(self, call: Call, queue: str, handles: list[str]) -> None:
        unique = list(dict.fromkeys(handles))
        try:
            with sqs_errors():
                await call.service.complete(queue, unique)
        except SqsError:
            raise
        except LeaseLost as exc:  # stale handles: success, without deleting (see above)
            call.stale_deletes += len(exc.details.get("failed", [])) or 1

    async def do_DeleteMessageBatch(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        entries = _entries(params, "DeleteMessageBatchRequestEntry")
        good, failed = self._handles(call, queue, entries)
        if good:
            await self._delete(call, queue, [e["ReceiptHandle"] for e in good])
        return {"Successful": [{"Id": e["Id"]} for e in good], "Failed": failed}

    def _handles(self, call: Call, queue: str, entries: list[dict[str, Any]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        good, failed = [], []
        for entry in entries:
            try:
                self._check_handle(call, queue, _str(entry, "ReceiptHandle"))
                good.append(entry)
            except SqsError as err:
                failed.append(_failure(entry["Id"], err))
        return good, failed

    async def do_ChangeMessageVisibility(self, call: Call,
                                         params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        handle = _str(params, "ReceiptHandle")
        timeout = _int(params, "VisibilityTimeout", 0, 43_200)
        self._check_handle(call, queue, handle)
        await self._change_visibility(call, queue, handle, timeout)
        return {}

    async def _change_visibility(self, call: Call, queue: str, handle: str, timeout: int) -> None:
        try:
            with sqs_errors():
                if timeout == 0:
                    outcome = await call.service.retry(queue, [Retry(handle)])
                    if outcome.failed:
                        raise LeaseLost(outcome.failed[0]["reason"],
                                        state=outcome.failed[0].get("state", ""))
                else:
                    await self._check_total_visibility(call, queue, handle, timeout)
                    await call.service.renew(queue, handle, float(timeout))
        except LeaseLost as exc:
            if left_queue(str(exc.details.get("state", ""))):
                raise invalid_value("ReceiptHandle", handle, "Message does not exist or is "
                                    "not available for visibility timeout change.") from None
            raise SqsError("MessageNotInflight", "The message referred to is not in flight: "
                           "its visibility timeout expired and it was received again, or it "
                           "was released.") from None

    async def _check_total_visibility(self, call: Call, queue: str, handle: str,
                                      timeout: int) -> None:
        """SQS's cap: a message is invisible for at most 12 hours in all since its first
        receive, so a change may reach no further than that from the first receive."""
        first = await call.service.first_leased(queue, handle)
        if first is None:
            return  # not current: the change itself answers why
        if call.service.now_ms() + timeout * 1000 > first + MAX_VISIBILITY_MS:
            raise invalid_value("VisibilityTimeout", timeout, "Total VisibilityTimeout for "
                                f"the message is beyond the limit [{MAX_VISIBILITY_MS // 1000} "
                                "seconds]")

    async def do_ChangeMessageVisibilityBatch(self, call: Call,
                                              params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        entries = _entries(params, "ChangeMessageVisibilityBatchRequestEntry")
        good, failed = self._handles(call, queue, entries)
        done = []
        for entry in good:
            try:
                timeout = _int(entry, "VisibilityTimeout", 0, 43_200)
                await self._change_visibility(call, queue, entry["ReceiptHandle"], timeout)
                done.append({"Id": entry["Id"]})
            except SqsError as err:
                failed.append(_failure(entry["Id"], err))
        return {"Successful": done, "Failed": failed}

    # -- moving dead letters (the tasks live in the bucket: okq/sqs/moves.py) -------------
    async def do_StartMessageMoveTask(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        source_arn = _str(params, "SourceArn")
        dead = call.names.queue_of_arn(source_arn, "SourceArn")
        await self.info(call, dead)
        with sqs_errors():
            if not any(i.config.dead_queue == dead for i in await call.service.queues()):
                raise invalid("Source queue must be configured as a Dead Letter Queue.")
        destination = params.get("DestinationArn")
        target = call.names.queue_of_arn(destination, "DestinationArn") \
            if destination else None
        if target is not None:
            await self.info(call, target)
        rate = _int(params, "MaxNumberOfMessagesPerSecond", 1, 500, 0) \
            if params.get("MaxNumberOfMessagesPerSecond") is not None else None
        with sqs_errors():
            tasks = await self._tasks(call, dead)
            if tasks and tasks[0].status in ACTIVE:
                raise _task_running()
            to_move = (await call.service.stats(dead)).available
            now = call.service.now_ms()
            task = MoveTask(dead, tasks[0].seq + 1 if tasks else 1, source_arn, destination,
                            target, rate, to_move, started_ms=now, owner=self.moves.owner,
                            beat_ms=now + self.moves.ttl_ms, hold_ms=self.moves.hold_ms(now))
            if not await call.service.move_tasks.create(task):
                raise _task_running()  # another node started one at the same moment
        self.moves.start(call.names.namespace, call.service, task)
        return {"TaskHandle": _handle(task)}

    async def _tasks(self, call: Call, dead: str) -> list[MoveTask]:
        """A queue's tasks, newest first; the newest resumed here if its node stopped."""
        tasks = await call.service.move_tasks.of_queue(dead)
        if tasks:
            await self.moves.resume(call.names.namespace, call.service, tasks[0])
        return tasks

    async def do_ListMessageMoveTasks(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        source_arn = _str(params, "SourceArn")
        dead = call.names.queue_of_arn(source_arn, "SourceArn")
        limit = _int(params, "MaxResults", 1, 10, 1)
        with sqs_errors():
            tasks = await self._tasks(call, dead)
        return {"Results": [_describe(t) for t in tasks[:limit]]}

    async def do_CancelMessageMoveTask(self, call: Call,
                                       params: dict[str, Any]) -> dict[str, Any]:
        handle = _str(params, "TaskHandle")
        found = _task_of_handle(handle)
        missing_task = SqsError("ResourceNotFoundException", "The resource that you "
                                "specified for the TaskHandle parameter doesn't exist.")
        if found is None:
            raise missing_task
        with sqs_errors():
            try:
                task = await call.service.move_tasks.update(*found, cancel,
                                                            call.service.now_ms)
            except ObjectNotFound:
                raise missing_task from None
            except TaskLost as exc:
                raise SqsError("UnsupportedOperation", exc.message) from None
        return {"ApproximateNumberOfMessagesMoved": task.moved}

    async def close(self) -> None:
        await self.moves.close()


def _task_running() -> SqsError:
    return invalid("There is already a task running. Only one active task is allowed for "
                   "each source queue arn at a given time.")


def _handle(task: MoveTask) -> str:
    """A task's handle: its queue and number (bound to the namespace it is read in)."""
    raw = json.dumps({"q": task.dead, "n": task.seq}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _task_of_handle(handle: str) -> tuple[str, int] | None:
    try:
        raw = json.loads(base64.urlsafe_b64decode(handle.encode()))
        dead, seq = raw["q"], raw["n"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return None
    if not isinstance(dead, str) or not SQS_NAME.fullmatch(dead) or type(seq) is not int \
            or not 0 < seq < 10**10:
        return None
    return dead, seq


def _describe(t: MoveTask) -> dict[str, Any]:
    out: dict[str, Any] = {"TaskHandle": _handle(t), "Status": t.status,
                           "SourceArn": t.source_arn,
                           "ApproximateNumberOfMessagesMoved": t.moved,
                           "ApproximateNumberOfMessagesToMove": t.to_move,
                           "StartedTimestamp": t.started_ms}
    if t.destination_arn:
        out["DestinationArn"] = t.destination_arn
    if t.rate:
        out["MaxNumberOfMessagesPerSecond"] = t.rate
    if t.failure:
        out["FailureReason"] = t.failure
    return out


def _entries(params: dict[str, Any], what: str) -> list[dict[str, Any]]:
    """A batch's entries, checked as SQS checks them before acting on any."""
    entries = params.get("Entries")
    if not entries:
        raise SqsError("EmptyBatchRequest", f"There should be at least one {what} in the "
                       "request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid("Entries must be a list of entries")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest", f"Maximum number of entries per "
                       f"request are {MAX_BATCH}. You have sent {len(entries)}.")
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry.get("Id")
        if not isinstance(entry_id, str) or not _ENTRY_ID.fullmatch(entry_id):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain "
                           "alphanumeric characters, hyphens and underscores. It can be at "
                           "most 80 letters long.")
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def _failure(entry_id: str, err: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": err.sender_fault, "Code": err.code,
            "Message": err.message}
