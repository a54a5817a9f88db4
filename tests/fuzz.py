"""Fuzzers for okq's decoders: every input ends in a value or in okq's error for bad input.

::

    python -m tests.fuzz [--inputs N] [--target name,...] [--seed N] [--list]

runs each target on N inputs (default 100,000) and prints, per target, the inputs
it ran, their outcomes (accepted, or refused by error type or by HTTP status and
code) and the seconds it took. It exits 1 when an input crashed a decoder, broke
a property or drew a 5xx, and prints the smallest input of each such failure.
``tests/unit/test_fuzz.py`` runs the same targets on a few thousand inputs in CI.

Inputs come in batches. Hypothesis draws the first input of a batch by structure
(a valid object of the decoder's kind, a body shaped like an endpoint's request
model, a token, a signed request, or any msgpack or JSON value, or bytes no
decoder should trust) and a ``random.Random`` seeded from its draw; the rest of
the batch are mutations of that input made with the generator, which costs far
less per input than a hypothesis draw: bytes flipped, set to msgpack type bytes,
inserted, deleted, repeated or cut; parts of the decoded tree replaced, dropped,
renamed, added or retyped and encoded again; text edited; headers swapped. Valid
inputs mutated get past the first checks and reach the code behind them. Every
input is counted as it runs. A failure does not stop a target: it is recorded under a signature (the
exception and the line of okq it came from, or the property broken) with the
smallest input seen for it, and the target runs on.

Hypothesis runs in chunks of ``CHUNK`` examples, each with a seed derived from
``--seed``, so that what it keeps of the examples it tried stays small. (atheris
3.0 installs and runs on Python 3.11 too, but a run of it ends its process and it
would be one more test dependency; hypothesis is one already and runs in pytest.)

The HTTP targets run a node in this process (``okq.server.app.create_app`` on a
memory store, aiohttp's test server on loopback) that holds queues, items, live
and stale lease tokens, a dead letter and API keys of every role to aim at; the
tokens of the leases the fuzzer makes join them. It is rebuilt every
``RESET_EVERY`` requests so that what the fuzzer piles up stays small. Its long
polls last 10 ms at most (``node_settings``): a fuzzer cannot wait for more.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import logging
import math
import random
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin
from urllib.parse import parse_qsl, urlencode, urlsplit

import msgpack
from aiohttp.test_utils import TestClient, TestServer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import BaseModel

import okq
from okq.errors import FormatError, InvalidToken
from okq.leases import (
    DEAD,
    DEAD_PENDING,
    DONE,
    LEASED,
    OUTPUTS_PENDING,
    WAITING,
    ItemState,
    LeaseObject,
    decode_lease,
    encode_lease,
)
from okq.limits import (
    LEASE_TIMEOUT_MAX,
    LEASE_TIMEOUT_MIN,
    MAX_ATTEMPTS_MAX,
    RETENTION_MAX,
    RETENTION_MIN,
)
from okq.model import (
    Manifest,
    QueueConfig,
    Segment,
    SegmentItem,
    SegmentMeta,
    decode_manifest,
    decode_segment,
    encode_manifest,
    encode_segment,
)
from okq.server.app import create_app
from okq.server.routes import ROUTES
from okq.settings import Settings
from okq.sqs import auth as sqs_auth
from okq.sqs.errors import SqsError
from okq.sqs.protocol import from_json, from_query
from okq.store import MemoryStore
from okq.tokens import Delivery, TokenSigner, key_id

T = TypeVar("T")

DEFAULT_INPUTS = 100_000
#: Hypothesis examples per run (each example is a batch of inputs).
CHUNK = 2_000
#: Requests an in-process node serves before it is rebuilt from scratch.
RESET_EVERY = 1_000
#: How much of a failing input a report shows.
SHOWN = 600
OKQ_DIR = Path(okq.__file__).resolve().parent

QUIET = settings(
    database=None, deadline=None, phases=[Phase.generate], print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large, HealthCheck.large_base_example],
)


# -- running a target ---------------------------------------------------------------------


class Violation(Exception):
    """An input broke a rule of its target; the message is the failure's signature."""


@dataclass
class Report:
    """What one target did: inputs run, outcomes counted, failures with their smallest input."""

    target: str
    executed: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> (input, detail)
    failed: Counter[str] = field(default_factory=Counter)

    def fail(self, signature: str, example: Any, detail: str) -> None:
        self.outcomes["FAILED"] += 1
        self.failed[signature] += 1
        text = repr(example)
        kept = self.failures.get(signature)
        if kept is None or len(text) < len(kept[0]):
            self.failures[signature] = (text, detail)

    def summary(self) -> str:
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(self.outcomes.items()))
        return (f"{self.target:10} {self.executed:8,d} inputs {self.seconds:7.1f} s  "
                f"{len(self.outcomes)} distinct outcomes, {len(self.failures)} failure(s)\n"
                f"{'':10} [{outcomes}]")

    def describe_failures(self) -> str:
        return "\n".join(
            f"FAILURE {self.target}: {sig} ({self.failed[sig]} inputs)\n  detail: {detail}\n"
            f"  smallest input ({len(example)} characters): {shorten(example)}"
            for sig, (example, detail) in self.failures.items())


def shorten(text: str) -> str:
    return text if len(text) <= SHOWN else f"{text[:SHOWN // 2]} ... {text[-SHOWN // 2:]}"


def where(exc: BaseException) -> str:
    """The innermost line of okq an exception went through (else its innermost line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if Path(f.filename).is_relative_to(OKQ_DIR)] or frames
    if not ours:
        return "?"
    path = Path(ours[-1].filename)
    shown = path.relative_to(OKQ_DIR.parent) if path.is_relative_to(OKQ_DIR) else path.name
    return f"{shown}:{ours[-1].lineno}"


def crash_signature(exc: BaseException) -> str:
    return f"{type(exc).__name__} at {where(exc)}"


Check = Callable[[Any], str]


def run_one(report: Report, check: Check, value: Any) -> None:
    """Run one input: its outcome counted, or its failure recorded."""
    report.executed += 1
    try:
        report.outcomes[check(value)] += 1
    except Violation as exc:
        report.fail(str(exc), value, str(exc.__cause__ or exc)[:300])
    except Exception as exc:
        report.fail(crash_signature(exc), value, f"{type(exc).__name__}: {exc}"[:300])


def drive(report: Report, batches: st.SearchStrategy[list[Any]], check: Check, n: int,
          seed: int, per_batch: int) -> None:
    """Run ``check`` on ``n`` inputs from ``batches`` (about ``per_batch`` inputs per
    hypothesis example), in chunks of hypothesis runs with seeds derived from ``seed``."""
    chunk = 0
    while report.executed < n:
        examples = min(CHUNK, math.ceil((n - report.executed) / per_batch))
        before = report.executed
        _run_chunk(report, batches, check, n, examples, seed * 1_000_003 + chunk)
        if report.executed == before:
            raise RuntimeError(f"{report.target}: hypothesis generated no input")
        chunk += 1


def _run_chunk(report: Report, batches: st.SearchStrategy[list[Any]], check: Check, n: int,
               examples: int, chunk_seed: int) -> None:
    @settings(QUIET, max_examples=examples)
    @hypothesis_seed(chunk_seed)
    @given(batches)
    def one(batch: list[Any]) -> None:
        for value in batch[:n - report.executed]:
            run_one(report, check, value)

    one()


def batches(first: st.SearchStrategy[T], vary: Callable[[T, random.Random], T],
            size: int) -> st.SearchStrategy[list[T]]:
    """``first`` (drawn by hypothesis) and ``size - 1`` variations of it, each made by
    ``vary`` with a generator seeded from the same draw."""
    return st.builds(lambda value, rng: [value, *(vary(value, rng) for _ in range(size - 1))],
                     first, st.randoms(use_true_random=True))


# -- values, drawn by hypothesis ------------------------------------------------------------

INT64 = st.integers(-(2**63), 2**63 - 1)
MS = st.integers(0, 2**53)
NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,15}", fullmatch=True)
SHORT_TEXT = st.text(max_size=24)
TIMESTAMPS = st.builds(msgpack.Timestamp, INT64, st.integers(0, 999_999_999))
EXTS = st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12))
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), SHORT_TEXT,
    st.binary(max_size=24), TIMESTAMPS, EXTS,
)
KEYS = st.one_of(st.text(max_size=12), INT64, st.binary(max_size=8), st.booleans(),
                 st.floats(allow_nan=False))
#: Any value msgpack carries.
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=16,
)
#: Raw msgpack timestamps (ext -1) of every length, with any content.
RAW_TIMESTAMPS = st.one_of(
    st.binary(min_size=4, max_size=4).map(lambda b: b"\xd6\xff" + b),
    st.binary(min_size=8, max_size=8).map(lambda b: b"\xd7\xff" + b),
    st.binary(min_size=12, max_size=12).map(lambda b: b"\xc7\x0c\xff" + b),
)


def pack(value: Any) -> bytes:
    """msgpack bytes of ``value``; a never-used byte when msgpack cannot pack it."""
    try:
        out: bytes = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, TypeError, ValueError):
        return b"\xc1"
    return out


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def jsonable(value: Any) -> Any:
    """A value as JSON can carry it: bytes as base64, timestamps as epoch seconds."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, msgpack.Timestamp):
        return value.seconds + value.nanoseconds / 1e9
    if isinstance(value, msgpack.ExtType):
        return [value.code, base64.b64encode(value.data).decode()]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def to_json(value: Any) -> bytes:
    return json.dumps(jsonable(value)).encode()


def hostile_bytes(kind: str) -> st.SearchStrategy[bytes]:
    """Bytes of ``kind`` ('msgpack' or 'json') no decoder should trust: random, nested
    deeper than any limit, or a timestamp past every calendar."""
    if kind == "json":
        deep = st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n)
        deep |= st.integers(1, 50_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n)
        return st.binary(max_size=48) | deep
    deep = st.integers(1, 100_000).map(lambda n: b"\x91" * n + b"\xc0")
    return st.binary(max_size=48) | deep | RAW_TIMESTAMPS | RAW_TIMESTAMPS.map(
        lambda t: b"\x81\xaaqueue_name" + t)


# -- values and mutations, made by a seeded generator --------------------------------------

