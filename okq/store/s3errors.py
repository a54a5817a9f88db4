"""One-line S3 errors, the same from both S3 clients (s3.py, obstore.py).

A failed S3 request becomes one line that says what failed and why, and no
more: the HTTP status, the operation and the key, and the server's error code
and message (``S3 503 SlowDown: Please reduce your request rate (PUT
'ns/q/manifest')``), or the cause of a request that got no answer (``S3 GET
'ns/x' failed: Connection refused``). Never a client library's debug dump, the
endpoint or the bucket path: these lines reach the CLI and the open /health.
A request that failed for want of an identity says which settings give one.
"""

from __future__ import annotations

from okq.errors import StorageError

#: What to set when no AWS identity was found.
CREDENTIALS_HELP = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
    "temporary keys) in the environment of okq serve and the compactor, or give them "
    "a role (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, a container or an "
    "instance role)"
)


#: The cause of a request that got no answer within the S3 timeout.
TIMED_OUT = "no answer in time (--s3-timeout)"
#: The cause of a request that could not connect.
NO_CONNECTION = "cannot connect to the endpoint"


def no_credentials(detail: str, key: str) -> StorageError:
    """The error of a request that found no AWS identity; ``detail`` says how it failed."""
    return StorageError(f"no S3 credentials ({detail}): {CREDENTIALS_HELP}", key=key,
                        status=0, s3_code="NoCredentials")


def s3_error(status: int, code: str, message: str, op: str, key: str,
             bucket: str) -> StorageError:
    """The error of a request the server refused with ``status`` (``code``, ``message``:
    its XML error's, when it sent one)."""
    where = f"({op} {key!r})"
    if code == "NoSuchBucket":
        return StorageError(f"no bucket {bucket!r}: S3 {status} {code} {where}; create it, "
                            "or check the store URL and the endpoint", key=key,
                            status=status, s3_code=code)
    if status in (401, 403) and code in ("", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                                         "AccessDenied", "ExpiredToken"):
        hint = "; check the AWS credentials okq runs with"
    else:
        hint = ""
    said = f"{code}: {message}" if code and message else (code or message or "no message")
    return StorageError(f"S3 {status} {said} {where}{hint}", key=key, status=status,
                        s3_code=code)


def s3_failed(op: str, key: str, cause: str) -> StorageError:
    """The error of a request that got no answer (refused, reset, timed out)."""
    return StorageError(f"S3 {op} {key!r} failed: {cause}", key=key)
