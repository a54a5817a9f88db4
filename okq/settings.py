"""Configuration, read once at the edge (the CLI) and passed down.

Every setting is an ``OKQ_*`` environment variable and an ``okq serve`` flag.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlparse

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from okq.auth import check_new_key
from okq.engine import EngineOptions
from okq.keys import check_name
from okq.limits import MAX_BATCH_MAX, PARTITIONS_MAX, REQUEST_TIMEOUT_MAX
from okq.loops import Choice as LoopChoice
from okq.model import CHUNK_SEGMENTS
from okq.store import DEFAULT_S3_CLIENT, DEFAULT_S3_TIMEOUT

log = logging.getLogger("okq.settings")

DEFAULT_STORE = "file://./okq-data"
#: The produce linger of a node in sequencer mode: calls forwarded by other nodes
#: reach the holder spread by their extra hop; a wider window gathers them into
#: one segment as one node's calls are (docs/OPERATIONS.md, "A fleet").
SEQUENCER_LINGER = 0.01
#: What --log-level takes (in any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OKQ_", extra="forbid")

    store: str = Field(
        DEFAULT_STORE,
        description="where state lives: file://DIR (default ./okq-data), s3://bucket/prefix, "
        "or memory:// (lost on exit)",
    )
    endpoint_url: str | None = Field(
        None, description="S3 endpoint URL for s3:// stores (MinIO, SeaweedFS, R2, ...)"
    )
    s3_client: Literal["aioboto3", "obstore"] = Field(
        "obstore",
        description="the S3 client of s3:// stores: obstore (Rust, a fifth of aioboto3's CPU "
        "per request) or aioboto3; a client=... in the store URL wins",
    )
    s3_timeout: float = Field(
        DEFAULT_S3_TIMEOUT, gt=0, le=600,
        description="seconds one S3 request may take, connecting included, before it fails "
        "and okq retries it: the longest a request that never answers stalls a queue",
    )
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(7878, ge=0, le=65535, description="port to listen on (0: any free port)")
    namespace: str = Field("default", description="key prefix in the store: a tenant")
    signing_keys: SecretStr | None = Field(
        None,
        description="comma-separated lease-token signing keys (16+ characters each); the "
        "first signs, all verify. Every node of a fleet needs the same list.",
    )
    signing_keys_file: Path | None = Field(
        None, description="file with one signing key per line (instead of signing_keys)"
    )
    token_format: int = Field(
        2, ge=1, le=2,
        description="the lease-token layout this node signs; every node reads both. 1 while "
        "a fleet still runs okq older than format 2, which reads only 1 (docs/DESIGN.md, "
        "\"Tokens\")",
    )
    manifest_chunk: int = Field(
        CHUNK_SEGMENTS, ge=0, le=100_000,
        description="segments per manifest chunk: a publish rewrites a manifest head of fewer "
        "segments than this plus a reference per chunk, whatever the backlog. 0 cuts no "
        "chunks, keeping manifests in format 1 while a fleet still runs okq older than "
        "chunks, which cannot read format 2 (docs/DESIGN.md, \"Manifests\")",
    )
    default_partitions: int = Field(
        1, ge=1, le=PARTITIONS_MAX,
        description="partitions of a queue created without saying how many: a queue of "
        "several is served by as many sequencer holders (docs/DESIGN.md, \"Partitions\")",
    )
    api_keys: SecretStr | None = Field(
        None,
        description="comma-separated operator API keys (admin in every namespace); when "
        "set, every /v1 call needs 'Authorization: Bearer KEY': an operator key or one "
        "made with keys.create (/health and /metrics stay open; docs/SECURITY.md)",
    )
    require_api_keys: bool = Field(
        False,
        description="ask every /v1 call for a key even without --api-keys (keys made "
        "earlier with keys.create are kept in the store)",
    )
    api_key_cache: float = Field(
        5.0, ge=0, le=3600,
        description="seconds a node remembers a key it looked up: a deleted key stops "
        "working within this long",
    )
    max_namespaces: int = Field(
        100, ge=1, le=100_000,
        description="namespaces one node serves at once (its own and its callers' keys')",
    )
    tls_cert: Path | None = Field(
        None, description="PEM certificate (chain) file: serve HTTPS instead of HTTP"
    )
    tls_key: Path | None = Field(None, description="PEM private key file of --tls-cert")
    max_connections: int = Field(
        1000, ge=1, le=1_000_000,
        description="open client connections before new ones are refused (503)",
    )
    max_header_bytes: int = Field(
        8190, ge=1024, le=65536,
        description="longest request line and header field, bytes (400 over it)",
    )
    request_read_timeout: float = Field(
        60, gt=0, le=3600,
        description="seconds a client may take to send a request's headers and body "
        "(a slow client is cut off; long polls wait on the node, not the client)",
    )
    linger: float | None = Field(
        None, ge=0, le=1,
        description="seconds to gather a produce batch while no lease waits for the queue "
        "and the connections of the last batch have not all called again with 100 items "
        "or more (default 0.005; 0.01 in sequencer mode, where forwarded calls reach the "
        "holder less together)",
    )
    max_item_bytes: int = Field(1 << 20, ge=1, le=64 << 20, description="largest item payload")
    max_batch: int = Field(1000, ge=1, le=MAX_BATCH_MAX,
                           description="most items per produce or lease")
    max_body_bytes: int = Field(8 << 20, ge=1024, le=256 << 20, description="largest request body")
    max_wait: float = Field(900, ge=0, le=REQUEST_TIMEOUT_MAX,
                            description="longest long poll, seconds")
    idle_poll_max: float = Field(
        5.0, ge=0.05, le=60,
        description="seconds at most between a long poll's looks at a queue whose manifest "
        "has not changed (from 0.25, doubling): the idle cost without the sequencer, and "
        "how late a produce through another node reaches a waiting lease (one through "
        "this node wakes it at once)",
    )
    depth_interval: float = Field(
        60, ge=0, le=86_400,
        description="seconds between refreshes of the okq_queue_items gauges, made when "
        "/metrics is scraped (one stats call per queue this node knows); 0: only "
        "queue.stats calls refresh them",
    )
    depth_max_queues: int = Field(
        100, ge=1, le=100_000, description="queues whose depth gauges a refresh keeps fresh"
    )
    max_waiting: int = Field(
        100, ge=1, le=100_000, description="waiting lease requests per queue before 429"
    )
    max_pending_produce: int = Field(
        50_000, ge=1, description="items waiting to be published per queue before 503"
    )
    idem_window: float = Field(
        300, ge=1, le=86_400, description="seconds a producer idempotency key is honoured"
    )
    max_idempotency_keys: int = Field(
        10_000, ge=1, le=1_000_000,
        description="live idempotency keys per queue (kept in its manifest) before 429",
    )
    sequencer: bool = Field(
        False,
        description="sequencer mode: one node per shard, elected through a role object in "
        "the store, batches the fleet's writes; the others forward to it (docs/OPERATIONS.md)",
    )
    advertise_url: str | None = Field(
        None,
        description="the URL other nodes reach this node at, in sequencer mode "
        "(default http://HOST:PORT of the listener)",
    )
    sequencer_shards: int = Field(
        1, ge=1, le=1024,
        description="sequencer roles: queues are spread over this many, each held by one node",
    )
    role_ttl: float = Field(
        45, ge=3, le=3600,
        description="seconds a sequencer role lasts unrenewed (renewed every third of it); "
        "a holder that dies or hangs is replaced within seconds (its port refuses, or it "
        "answers no ping); one cut off from the store steps down after this long",
    )
    sqs: bool = Field(
        True,
        description="serve the SQS-compatible API on the same port (docs/SQS.md); it "
        "answers only requests signed with an --sqs-keys key, unless --sqs-unsigned",
    )
    sqs_keys: SecretStr | None = Field(
        None,
        description="comma-separated ACCESS_KEY_ID:SECRET_ACCESS_KEY[:NAMESPACE[:ROLE[:PREFIXES]]] "
        "for the SQS API (AWS Signature Version 4); a key acts in its namespace (default: the "
        "node's) with its role (default: admin) on queues starting with one of its "
        "'+'-separated prefixes (default: every queue), as an API key does",
    )
    sqs_keys_file: Path | None = Field(
        None, description="file with one ACCESS_KEY_ID:SECRET[:NAMESPACE[:ROLE[:PREFIXES]]] "
        "per line (instead of sqs_keys)",
    )
    sqs_unsigned: bool = Field(
        False,
        description="also accept unsigned SQS requests, acting with every right in the "
        "node's namespace: for local development only, never where others can reach the "
        "port; refused with --api-keys or --require-api-keys",
    )
    sqs_region: str = Field(
        "us-east-1", pattern=r"^[a-z0-9-]{1,32}$",
        description="the region in the SQS API's queue ARNs",
    )
    sqs_url: str | None = Field(
        None,
        description="the base of the SQS API's queue URLs, e.g. https://queues.example.com "
        "(default: the scheme and Host of each request)",
    )
    console: bool = Field(
        True, description="serve the web console at /ui (its data comes from the /v1 API, "
        "with the user's key: docs/CONSOLE.md)",
    )
    report_interval: float = Field(
        60, ge=0, le=86_400,
        description="seconds between this process's presence reports in the store (one PUT "
        "each: the console's fleet page, docs/CONSOLE.md); 0: none",
    )
    self_check: bool = Field(True, description="check the store honours conditional writes")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR")
    access_log: bool = Field(
        False,
        description="log a line per HTTP request (aiohttp's access log, at INFO): about "
        "170,000 instructions a request, a fifth of what a lease of 10 items costs otherwise. "
        "/metrics counts requests by endpoint and status either way",
    )
    event_loop: LoopChoice = Field(
        "auto",
        description="the node's event loop: uvloop's (C; about 5 % fewer instructions per "
        "lease+complete message) or asyncio's; auto takes uvloop where it is installed",
    )

    @model_validator(mode="after")
    def _client_in_url(self) -> Settings:
        """Carry ``s3_client`` in the store URL, the one thing every caller of
        ``open_store`` passes on (the node, the compactor, a fleet's nodes)."""
        if self.s3_client != DEFAULT_S3_CLIENT and self.store.startswith("s3://"):
            if "client" not in parse_qs(urlparse(self.store).query):
                sep = "&" if "?" in self.store else "?"
                self.store = f"{self.store}{sep}client={self.s3_client}"
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        return self

    @model_validator(mode="after")
    def _sqs_unsigned_only_where_no_key_is_asked(self) -> Settings:
        """An unsigned SQS request acts with every right in the node's namespace (the
        SQS API has no roles): beside API keys, it would walk round them."""
        if self.sqs and self.sqs_unsigned and (self.require_api_keys or self.api_key_set()):
            raise ValueError(
                "--sqs-unsigned cannot go with --api-keys or --require-api-keys: every "
                "unsigned SQS request would act with every right in namespace "
                f"{self.namespace!r} (create, purge and delete queues, read and delete "
                "messages) without a key. Give the SQS API keys instead (--sqs-keys)")
        return self

    @field_validator("namespace")
    @classmethod
    def _ns(cls, value: str) -> str:
        return check_name(value, "namespace")

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        level = value.upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"must be {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}, "
                             f"not {value!r}")
        return level

    def keys(self) -> list[bytes]:
        """The signing keys; a random development key (with a warning) when none is set."""
        raw: list[str] = []
        if self.signing_keys is not None:
            raw = [k.strip() for k in self.signing_keys.get_secret_value().split(",")]
        elif self.signing_keys_file is not None:
            raw = [k.strip() for k in self.signing_keys_file.read_text().splitlines()]
        keys = [k.encode() for k in raw if k]
        if not keys:
            log.warning(
                "no signing keys configured (OKQ_SIGNING_KEYS): using a random development "
                "key. Lease tokens will not survive a restart and other nodes cannot "
                "verify them."
            )
            return [secrets.token_hex(32).encode()]
        short = [n for n, k in enumerate(keys) if len(k) < 16]
        if short:
            raise ValueError(f"signing key #{short[0] + 1} is shorter than 16 characters")
        return keys

    def api_key_set(self) -> frozenset[str]:
        if self.api_keys is None:
            return frozenset()
        return frozenset(k.strip() for k in self.api_keys.get_secret_value().split(",")
                         if k.strip())

    def sqs_credentials(self) -> dict[str, tuple[str, str, str, tuple[str, ...]]]:
        """The SQS API's keys: access key id -> (secret, namespace, role, queue
        prefixes), from ``ACCESS_KEY_ID:SECRET[:NAMESPACE[:ROLE[:PREFIX+PREFIX...]]]``
        (by default the node's namespace, admin, every queue)."""
        if self.sqs_keys is not None:
            lines = self.sqs_keys.get_secret_value().split(",")
        elif self.sqs_keys_file is not None:
            lines = self.sqs_keys_file.read_text().splitlines()
        else:
            return {}
        keys: dict[str, tuple[str, str, str, tuple[str, ...]]] = {}
        for n, line in enumerate(x.strip() for x in lines):
            if not line:
                continue
            parts = line.split(":")
            if not 2 <= len(parts) <= 5 or not parts[0] or not parts[1]:
                raise ValueError(f"SQS key #{n + 1} is not "
                                 "ACCESS_KEY_ID:SECRET[:NAMESPACE[:ROLE[:PREFIXES]]]")
            namespace = check_name(parts[2], "sqs_keys namespace") if len(parts) > 2 \
                and parts[2] else self.namespace
            role = parts[3] if len(parts) > 3 and parts[3] else "admin"
            prefixes = [p for p in parts[4].split("+") if p] if len(parts) > 4 else []
            check_new_key(role, prefixes, "")
            keys[parts[0]] = (parts[1], namespace, role, tuple(prefixes))
        return keys

    def engine_options(self) -> EngineOptions:
        return EngineOptions(
            linger=self.linger if self.linger is not None else (
                SEQUENCER_LINGER if self.sequencer else EngineOptions.linger),
            max_item_bytes=self.max_item_bytes,
            max_batch=self.max_batch,
            max_wait=self.max_wait,
            idle_poll_max=self.idle_poll_max,
            idem_window=self.idem_window,
            max_idem_keys=self.max_idempotency_keys,
            manifest_chunk=self.manifest_chunk,
        )