INTERESTING_INTS = (0, 1, -1, 127, 128, 255, 256, 4095, 4096, 65_535, 65_536, 2**31 - 1, 2**31,
                    2**32 - 1, 2**32, 2**53, 2**63 - 1, -(2**63), 2**64 - 1, -(2**31), 1000,
                    1001, 43_200, 43_201)
INTERESTING_FLOATS = (0.0, -0.0, math.nan, math.inf, -math.inf, 1e308, 5e-324, 0.1, 0.01,
                      43_200.0, 1.5, -1.5)
PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))


def r_char(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return chr(rng.randint(0x20, 0x7E))
    if roll < 0.75:
        return chr(rng.randint(0, 0x1F))
    if roll < 0.9:
        return chr(rng.randint(0x80, 0x7FF))
    code = rng.randint(0x800, 0x10FFFF)
    return "\ufffd" if 0xD800 <= code <= 0xDFFF else chr(code)


def r_text(rng: random.Random, longest: int = 24, alphabet: str | None = None) -> str:
    n = rng.randint(0, longest)
    if alphabet is not None:
        return "".join(rng.choice(alphabet) for _ in range(n))
    return "".join(r_char(rng) for _ in range(n))


def r_int(rng: random.Random) -> int:
    if rng.random() < 0.5:
        return min(2**64 - 1, max(-(2**63), rng.choice(INTERESTING_INTS) + rng.choice(
            (0, 0, 1, -1))))
    return rng.randint(-1000, 100_000)


def r_bytes(rng: random.Random, longest: int = 24) -> bytes:
    return rng.randbytes(rng.randint(0, longest))


R_SCALARS: tuple[Callable[[random.Random], Any], ...] = (
    lambda rng: None, lambda rng: rng.random() < 0.5, r_int,
    lambda rng: rng.choice(INTERESTING_FLOATS), r_text, r_bytes,
    lambda rng: msgpack.Timestamp(r_int(rng) % 2**63, rng.randint(0, 999_999_999)),
    lambda rng: msgpack.ExtType(rng.randint(0, 127), r_bytes(rng, 8)),
)


def r_key(rng: random.Random) -> Any:
    return r_text(rng, 8) if rng.random() < 0.7 else rng.choice(R_SCALARS[1:6])(rng)


def r_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return [r_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 3 and roll < 0.3:
        return {r_key(rng): r_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return rng.choice(R_SCALARS)(rng)


#: Bytes that start msgpack values: type confusion and length fields.
MSGPACK_BYTES = (0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xC3,
                 0xC4, 0xC7, 0xCA, 0xCB, 0xCC, 0xCF, 0xD0, 0xD3, 0xD4, 0xD6, 0xD7, 0xD9,
                 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0, 0xFF)
#: Pieces worth inserting: msgpack values and timestamps, long lengths, JSON syntax.
INSERTS: tuple[Callable[[random.Random], bytes], ...] = (
    lambda rng: r_bytes(rng, 8), lambda rng: pack(r_value(rng, 2)),
    lambda rng: rng.choice((b"\xd6\xff", b"\xd7\xff", b"\xc7\x0c\xff")) + r_bytes(rng, 12),
    lambda rng: rng.choice((b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\xdf\xff\xff\xff\xff")),
    lambda rng: rng.choice((b'"', b"[", b"{", b"]", b"}", b",", b":", b"\\u", b"\\ud800",
                            b"NaN", b"-Infinity", b"1e999", b"null", b"\x00", b"\xff")),
)


def _flip(rng: random.Random, data: bytearray) -> None:
    if data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)


def _type_byte(rng: random.Random, data: bytearray) -> None:
    if data:
        data[rng.randrange(len(data))] = rng.choice(MSGPACK_BYTES)


def _insert(rng: random.Random, data: bytearray) -> None:
    at = rng.randint(0, len(data))
    data[at:at] = rng.choice(INSERTS)(rng)


def _delete(rng: random.Random, data: bytearray) -> None:
    at = rng.randint(0, len(data))
    del data[at:at + rng.randint(1, 8)]


def _truncate(rng: random.Random, data: bytearray) -> None:
    del data[rng.randint(0, len(data)):]


def _repeat(rng: random.Random, data: bytearray) -> None:
    at = rng.randint(0, len(data))
    piece = data[at:at + rng.randint(1, 16)]
    to = rng.randint(0, len(data))
    data[to:to] = piece * rng.randint(1, 3)


BYTE_OPS = (_flip, _type_byte, _insert, _delete, _truncate, _repeat)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to four byte-level edits."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        rng.choice(BYTE_OPS)(rng, out)
    return bytes(out)


def _replace(rng: random.Random, node: Any) -> Any:
    return r_value(rng)


def _drop(rng: random.Random, node: Any) -> Any:
    if isinstance(node, dict | list) and node:
        del node[rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))]
    return node


def _rename(rng: random.Random, node: Any) -> Any:
    if isinstance(node, dict) and node:
        key = rng.choice(list(node))
        node[r_key(rng) if rng.random() < 0.5 else rng.randint(-5000, 5000)] = node.pop(key)
    return node


def _add(rng: random.Random, node: Any) -> Any:
    """A new entry: a key of any type (an item index below zero or past the end) in a
    map, a value at the end of a list."""
    if isinstance(node, dict):
        key = r_key(rng) if rng.random() < 0.5 else rng.choice(
            [rng.randint(-5000, 5000), -1, math.inf, 2**63 - 1, 1.5])
        node[key] = next(iter(node.values())) if node and rng.random() < 0.5 else r_value(rng)
    elif isinstance(node, list):
        node.append(node[-1] if node and rng.random() < 0.5 else r_value(rng))
    return node


def _retype(rng: random.Random, node: Any) -> Any:
    choices: list[Any] = [[node], str(node)[:40], None]
    if isinstance(node, int) and not isinstance(node, bool):
        choices += [-node, node + 1, node - 1, float(node), 2**64 - 1, -(2**63), -1]
    if isinstance(node, str):
        choices += [node.encode(), node * 3, ""]
    if isinstance(node, dict):
        choices += [list(node.values()), list(node.items())]
    if isinstance(node, list):
        choices += [node * 2, {str(i): v for i, v in enumerate(node)}, node[:-1]]
    return rng.choice(choices)


NODE_OPS = (_replace, _drop, _rename, _add, _retype)


def _reshape(rng: random.Random, node: Any, depth: int = 0) -> Any:
    """Walk down to a random part of the tree and change it."""
    keys = list(node) if isinstance(node, dict) else list(range(len(node))) \
        if isinstance(node, list) else []
    if keys and depth < 8 and rng.random() < 0.75:
        key = rng.choice(keys)
        node[key] = _reshape(rng, node[key], depth + 1)
        return node
    return rng.choice(NODE_OPS)(rng, node)


def reshape_tree(tree: Any, rng: random.Random) -> Any:
    """One to three parts of a decoded tree replaced, dropped, renamed or retyped."""
    for _ in range(rng.randint(1, 3)):
        tree = _reshape(rng, tree)
    return tree


def decode_as(data: bytes, kind: str) -> Any:
    return unpack(data) if kind == "msgpack" else json.loads(data)


def encode_as(value: Any, kind: str) -> bytes:
    return pack(value) if kind == "msgpack" else to_json(value)


def mutate_encoded(data: bytes, kind: str, rng: random.Random) -> bytes:
    """Half the time an edit of the decoded tree encoded again, else byte edits."""
    if rng.random() < 0.5:
        try:
            return encode_as(reshape_tree(decode_as(data, kind), rng), kind)
        except Exception:  # not a value of its kind, or nested too deep to walk
            pass
    return mutate_bytes(data, rng)


def mutate_text(text: str, rng: random.Random, alphabet: str | None = None) -> str:
    """One to three edits of a string: a character set, inserted or deleted, a cut,
    the case swapped, its two halves around the first dot swapped."""
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        at = rng.randint(0, len(chars))
        char = rng.choice(alphabet) if alphabet else r_char(rng)
        op = rng.randrange(6)
        if op == 0 and at < len(chars):
            chars[at] = char
        elif op == 1:
            chars.insert(at, char)
        elif op == 2:
            del chars[at:at + rng.randint(1, 4)]
        elif op == 3:
            del chars[at:]
        elif op == 4:
            chars = list("".join(chars).swapcase())
        else:
            chars = list(".".join(reversed("".join(chars).split(".", 1))))
    return "".join(chars)


# -- target: the stored objects (okq.model) -----------------------------------------------


CONFIGS = st.builds(
    QueueConfig,
    lease_timeout=st.floats(LEASE_TIMEOUT_MIN, LEASE_TIMEOUT_MAX),
    retention=st.floats(RETENTION_MIN, RETENTION_MAX),
    max_attempts=st.integers(0, MAX_ATTEMPTS_MAX),
    dead_queue=st.none() | NAMES,
    retention_dead_letter=st.booleans(),
    attributes=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
)
SEGMENT_METAS = st.builds(SegmentMeta, st.text(max_size=24), MS, MS, MS, st.none() | MS,
                          st.none() | MS)
METAS = st.none() | st.dictionaries(st.text(max_size=10), VALUES, max_size=4)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    purge_rq = draw(st.just("") | st.text(min_size=1, max_size=8))
    return Manifest(
        queue=draw(NAMES), created_ms=draw(MS), config=draw(CONFIGS),
        segments=draw(st.lists(SEGMENT_METAS, max_size=5)),
        idem=draw(st.dictionaries(st.text(max_size=8), st.tuples(st.text(max_size=20), MS)
                                  .map(list), max_size=3)),
        produced=draw(MS), gc_floor_ms=draw(MS), ver=draw(MS), nonce=draw(st.text(max_size=16)),
        purge_rq=purge_rq,
        purged=draw(st.dictionaries(st.text(max_size=20), MS, max_size=3)) if purge_rq else {},
    )


SEGMENT_ITEMS = st.builds(SegmentItem, st.binary(max_size=32), st.none() | MS, METAS,
                          st.none() | MS)
SEGMENTS = st.builds(Segment, st.text(max_size=24), NAMES, MS, MS,
                     st.lists(SEGMENT_ITEMS, max_size=6))
ITEM_STATES = st.builds(
    ItemState,
    st.sampled_from([LEASED, WAITING, DONE, DEAD_PENDING, DEAD, OUTPUTS_PENDING]),
    MS, st.integers(0, 10_000), MS, st.none() | st.text(max_size=16),
    st.none() | st.tuples(NAMES, st.text(max_size=20), MS, MS, MS).map(list),
    st.none() | st.text(max_size=8), st.none() | MS,
)
LEASES = st.builds(LeaseObject, st.text(max_size=24),
                   st.dictionaries(st.integers(0, 5000), ITEM_STATES, max_size=8), MS,
                   st.text(max_size=16), st.booleans())

CODECS: dict[str, tuple[Callable[[bytes], Any], Callable[[Any], bytes], st.SearchStrategy[Any]]]
CODECS = {
    "manifest": (decode_manifest, encode_manifest, manifests()),
    "segment": (decode_segment, encode_segment, SEGMENTS),
    "lease": (decode_lease, encode_lease, LEASES),
}


def object_inputs(kind: str) -> st.SearchStrategy[list[bytes]]:
    """Valid encodings (most often), foreign maps of the kind, any msgpack value, bytes
    no decoder should trust; each with 15 mutations."""
    _, encode, objects = CODECS[kind]
    valid = objects.map(encode)
    foreign = st.dictionaries(st.text(max_size=10), VALUES, max_size=6).map(
        lambda d: pack({"f": kind, "v": 1, **d}))
    first = st.one_of(valid, valid, valid, foreign, VALUES.map(pack), hostile_bytes("msgpack"))
    return batches(first, lambda data, rng: mutate_encoded(data, "msgpack", rng), 16)


def _same(a: Any, b: Any) -> bool:
    return bool(a == b) or repr(a) == repr(b)  # NaN is not equal to itself, its repr is


def changed_fields(a: Any, b: Any) -> list[str]:
    return [f.name for f in fields(a)
            if f.compare and not _same(getattr(a, f.name), getattr(b, f.name))]


def object_check(kind: str) -> Check:
    """decode_<kind>: a value or FormatError (stored bytes that do not decode are a
    FormatError that keeps them); a decoded object re-encodes and decodes equal."""
    decode, encode, _ = CODECS[kind]

    def check(data: bytes) -> str:
        try:
            obj = decode(data)
        except FormatError as exc:
            if exc.data != data:
                raise Violation(f"{kind}: FormatError without the bytes") from None
            return "refused FormatError"
        try:
            again = decode(encode(obj))
        except Exception as exc:
            raise Violation(f"{kind}: a decoded object does not re-encode and decode: "
                            f"{crash_signature(exc)}") from exc
        diff = changed_fields(obj, again)
        if diff:
            raise Violation(f"{kind}: re-encoding changed {', '.join(diff)}") from ValueError(
                f"{obj!r:.150} became {again!r:.150}")
        return "accepted"

    return check


# -- target: lease tokens (okq.tokens) -----------------------------------------------------

TOKEN_KEY = b"fuzz-signing-key-0123456789abcdef"
NEW_KEY = b"fuzz-rotated-key-0123456789abcdef"
NAMESPACE = "default"
#: Signs as a node does; the verifier holds a newer key first and this one second,
#: as a node does in the middle of a key rotation.
MINTER = TokenSigner([TOKEN_KEY])
VERIFIER = TokenSigner([NEW_KEY, TOKEN_KEY])
B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@dataclass(frozen=True)
class TokenCase:
    """A token to verify in ``namespace``; ``names``: the delivery it must verify as
    with a signer that holds ``key`` (the key that signed it), None when it must be
    refused."""

    token: str
    namespace: str
    names: Delivery | None
    how: str
    key: bytes = TOKEN_KEY

    def expected(self, signer: TokenSigner) -> Delivery | None:
        return self.names if self.key in signer.keys else None


DELIVERIES = st.builds(Delivery, st.sampled_from([NAMESPACE, NAMESPACE, NAMESPACE, "other"])
                       | st.text(max_size=8),
                       SHORT_TEXT, SHORT_TEXT, st.integers(0, 2**63 - 1) | INT64,
                       st.integers(0, 2**63 - 1))


def _genuine(d: Delivery, namespace: str) -> TokenCase:
    return TokenCase(MINTER.sign(d), namespace, d if d.namespace == namespace else None,
                     "genuine")


def _mac(key: bytes, body: bytes) -> bytes:
    """A token's MAC as the token format defines it (HMAC-SHA256, first 16 bytes)."""
    return hmac.new(key, body, hashlib.sha256).digest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@st.composite
def forged_tokens(draw: st.DrawFn) -> TokenCase:
    """A token whose body is built field by field (kid, namespace, queue, segment,
    index, v, each plausible or anything) and whose MAC is right or not."""
    key = draw(st.sampled_from([TOKEN_KEY, NEW_KEY, b"another-key-of-32-bytes-0123456"]))
    kid = draw(st.just(key_id(key)) | st.sampled_from([key_id(TOKEN_KEY), b"\0" * 4]) | VALUES)
    plausible = [st.just(NAMESPACE), SHORT_TEXT, SHORT_TEXT, st.integers(0, 100), MS]
    values = [kid, *(draw(s | VALUES) for s in plausible)]
    values = draw(st.sampled_from([values, values, values[:5], [*values, None]])
                  | st.lists(VALUES))
    body = pack(values)
    mac = draw(st.just(_mac(key, body)) | st.binary(min_size=16, max_size=16) | st.binary())
    token = _b64(body) + "." + draw(st.just(_b64(mac)) | st.just(
        base64.b64encode(mac).decode()) | st.text(max_size=30))
    return TokenCase(token, NAMESPACE, _forged_names(token, body, key), "forged", key)


def _forged_names(token: str, body: bytes, key: bytes) -> Delivery | None:
    """What a forged token must verify as: only a well-formed body of this namespace,
    named by its key's id, with its MAC spelt canonically."""
    try:
        values = msgpack.unpackb(body)
    except Exception:
        return None
    if not (isinstance(values, list) and len(values) == 6) \
            or token != f"{_b64(body)}.{_b64(_mac(key, body))}" \
            or key not in VERIFIER.keys or values[0] != key_id(key):
        return None
    _, ns, queue, segment, index, v = values
    if ns != NAMESPACE or not (isinstance(queue, str) and isinstance(segment, str)
                               and isinstance(index, int) and isinstance(v, int)):
        return None
    return Delivery(ns, queue, segment, index, v)


def vary_token(case: TokenCase, rng: random.Random) -> TokenCase:
    """A token's text edited: refused, unless the edit left it as it was."""
    token = mutate_text(case.token, rng, B64_CHARS + "=+/.~ " if rng.random() < 0.7 else None)
    return TokenCase(token, case.namespace, case.names if token == case.token else None,
                     f"{case.how}, edited", case.key)


TOKEN_INPUTS = batches(st.one_of(
    st.builds(_genuine, DELIVERIES, st.sampled_from([NAMESPACE, NAMESPACE, "other"])),
    forged_tokens(),
    st.builds(TokenCase, st.text(max_size=80), st.just(NAMESPACE), st.none(),
              st.just("text")),
), vary_token, 16)


def token_check(case: TokenCase) -> str:
    """TokenSigner.verify: the delivery a token names, or InvalidToken (a client's token
    that is not genuine, or not of this namespace, is a 400). Checked with the signer
    that minted the genuine tokens (it remembers them) and with a node in the middle of
    a key rotation (a newer key first, the minter's second)."""
    outcomes = []
    for signer in (MINTER, VERIFIER):
        got, expected = _verify(signer, case), case.expected(signer)
        if got != expected and expected is None:
            raise Violation(f"{case.how} token verified: it must be refused") from ValueError(
                f"verified as {got}")
        if got != expected:
            raise Violation(f"{case.how} token: verified as {got}, not {expected}")
        outcomes.append(got)
    accepted = " and ".join(name for name, got in zip(("minter", "verifier"), outcomes,
                                                       strict=True) if got is not None)
    return f"accepted by {accepted} ({case.how})" if accepted else \
        f"refused InvalidToken ({case.how})"


def _verify(signer: TokenSigner, case: TokenCase) -> Delivery | None:
    try:
        return signer.verify(case.token, case.namespace)
    except InvalidToken:
        return None


# -- target: the SQS front end's parsers --------------------------------------------------

QUERY_PARTS = [
    "Attribute", "MessageAttribute", "MessageSystemAttribute", "Tag", "AttributeName",
    "MessageAttributeName", "MessageSystemAttributeName", "TagKey", "AWSAccountId",
    "ActionName", "SendMessageBatchRequestEntry", "DeleteMessageBatchRequestEntry",
    "ChangeMessageVisibilityBatchRequestEntry", "Name", "Value", "Key", "Id", "StringValue",
    "BinaryValue", "DataType", "StringListValue", "BinaryListValue", "QueueUrl",
    "MessageBody", "ReceiptHandle", "1", "2", "3", "0", "01", "10", "9999", "10000", "",
]
QUERY_NAMES = st.lists(st.sampled_from(QUERY_PARTS) | st.text(max_size=6), min_size=1,
                       max_size=6).map(".".join)
QUERY_PAIRS = st.lists(st.tuples(QUERY_NAMES, st.text(max_size=16)), max_size=12)


def r_query_name(rng: random.Random) -> str:
    return ".".join(rng.choice(QUERY_PARTS) if rng.random() < 0.8 else r_text(rng, 6)
                    for _ in range(rng.randint(1, 6)))


def vary_pairs(pairs: list[tuple[str, str]], rng: random.Random) -> list[tuple[str, str]]:
    """One to three edits of a form: a name edited or new, a pair dropped or repeated,
    a value changed."""
    out = list(pairs)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        if op == 0 and out:
            at = rng.randrange(len(out))
            parts = out[at][0].split(".")
            parts[rng.randrange(len(parts))] = rng.choice(QUERY_PARTS)
            out[at] = (".".join(parts), out[at][1])
        elif op == 1:
            out.insert(rng.randint(0, len(out)), (r_query_name(rng), r_text(rng, 16)))
        elif op == 2 and out:
            del out[rng.randrange(len(out))]
        elif op == 3 and out:
            out.append(rng.choice(out))
        elif out:
            at = rng.randrange(len(out))
            out[at] = (out[at][0], r_text(rng, 16))
    return out


def query_check(pairs: list[tuple[str, str]]) -> str:
    """from_query: the JSON protocol's shape, or SqsError (a malformed form is a 400)."""
    try:
        params = from_query(pairs)
    except SqsError as err:
        return f"refused SqsError {err.shape}"
    json.dumps(params)  # the shape the actions read: JSON's
    return "accepted"


JSON_INPUTS = batches(st.one_of(
    st.dictionaries(st.text(max_size=12), VALUES, max_size=6).map(to_json),
    st.dictionaries(st.text(max_size=12), VALUES, max_size=6).map(to_json),
    VALUES.map(to_json), hostile_bytes("json"),
    st.text(max_size=40).map(lambda t: json.dumps({"a": t}).encode("utf-16")),
), lambda data, rng: mutate_encoded(data, "json", rng), 16)


def json_check(body: bytes) -> str:
    """from_json: a dict, or SqsError (a body that is not a JSON object is a 400)."""
    try:
        params = from_json(body)
    except SqsError as err:
        return f"refused SqsError {err.shape}"
    if not isinstance(params, dict):
        raise Violation("from_json returned something other than an object")
    return "accepted"


AKID, SECRET = "AKIDFUZZ0000000000", "fuzz-secret-access-key-0123456789"
SQS_KEYS = {AKID: (SECRET, NAMESPACE)}
#: Header text as aiohttp delivers it: bytes that are not UTF-8 arrive as lone
#: surrogates (U+DC80 to U+DCFF, Python's surrogateescape).
HEADER_CHARS = PRINTABLE + "\t é€\udce9\udcff"


@dataclass(frozen=True)
class AuthCase:
    """A request to verify. ``genuine``: True when botocore signed it and nothing the
    signature covers changed since, False when something it covers did (or the
    signature is made up), None when either may hold."""

    request: sqs_auth.Signed
    genuine: bool | None
    how: str


def botocore_signed(path: str, body: bytes, params: dict[str, str],
                    headers: dict[str, str]) -> sqs_auth.Signed:
    """A request as botocore signs it now, and as the node receives it."""
    request = AWSRequest("POST", f"http://sqs.local{path}", data=body, params=params,
                         headers=headers)
    SigV4Auth(Credentials(AKID, SECRET), "sqs", "us-east-1").add_auth(request)
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    sent = CIMultiDict(prepared.headers.items())
    sent["Host"] = parts.netloc
    return sqs_auth.Signed("POST", parts.path, parts.query, CIMultiDictProxy(sent),
                           prepared.body or b"")


def signed_with_header(req: sqs_auth.Signed, name: str, value: str | None) -> sqs_auth.Signed:
    headers = CIMultiDict(req.headers)
    headers.popall(name, None)
    if value is not None:
        headers[name] = value
    return replace(req, headers=CIMultiDictProxy(headers))


def _signed_headers(req: sqs_auth.Signed) -> list[str]:
    header = req.headers["Authorization"]
    return header.split("SignedHeaders=", 1)[1].split(",", 1)[0].lower().split(";")


def _auth_unsigned_header(rng: random.Random, req: sqs_auth.Signed) -> AuthCase:
    return AuthCase(signed_with_header(req, "User-Agent", r_text(rng, 40, HEADER_CHARS)), True,
                    "unsigned header changed")


def _auth_body(rng: random.Random, req: sqs_auth.Signed) -> AuthCase:
    body = mutate_bytes(req.body, rng)
    return AuthCase(replace(req, body=body), body == req.body, "body changed")


def _auth_date(rng: random.Random, req: sqs_auth.Signed) -> AuthCase:
    old = req.headers["X-Amz-Date"]
    roll = rng.randrange(4)
    new = mutate_text(old, rng) if roll == 0 else r_text(rng, 20, HEADER_CHARS) \
        if roll == 1 else None if roll == 2 else time.strftime(
            "%Y%m%dT%H%M%SZ", time.gmtime(time.time() + rng.randint(-2000, 2000)))
    return AuthCase(signed_with_header(req, "X-Amz-Date", new), new == old, "date changed")


def _auth_method(rng: random.Random, req: sqs_auth.Signed) -> AuthCase:
    method = rng.choice(["GET", "PUT", "post", "DELETE", "", r_text(rng, 8)])
    return AuthCase(replace(req, method=method), method.upper() == "POST", "method changed")


def _auth_signed_header(rng: random.Random, req: sqs_auth.Signed) -> AuthCase:
    name = rng.choice(["Host", "Content-Type", "X-Amz-Target"])
    old = req.headers.get(name)
    new = None if rng.random() < 0.2 else r_text(rng, 30, HEADER_CHARS)
    if name.lower() not in _signed_headers(req):  # an unsigned X-Amz-Target is refused
        same = new is None or name != "X-Amz-Target"
    else:
        same = new is not None and old is not None and old.split() == new.split()
    return AuthCase(signed_with_header(req, name, new), same, f"{name} changed")


def _auth_forged(rng: random.Random, req: sqs_auth.Signed) -> AuthCase:
    """An Authorization header built part by part; its signature is never right."""
    date = req.headers["X-Amz-Date"][:8]
    parts = [rng.choice([AKID, AKID, "AKIDOTHER", "", r_text(rng, 8)]),
             rng.choice([date, date, "20200101", "2026010", r_text(rng, 8)]),
             rng.choice(["us-east-1", "", r_text(rng, 8)]),
             rng.choice(["sqs", "sqs", "s3", r_text(rng, 4)]),
             rng.choice(["aws4_request", "aws4_request", "", r_text(rng, 8)])]
    signed = rng.choice(["host;x-amz-date", "x-amz-date", "host", "host;;", r_text(rng, 12)])
    sig = rng.choice([f"{rng.getrandbits(256):064x}", r_text(rng, 70, "0123456789abcdefABC")])
    sep = rng.choice([" ", "", "  ", "\t"])
    scheme = rng.choice(["AWS4-HMAC-SHA256", "AWS4-HMAC-SHA256", "AWS4-HMAC-SHA1", ""])
    header = (f"{scheme} Credential={'/'.join(parts)},{sep}SignedHeaders={signed},{sep}"
              f"Signature={sig}")
    return AuthCase(signed_with_header(req, "Authorization", header), False, "forged")


def _auth_anything(rng: random.Random, req: sqs_auth.Signed) -> AuthCase:
    """The Authorization header, path or query edited: refused or not, never a crash."""
    part = rng.choice(["Authorization", "raw_path", "raw_query"])
    if part == "Authorization":
        changed = signed_with_header(req, part, mutate_text(req.headers[part], rng))
    else:
        changed = replace(req, **{part: mutate_text(getattr(req, part) or "a", rng)})
    return AuthCase(changed, None, f"{part} changed")


AUTH_CHANGES = (_auth_unsigned_header, _auth_body, _auth_date, _auth_method,
                _auth_signed_header, _auth_forged, _auth_forged, _auth_anything,
                _auth_anything)
SQS_PATHS = ["/", "/default/q", "/default/q/", "/other/q", "/default/a%20b", "/./default//q"]


@st.composite
def signed_requests(draw: st.DrawFn) -> sqs_auth.Signed:
    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
               "User-Agent": "okq-fuzz"}
    if draw(st.booleans()):
        headers["X-Amz-Target"] = "AmazonSQS.ListQueues"
    return botocore_signed(draw(st.sampled_from(SQS_PATHS)), draw(st.binary(max_size=40)),
                           draw(st.dictionaries(SHORT_TEXT, SHORT_TEXT, max_size=3)), headers)


AUTH_INPUTS = st.builds(
    lambda req, rng: [AuthCase(req, True, "unchanged"),
                      *(rng.choice(AUTH_CHANGES)(rng, req) for _ in range(7))],
    signed_requests(), st.randoms(use_true_random=True))


def auth_check(case: AuthCase) -> str:
    """okq.sqs.auth.verify: the caller, or SqsError (a request whose signature is wrong,
    stale or missing is a 400/403). A genuine request verifies as its key; a request
    changed where the signature reaches is refused."""
    try:
        caller = sqs_auth.verify(case.request, SQS_KEYS, unsigned_namespace=None)
    except SqsError as err:
        if case.genuine:
            raise Violation(f"a genuine request was refused: {err.shape}") from ValueError(
                f"{case.how}: {err.message}")
        return f"refused SqsError {err.shape}"
    if case.genuine is False:
        raise Violation(f"{case.how}: verified a request that must be refused")
    if caller != sqs_auth.Caller(AKID, NAMESPACE):
        raise Violation(f"{case.how}: verified as {caller}")
    return f"accepted ({case.how})"


# -- the HTTP targets: a node in this process -----------------------------------------------

OPERATOR_KEY = "fuzz-operator-key-0123456789abcdef"


def node_settings() -> Settings:
    """The fuzzed node: small limits (all within the fuzzer's reach), long polls too
    short to wait for, an operator API key, an SQS key (the node signs what it posts
    to the SQS API with it: ``--sqs-unsigned`` cannot go with API keys)."""
    return Settings(store="memory://", signing_keys=TOKEN_KEY.decode(), self_check=False,
                    linger=0, max_wait=0.01, max_body_bytes=65_536, max_item_bytes=1024,
                    max_batch=50, api_keys=OPERATOR_KEY, sqs_keys=f"{AKID}:{SECRET}")


def sqs_signed(url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the SigV4 signature botocore gives a POST of ``body`` to
    ``url`` with the fuzzed node's SQS key."""
    request = AWSRequest("POST", url, data=body, headers=headers)
    SigV4Auth(Credentials(AKID, SECRET), "sqs", "us-east-1").add_auth(request)
    return dict(request.headers.items())


class Pool:
    """The fuzzed node's live and stale lease tokens, segment ids and API keys, for
    requests to aim at."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.segments: list[str] = []
        self.keys: list[str] = []  # made with keys.create, one per role

    def harvest(self, tokens: list[Any]) -> None:
        """Keep the tokens of a lease the fuzzer made (the last 64 of them)."""
        self.tokens[:] = [*self.tokens, *(t for t in tokens if isinstance(t, str))][-64:]

    def token(self, i: int) -> str:
        return self.tokens[i % len(self.tokens)] if self.tokens else "no-token"

    def segment(self, i: int) -> str:
        return self.segments[i % len(self.segments)] if self.segments else "no-segment"

    def key(self, i: int) -> str:
        return self.keys[i % len(self.keys)] if self.keys else OPERATOR_KEY


POOL = Pool()


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    headers: CIMultiDictProxy[str]
    body: bytes


class LogCatcher(logging.Handler):
    """The last exception okq or aiohttp logged (the cause behind a 5xx); keeps their
    logs off the terminal while the fuzzer runs."""

    LOGGERS = ("okq", "aiohttp")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: BaseException | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.last = record.exc_info[1]

    def take(self) -> BaseException | None:
        last, self.last = self.last, None
        return last


@contextmanager
def catching_logs() -> Iterator[LogCatcher]:
    catcher = LogCatcher()
    loggers = [logging.getLogger(name) for name in LogCatcher.LOGGERS]
    saved = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(catcher)
        logger.propagate = False
    try:
        yield catcher
    finally:
        for logger, propagate in zip(loggers, saved, strict=True):
            logger.removeHandler(catcher)
            logger.propagate = propagate


class Node:
    """An okq node in this process: create_app on a memory store behind aiohttp's test
    server (loopback), seeded with queues, items, live and stale lease tokens, a dead
    letter and a key of each role (unless ``seeded`` is false); rebuilt every
    RESET_EVERY requests."""

    def __init__(self, *, seeded: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self.client: TestClient[Any, Any] | None = None
        self.served = 0
        self.seeded = seeded

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        if self.client is None or self.served >= RESET_EVERY:
            self.loop.run_until_complete(self._restart())
        self.served += 1
        return self.loop.run_until_complete(self._post(path, body, headers))

    def close(self) -> None:
        if self.client is not None:
            self.loop.run_until_complete(self.client.close())
        self.loop.close()

    async def _post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        assert self.client is not None
        if not path.startswith(("/v1/", "/internal/")):  # the SQS API's: signed, as a client
            headers = sqs_signed(str(self.client.make_url(path)), body, headers)
        async with self.client.post(path, data=body, headers=headers,
                                    skip_auto_headers=["Content-Type"]) as resp:
            return Answer(resp.status, resp.content_type, resp.headers, await resp.read())

    async def _restart(self) -> None:
        if self.client is not None:
            await self.client.close()
        self.client = TestClient(TestServer(create_app(node_settings(), MemoryStore()),
                                            host="127.0.0.1"))
        await self.client.start_server()
        self.served = 0
        if self.seeded:
            await self._seed()

    async def _call(self, path: str, body: dict[str, Any]) -> Any:
        assert self.client is not None
        headers = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        async with self.client.post(path, json=body, headers=headers) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"seeding the fuzzed node: {path} answered {resp.status} "
                                   f"{await resp.text()}")
            return await resp.json()

    async def _seed(self) -> None:
        await self._call("/v1/queues.create", {"name": "dlq"})
        await self._call("/v1/queues.create", {"name": "q", "dead_queue": "dlq",
                                               "max_attempts": 3})
        await self._call("/v1/queues.create", {"name": "empty"})
        for n in range(3):
            await self._call("/v1/queue.produce", {"queue_name": "q", "items": [
                {"utf8": f"item {n}.{i}"} for i in range(10)]})
        leased = await self._call("/v1/queue.lease", {"queue_name": "q", "batch_size": 12})
        tokens = [item["token"] for item in leased["items"]]
        await self._call("/v1/queue.complete", {"queue_name": "q", "tokens": tokens[:2]})
        await self._call("/v1/queue.retry", {"queue_name": "q", "items": [
            {"token": tokens[2], "dead": True, "error": "seeded"}]})
        POOL.tokens[:] = tokens
        POOL.segments[:] = sorted({VERIFIER.verify(t, NAMESPACE).segment for t in tokens})
        if any(route.path == "/v1/keys.create" for route in ROUTES):
            POOL.keys[:] = [(await self._call("/v1/keys.create", {"role": role}))["key"]
                            for role in ("admin", "producer", "consumer", "read-only")]


@dataclass(frozen=True)
class HttpCase:
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def with_header(self, name: str, value: str | None) -> HttpCase:
        kept = tuple((k, v) for k, v in self.headers if k.lower() != name.lower())
        return replace(self, headers=kept if value is None else (*kept, (name, value)))


#: Header text an HTTP client sends (aiohttp's sends UTF-8).
CLIENT_CHARS = PRINTABLE + "é€"
CLIENT_TEXT = st.text(st.sampled_from(CLIENT_CHARS), max_size=40)
#: The fuzzed node's queues (most often), names near them, names past the limits.
QUEUE_NAMES = st.one_of(
    st.sampled_from(["q", "dlq", "empty"]), st.sampled_from(["q", "dlq", "empty"]),
    st.sampled_from(["q", "dlq", "empty"]),
    st.sampled_from(["missing", "Q", "q.", "-q", "", "x" * 128, "x" * 129]), NAMES,
)
POOL_TOKENS = st.integers(0, 255).map(POOL.token)
#: Tokens the node would sign, for deliveries that may not exist.
SIGNED_FAKES = st.builds(
    lambda queue, segment, index, v: MINTER.sign(Delivery(NAMESPACE, queue, segment, index, v)),
    QUEUE_NAMES, st.integers(0, 255).map(POOL.segment) | SHORT_TEXT,
    st.integers(-2, 40) | INT64, st.integers(0, 4) | INT64,
)
TOKENS = st.one_of(POOL_TOKENS, POOL_TOKENS, SIGNED_FAKES, SHORT_TEXT,
                   st.builds(mutate_text, POOL_TOKENS, st.randoms(use_true_random=True)))
TIMES = st.one_of(
    st.datetimes(timezones=st.none() | st.just(UTC)).map(lambda d: d.isoformat()),
    st.integers(-(2**40), 2**45), st.floats(), TIMESTAMPS,
    st.sampled_from(["9000-01-01T00:00:00Z", "9000-01-01T00:00:00.001Z", "1969-12-31T23:59:59Z",
                     "now", "", "2026-13-01", "2026-01-01T00:00:00+25:00"]),
)
BY_TYPE: dict[Any, st.SearchStrategy[Any]] = {
    str: SHORT_TEXT | st.sampled_from(["", "x" * 257, "x" * 4097]),
    int: st.integers(-3, 1100) | st.sampled_from(INTERESTING_INTS),
    float: st.floats() | st.integers(-5, 50_000) | st.sampled_from(
        [0.1, 0.01, 0.099, 43_200, 43_201, 3600, 3601, 1e308]),
    bool: st.booleans(),
    bytes: st.binary(max_size=40) | st.just(b"x" * 1025),
    datetime: TIMES,
}
NAMED: dict[str, st.SearchStrategy[Any]] = {
    "queue_name": QUEUE_NAMES, "name": QUEUE_NAMES, "dead_queue": QUEUE_NAMES,
    "token": TOKENS, "tokens": st.lists(TOKENS, max_size=4),
    "prefixes": st.lists(st.sampled_from(["q", "d", ""]) | SHORT_TEXT, max_size=3),
    "id": st.sampled_from(["0123456789abcdef", ""]) | SHORT_TEXT,
}


def for_annotation(name: str, annotation: Any) -> st.SearchStrategy[Any]:
    """Plausible values of a request field: by its name, else by its type."""
    if name in NAMED:
        return NAMED[name]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return for_annotation(name, args[0])
    if origin in (Union, UnionType):
        return st.one_of([for_annotation(name, a) for a in args])
    if origin is list:
        return st.lists(for_annotation(name, args[0]), max_size=4)
    if origin is dict:
        return st.dictionaries(SHORT_TEXT, VALUES, max_size=3)
    if origin is Literal:
        return st.sampled_from(args) | SHORT_TEXT
    if annotation is NoneType:
        return st.none()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return st.deferred(lambda: model_values(annotation))
    return BY_TYPE.get(annotation, VALUES)


@st.composite
def model_values(draw: st.DrawFn, model: type[BaseModel]) -> dict[str, Any]:
    """A body for ``model``: most often its required fields and some others, each
    plausible (three times in four) or anything; now and then a field it does not have."""
    names = list(model.model_fields)
    chosen = draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    if draw(st.integers(0, 3)):
        required = [n for n, f in model.model_fields.items() if f.is_required()]
        chosen = list(dict.fromkeys([*required, *chosen]))
    body = {}
    for name in chosen:
        plausible = for_annotation(name, model.model_fields[name].annotation)
        body[name] = draw(st.one_of(plausible, plausible, plausible, VALUES))
    if not draw(st.integers(0, 15)):
        body[draw(SHORT_TEXT)] = draw(VALUES)
    return body


OVERSIZE = st.integers(65_000, 70_000).map(
    lambda n: b'{"queue_name": "q", "pad": "' + b"a" * n + b'"}')


FUTURE = st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2100, 1, 1),
                     timezones=st.just(UTC)).map(lambda d: d.isoformat())
NEW_ITEMS = st.lists(st.one_of(
    st.fixed_dictionaries({"bytes": st.binary(max_size=40)}),
    st.fixed_dictionaries({"utf8": st.text(max_size=40)}, optional={"enqueue_at": FUTURE}),
    st.fixed_dictionaries({"bytes": st.binary(max_size=40), "key": st.text(min_size=1,
                                                                           max_size=20)}),
), min_size=1, max_size=5)
EXISTING = st.sampled_from(["q", "q", "dlq", "empty"])
#: Queues a purge or a delete may take away: the fuzzed node's busy queue "q" seldom.
DISPOSABLE = st.sampled_from(["empty", "empty", "empty", "dlq", "q", "missing"]) | NAMES
LEASE_TIMEOUTS = st.floats(LEASE_TIMEOUT_MIN, 120)
QUEUE_SETTINGS = {"lease_timeout": LEASE_TIMEOUTS, "retention": st.integers(RETENTION_MIN, 10**6),
                  "max_attempts": st.integers(0, 5), "dead_queue": st.just("dlq"),
                  "retention_dead_letter": st.booleans()}
#: A valid body of each endpoint, naming the fuzzed node's queues and live tokens.
VALID_BODIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "/v1/queue.produce": st.fixed_dictionaries({"queue_name": EXISTING, "items": NEW_ITEMS}),
    "/v1/queue.lease": st.fixed_dictionaries(
        {"queue_name": EXISTING}, optional={"batch_size": st.integers(1, 60),
                                            "lease_timeout": LEASE_TIMEOUTS,
                                            "request_timeout": st.sampled_from([0, 0.005]),
                                            "client_id": st.text(max_size=20)}),
    "/v1/queue.renew": st.fixed_dictionaries({"queue_name": st.just("q"), "token": POOL_TOKENS},
                                             optional={"lease_timeout": LEASE_TIMEOUTS}),
    "/v1/queue.complete": st.one_of(
        st.fixed_dictionaries({"queue_name": st.just("q"),
                               "tokens": st.lists(POOL_TOKENS, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"queue_name": st.just("q"), "tokens": st.tuples(POOL_TOKENS),
                               "outputs": st.fixed_dictionaries({"queue_name": EXISTING,
                                                                 "items": NEW_ITEMS})})),
    "/v1/queue.retry": st.fixed_dictionaries({"queue_name": st.just("q"), "items": st.lists(
        st.fixed_dictionaries({"token": POOL_TOKENS}, optional={
            "retry_at": FUTURE, "dead": st.booleans(), "error": st.text(max_size=30),
            "count_attempt": st.booleans()}), min_size=1, max_size=3)}),
    "/v1/queue.stats": st.fixed_dictionaries({"queue_name": EXISTING}),
    "/v1/queue.purge": st.fixed_dictionaries({"queue_name": DISPOSABLE}),
    "/v1/queues.create": st.fixed_dictionaries({"name": EXISTING | NAMES},
                                               optional=QUEUE_SETTINGS),
    "/v1/queues.list": st.just({}),
    "/v1/queues.info": st.fixed_dictionaries({"name": EXISTING}),
    "/v1/queues.update": st.fixed_dictionaries({"name": EXISTING}, optional=QUEUE_SETTINGS),
    "/v1/queues.delete": st.fixed_dictionaries({"name": DISPOSABLE}),
    "/v1/items.list": st.fixed_dictionaries({"queue_name": EXISTING}, optional={
        "limit": st.integers(1, 1000), "start_after": st.text(max_size=30)}),
    "/v1/dead.redrive": st.fixed_dictionaries({"queue_name": st.just("dlq")},
                                              optional={"limit": st.integers(1, 100)}),
    "/v1/keys.create": st.fixed_dictionaries(
        {"role": st.sampled_from(["admin", "producer", "consumer", "read-only"])},
        optional={"prefixes": st.lists(st.sampled_from(["q", "d", "e"]), max_size=2),
                  "name": st.text(max_size=20)}),
    "/v1/keys.list": st.just({}),
    "/v1/keys.delete": st.fixed_dictionaries({"id": st.integers(0, 3).map(
        lambda i: POOL.key(i).split("_")[1] if POOL.key(i).startswith("okq_") else "0" * 16)}),
}


def encoded_bodies(route: Any, kind: str) -> st.SearchStrategy[bytes]:
    """A valid body (for the routes VALID_BODIES knows), one shaped like its request
    model, any value, bytes no decoder should trust, a body over the limit."""
    valid = VALID_BODIES.get(route.path, model_values(route.request))
    valid = valid.map(lambda body: encode_as(body, kind))
    structured = model_values(route.request).map(lambda body: encode_as(body, kind))
    return st.one_of(valid, valid, valid, structured, structured, structured,
                     VALUES.map(lambda v: encode_as(v, kind)), hostile_bytes(kind), OVERSIZE)


#: Content-Types the node reads (most often), then ones it refuses.
CONTENT_TYPES = ["application/msgpack", "application/json", None, "application/x-msgpack",
                 "application/vnd.msgpack", "application/json; charset=utf-8",
                 "application/x-www-form-urlencoded", "APPLICATION/MSGPACK", "",
                 "application/msgpack; q=0.5"]
BAD_CONTENT_TYPES = ["text/plain", "application/octet-stream", "multipart/form-data; boundary=x"]
ACCEPTS = [None, "application/msgpack", "application/json", "*/*",
           "application/x-msgpack, application/json"]
NAMESPACE_HEADERS = ["default", "default", "other", "ns-2", "", "Bad Name", "_auth", "x" * 200]


def r_authorization(rng: random.Random) -> str | None:
    """The operator's key most often; a key of some role; a malformed or unknown one."""
    roll = rng.randrange(20)
    if roll < 14:
        return f"Bearer {OPERATOR_KEY}"
    if roll < 18:
        return f"Bearer {POOL.key(rng.randrange(4))}"
    if roll == 18:
        return rng.choice([None, "Bearer", "Bearer ", f"bearer  {OPERATOR_KEY} ",
                           f"Basic {OPERATOR_KEY}", "Bearer okq_0123456789abcdef_" + "A" * 43])
    if rng.random() < 0.5:
        return "Bearer " + mutate_text(POOL.key(rng.randrange(4)), rng, CLIENT_CHARS)
    return r_text(rng, 40, CLIENT_CHARS)


def r_okq_header(name: str, rng: random.Random) -> str | None:
    """A header's value: most often a plausible one, now and then any text."""
    if name == "Authorization":
        return r_authorization(rng)
    if name == "X-Okq-Namespace" and rng.random() < 0.85:
        return None  # the key's own namespace
    if name == "Content-Type" and rng.random() < 0.1:
        return rng.choice(BAD_CONTENT_TYPES)
    choices = {"Content-Type": CONTENT_TYPES, "Accept": ACCEPTS,
               "X-Okq-Namespace": NAMESPACE_HEADERS}[name]
    return rng.choice(choices) if rng.random() < 0.92 else r_text(rng, 40, CLIENT_CHARS)


def body_kind(case: HttpCase) -> str:
    ctype = (case.header("Content-Type") or "").lower()
    return "msgpack" if "msgpack" in ctype else "json"


@st.composite
def okq_requests(draw: st.DrawFn) -> HttpCase:
    """A POST to one of the API's endpoints (now and then to a path it does not have),
    half the time as okq's client sends it (its headers, a valid body), else with any
    plausible headers and a body in the encoding its Content-Type names (now and then in
    the other)."""
    route = draw(st.sampled_from(ROUTES))
    path = route.path if draw(st.integers(0, 31)) else "/v1/" + draw(CLIENT_TEXT)
    rng = draw(st.randoms(use_true_random=True))
    if draw(st.booleans()):  # what okq's client sends: the variations go from there
        case = HttpCase(path, b"", (("Authorization", f"Bearer {OPERATOR_KEY}"),
                                    ("Content-Type", rng.choice(["application/msgpack",
                                                                 "application/json"]))))
        valid = VALID_BODIES.get(route.path, model_values(route.request))
        return replace(case, body=draw(valid.map(lambda body: encode_as(body, body_kind(case)))))
    case = HttpCase(path, b"", ())
    for name in ("Content-Type", "Accept", "Authorization", "X-Okq-Namespace"):
        case = case.with_header(name, r_okq_header(name, rng))
    kind = body_kind(case)
    if not draw(st.integers(0, 15)):
        kind = "json" if kind == "msgpack" else "msgpack"  # a body that is not its type
    return replace(case, body=draw(encoded_bodies(route, kind)))


def vary_okq_request(case: HttpCase, rng: random.Random) -> HttpCase:
    """The body mutated (most often), a header swapped, another body, another endpoint."""
    roll = rng.randrange(8)
    if roll < 5:
        return replace(case, body=mutate_encoded(case.body, body_kind(case), rng))
    if roll == 5:
        name = rng.choice(["Content-Type", "Accept", "Authorization", "X-Okq-Namespace"])
        return case.with_header(name, r_okq_header(name, rng))
    if roll == 6:
        return replace(case, body=encode_as(r_value(rng), body_kind(case)))
    return replace(case, path=rng.choice(ROUTES).path)


def decoded_body(answer: Answer) -> Any:
    """The answer's body decoded by its Content-Type; None when it does not decode."""
    try:
        if answer.content_type in ("application/msgpack", "application/x-msgpack"):
            return msgpack.unpackb(answer.body, raw=False)
        if answer.content_type in ("application/json", "application/x-amz-json-1.0"):
            return json.loads(answer.body)
        if answer.content_type == "text/xml":
            return ET.fromstring(answer.body)
    except Exception:
        return None
    return None


def okq_answer(answer: Answer, cause: BaseException | None) -> str:
    """Below 500; a 4xx in okq's error shape ``{code, message, details}``."""
    value = decoded_body(answer)
    code = value.get("code") if isinstance(value, dict) else None
    if answer.status >= 500:
        raise Violation(f"HTTP {answer.status} {code}"
                        + (f": {crash_signature(cause)}" if cause else "")) from cause
    if value is None:
        raise Violation(f"HTTP {answer.status}: a body that is not {answer.content_type}")
    if answer.status < 400:
        return str(answer.status)
    if not (isinstance(value, dict) and set(value) == {"code", "message", "details"}
            and isinstance(code, str) and isinstance(value["message"], str)
            and isinstance(value["details"], dict)):
        raise Violation(f"HTTP {answer.status} without okq's error shape "
                        f"({answer.content_type})")
    return f"{answer.status} {code}"


# -- the SQS API over HTTP ---------------------------------------------------------------------

QUEUE_URLS = st.sampled_from([
    "http://127.0.0.1/default/q", "http://x/default/dlq", "/default/q", "http://x/other/q",
    "http://x/default/", "q", "", "http://x/default/missing", "http://x/default/q/extra",
]) | SHORT_TEXT
ARNS = st.sampled_from(["arn:aws:sqs:us-east-1:default:dlq", "arn:aws:sqs:us-east-1:default:q",
                        "arn:aws:sqs:us-east-1:other:q", "arn:aws:sqs:x"]) | SHORT_TEXT
NUMBERS = st.integers(-2, 1_300_000).map(str) | st.integers(-2, 1000) | st.sampled_from(
    ["", "1.5", "1e3", " 5", "0x10", "\u0663", "20", "21", "43200", "43201", "10", "11"])
ATTRIBUTE_NAMES = st.sampled_from([
    "All", "QueueArn", "CreatedTimestamp", "LastModifiedTimestamp",
    "ApproximateNumberOfMessages", "VisibilityTimeout", "MessageRetentionPeriod",
    "RedrivePolicy", "DelaySeconds", "ReceiveMessageWaitTimeSeconds", "MaximumMessageSize",
    "RedriveAllowPolicy", "Policy", "SqsManagedSseEnabled", "KmsDataKeyReusePeriodSeconds",
    "FifoQueue", "ApproximateReceiveCount", "SentTimestamp", "AWSTraceHeader",
]) | SHORT_TEXT
ATTRIBUTE_VALUES = NUMBERS | st.sampled_from([
    '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:default:dlq", "maxReceiveCount": "3"}',
    '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:default:q", "maxReceiveCount": 0}',
    '{"redrivePermission": "allowAll"}', '{"redrivePermission": "denyAll"}',
    '{"redrivePermission": "byQueue", "sourceQueueArns": ["arn:aws:sqs:us-east-1:default:q"]}',
    "{", "[]", "null", "true", "false",
]) | SHORT_TEXT
MESSAGE_ATTRIBUTES = st.dictionaries(
    SHORT_TEXT | st.sampled_from(["a", "b.c", "AWSTraceHeader"]),
    st.fixed_dictionaries({}, optional={
        "DataType": st.sampled_from(["String", "Number", "Binary", "String.x", "Custom"])
        | SHORT_TEXT,
        "StringValue": SHORT_TEXT | NUMBERS,
        "BinaryValue": st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode())
        | SHORT_TEXT,
        "StringListValues": st.lists(SHORT_TEXT, max_size=2),
    }), max_size=4)
ENTRIES = st.lists(st.fixed_dictionaries(
    {"Id": st.sampled_from(["a", "b", "1"]) | SHORT_TEXT},
    optional={"MessageBody": SHORT_TEXT, "ReceiptHandle": TOKENS, "VisibilityTimeout": NUMBERS,
              "DelaySeconds": NUMBERS, "MessageAttributes": MESSAGE_ATTRIBUTES}), max_size=12)
SQS_PARAMS: dict[str, st.SearchStrategy[Any]] = {
    "QueueUrl": QUEUE_URLS,
    "QueueName": st.sampled_from(["q", "dlq", "new-q", "x.fifo", "", "a" * 81]) | SHORT_TEXT,
    "QueueNamePrefix": SHORT_TEXT, "MessageBody": SHORT_TEXT, "ReceiptHandle": TOKENS,
    "DelaySeconds": NUMBERS, "MaxNumberOfMessages": NUMBERS, "WaitTimeSeconds": NUMBERS,
    "VisibilityTimeout": NUMBERS, "MaxResults": NUMBERS, "MaxNumberOfMessagesPerSecond": NUMBERS,
    "Attributes": st.dictionaries(ATTRIBUTE_NAMES, ATTRIBUTE_VALUES, max_size=4),
    "MessageAttributes": MESSAGE_ATTRIBUTES, "MessageSystemAttributes": MESSAGE_ATTRIBUTES,
    "AttributeNames": st.lists(ATTRIBUTE_NAMES, max_size=3),
    "MessageAttributeNames": st.lists(st.just("All") | SHORT_TEXT, max_size=3),
    "MessageSystemAttributeNames": st.lists(ATTRIBUTE_NAMES, max_size=3),
    "Entries": ENTRIES, "Tags": st.dictionaries(SHORT_TEXT, SHORT_TEXT, max_size=3),
    "TagKeys": st.lists(SHORT_TEXT, max_size=3), "SourceArn": ARNS, "DestinationArn": ARNS,
    "TaskHandle": SHORT_TEXT, "NextToken": SHORT_TEXT | NAMES.map(
        lambda n: base64.urlsafe_b64encode(n.encode()).decode()),
    "QueueOwnerAWSAccountId": SHORT_TEXT,
}
SQS_ACTIONS = [
    "CreateQueue", "GetQueueUrl", "ListQueues", "DeleteQueue", "PurgeQueue",
    "GetQueueAttributes", "SetQueueAttributes", "ListDeadLetterSourceQueues", "TagQueue",
    "UntagQueue", "ListQueueTags", "AddPermission", "SendMessage", "SendMessageBatch",
    "ReceiveMessage", "DeleteMessage", "DeleteMessageBatch", "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch", "StartMessageMoveTask", "ListMessageMoveTasks",
    "CancelMessageMoveTask", "close", "__init__", "",
]
SQS_REQUEST_PATHS = ["/", "/", "/default/q", "/default/dlq", "/other/q", "/default/missing"]


SQS_URL = "http://127.0.0.1/default/"
SQS_QUEUES = st.sampled_from([SQS_URL + "q", SQS_URL + "q", SQS_URL + "empty", SQS_URL + "dlq"])
SQS_DISPOSABLE = st.sampled_from([SQS_URL + "empty", SQS_URL + "new-q", SQS_URL + "q"])
SQS_NEW_NAMES = st.sampled_from(["q", "new-q", "empty"]) | st.from_regex(r"[A-Za-z0-9_-]{1,80}",
                                                                         fullmatch=True)
SQS_ATTRIBUTES = st.fixed_dictionaries({}, optional={
    "VisibilityTimeout": st.integers(0, 600).map(str),
    "DelaySeconds": st.integers(0, 900).map(str),
    "MessageRetentionPeriod": st.integers(60, 1_209_600).map(str),
    "ReceiveMessageWaitTimeSeconds": st.just("0"),
    "MaximumMessageSize": st.integers(1024, 1_048_576).map(str),
    "RedrivePolicy": st.integers(1, 5).map(lambda n: json.dumps({
        "deadLetterTargetArn": "arn:aws:sqs:us-east-1:default:dlq", "maxReceiveCount": n})),
    "RedriveAllowPolicy": st.just('{"redrivePermission": "allowAll"}'),
})
SQS_BODIES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xD7FF), min_size=1,
                     max_size=40)
