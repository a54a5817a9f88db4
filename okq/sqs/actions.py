"""The SQS actions, each over okq's queue service (``okq.service.QueueService``) as
the request's key: the messages' here, the queues' in ``okq.sqs.queue_actions``,
the move tasks' in ``okq.sqs.move_actions``, what they share in ``okq.sqs.params``.

Every action takes its parameters in the JSON protocol's shape and returns its
reply in that shape (``okq.sqs.protocol`` turns both into the query protocol's when
a client speaks it). okq's errors become SQS's in one place,
:func:`okq.sqs.params.as_sqs`.

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

import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

from okq.admin import QueueInfo
from okq.errors import InvalidRequest, InvalidToken, LeaseLost
from okq.keys import split_partition
from okq.leases import LeasedItem, left_queue
from okq.limits import PARTITIONS_MAX
from okq.model import dead_letter_source, group_of, item_origin, with_group
from okq.publisher import NewItem, Produced
from okq.service import Retry
from okq.sqs import messages as msg
from okq.sqs import queues as qa
from okq.sqs.errors import SqsError, invalid, invalid_value, missing
from okq.sqs.move_actions import MoveActions
from okq.sqs.moves import Moves
from okq.sqs.params import (
    MAX_BATCH,
    MAX_BATCH_BYTES,
    MAX_VISIBILITY_MS,
    SETTINGS_MAX_AGE,
    Call,
    as_sqs,
    batch_entries,
    failure,
    int_param,
    names_param,
    sqs_errors,
    str_param,
)

__all__ = ["Call", "SqsApi", "as_sqs"]

_DEDUP_ID = re.compile(r"[!-~]{1,128}")


class SqsApi(MoveActions):
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
            self.moves.serve(call.names.namespace, call.service.background())
            return await handler(call, params)  # type: ignore[no-any-return]

        return run

    # -- messages -----------------------------------------------------------------------
    async def do_SendMessage(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        info = await self.info(call, queue, SETTINGS_MAX_AGE)
        item, reply, _ = self._new_item(call, info, params)
        with sqs_errors():
            ids = await call.service.produce(queue, [item])
        reply["MessageId"] = msg.message_id(ids[0])
        if info.config.fifo:
            _add_sequence_number(reply, ids, 0)
        return reply

    async def do_SendMessageBatch(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        entries = batch_entries(params, "SendMessageBatchRequestEntry")
        info = await self.info(call, queue, SETTINGS_MAX_AGE)
        items: list[NewItem] = []
        replies: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        size = 0
        for entry in entries:
            try:
                item, reply, item_size = self._new_item(call, info, entry)
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
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
            for n, (reply, item_id) in enumerate(zip(replies, ids, strict=True)):
                reply["MessageId"] = msg.message_id(item_id)
                if info.config.fifo:
                    _add_sequence_number(reply, ids, n)
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
        fifo = info.config.fifo
        if fifo and params.get("DelaySeconds") is not None:
            raise invalid_value("DelaySeconds", params["DelaySeconds"], "The request include "
                                "parameter that is not valid for this queue type.")
        delay = int_param(params, "DelaySeconds", 0, 900, int(kept.get("DelaySeconds", "0")))
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
        group = meta.get("group")
        key = meta.get("dedup")
        if fifo:
            key = self._fifo_key(info, group, key, body)
        enqueue_at = call.service.now_ms() + delay * 1000 if delay else None
        item = NewItem(body.encode(), enqueue_at, key,
                       with_group({msg.META_KEY: meta} if meta else None, group))
        reply: dict[str, Any] = {"MD5OfMessageBody": msg.md5_of_body(body)}
        if attributes:
            reply["MD5OfMessageAttributes"] = msg.md5_of_attributes(attributes)
        if system:
            reply["MD5OfMessageSystemAttributes"] = msg.md5_of_attributes(system)
        return item, reply, size

    @staticmethod
    def _fifo_key(info: QueueInfo, group: str | None, dedup: str | None, body: str) -> str:
        """A FIFO send's idempotency key: its deduplication id, or its body's SHA-256
        with ContentBasedDeduplication, within its message group when the queue's
        DeduplicationScope is messageGroup. okq keeps a key for the SQS window of 5
        minutes (``--idem-window``), so a send repeated within it adds nothing."""
        if group is None:
            raise missing("MessageGroupId")
        if dedup is None:
            if qa.fifo_setting(info, "ContentBasedDeduplication") != "true":
                raise invalid("The queue should either have ContentBasedDeduplication "
                              "enabled or MessageDeduplicationId provided explicitly")
            dedup = hashlib.sha256(body.encode()).hexdigest()
        if qa.fifo_setting(info, "DeduplicationScope") == "messageGroup":
            return f"{group}\x00{dedup}"
        return dedup

    async def do_ReceiveMessage(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        info = await self.info(call, queue, SETTINGS_MAX_AGE)
        count = int_param(params, "MaxNumberOfMessages", 1, MAX_BATCH, 1)
        default_wait = int(info.config.attributes.get("ReceiveMessageWaitTimeSeconds", "0"))
        wait = int_param(params, "WaitTimeSeconds", 0, 20, default_wait)
        visibility = int_param(params, "VisibilityTimeout", 0, 43_200, -1)
        system = names_param(params, "AttributeNames") + \
            names_param(params, "MessageSystemAttributeNames")
        wanted = names_param(params, "MessageAttributeNames")
        with sqs_errors():
            items = await call.service.lease(
                queue, count, lease_timeout=None if visibility < 0 else visibility,
                wait=wait)
        fifo = info.config.fifo
        messages = [self._message(call, i, system, wanted, fifo) for i in items]
        return {"Messages": messages} if messages else {}

    def _message(self, call: Call, item: LeasedItem, system: list[str],
                 wanted: list[str], fifo: bool) -> dict[str, Any]:
        body = item.payload.decode("utf-8", "replace")
        kept = msg.stored(item.meta)
        origin = item_origin(item.meta)  # a moved message keeps its first id
        out: dict[str, Any] = {"MessageId": msg.message_id(origin[0] if origin else item.id),
                               "ReceiptHandle": item.token,
                               "MD5OfBody": msg.md5_of_body(body), "Body": body}
        attributes = self._system_attributes(call, item, kept, system, fifo)
        if attributes:
            out["Attributes"] = attributes
        chosen = msg.select(msg.message_attributes(item.meta), wanted)
        if chosen:
            out["MD5OfMessageAttributes"] = msg.md5_of_attributes(chosen)
            out["MessageAttributes"] = {k: a.reply() for k, a in chosen.items()}
        return out

    def _system_attributes(self, call: Call, item: LeasedItem, kept: dict[str, Any],
                           names: list[str], fifo: bool) -> dict[str, str]:
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
            "MessageGroupId": kept.get("group") or group_of(item.meta),
            "MessageDeduplicationId": kept.get("dedup"),
            "SequenceNumber": _sequence_number(item) if fifo else None,  # FIFO queues' only
            "DeadLetterQueueSourceArn": call.names.arn(source) if source else None,
        }
        return {k: str(v) for k, v in known.items()
                if v is not None and (every or k in names)}

    async def do_DeleteMessage(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        handle = str_param(params, "ReceiptHandle")
        await self._check_handle(call, queue, handle)
        await self._delete(call, queue, [handle])
        return {}

    async def _check_handle(self, call: Call, queue: str, handle: str) -> None:
        try:
            await call.service.check_tokens([handle], queue, "ReceiptHandle")
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
        entries = batch_entries(params, "DeleteMessageBatchRequestEntry")
        good, failed = await self._handles(call, queue, entries)
        if good:
            await self._delete(call, queue, [e["ReceiptHandle"] for e in good])
        return {"Successful": [{"Id": e["Id"]} for e in good], "Failed": failed}

    async def _handles(self, call: Call, queue: str, entries: list[dict[str, Any]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        good, failed = [], []
        for entry in entries:
            try:
                await self._check_handle(call, queue, str_param(entry, "ReceiptHandle"))
                good.append(entry)
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        return good, failed

    async def do_ChangeMessageVisibility(self, call: Call,
                                         params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        handle = str_param(params, "ReceiptHandle")
        timeout = int_param(params, "VisibilityTimeout", 0, 43_200)
        await self._check_handle(call, queue, handle)
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
        entries = batch_entries(params, "ChangeMessageVisibilityBatchRequestEntry")
        good, failed = await self._handles(call, queue, entries)
        done = []
        for entry in good:
            try:
                timeout = int_param(entry, "VisibilityTimeout", 0, 43_200)
                await self._change_visibility(call, queue, entry["ReceiptHandle"], timeout)
                done.append({"Id": entry["Id"]})
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        return {"Successful": done, "Failed": failed}

    async def close(self) -> None:
        await self.moves.close()


def _sequence_number(item: LeasedItem) -> str | None:
    """A message's SequenceNumber: its sequence number in its partition, made unique
    across the queue's partitions (at most PARTITIONS_MAX), 20 digits as SQS shows
    it; it grows within a message group, whose items share a partition."""
    if item.seq is None:
        return None
    return _sequence_text(split_partition(item.queue)[1], item.seq)


def _sequence_text(partition: int, seq: int) -> str:
    return f"{seq * PARTITIONS_MAX + partition:020d}"


def _add_sequence_number(reply: dict[str, Any], ids: list[str], n: int) -> None:
    """A FIFO send's reply gets the SequenceNumber its message is received with (none
    when the node does not know it: a duplicate whose segment was merged since)."""
    place = ids.sequence[n] if isinstance(ids, Produced) and ids.sequence else None
    if place is not None:
        reply["SequenceNumber"] = _sequence_text(*place)
