"""Object stores as the simulation sees them: a latency distribution per kind of
request, request-rate limits (per bucket, per prefix, per object), prices, and
for the local profile a server whose CPU shares the machine.

Figures and where they come from (the profiles' ``source`` says it in short):

* S3 Standard: at least 3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests
  per second per partitioned prefix, 503 SlowDown beyond (AWS, "Best practices
  design patterns: optimizing Amazon S3 performance"); a fresh bucket is one
  partition until S3 splits it, which takes a while under sustained load. Small
  requests' median latency "often in the tens of milliseconds" (AWS whitepaper
  "Timeouts and Retries for Latency-Sensitive Applications"): assumed 15 ms GET
  and 25 ms PUT at the median, 60 and 100 ms at p99. Prices from BRIEF.md:
  $0.005 per 1,000 PUT/LIST, $0.0004 per 1,000 GET.
* S3 Express One Zone: "consistent single-digit millisecond" first-byte latency
  (AWS, "Optimizing S3 Express One Zone performance"; assumed 2.5 / 4 ms median,
  6 / 10 ms p99); by default a directory bucket supports up to 200,000 reads and
  100,000 writes per second (same page). Prices from the S3 FAQ's worked example:
  $0.00113 per 1,000 PUT, $0.00003 per 1,000 GET, $0.0032 per GB uploaded and
  $0.0006 per GB retrieved.
* Google Cloud Storage: "an update limit on each object of once per second" and
  buckets that "initially support roughly 1000 writes per second" and 5,000 reads,
  "then scale as needed" (cloud.google.com/storage/quotas); latency assumed 20 /
  40 ms median, 80 / 150 ms p99 (no published figure). Class A $0.005 and class B
  $0.0004 per 1,000 (cloud.google.com/storage/pricing, Standard, one region).
* MinIO-like: a self-hosted server on the LAN, no request limits, no request
  prices; assumed 1.5 / 3 ms median, 5 / 10 ms p99.
* seaweed-local: SeaweedFS (weed mini) on this machine's loopback: its CPU per
  request runs on the machine's cores (calibration.py); what is left of a
  request's time is small (bench_s3_client.py: an obstore PUT of 100 KiB takes
  4.7 to 5.3 ms sequentially, nearly all of it the two processes' CPU). Priced as
  S3 Standard, as bench_fleet.py does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .calibration import Calibration
from .engine import Proc, Process, Sim

Z99 = 2.3263  # the standard normal's 99th percentile
COUNTS = ("get", "put", "throttled", "kib_in", "kib_out")  # requests, KiB moved


@dataclass(frozen=True)
class Latency:
    """Lognormal, given by its median and 99th percentile in milliseconds."""

    median_ms: float
    p99_ms: float

    def sample(self, sim: Sim) -> float:
        sigma = math.log(self.p99_ms / self.median_ms) / Z99
        return sim.rng.lognormvariate(math.log(self.median_ms / 1000), sigma)


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    get: Latency
    put: Latency
    price_put: float  # dollars per PUT-class request
    price_get: float  # dollars per GET-class request
    price_gb_in: float = 0.0  # dollars per GB written
    price_gb_out: float = 0.0  # dollars per GB read
    prefix_put: float | None = None  # PUT-class requests per second per prefix
    prefix_get: float | None = None
    bucket_put: float | None = None  # per bucket
    bucket_get: float | None = None
    object_put: float | None = None  # writes per second to one object
    net_ms: float = 0.25  # one way, client to node and node to node
    local: bool = False  # SeaweedFS on the machine: its CPU counts
    source: str = ""


PROFILES = {p.name: p for p in (
    Profile("s3", "S3 Standard", Latency(15, 60), Latency(25, 100), 0.005e-3, 0.0004e-3,
            prefix_put=3500, prefix_get=5500,
            source="AWS S3 performance guidelines; prices BRIEF.md"),
    Profile("s3express", "S3 Express One Zone", Latency(2.5, 6), Latency(4, 10),
            0.00113e-3, 0.00003e-3, price_gb_in=0.0032, price_gb_out=0.0006,
            bucket_put=100_000, bucket_get=200_000,
            source="AWS S3 Express One Zone performance page; S3 FAQ prices"),
    Profile("gcs", "Google Cloud Storage", Latency(20, 80), Latency(40, 150),
            0.005e-3, 0.0004e-3, bucket_put=1000, bucket_get=5000, object_put=1.0,
            source="cloud.google.com/storage/quotas and /pricing"),
    Profile("minio", "MinIO-like (LAN)", Latency(1.5, 5), Latency(3, 10), 0.0, 0.0,
            source="assumed: a LAN and NVMe, no limits, self-hosted"),
    Profile("seaweed-local", "SeaweedFS on loopback (this machine)", Latency(0.4, 2),
            Latency(0.6, 3), 0.005e-3, 0.0004e-3, net_ms=0.08, local=True,
            source="calibration.py; priced as S3 Standard"),
)}


class Bucket:
    """A token bucket: ``rate`` a second, ``burst`` at most saved up."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, 0.0

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class Store:
    """One bucket. ``request`` runs one request for a node, retrying a throttled
    one with jittered back-off (25 ms doubling to 1.6 s), as an SDK does on 503."""

    def __init__(self, sim: Sim, profile: Profile, cal: Calibration,
                 server: Process | None) -> None:
        self.sim, self.profile, self.cal, self.server = sim, profile, cal, server
        self.counts = dict.fromkeys(COUNTS, 0.0)
        self._limits: dict[tuple[str, str], Bucket] = {}

    def _limit(self, scope: str, name: str, rate: float | None, burst: float) -> bool:
        if rate is None:
            return True
        bucket = self._limits.get((scope, name))
        if bucket is None:
            bucket = self._limits[(scope, name)] = Bucket(rate, max(1.0, burst))
        return bucket.take(self.sim.now)

    def _allowed(self, op: str, key: str, prefix: str) -> bool:
        p = self.profile
        if op == "put":
            return (self._limit("bucket-put", "", p.bucket_put, 0.1 * (p.bucket_put or 0))
                    and self._limit("prefix-put", prefix, p.prefix_put,
                                    0.1 * (p.prefix_put or 0))
                    and self._limit("object", key, p.object_put, 1.0))
        return (self._limit("bucket-get", "", p.bucket_get, 0.1 * (p.bucket_get or 0))
                and self._limit("prefix-get", prefix, p.prefix_get, 0.1 * (p.prefix_get or 0)))

    def request(self, node: Process, io: Process, op: str, key: str, prefix: str,
                kib: float) -> Proc[None]:
        """One GET or PUT of ``kib`` KiB by a node (its loop ``node``, its client's
        threads ``io``): the client's CPU, the server's (local only), the latency."""
        cal, sim = self.cal, self.sim
        for attempt in range(12):
            yield node.cpu(cal.store_loop_us)
            yield io.cpu(cal.store_thread_us)
            ok = self._allowed(op, key, prefix)
            if self.server is not None:
                fixed = cal.seaweed_request_us
                yield self.server.cpu(fixed * cal.seaweed_sync_share + cal.seaweed_kib_us * kib)
                self.server.cpu(fixed * (1 - cal.seaweed_sync_share))  # not waited for
            lat = self.profile.put if op == "put" else self.profile.get
            yield sim.sleep(lat.sample(sim))
            if ok:
                self.counts[op] += 1
                self.counts["kib_in" if op == "put" else "kib_out"] += kib
                return
            self.counts["throttled"] += 1
            yield sim.sleep(0.025 * 2 ** min(attempt, 6) * sim.rng.uniform(0.5, 1.5))
        raise RuntimeError(f"{op} {key}: throttled 12 times")
