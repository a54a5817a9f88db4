"""Queue attributes as SQS names them, and where each lives in okq.

Four map onto the queue's own settings (``VisibilityTimeout`` -> ``lease_timeout``,
``MessageRetentionPeriod`` -> ``retention``, ``RedrivePolicy`` -> ``dead_queue`` and
``max_attempts``); the rest that okq acts on (``DelaySeconds``,
``ReceiveMessageWaitTimeSeconds``, ``MaximumMessageSize``, ``RedriveAllowPolicy``)
and those it keeps without acting (``Policy``, the encryption settings) are kept in
the queue's ``attributes``, as are tags (``tag:`` + key). Counts come from the
queue's stats.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from okq.admin import QueueInfo
from okq.sqs.errors import SqsError, invalid_value

#: What the queue's own settings hold; set through ``changes`` of update_queue.
OWN = ("VisibilityTimeout", "MessageRetentionPeriod", "RedrivePolicy")
#: Kept in ``attributes``, with their defaults and ranges (None: free text).
KEPT: dict[str, tuple[str, tuple[int, int] | None]] = {
    "DelaySeconds": ("0", (0, 900)),
    "ReceiveMessageWaitTimeSeconds": ("0", (0, 20)),
    "MaximumMessageSize": ("1048576", (1024, 1_048_576)),
    "RedriveAllowPolicy": ("", None),
    "Policy": ("", None),
    "SqsManagedSseEnabled": ("false", None),
    "KmsMasterKeyId": ("", None),
    "KmsDataKeyReusePeriodSeconds": ("", (60, 86_400)),
}
COUNTS = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
          "ApproximateNumberOfMessagesDelayed")
READ_ONLY = ("QueueArn", "CreatedTimestamp", "LastModifiedTimestamp", *COUNTS)
FIFO_ONLY = ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
             "FifoThroughputLimit")
#: A FIFO queue's own attributes kept in ``attributes``: their defaults and values.
FIFO_KEPT: dict[str, tuple[str, tuple[str, ...]]] = {
    "ContentBasedDeduplication": ("false", ("true", "false")),
    "DeduplicationScope": ("queue", ("queue", "messageGroup")),
    "FifoThroughputLimit": ("perQueue", ("perQueue", "perMessageGroupId")),
}
ALL = (*READ_ONLY, *OWN, *KEPT, *FIFO_ONLY)
FIFO_SUFFIX = ".fifo"
TAG = "tag:"
MAX_TAGS = 50
SQS_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ARN = re.compile(r"arn:aws:sqs:([a-z0-9-]+):([^:]+):([^:]+)")


@dataclass(frozen=True)
class Names:
    """How queues are named to SQS clients: URLs and ARNs of a namespace."""

    base_url: str
    region: str
    namespace: str

    def url(self, queue: str) -> str:
        return f"{self.base_url}/{self.namespace}/{queue}"

    def arn(self, queue: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.namespace}:{queue}"

    def queue_of_arn(self, arn: Any, param: str) -> str:
        """The queue an ARN of this namespace names; InvalidParameterValue otherwise."""
        m = _ARN.fullmatch(arn) if isinstance(arn, str) else None
        if m is None or m[2] != self.namespace:
            raise invalid_value(param, arn, f"it must be the ARN of a queue of this account "
                                f"({self.arn('<queue>')})")
        return m[3]


def check_queue_name(name: Any, fifo: bool = False) -> str:
    """A name SQS accepts for a new queue: a FIFO queue's ends with ``.fifo``, and only
    a FIFO queue's does."""
    if fifo:
        if not (isinstance(name, str) and name.endswith(FIFO_SUFFIX) and len(name) <= 80
                and SQS_NAME.fullmatch(name.removesuffix(FIFO_SUFFIX))):
            raise SqsError("InvalidParameterValue",
                           "The name of a FIFO queue can only include alphanumeric "
                           "characters, hyphens, or underscores, must end with .fifo suffix "
                           "and be 1 to 80 in length.")
        return name
    if isinstance(name, str) and name.endswith(FIFO_SUFFIX):
        raise SqsError("InvalidParameterValue", "A queue whose name ends with .fifo is a FIFO "
                       "queue: set its FifoQueue attribute to true.")
    if not isinstance(name, str) or not SQS_NAME.fullmatch(name):
        raise SqsError("InvalidParameterValue",
                       "Can only include alphanumeric characters, hyphens, or underscores. "
                       "1 to 80 in length")
    return name


def _fifo_value(info: QueueInfo, name: str) -> str:
    return "true" if name == "FifoQueue" else fifo_setting(info, name)


def fifo_setting(info: QueueInfo, name: str) -> str:
    """A FIFO queue's attribute ``name`` (of FIFO_KEPT), its default when not set."""
    return info.config.attributes.get(name, FIFO_KEPT[name][0])


