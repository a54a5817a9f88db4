"""What a run of the model says: predictions for a store, and the validation
against bench_fleet.py's measurements on this machine."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .calibration import Calibration
from .engine import percentile
from .store import PROFILES
from .workload import Phase, Setup, World

PUT_CLASS = ("put",)  # the simulated store counts LIST nowhere: okq lists only to GC
GB = 1024 * 1024  # KiB in a GiB


@dataclass
class Prediction:
    setup: Setup
    produce: Phase
    drain: Phase
    mixed: Phase
    offered: float

    def per_message(self, op: str) -> float:
        return self.produce.per_message(op) + self.drain.per_message(op)

    def dollars_per_million(self) -> float:
        p = self.setup.profile or PROFILES[self.setup.store]
        cost = (self.per_message("put") * p.price_put + self.per_message("get") * p.price_get
                + self.per_message("kib_in") / GB * p.price_gb_in
                + self.per_message("kib_out") / GB * p.price_gb_out)
        return cost * 1e6

    def throttled(self) -> float:
        """Refused requests (503 / 429) per request that landed, both throughput phases."""
        both = (self.produce.requests, self.drain.requests)
        refused = sum(r["throttled"] for r in both)
        made = sum(r[k] for r in both for k in ("put", "get"))
        return refused / made if made else 0.0

    def busiest(self) -> float:
        """The busiest node's CPU (its loop and its S3 client's threads) as a share of
        its core, in the drain."""
        cpu = self.drain.cpu
        nodes = [cpu[f"node {k}"] + cpu[f"node {k} io"] for k in range(self.setup.nodes)]
        return max(nodes) / self.drain.seconds if self.drain.seconds else 0.0


def predict(setup: Setup, cal: Calibration, seconds: float) -> Prediction:
    """Saturated produce and drain, each in a fresh fleet for ``seconds``; then a
    mixed phase at half of what the fleet can both produce and consume."""
    produce = World(setup, cal).produce_phase(seconds=seconds)
    drain = World(replace(setup, seed=setup.seed + 1), cal).drain_phase(seconds=seconds)
    both = 1 / (1 / max(produce.rate, 1.0) + 1 / max(drain.rate, 1.0))
    offered = 0.5 * both
    calls = 40 * setup.batch / offered  # seconds for at least 40 produce calls
    mixed = World(replace(setup, seed=setup.seed + 2), cal).mixed_phase(
        offered, max(seconds, calls))
    return Prediction(setup, produce, drain, mixed, offered)


def ms(value: float) -> str:
    return "n/a" if value != value else f"{value * 1000:,.0f}"  # NaN: no latency seen


def prediction_table(preds: list[Prediction]) -> list[str]:
    lines = [
        "| nodes | partitions | produce msg/s | lease+complete msg/s | offered msg/s "
        "| e2e p50 / p99 ms | PUT-class / GET per msg | refused per request landed "
        "| $ per million msgs "
        "| busiest node (drain) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in preds:
        lat = p.mixed.latencies
        lines.append(
            f"| {p.setup.nodes} | {p.setup.partitions} | {p.produce.rate:,.0f} "
            f"| {p.drain.rate:,.0f} | {p.offered:,.0f} "
            f"| {ms(percentile(lat, 0.5))} / {ms(percentile(lat, 0.99))} "
            f"| {p.per_message('put'):.4f} / {p.per_message('get'):.4f} "
            f"| {p.throttled():.2g} | ${p.dollars_per_million():.3f} | {p.busiest():.0%} |")
    return lines


# -- validation: bench_fleet.py's table (sequencer on) and shards phases ----------------


def local(nodes: int, partitions: int = 1, shards: int = 1, seed: int = 1) -> Setup:
    """bench_fleet.py's configuration: SeaweedFS, the nodes and the driver on 2 cores."""
    return Setup(store="seaweed-local", nodes=nodes, partitions=partitions, shards=shards,
                 cores=2, driver=True, seed=seed)


def table_row(nodes: int, cal: Calibration, messages: int, mixed_seconds: float,
              seed: int = 1) -> dict[str, float]:
    """One row of bench_fleet.py's table phase: produce, drain, the mixed phase."""
    world = World(local(nodes, seed=seed), cal)
    produce = world.produce_phase(messages=messages)
    drain = world.drain_phase()
    mixed = World(local(nodes, seed=seed + 7), cal).mixed_phase(1000.0, mixed_seconds)
    lat = mixed.latencies
    return {"produce": produce.rate, "consume": drain.rate,
            "p50": percentile(lat, 0.5) * 1000, "p99": percentile(lat, 0.99) * 1000,
            "put_consume": drain.per_message("put"), "put_mixed": mixed.per_message("put")}


def shards_row(shards: int, cal: Calibration, messages: int, seed: int = 1
               ) -> dict[str, float]:
    """bench_fleet.py's shards phase: 4 nodes, 4 queues on ``shards`` shards."""
    world = World(local(4, partitions=4, shards=shards, seed=seed), cal)
    produce = world.produce_phase(messages=messages)
    drain = world.drain_phase()
    out = {"produce": produce.rate, "consume": drain.rate}
    for name, phase in (("produce", produce), ("consume", drain)):
        for k in range(4):
            out[f"cpu_{name}_node{k + 1}"] = (phase.cpu[f"node {k}"]
                                              + phase.cpu[f"node {k} io"])
        out[f"cpu_{name}_seaweed"] = phase.cpu["SeaweedFS"]
        out[f"cpu_{name}_driver"] = phase.cpu["driver"]
    return out


def error(predicted: float, measured: float) -> str:
    if not measured:
        return ""
    return f"{(predicted - measured) / measured:+.0%}"


def shown(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def validation_table(predicted: dict[str, dict[str, float]],
                     measured: dict[str, dict[str, float]],
                     each: dict[str, list[dict[str, float]]]) -> list[str]:
    """Predicted beside measured (the median of the runs, and their range)."""
    lines = ["| run | figure | predicted | measured (median) | runs' range | error |",
             "|---|---|---:|---:|---:|---:|"]
    for run, figures in predicted.items():
        seen = measured.get(run, {})
        for name, value in figures.items():
            if name not in seen:
                continue
            got = seen[name]
            values = [r[name] for r in each.get(run, []) if name in r]
            span = f"{shown(min(values))} to {shown(max(values))}" if values else ""
            lines.append(f"| {run} | {name} | {shown(value)} | {shown(got)} | {span} "
                         f"| {error(value, got)} |")
    return lines