SQS_MESSAGE_ATTRIBUTES = st.dictionaries(
    st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True), st.one_of(
        st.fixed_dictionaries({"DataType": st.just("String"), "StringValue": SQS_BODIES}),
        st.fixed_dictionaries({"DataType": st.just("Number"),
                               "StringValue": st.integers(-999, 999).map(str)}),
        st.fixed_dictionaries({"DataType": st.just("Binary"), "BinaryValue": st.binary(
            min_size=1, max_size=12).map(lambda b: base64.b64encode(b).decode())})),
    max_size=3)
ENTRY_IDS = st.sampled_from(["a", "b", "c", "d"])
SENDS = st.fixed_dictionaries({"Id": ENTRY_IDS, "MessageBody": SQS_BODIES},
                              optional={"DelaySeconds": st.integers(0, 900).map(str),
                                        "MessageAttributes": SQS_MESSAGE_ATTRIBUTES})
HANDLES = st.fixed_dictionaries({"Id": ENTRY_IDS, "ReceiptHandle": POOL_TOKENS},
                                optional={"VisibilityTimeout": st.integers(0, 600).map(str)})
DLQ_ARN = st.just("arn:aws:sqs:us-east-1:default:dlq")


def _sqs(required: dict[str, Any], **optional: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(required, optional=optional)


#: Valid parameters of each SQS action, naming the fuzzed node's queues and live handles.
SQS_VALID: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "CreateQueue": _sqs({"QueueName": SQS_NEW_NAMES}, Attributes=SQS_ATTRIBUTES,
                        tags=st.dictionaries(SHORT_TEXT, SHORT_TEXT, max_size=2)),
    "GetQueueUrl": _sqs({"QueueName": st.sampled_from(["q", "dlq", "empty", "missing"])}),
    "ListQueues": _sqs({}, QueueNamePrefix=st.sampled_from(["", "q", "e"]),
                       MaxResults=st.integers(1, 3).map(str)),
    "DeleteQueue": _sqs({"QueueUrl": SQS_DISPOSABLE}),
    "PurgeQueue": _sqs({"QueueUrl": SQS_DISPOSABLE}),
    "GetQueueAttributes": _sqs({"QueueUrl": SQS_QUEUES}, AttributeNames=st.lists(
        ATTRIBUTE_NAMES, max_size=3)),
    "SetQueueAttributes": _sqs({"QueueUrl": SQS_QUEUES, "Attributes": SQS_ATTRIBUTES}),
    "ListDeadLetterSourceQueues": _sqs({"QueueUrl": st.just(SQS_URL + "dlq")}),
    "TagQueue": _sqs({"QueueUrl": SQS_QUEUES, "Tags": st.dictionaries(
        SHORT_TEXT, SHORT_TEXT, min_size=1, max_size=3)}),
    "UntagQueue": _sqs({"QueueUrl": SQS_QUEUES, "TagKeys": st.lists(SHORT_TEXT, max_size=3)}),
    "ListQueueTags": _sqs({"QueueUrl": SQS_QUEUES}),
    "SendMessage": _sqs({"QueueUrl": SQS_QUEUES, "MessageBody": SQS_BODIES},
                        DelaySeconds=st.integers(0, 900).map(str),
                        MessageAttributes=SQS_MESSAGE_ATTRIBUTES),
    "SendMessageBatch": _sqs({"QueueUrl": SQS_QUEUES, "Entries": st.lists(
        SENDS, min_size=1, max_size=10, unique_by=lambda e: e["Id"])}),
    "ReceiveMessage": _sqs({"QueueUrl": SQS_QUEUES},
                           MaxNumberOfMessages=st.integers(1, 10).map(str),
                           VisibilityTimeout=st.integers(0, 600).map(str),
                           AttributeNames=st.just(["All"]),
                           MessageAttributeNames=st.just(["All"])),
    "DeleteMessage": _sqs({"QueueUrl": st.just(SQS_URL + "q"), "ReceiptHandle": POOL_TOKENS}),
    "DeleteMessageBatch": _sqs({"QueueUrl": st.just(SQS_URL + "q"), "Entries": st.lists(
        HANDLES, min_size=1, max_size=4, unique_by=lambda e: e["Id"])}),
    "ChangeMessageVisibility": _sqs({"QueueUrl": st.just(SQS_URL + "q"),
                                     "ReceiptHandle": POOL_TOKENS,
                                     "VisibilityTimeout": st.integers(0, 600).map(str)}),
    "ChangeMessageVisibilityBatch": _sqs({"QueueUrl": st.just(SQS_URL + "q"), "Entries": st.lists(
        HANDLES, min_size=1, max_size=4, unique_by=lambda e: e["Id"])}),
    "StartMessageMoveTask": _sqs({"SourceArn": DLQ_ARN}),
    "ListMessageMoveTasks": _sqs({"SourceArn": DLQ_ARN}),
    "CancelMessageMoveTask": _sqs({"TaskHandle": SHORT_TEXT}),
}


