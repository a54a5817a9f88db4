"""Fitting the calibration's CPU figures to CPU measured on this machine.

bench_fleet.py's shards phase reports every process's CPU seconds per phase
(4 nodes, 4 queues, 1 and 4 shards). Each group of figures below is scaled
until the model's CPU for the processes it governs matches the measured CPU:
the forward's figures by the nodes that only forward (1 shard: nodes 2 to 4),
produce's and lease+complete's by the holder (1 shard: node 1), SeaweedFS's
and the driver's by their own. Throughput and latency are not fitted: they are
what ``--validate`` checks. The S3 client's figures stay bench_s3_client.py's.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from .calibration import Calibration
from .report import shards_row

GROUPS = {  # fields scaled together -> the measured figures they answer for
    "forward": (("fwd_call_us", "fwd_item_us"),
                [f"cpu_{ph}_node{k}" for ph in ("produce", "consume") for k in (2, 3, 4)]),
    "produce": (("call_us", "produce_item_us", "commit_us"), ["cpu_produce_node1"]),
    "consume": (("lease_call_us", "lease_item_us", "reply_item_us", "complete_item_us",
                 "cell_write_us"),
                ["cpu_consume_node1"]),
    "seaweed": (("seaweed_request_us", "seaweed_kib_us"),
                ["cpu_produce_seaweed", "cpu_consume_seaweed"]),
    "driver": (("client_call_us", "client_produce_item_us", "client_lease_item_us",
                "client_complete_item_us"), ["cpu_produce_driver", "cpu_consume_driver"]),
}


def fit(cal: Calibration, measured: dict[str, float], messages: int,
        rounds: int = 6) -> Calibration:
    """``cal`` with each group scaled to the 1-shard run's measured CPU."""
    for _ in range(rounds):
        model = shards_row(1, cal, messages)
        values = asdict(cal)
        for names, figures in GROUPS.values():
            want = sum(measured[f] for f in figures)
            got = sum(model[f] for f in figures)
            if want > 0 and got > 0:
                scale = (want / got) ** 0.8  # damped: the groups overlap a little
                for name in names:
                    values[name] *= scale
        cal = replace(cal, **{k: round(v, 1) if k.endswith("_us") else v
                              for k, v in values.items()})
    return cal
