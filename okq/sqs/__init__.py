"""The SQS-compatible API: boto3, the AWS CLI and Celery's SQS transport against okq.

A front end beside ``okq.server``, over the same ``okq.service.QueueService``:
``protocol`` (JSON and query wire formats), ``auth`` (Signature Version 4),
``messages`` (bodies, message attributes, MD5s), ``queues`` (queue attributes),
``actions`` (the SQS actions) and ``http`` (the aiohttp handler). docs/SQS.md has the
parity table.
"""
