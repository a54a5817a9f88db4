"""SQS's errors: each with the shape name of the JSON protocol (``__type``, the class
boto3 raises), the code of the query protocol (``<Code>``, also sent to JSON clients
in ``x-amzn-query-error``) and the HTTP status SQS answers it with."""

from __future__ import annotations

#: shape name -> (query code, HTTP status). Shapes SQS models, then its common errors.
ERRORS: dict[str, tuple[str, int]] = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 400),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "OverLimit": ("OverLimit", 403),
    "RequestThrottled": ("RequestThrottled", 403),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
    # common errors, not modelled: their shape is their code
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "MissingParameter": ("MissingParameter", 400),
    "InvalidAction": ("InvalidAction", 400),
    "MissingAction": ("MissingAction", 400),
    "MalformedQueryString": ("MalformedQueryString", 400),
    "SerializationException": ("SerializationException", 400),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403),
    "IncompleteSignature": ("IncompleteSignature", 400),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403),
    "RequestExpired": ("RequestExpired", 400),
    "AccessDenied": ("AccessDenied", 403),
    "RequestTimeout": ("RequestTimeout", 408),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
    "InternalFailure": ("InternalFailure", 500),
}


class SqsError(Exception):
    """An error as SQS answers it. ``shape`` is a key of :data:`ERRORS`."""

    def __init__(self, shape: str, message: str) -> None:
        super().__init__(message)
        self.shape = shape
        self.code, self.status = ERRORS[shape]
        self.message = message

    @property
    def sender_fault(self) -> bool:
        return self.status < 500


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def invalid_value(name: str, value: object, reason: str) -> SqsError:
    """SQS's wording: the parameter, its value and why."""
    return SqsError("InvalidParameterValue",
                    f"Value {value} for parameter {name} is invalid. Reason: {reason}")


def missing(name: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


def no_queue() -> SqsError:
    return SqsError("QueueDoesNotExist",
                    "The specified queue does not exist or you do not have access to it.")
