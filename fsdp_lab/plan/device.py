"""The lab's one registry of GPUs, for mode=plan and mode=estimate alike: a device table
(fsdp_lab/plan/devices/<name>.json, written by benchmarks/calibrate_device.py) as the time of one
kernel, one collective or one eager op on that device, and its memory (`memory_gib`); GPUs without a
table are known by their memory alone (fsdp_lab/device_memory.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache

from fsdp_lab.device_memory import DEVICES_DIR, memory_gib, tables

# Total memory CUDA reports (cudaMemGetInfo), GiB, of GPUs the estimate may fit on but no table times.


def _nearest(points: list[tuple[tuple[float, ...], float]], key: tuple[float, ...], k: int = 3) -> float:
    """Inverse-distance mean of the k measured values nearest to `key` in log space."""
    logs = tuple(math.log(max(x, 1)) for x in key)
    ranked = sorted((math.dist(logs, tuple(math.log(x) for x in p)), v) for p, v in points)[:k]
    if ranked[0][0] < 1e-9:
        return ranked[0][1]
    weights = [1 / d for d, _ in ranked]
    return sum(w * v for w, (_, v) in zip(weights, ranked)) / sum(weights)


def _fit_collective(rows: list[dict], key: str, factor) -> tuple[float, float]:
    """Latency (s) and bandwidth (bytes/s) of t = latency + factor(n) * bytes / bandwidth, least squares."""
    xs = [factor(r["group"]) * r["mib"] * 2**20 for r in rows]
    ys = [r[key] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return max(my - slope * mx, 0.0), 1 / slope


RING = {"all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n, "all_reduce": lambda n: 2 * (n - 1) / n}


@dataclass
class Device:
    name: str
    table: dict
    inter_node_gbps: float | None = None
    """Bandwidth per GPU between nodes, GB/s, over the table's assumption (plan.inter_node_gbps)."""

    @property
    def link_gbps(self) -> float:
        return self.inter_node_gbps or self.table["spec"]["inter_node_gbps"]

    @property
    def link_source(self) -> str:
        return "plan.inter_node_gbps" if self.inter_node_gbps else "the table's assumption, not measured"

    @property
    def float8_matmul_ratio(self) -> float | None:
        """A float8 linear's matmul time over bf16's, as measured on this device; None: not measured."""
        return self.table.get("float8", {}).get("matmul_ratio")

    @property
    def sustained_matmul_fraction(self) -> float:
        """The rate a matmul holds for seconds with every GPU at it (as in a training step, where the
        power limit lowers the clock) over its rate in the table's short bursts, as measured on this
        device (benchmarks/sustained_matmul.py); 1 where not measured."""
        return self.table.get("sustained", {}).get("matmul_fraction", 1.0)

    @property
    def memory_bytes(self) -> float:
        return self.table["spec"]["memory_gib"] * 2**30

    @property
    def peak_flops(self) -> float:
        return self.table["spec"]["peak_bf16_tflops"] * 1e12

    def matmul_s(self, m: int, n: int, k: int, dtype: str) -> float:
        rows = self.table["matmul"].get(dtype) or self.table["matmul"]["bfloat16"]
        tflops = _nearest([((r["m"], r["n"], r["k"]), r["tflops"]) for r in rows], (m, n, k))
        return 2 * m * n * k / (tflops * 1e12 * self.sustained_matmul_fraction)

    def attention_s(self, bh: int, s: int, d: int, backward: bool) -> float:
        rows = self.table["attention"]["bfloat16"]
        key = "bwd_tflops" if backward else "fwd_tflops"
        tflops = _nearest([((r["b"] * r["h"], r["s"], r["d"]), r[key]) for r in rows], (bh, s, d))
        flops = 4 * bh * s * s * d / 2 * (2.5 if backward else 1)
        return flops / (tflops * 1e12)

    def memory_s(self, nbytes: float) -> float:
        """An elementwise kernel moving nbytes (reads + writes): bandwidth interpolated by size."""
        rows = self.table["bandwidth"]
        sizes = [r["mib"] * 2**20 * 3 for r in rows]  # add: two reads and a write of mib each
        gbps = [r["add_gbps"] for r in rows]
        if nbytes <= sizes[0]:
            return sizes[0] / (gbps[0] * 1e9)  # below the smallest size a kernel costs its launch
        for (s0, g0), (s1, g1) in zip(zip(sizes, gbps), zip(sizes[1:], gbps[1:])):
            if nbytes <= s1:
                g = g0 + (g1 - g0) * math.log(nbytes / s0) / math.log(s1 / s0)
                return nbytes / (g * 1e9)
        return nbytes / (gbps[-1] * 1e9)

    def collective_s(self, kind: str, nbytes: float, group: int, inter_node: bool) -> float:
        """One collective whose full (gathered / unreduced) tensor has nbytes, over `group` ranks."""
        if group <= 1:
            return 0.0
        latency, bandwidth = _collective_fit(self.name, kind, group)
        if inter_node:
            spec = self.table["spec"]
            latency, bandwidth = spec["inter_node_latency_s"], min(bandwidth, self.link_gbps * 1e9)
        return latency * math.log2(group) + RING[kind](group) * nbytes / bandwidth

    def elementwise(self, figure: str, unmeasured: float) -> float:
        """A block's measured elementwise figure (fsdp_lab/calibrate/elementwise.py): `eager_factor`, its
        eager time over the bandwidth pricing of its ops, or `compiled_share`, what torch.compile
        leaves of it; `unmeasured` where the table has not measured it."""
        return self.table.get("elementwise", {}).get(figure, unmeasured)

    def optimizer_s(self, params: float) -> float | None:
        """The optimizer's step (the gradient norm, then fused AdamW) over `params` float32 parameters
        at the table's measured time per parameter; None where the table has not measured it."""
        measured = self.table.get("optimizer")
        return params * measured["s_per_param"] if measured else None

    @property
    def host(self) -> dict:
        """The table's host section as calibrated: one width's figures, {"widths": [...]}, or such
        sections by the rank count they were timed on ({"by_gpus": {...}})."""
        return self.table["host"]

    def host_figures(self, block_kernel_s: float, gpus: int) -> dict:
        """Host seconds per op dispatched, per TP matmul, per compiled kernel, per checkpointed block
        (eager and compiled), per step, for a block whose forward kernels take block_kernel_s, in a
        step over `gpus` GPUs (fsdp_lab/plan/host.py: which calibrated count and widths are read)."""
        from fsdp_lab.plan.host import host_figures, host_section

        return host_figures(host_section(self.table["host"], gpus), block_kernel_s)


