"""CPU per operation, measured on this project's 2-core development machine.

Every figure is microseconds of CPU (user + system) of the process named, per
the unit named. Where each comes from:

* docs/PERFORMANCE.md, "The race" (issue 21's run of 2026-12-02, compiled hot
  path, one node on SeaweedFS, batches of 100, 1 KiB): node 20 us per message
  produced and 54 per message leased and completed; SeaweedFS 31 and 55; the
  driver 29 per message leased and completed.
* docs/PERFORMANCE.md, "The S3 client" (bench_s3_client.py): obstore spends
  695 to 910 us of CPU per call with 8 in flight, 200 to 300 of it on the event
  loop, the rest on its Rust threads.
* docs/PERFORMANCE.md, issue 21 (bench_node_instructions.py): a produce request
  costs about 1.9 M instructions whatever its size and about 34,000 per item; a
  lease-and-complete pair about 3 M, the rest per item; at about 2,300
  instructions per microsecond here (53,400 instructions = 21.5 to 25 us).
* benchmarks/bench_fleet.py on this machine, 2026-12-03 (three runs of its
  table and shards phases, sequencer on, 1, 2 and 4 nodes, 20,000 messages;
  fleetsim/measured.json): the figures above set how each total splits, and
  ``fleet_sim.py --fit`` (fleetsim/fit.py) scaled each group of them until the
  model's CPU per process matched the shards run's (1 shard: the holder, the
  nodes that only forward, SeaweedFS, the driver). The values below are that
  fit. Throughput and latency were not fitted: ``--validate`` compares them.

A JSON object of any of these fields (``--calibrate FILE``) replaces them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class Calibration:
    # -- a node (one Python process) --------------------------------------------------
    # produce's three: split as the instruction counts split a produce (1.9 M a request,
    # 34,000 an item), fitted to the 1-shard holder's CPU producing
    call_us: float = 634.0  # any HTTP call it serves (a client's or a forwarded one)
    produce_item_us: float = 9.4  # per message produced: decode, ids, segment coding
    commit_us: float = 317.0  # per group commit: segment and manifest encoding
    # lease+complete's five: split from the race's 54 us a message, fitted to the 1-shard
    # holder's CPU draining
    lease_call_us: float = 345.0  # per lease look: the walk over cached summaries
    lease_item_us: float = 12.6  # per message leased, under the queue's lock: state, token
    reply_item_us: float = 11.4  # per message leased, after the lock: the reply's entry
    complete_item_us: float = 6.8  # per message completed: token check, tombstone
    cell_write_us: float = 173.0  # per lease-object write: encode the changed states
    # the S3 client: bench_s3_client.py's obstore figures (8 in flight), not fitted
    store_loop_us: float = 250.0  # per store request, on the event loop (obstore)
    store_thread_us: float = 550.0  # per store request, on obstore's Rust threads
    # the forward: fitted to the CPU of the 1-shard run's nodes 2 to 4, which only forward
    fwd_call_us: float = 884.0  # a node that forwards: per call sent and answered
    fwd_item_us: float = 7.1  # per payload carried through a forward, either way
    # -- the driver (validation only: bench_fleet.py's clients) -------------------------
    # split as the race's 29 us per message leased and completed, fitted to its CPU
    client_call_us: float = 398.0  # per call
    client_produce_item_us: float = 5.3  # per message sent
    client_lease_item_us: float = 15.9  # per message received (msgspec, the Item)
    client_complete_item_us: float = 1.8  # per token sent back
    # -- SeaweedFS on loopback (validation only) ---------------------------------------
    # split as the race's 31 and 55 us per message, fitted to its CPU
    seaweed_request_us: float = 2871.0  # per S3 request
    seaweed_kib_us: float = 18.8  # per KiB written or read
    # the share of the per-request figure a request waits for (its bytes' share it waits
    # for whole): an obstore PUT of 100 KiB takes 4.2 ms of server time sequentially
    # (bench_s3_client.py: 5.33 ms less 1.14 of client CPU) where SeaweedFS's CPU per
    # such request is about 4.7 ms; the rest runs beside the requests (Go's concurrent
    # garbage collector), still on the machine's cores
    seaweed_sync_share: float = 0.75

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def load(path: Path | None) -> Calibration:
    """The defaults, with the fields a JSON file names replaced."""
    if path is None:
        return Calibration()
    data = json.loads(path.read_text())
    known = {f.name for f in fields(Calibration)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{path}: unknown calibration fields {sorted(unknown)}")
    return replace(Calibration(), **{k: float(v) for k, v in data.items()})
