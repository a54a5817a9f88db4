"""A user's tests of thumbnails.py against a real okq node from okq.testing's
fixtures (okq_client, okq_queue, okq_drain, okq_sqs); no okq code is mocked."""

from __future__ import annotations

import pytest
from thumbnails import make_handler, request_thumbnail


async def test_a_requested_thumbnail_is_rendered(okq_client, okq_queue, okq_drain):
    jobs, done = okq_queue("jobs"), okq_queue("done")
    await request_thumbnail(okq_client, jobs, "cat.png", "small", user="ada")

    result = await okq_drain(jobs, make_handler(done))

    assert (result.completed, result.dead) == (1, 0)
    [note] = await okq_client.lease(done, 10)
    assert note.bytes == b"ada:cat.png@64px"


async def test_a_bad_image_goes_to_the_dead_letter_queue(okq_client, okq_queue, okq_drain):
    dead = okq_queue("jobs-dead")
    jobs = okq_queue("jobs", max_attempts=3, dead_queue=dead)
    await request_thumbnail(okq_client, jobs, "notes.txt", "large", user="grace")

    result = await okq_drain(jobs, make_handler(okq_queue("done")))

    assert result.dead == 1
    [letter] = await okq_client.lease(dead, 10)
    assert letter.headers == {"user": "grace"}


async def test_an_unknown_size_is_refused_before_anything_is_queued(okq_client, okq_queue):
    jobs = okq_queue("jobs")
    with pytest.raises(ValueError, match="unknown size"):
        await request_thumbnail(okq_client, jobs, "cat.png", "huge", user="ada")
    assert (await okq_client.stats(jobs)).available == 0


def test_the_same_queue_over_the_sqs_api(okq_sync_client, okq_queue, okq_sqs):
    jobs = okq_queue("jobs")
    url = okq_sqs.get_queue_url(QueueName=jobs)["QueueUrl"]
    okq_sqs.send_message(QueueUrl=url, MessageBody="from boto3",
                         MessageAttributes={"user": {"DataType": "String",
                                                     "StringValue": "alan"}})
    [item] = okq_sync_client.lease(jobs, 1)
    assert (item.bytes, item.headers) == (b"from boto3", {"user": "alan"})