def render(info: QueueInfo, names: Names, wanted: list[str],
           counts: dict[str, int] | None) -> dict[str, str]:
    """The attributes ``wanted`` (names of :data:`ALL`) of a queue."""
    cfg, kept = info.config, info.config.attributes
    out: dict[str, str] = {}
    for name in wanted:
        if name in FIFO_ONLY:
            if cfg.fifo:  # a standard queue has none of them
                out[name] = _fifo_value(info, name)
        elif name in COUNTS:
            out[name] = str((counts or {}).get(name, 0))
        elif name in READ_ONLY or name in OWN:
            value = _own(info, names, name)
            if value is not None:
                out[name] = value
        elif kept.get(name, KEPT[name][0]):
            out[name] = kept.get(name, KEPT[name][0])
    return out


def _own(info: QueueInfo, names: Names, name: str) -> str | None:
    """An attribute the queue's own settings or its info hold (None: not set)."""
    cfg = info.config
    if name == "QueueArn":
        return names.arn(info.name)
    if name == "CreatedTimestamp":
        return str(info.created_ms // 1000)
    if name == "LastModifiedTimestamp":
        return cfg.attributes.get(name, str(info.created_ms // 1000))
    if name == "VisibilityTimeout":
        return str(int(cfg.lease_timeout))
    if name == "MessageRetentionPeriod":
        return str(int(cfg.retention))
    if cfg.dead_queue is not None and cfg.max_attempts:  # RedrivePolicy
        return json.dumps({"deadLetterTargetArn": names.arn(cfg.dead_queue),
                           "maxReceiveCount": cfg.max_attempts})
    return None


def changes(attributes: Any, names: Names, *, creating: bool,
            fifo: bool = False) -> dict[str, Any]:
    """``update_queue`` changes (``attributes`` merged key by key) from SQS attributes.
    ``fifo``: whether the queue is a FIFO queue (when ``creating``, its ``FifoQueue``
    attribute says, and ``fifo`` is then in the changes)."""
    if attributes is None:
        return {}
    if not isinstance(attributes, dict):
        raise SqsError("InvalidParameterValue", "Attributes must be a map of names to values")
    out: dict[str, Any] = {}
    kept: dict[str, str | None] = {}
    if creating:
        fifo = str(attributes.get("FifoQueue", "false")).lower() == "true"
        if fifo:
            out["fifo"] = True
    for name, raw in attributes.items():
        value = raw if isinstance(raw, str) else str(raw)
        if name in FIFO_ONLY:
            _fifo_attribute(name, value, creating=creating, fifo=fifo, kept=kept)
        elif name == "VisibilityTimeout":
            out["lease_timeout"] = max(0.1, _integer(name, value, 0, 43_200))
        elif name == "MessageRetentionPeriod":
            out["retention"] = _integer(name, value, 60, 1_209_600)
        elif name == "RedrivePolicy":
            out.update(_redrive(value, names))
        elif name in KEPT:
            kept[name] = _kept_value(name, value)
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    if kept:
        out["attributes"] = kept
    return out


def _fifo_attribute(name: str, value: str, *, creating: bool, fifo: bool,
                    kept: dict[str, str | None]) -> None:
    """Check a FIFO attribute; keep those kept in ``attributes``."""
    if name == "FifoQueue":
        if not creating:
            raise SqsError("InvalidAttributeName", "FifoQueue is set when a queue is "
                           "created and cannot be changed.")
        if value.lower() not in ("true", "false"):
            raise SqsError("InvalidAttributeValue",
                           f"Invalid value for the parameter FifoQueue: {value!r}.")
        return
    if not fifo:
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    if value not in FIFO_KEPT[name][1]:
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter "
                       f"{name}: one of {', '.join(FIFO_KEPT[name][1])}.")
    kept[name] = value


def check_fifo_settings(info: QueueInfo | None, changes: dict[str, Any]) -> None:
    """SQS's rule for a FIFO queue's throughput: per message group only with
    deduplication per message group (``info``: the queue before the change)."""
    kept = {**(info.config.attributes if info is not None else {}),
            **changes.get("attributes", {})}
    if (kept.get("FifoThroughputLimit") == "perMessageGroupId"
            and kept.get("DeduplicationScope", "queue") != "messageGroup"):
        raise SqsError("InvalidAttributeValue", "Invalid value for the parameter "
                       "FifoThroughputLimit: perMessageGroupId needs DeduplicationScope "
                       "messageGroup.")
    if (info is not None and info.config.fifo and info.config.partitions > 1
            and kept.get("DeduplicationScope", "queue") != "messageGroup"):
        raise SqsError("InvalidAttributeValue", "Invalid value for the parameter "
                       "DeduplicationScope: this queue is spread over "
                       f"{info.config.partitions} partitions by message group (okq), so its "
                       "deduplication ids are per message group.")


def same_value(name: str, have: str, asked: str) -> bool:
    """Whether an attribute a CreateQueue asks for is what the queue has (policies
    compared as JSON, so that spacing and key order do not matter)."""
    if name in ("RedrivePolicy", "RedriveAllowPolicy", "Policy") and have and asked:
        try:
            a, b = json.loads(have), json.loads(asked)
        except ValueError:
            return have == asked
        if name == "RedrivePolicy" and isinstance(b, dict):
            b = {**b, "maxReceiveCount": int(b.get("maxReceiveCount", 10))}
        return bool(a == b)
    return have == asked


def _kept_value(name: str, value: str) -> str | None:
    """The value to keep (None removes it: back to the default)."""
    limits = KEPT[name][1]
    if limits is not None and value != "":
        _integer(name, value, *limits)
    elif name == "RedriveAllowPolicy" and value:
        check_redrive_allow(value)
    elif name == "SqsManagedSseEnabled" and value.lower() not in ("true", "false"):
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
    elif name == "Policy" and value:
        try:
            json.loads(value)
        except ValueError:
            raise SqsError("InvalidAttributeValue", "Invalid value for the parameter "
                           "Policy: not JSON.") from None
    return value if value != "" else None


def _integer(name: str, value: str, low: int, high: int) -> int:
    try:
        n = int(value)
    except ValueError:
        n = low - 1
    if not low <= n <= high:
        raise SqsError("InvalidAttributeValue",
                       f"Invalid value for the parameter {name}: an integer from {low} to "
                       f"{high}; got {value!r}.")
    return n


def _redrive(value: str, names: Names) -> dict[str, Any]:
    if value == "":
        return {"dead_queue": None, "max_attempts": 0}
    try:
        policy = json.loads(value)
    except ValueError:
        policy = None
    if not isinstance(policy, dict) or "deadLetterTargetArn" not in policy:
        raise SqsError("InvalidParameterValue", "Value for parameter RedrivePolicy is invalid. "
                       "Reason: Redrive policy is not a dict or valid json, or lacks "
                       "deadLetterTargetArn.")
    target = names.queue_of_arn(policy["deadLetterTargetArn"], "RedrivePolicy")
    try:
        count = int(policy.get("maxReceiveCount", 10))
    except (TypeError, ValueError):
        count = 0
    if not 1 <= count <= 1000:
        raise SqsError("InvalidParameterValue", "Value for parameter RedrivePolicy is invalid. "
                       "Reason: maxReceiveCount must be an integer from 1 to 1000.")
    return {"dead_queue": target, "max_attempts": count}


def check_redrive_allow(value: str) -> dict[str, Any]:
    try:
        policy = json.loads(value)
    except ValueError:
        policy = None
    permission = policy.get("redrivePermission") if isinstance(policy, dict) else None
    if permission not in ("allowAll", "denyAll", "byQueue"):
        raise SqsError("InvalidParameterValue", "Value for parameter RedriveAllowPolicy is "
                       "invalid. Reason: redrivePermission must be allowAll, denyAll or byQueue.")
    assert isinstance(policy, dict)
    sources = policy.get("sourceQueueArns", [])
    if permission == "byQueue" and (not isinstance(sources, list) or not 1 <= len(sources) <= 10):
        raise SqsError("InvalidParameterValue", "Value for parameter RedriveAllowPolicy is "
                       "invalid. Reason: byQueue needs 1 to 10 sourceQueueArns.")
    return policy


def redrive_allowed(dead: QueueInfo, source_arn: str) -> bool:
    """Whether the dead-letter queue's RedriveAllowPolicy lets ``source_arn`` use it."""
    raw = dead.config.attributes.get("RedriveAllowPolicy")
    if not raw:
        return True
    policy = check_redrive_allow(raw)
    if policy["redrivePermission"] == "byQueue":
        return source_arn in policy.get("sourceQueueArns", [])
    return bool(policy["redrivePermission"] == "allowAll")


def tags(info: QueueInfo) -> dict[str, str]:
    return {k[len(TAG):]: v for k, v in info.config.attributes.items() if k.startswith(TAG)}


def tag_changes(existing: dict[str, str], add: Any, remove: Any) -> dict[str, str | None]:
    """``attributes`` changes that add tags (a map) or remove them (a list of keys)."""
    out: dict[str, str | None] = {}
    if add is not None:
        if not isinstance(add, dict) or not add:
            raise SqsError("InvalidParameterValue", "Tags must be a non-empty map")
        for key, value in add.items():
            if not isinstance(key, str) or not 1 <= len(key) <= 128 or \
                    not isinstance(value, str) or len(value) > 256:
                raise SqsError("InvalidParameterValue",
                               "Tag keys are 1 to 128 characters, values up to 256")
            out[TAG + key] = value
        if len(set(existing) | {k[len(TAG):] for k in out}) > MAX_TAGS:
            raise SqsError("InvalidParameterValue", f"A queue has at most {MAX_TAGS} tags")
    if remove is not None:
        if not isinstance(remove, list) or not all(isinstance(k, str) for k in remove):
            raise SqsError("InvalidParameterValue", "TagKeys must be a list of tag keys")
        out.update({TAG + k: None for k in remove})
    return out
