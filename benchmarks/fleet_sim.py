"""A fleet simulation: what N okq nodes and P partitions do on a given store. Not a test.

A discrete-event model (benchmarks/fleetsim/): nodes with their measured CPU per
operation (one core each; the model's calibration, fleetsim/calibration.py, was
taken on this project's 2-core machine), the sequencer's group commits and
forwards, and a store with a latency distribution, request-rate limits and
prices (fleetsim/store.py). A partition is one manifest on one sequencer shard:
today a queue on its own shard, once partitions exist a partition of a queue.

Predictions (the default): for each store and node count, with one partition and
with one partition per node: produce and lease+complete msg/s at saturation
(closed-loop clients, ``--clients`` per partition, batches of 100, 1 KiB), then
the produce-to-lease latency with half that load offered, object-store requests
per message end to end, and dollars per million messages.

Validation (``--validate``): bench_fleet.py's table (sequencer on) and shards
phases as they ran here (SeaweedFS, the nodes and the driver sharing two cores),
side by side with the measurements in fleetsim/measured.json.

    python benchmarks/fleet_sim.py [--store s3,s3express,gcs,minio]
        [--nodes 1,2,4,8,16,32,64] [--partitions 1,N] [--prefixes 1|P]
        [--clients 16] [--batch 100] [--seconds 1.5] [--seed 1] [--calibrate FILE]
    python benchmarks/fleet_sim.py --validate [--measured FILE] [--messages 20000]
    python benchmarks/fleet_sim.py --fit [--measured FILE] > calibration.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleetsim.calibration import Calibration, load
from fleetsim.fit import fit
from fleetsim.report import (
    predict,
    prediction_table,
    shards_row,
    table_row,
    validation_table,
)
from fleetsim.store import PROFILES
from fleetsim.workload import Setup

MEASURED = Path(__file__).resolve().parent / "fleetsim" / "measured.json"


def partition_counts(spec: str, nodes: int) -> list[int]:
    """``1,N,2N``: numbers, or multiples of the node count."""
    out = []
    for token in spec.split(","):
        token = token.strip().upper()
        out.append(int(token[:-1] or 1) * nodes if token.endswith("N") else int(token))
    return sorted(set(out))


def predictions(args: argparse.Namespace, cal: Calibration) -> None:
    for name in args.store.split(","):
        profile = PROFILES[name]
        rows = []
        for nodes in (int(n) for n in args.nodes.split(",")):
            for parts in partition_counts(args.partitions, nodes):
                prefixes = parts if args.prefixes.upper() == "P" else int(args.prefixes)
                setup = Setup(store=name, nodes=nodes, partitions=parts, shards=parts,
                              prefixes=prefixes, producers=args.clients * parts,
                              consumers=args.clients * parts, batch=args.batch,
                              seed=args.seed)
                rows.append(predict(setup, cal, args.seconds))
                print(f"  {name}: {nodes} nodes, {parts} partitions: done", file=sys.stderr,
                      flush=True)
        print(f"\n## {profile.title} (`{name}`): one core per node, {args.clients} producers "
              f"and {args.clients} consumers per partition, batches of {args.batch}, 1 KiB; "
              f"{'each partition its own prefix' if args.prefixes.upper() == 'P' else 'one prefix'}"
              f"; figures: {profile.source}\n")
        print("\n".join(prediction_table(rows)))


def validate(args: argparse.Namespace, cal: Calibration) -> None:
    measured = json.loads(Path(args.measured).read_text()) if Path(args.measured).exists() \
        else {}
    predicted: dict[str, dict[str, float]] = {}
    for nodes in (1, 2, 4):
        predicted[f"table, {nodes} node{'s' * (nodes > 1)}"] = table_row(
            nodes, cal, args.messages, args.mixed_seconds, args.seed)
    for shards in (1, 4):
        predicted[f"shards, {shards}"] = shards_row(shards, cal, args.messages, args.seed)
    print("\n## Validation: bench_fleet.py on this machine (SeaweedFS on loopback, sequencer "
          "on, nodes and driver on 2 cores) against the model\n")
    if measured.get("note"):
        print(f"Measured: {measured['note']}\n")
    print("\n".join(validation_table(predicted, measured.get("runs", {}),
                                     measured.get("each", {}))))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default="s3,s3express,gcs,minio",
                        help=f"any of {', '.join(PROFILES)}, comma-separated")
    parser.add_argument("--nodes", default="1,2,4,8,16,32,64")
    parser.add_argument("--partitions", default="1,N",
                        help="partition counts: numbers or multiples of the nodes (N, 2N)")
    parser.add_argument("--prefixes", default="1",
                        help="S3 prefixes the partitions spread over: a number, or P "
                        "(one each; S3 splits a hot prefix only after a while)")
    parser.add_argument("--batch", type=int, default=100, help="produce and lease batch")
    parser.add_argument("--clients", type=int, default=16,
                        help="producers and consumers per partition (predictions)")
    parser.add_argument("--seconds", type=float, default=1.5,
                        help="simulated seconds of each prediction phase")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--calibrate", type=Path, help="a JSON object of calibration fields")
    parser.add_argument("--validate", action="store_true",
                        help="bench_fleet.py's runs here, side by side with the measured")
    parser.add_argument("--measured", default=str(MEASURED))
    parser.add_argument("--messages", type=int, default=20_000, help="validation: per run")
    parser.add_argument("--mixed-seconds", type=float, default=30.0,
                        help="validation: the mixed phase at 1,000 msg/s")
    parser.add_argument("--show-calibration", action="store_true")
    parser.add_argument("--fit", action="store_true",
                        help="print the calibration's CPU figures fitted to the CPU "
                        "measured in --measured's shards run (fleetsim/fit.py)")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    cal = load(args.calibrate)
    began = time.monotonic()
    if args.fit:
        measured = json.loads(Path(args.measured).read_text())["runs"]["shards, 1"]
        print(fit(cal, measured, args.messages).to_json())
        return
    if args.show_calibration:
        print(cal.to_json())
    if args.validate:
        validate(args, cal)
    else:
        predictions(args, replace(cal))
    print(f"\n(model run {time.monotonic() - began:,.1f} s)")


if __name__ == "__main__":
    main()