@lru_cache(maxsize=None)
def load_device(name: str) -> Device:
    return Device(name, json.loads((DEVICES_DIR / f"{name}.json").read_text()))


def device_in_hand() -> str:
    """The table of the GPU this process sees (plan.device=auto); ConfigError where none fits."""
    import torch

    from fsdp_lab.config import ConfigError

    allowed = ", ".join(tables())
    if not torch.cuda.is_available():
        raise ConfigError(f"plan.device=auto: no GPU is visible here to take the table of; allowed: {allowed}")
    props = torch.cuda.get_device_properties(0)
    gib = props.total_memory / 2**30
    for name in tables():
        if name.split("-")[0].upper() in props.name.upper() and abs(memory_gib(name) - gib) < 2:
            return name
    raise ConfigError(f"plan.device=auto: the GPU here ({props.name}, {gib:.1f} GiB) has no device table; allowed: {allowed}")


def plan_device(name: str, inter_node_gbps: float | None = None) -> Device:
    """The device a plan prices on: plan.device (auto: the GPU in hand), with plan.inter_node_gbps."""
    return replace(load_device(device_in_hand() if name == "auto" else name), inter_node_gbps=inter_node_gbps)


@lru_cache(maxsize=None)
def _collective_fit(name: str, kind: str, group: int) -> tuple[float, float]:
    """Latency per doubling of the group (s) and bandwidth (bytes/s), fitted on the rows of the
    measured group size nearest to `group` (a table holds rows of every GPU count it was calibrated
    on: NCCL's latency and bus bandwidth change with the ranks in a ring)."""
    return fit_nearest_group(load_device(name).table["collectives"]["intra_node"], kind, group)


def nearest_count(measured, count: int) -> int:
    """Of the GPU counts a table measured at, the nearest to `count` in log2, the larger on a tie."""
    return min(measured, key=lambda g: (abs(math.log2(g / count)), -g))


def fit_nearest_group(rows: list[dict], kind: str, group: int) -> tuple[float, float]:
    nearest = nearest_count({r["group"] for r in rows}, group)
    latency, bandwidth = _fit_collective([r for r in rows if r["group"] == nearest], f"{kind}_s", RING[kind])
    return latency / math.log2(nearest), bandwidth
