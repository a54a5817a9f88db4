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
- ``ChangeMessageVisibility`` on a lease no longer held is ``MessageNotInflight``;
  to 0 it releases the message at once (its receive still counts, as in SQS).
"""

from __future__ import annotations

import asyncio
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
    OkqError,
    Overloaded,
    QueueExists,
    QueueInUse,
    QueueNotFound,
    StorageError,
    TooLarge,
)
from okq.model import QueueConfig, dead_letter_source, item_origin, redriven_meta
from okq.publisher import NewItem
from okq.scheduler import LeasedItem
from okq.service import QueueService, Retry
from okq.sqs import messages as msg
from okq.sqs import queues as qa
from okq.sqs.errors import SqsError, invalid, invalid_value, missing, no_queue
from okq.sqs.queues import Names

MAX_BATCH = 10
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
    except LeaseLost:
        raise  # each action decides what a lost lease answers
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
    """The SQS actions. ``redrives`` are this node's message move tasks."""

    def __init__(self, max_item_bytes: int) -> None:
        self.max_message_bytes = min(max_item_bytes, 1_048_576)
        self.moves: dict[str, MoveTask] = {}

    def knows(self, name: str) -> bool:
        return name.isalpha() and hasattr(self, f"do_{name}")

    def action(self, name: str) -> Callable[[Call, dict[str, Any]], Awaitable[dict[str, Any]]]:
        handler = getattr(self, f"do_{name}", None) if self.knows(name) else None
        if handler is None:
            raise SqsError("InvalidAction", f"The action {name} is not valid for this endpoint.")
        return handler  # type: ignore[no-any-return]

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
            names = sorted(n for n in await call.service.engine.list_queues()
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
        queue = self.queue_of(call, params)
        with sqs_errors():
            await call.service.purge(queue)
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
        enqueue_at = call.service.engine.clock.now_ms() + delay * 1000 if delay else None
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
                queue, count, lease_timeout=None if visibility < 0 else max(0.1, visibility),
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
            call.service.engine.check_tokens([handle], queue, "ReceiptHandle")
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
                    outcome.raise_if_failed()
                else:
                    await call.service.renew(queue, handle, float(timeout))
        except LeaseLost:
            raise SqsError("MessageNotInflight", "The message referred to is not in flight: "
                           "its visibility timeout expired and it was received again, or it "
                           "was deleted.") from None

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

    # -- moving dead letters -------------------------------------------------------------
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
        if any(t.source_arn == source_arn and t.status == "RUNNING" for t in self.moves.values()):
            raise invalid("There is already a task running. Only one active task is allowed "
                          "for each source queue arn at a given time.")
        with sqs_errors():
            to_move = (await call.service.stats(dead)).available
        task = MoveTask(call.service, dead, source_arn, target, destination, rate, to_move)
        self.moves[task.handle] = task
        task.start()
        return {"TaskHandle": task.handle}

    async def do_ListMessageMoveTasks(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        source_arn = _str(params, "SourceArn")
        call.names.queue_of_arn(source_arn, "SourceArn")
        limit = _int(params, "MaxResults", 1, 10, 1)
        tasks = sorted((t for t in self.moves.values() if t.source_arn == source_arn),
                       key=lambda t: -t.started_ms)[:limit]
        return {"Results": [t.describe() for t in tasks]}

    async def do_CancelMessageMoveTask(self, call: Call,
                                       params: dict[str, Any]) -> dict[str, Any]:
        handle = _str(params, "TaskHandle")
        task = self.moves.get(handle)
        if task is None:
            raise SqsError("ResourceNotFoundException", "The resource that you specified for "
                           "the TaskHandle parameter doesn't exist.")
        if task.status != "RUNNING":
            raise SqsError("UnsupportedOperation", f"The task is {task.status}, not RUNNING")
        task.cancel()
        return {"ApproximateNumberOfMessagesMoved": task.moved}

    async def close(self) -> None:
        for task in self.moves.values():
            task.cancel()
        await asyncio.gather(*(t.task for t in self.moves.values() if t.task),
                             return_exceptions=True)


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


class MoveTask:
    """A message move task: dead letters back to their source queues (okq's redrive),
    or, with a destination, each moved there in the step that deletes it from the
    dead-letter queue (complete-and-produce). Lives in the node that started it."""

    def __init__(self, service: QueueService, dead: str, source_arn: str, target: str | None,
                 destination_arn: str | None, rate: int | None, to_move: int) -> None:
        self.service = service
        self.dead = dead
        self.source_arn = source_arn
        self.target = target
        self.destination_arn = destination_arn
        self.rate = rate
        self.to_move = to_move
        self.moved = 0
        self.status = "RUNNING"
        self.failure: str | None = None
        self.started_ms = int(time.time() * 1000)
        raw = json.dumps({"task": f"{self.started_ms}-{id(self):x}", "source": source_arn})
        self.handle = base64.urlsafe_b64encode(raw.encode()).decode()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.status = "CANCELLING"
            self.task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                batch = min(self.rate or 100, 100)
                began = time.monotonic()
                n = await (self._move_to_target(batch) if self.target else
                           self.service.redrive(self.dead, batch))
                self.moved += n
                if n == 0:
                    break
                if self.rate:
                    await asyncio.sleep(max(0.0, n / self.rate - (time.monotonic() - began)))
            self.status = "COMPLETED"
        except asyncio.CancelledError:
            self.status = "CANCELLED"
        except OkqError as exc:
            self.status, self.failure = "FAILED", exc.message

    async def _move_to_target(self, batch: int) -> int:
        assert self.target is not None
        items = await self.service.lease(self.dead, batch, lease_timeout=60)
        for item in items:
            meta = redriven_meta(item.meta, self.dead, item.id)
            await self.service.engine.complete_and_produce(
                item.token, self.target, [NewItem(item.payload, None, None, meta)],
                queue=self.dead)
        return len(items)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"TaskHandle": self.handle, "Status": self.status,
                               "SourceArn": self.source_arn,
                               "ApproximateNumberOfMessagesMoved": self.moved,
                               "ApproximateNumberOfMessagesToMove": self.to_move,
                               "StartedTimestamp": self.started_ms}
        if self.destination_arn:
            out["DestinationArn"] = self.destination_arn
        if self.rate:
            out["MaxNumberOfMessagesPerSecond"] = self.rate
        if self.failure:
            out["FailureReason"] = self.failure
        return out