@st.composite
def sqs_params(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(list(SQS_PARAMS)), unique=True, max_size=6))
    if draw(st.integers(0, 3)):
        names = list(dict.fromkeys(["QueueUrl", *names]))
    return {n: draw(st.one_of(SQS_PARAMS[n], SQS_PARAMS[n], SQS_PARAMS[n], VALUES))
            for n in names}


#: The query protocol's flattened maps: JSON name -> (query name, key field, value field).
QUERY_MAPS = {"Attributes": ("Attribute", "Name", "Value"),
              "MessageAttributes": ("MessageAttribute", "Name", "Value"),
              "MessageSystemAttributes": ("MessageSystemAttribute", "Name", "Value"),
              "Tags": ("Tag", "Key", "Value")}
QUERY_LISTS = {"AttributeNames": "AttributeName", "MessageAttributeNames": "MessageAttributeName",
               "MessageSystemAttributeNames": "MessageSystemAttributeName", "TagKeys": "TagKey",
               "StringListValues": "StringListValue"}


def _flatten(name: str, value: Any, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{name}.{QUERY_LISTS.get(str(key), key)}", inner, out)
    elif isinstance(value, list):
        for n, inner in enumerate(value, 1):
            _flatten(f"{name}.{n}", inner, out)
    else:
        out.append((name, str(value)))


def to_query(action: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """JSON-shaped parameters as the query protocol flattens them."""
    out: list[tuple[str, str]] = [("Action", action), ("Version", "2012-11-05")]
    for key, value in params.items():
        if key in QUERY_MAPS and isinstance(value, dict):
            name, k, v = QUERY_MAPS[key]
            for n, (entry, inner) in enumerate(value.items(), 1):
                _flatten(f"{name}.{n}.{k}", entry, out)
                _flatten(f"{name}.{n}.{v}", inner, out)
        elif key == "Entries":
            _flatten(f"{action}RequestEntry", value, out)
        else:
            _flatten(QUERY_LISTS.get(key, key), value, out)
    return out


def form(pairs: list[tuple[str, str]]) -> bytes:
    return urlencode(pairs).encode()


@st.composite
def sqs_requests(draw: st.DrawFn) -> HttpCase:
    """A request to the SQS API, in the JSON protocol or the query protocol."""
    path = draw(st.sampled_from(SQS_REQUEST_PATHS))
    known = st.sampled_from(SQS_ACTIONS)
    action = draw(st.one_of(known, known, known, st.text(st.sampled_from(PRINTABLE),
                                                          max_size=12)))
    valid = SQS_VALID.get(action, sqs_params())
    params = st.one_of(valid, valid, valid, sqs_params(), sqs_params())
    if draw(st.booleans()):
        body = st.one_of(params.map(to_json), params.map(to_json), params.map(to_json),
                         VALUES.map(to_json), hostile_bytes("json"))
        headers = (("X-Amz-Target", f"AmazonSQS.{action}"),
                   ("Content-Type", "application/x-amz-json-1.0"))
        return HttpCase(path, draw(body), headers)
    body = st.one_of(params.map(lambda p: form(to_query(action, p))),
                     params.map(lambda p: form(to_query(action, p))),
                     params.map(lambda p: form(to_query(action, p))),
                     QUERY_PAIRS.map(lambda p: form([("Action", action), *p])),
                     st.binary(max_size=40))
    return HttpCase(path, draw(body), (("Content-Type", "application/x-www-form-urlencoded"),))


def vary_sqs_request(case: HttpCase, rng: random.Random) -> HttpCase:
    """The body mutated as JSON or as a form (most often) or as bytes, another path,
    another action."""
    roll = rng.randrange(8)
    json_protocol = case.header("X-Amz-Target") is not None
    if roll < 3 and json_protocol:
        return replace(case, body=mutate_encoded(case.body, "json", rng))
    if roll < 3:
        pairs = parse_qsl(case.body.decode(errors="replace"), keep_blank_values=True)
        return replace(case, body=form(vary_pairs(pairs, rng)))
    if roll < 6:
        return replace(case, body=mutate_bytes(case.body, rng))
    if roll == 6:
        return replace(case, path=rng.choice(SQS_REQUEST_PATHS))
    action = rng.choice(SQS_ACTIONS)
    if json_protocol:
        return case.with_header("X-Amz-Target", f"AmazonSQS.{action}")
    pairs = [(k, v) for k, v in parse_qsl(case.body.decode(errors="replace"),
                                          keep_blank_values=True) if k != "Action"]
    return replace(case, body=form([("Action", action), *pairs]))


def sqs_answer(answer: Answer, json_protocol: bool, cause: BaseException | None) -> str:
    """Below 500; an error in SQS's shape for the request's protocol (JSON: ``__type``
    and ``message``; query: an ``ErrorResponse`` XML document with a ``Code``)."""
    value = decoded_body(answer)
    if answer.status >= 500:
        raise Violation(f"SQS HTTP {answer.status} {_sqs_code(value)}"
                        + (f": {crash_signature(cause)}" if cause else "")) from cause
    if value is None:
        raise Violation(f"SQS HTTP {answer.status}: a body that does not parse as "
                        f"{answer.content_type}")
    if answer.status < 400:
        return str(answer.status)
    if json_protocol and not (isinstance(value, dict) and isinstance(value.get("__type"), str)
                              and isinstance(value.get("message"), str)):
        raise Violation(f"SQS HTTP {answer.status} without the JSON protocol's error shape")
    code = _sqs_code(value)
    if code is None:
        raise Violation(f"SQS HTTP {answer.status} without an error code")
    return f"{answer.status} {code}"


def _sqs_code(value: Any) -> str | None:
    if isinstance(value, dict):
        shape = value.get("__type")
        return shape.rsplit("#", 1)[-1] if isinstance(shape, str) else None
    if isinstance(value, ET.Element) and value.tag.endswith("ErrorResponse"):
        code = value.find(".//{*}Code")
        return code.text if code is not None else None
    return None


# -- the targets -------------------------------------------------------------------------------

Run = Callable[[Report, int, int], None]


@dataclass(frozen=True)
class Target:
    name: str
    feeds: str
    allowed: str  # the outcomes allowed besides a value, and why
    run: Run


def pure(inputs: st.SearchStrategy[list[Any]], check: Check, per_batch: int) -> Run:
    def run(report: Report, n: int, seed: int) -> None:
        drive(report, inputs, check, n, seed, per_batch)

    return run


def over_http(requests: st.SearchStrategy[list[HttpCase]],
              judge: Callable[[HttpCase, Answer, BaseException | None], str],
              per_batch: int) -> Run:
    """Send each request to a node in this process and judge its answer."""
    def run(report: Report, n: int, seed: int) -> None:
        with catching_logs() as catcher:
            node = Node()

            def check(case: HttpCase) -> str:
                answer = node.post(case.path, case.body, dict(case.headers))
                return judge(case, answer, catcher.take())

            try:
                drive(report, requests, check, n, seed, per_batch)
            finally:
                node.close()

    return run


def _okq_judge(case: HttpCase, answer: Answer, cause: BaseException | None) -> str:
    outcome = okq_answer(answer, cause)
    if case.path == "/v1/queue.lease" and answer.status == 200:
        POOL.harvest([i.get("token") for i in decoded_body(answer)["items"]])
    return outcome


def _sqs_judge(case: HttpCase, answer: Answer, cause: BaseException | None) -> str:
    json_protocol = case.header("X-Amz-Target") is not None
    outcome = sqs_answer(answer, json_protocol, cause)
    value = decoded_body(answer) if json_protocol and answer.status == 200 else None
    if isinstance(value, dict) and isinstance(value.get("Messages"), list):
        POOL.harvest([m.get("ReceiptHandle") for m in value["Messages"]])
    return outcome


TARGETS: dict[str, Target] = {t.name: t for t in [
    *(Target(kind, f"okq.model.decode_{kind}", "FormatError: stored bytes that do not decode "
             "are reported as such, with the bytes; and what decodes re-encodes to an equal "
             "object", pure(object_inputs(kind), object_check(kind), 16))
      for kind in CODECS),
    Target("token", "okq.tokens.TokenSigner.verify", "InvalidToken: a token that is not "
           "genuine or not of this namespace is a 400; a genuine one verifies as exactly its "
           "delivery, an edited one never", pure(TOKEN_INPUTS, token_check, 16)),
    Target("http", "POST /v1/* of a node (every route of okq.server.routes.ROUTES)",
           "any status below 500; a 4xx carries okq's {code, message, details}",
           over_http(batches(okq_requests(), vary_okq_request, 8), _okq_judge, 8)),
    Target("sqs-query", "okq.sqs.protocol.from_query", "SqsError: a malformed form is a 400",
           pure(batches(QUERY_PAIRS, vary_pairs, 16), query_check, 16)),
    Target("sqs-json", "okq.sqs.protocol.from_json", "SqsError: a body that is not a JSON "
           "object is a 400", pure(JSON_INPUTS, json_check, 16)),
    Target("sqs-auth", "okq.sqs.auth.verify", "SqsError: a missing, malformed, stale or wrong "
           "signature is a 400/403; a genuine request verifies", pure(AUTH_INPUTS, auth_check, 8)),
    Target("sqs-http", "POST / and queue URLs of the SQS API (signed with an SQS key)",
           "any status below 500, with SQS's error shape for the request's protocol",
           over_http(batches(sqs_requests(), vary_sqs_request, 8), _sqs_judge, 8)),
]}


def run_target(target: Target, n: int, seed: int) -> Report:
    report = Report(target.name)
    began = time.perf_counter()
    target.run(report, n, seed)
    report.seconds = time.perf_counter() - began
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz",
                                     description="Fuzzers for okq's decoders (tests/fuzz.py).")
    parser.add_argument("--inputs", type=int, default=DEFAULT_INPUTS,
                        help="inputs per target (default %(default)s)")
    parser.add_argument("--target", default=",".join(TARGETS),
                        help="comma-separated targets (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    args = parser.parse_args(argv)
    if args.list:
        for t in TARGETS.values():
            print(f"{t.name:10} {t.feeds}\n{'':10} allowed: {t.allowed}")
        return 0
    names = [n.strip() for n in args.target.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    reports = []
    for name in names:
        reports.append(run_target(TARGETS[name], args.inputs, args.seed))
        print(reports[-1].summary(), flush=True)
    failures = [r.describe_failures() for r in reports if r.failures]
    print("\n".join(failures) if failures else "no failure", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
