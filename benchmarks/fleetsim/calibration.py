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
* benchmarks/bench_fleet.py runs on this machine (table and shards phases,
  sequencer on, 1, 2 and 4 nodes, 20,000 messages; docs/OPERATIONS.md, "Sizing
  a fleet"), against which the figures split from the totals above were fitted:
  the forward's cost from the shards phase's non-holders, the rest by matching
  the measured throughputs (``python benchmarks/fleet_sim.py --validate``).

A JSON object of any of these fields (``--calibrate FILE``) replaces them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class Calibration:
    # -- a node (one Python process) --------------------------------------------------
    call_us: float = 600.0  # any HTTP call it serves (a client's or a forwarded one)
    produce_item_us: float = 9.0  # per message produced: decode, ids, segment coding
    commit_us: float = 300.0  # per group commit: segment and manifest encoding
    lease_call_us: float = 300.0  # per lease look: the walk over cached summaries
    lease_item_us: float = 16.0  # per message leased: state, token, reply entry
    complete_item_us: float = 6.0  # per message completed: token check, tombstone
    cell_write_us: float = 150.0  # per lease-object write: encode the changed states
    store_loop_us: float = 250.0  # per store request, on the event loop (obstore)
    store_thread_us: float = 550.0  # per store request, on obstore's Rust threads
    fwd_call_us: float = 500.0  # a node that forwards: per call sent and answered
    fwd_item_us: float = 4.0  # per payload carried through a forward, either way
    # -- the driver (validation only: bench_fleet.py's clients) -------------------------
    client_call_us: float = 450.0  # per call
    client_produce_item_us: float = 6.0  # per message sent
    client_lease_item_us: float = 18.0  # per message received (msgspec, the Item)
    client_complete_item_us: float = 2.0  # per token sent back
    # -- SeaweedFS on loopback (validation only) ---------------------------------------
    seaweed_request_us: float = 2600.0  # per S3 request
    seaweed_kib_us: float = 17.0  # per KiB written or read

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
