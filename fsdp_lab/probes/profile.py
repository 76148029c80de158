"""A window of training steps under torch.profiler, and what it showed: the ops ranked by the time
they took themselves on the device (the GPU's kernels; on CPU, the host), per step. The probe
(profile_probe.py) and the speed benchmark's peers (benchmarks/yardstick_loop.py) share it, so a lab
step and a peer's read the same way."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

TOP_OPS = 25
"""Ops listed in the summary and ops.md."""


class ProfileWindow:
    """Consecutive steps under one torch.profiler session: `begin()` before the first, `end(out_dir,
    rank, steps)` after the last (`steps` of them) writes trace_rank<R>.json there and keeps the op
    table, per step."""

    def __init__(self, device: torch.device):
        self.device = device
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.profiler = profile(activities=activities, record_shapes=False)
        self.ops: list[dict] = []

    def begin(self) -> None:
        self.profiler.__enter__()

    def end(self, out_dir: Path | None, rank: int, steps: int) -> None:
        self.profiler.__exit__(None, None, None)  # waits for the device: the window's kernels are in
        self.ops = op_rows(self.profiler.key_averages(), steps, self.device.type)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.profiler.export_chrome_trace(str(out_dir / f"trace_rank{rank}.json"))

    def figures(self) -> dict:
        return {"self_ms_per_step": sum(op["self_ms_per_step"] for op in self.ops), "top_ops": self.ops[:TOP_OPS]}


def op_rows(averages, steps: int, device_type: str) -> list[dict]:
    """Every op's self time per step on the device (host on CPU), its total and its calls per step,
    largest first; ops that took no time of their own are left out. On a GPU an op's self time is
    that of the kernels it launched itself, so the device's own events (the kernels, and the GPU-side
    copies of record_function spans) are not listed again: each kernel counts once, under the host
    event that launched it, an aten op or a record_function (inductor launches each of its kernels
    inside one named after it; FSDP's and the steps' spans launch none themselves)."""
    on_device = device_type != "cpu"
    rows = []
    for avg in averages:
        if avg.device_type != DeviceType.CPU:
            continue
        self_us = avg.self_device_time_total if on_device else avg.self_cpu_time_total
        if self_us <= 0:
            continue
        total_us = avg.device_time_total if on_device else avg.cpu_time_total
        rows.append({"name": avg.key, "self_ms_per_step": self_us / 1e3 / steps,
                     "total_ms_per_step": total_us / 1e3 / steps, "calls_per_step": avg.count / steps})
    return sorted(rows, key=lambda r: r["self_ms_per_step"], reverse=True)


def write_ops_table(path: Path, ops: list[dict], title: str) -> None:
    """ops.md: the rows of op_rows as a Markdown table, under `title`."""
    total = sum(op["self_ms_per_step"] for op in ops) or 1.0
    lines = [f"# {title}", "", f"Self time per step, all ops: {total:.3f} ms", "",
             "| op | self ms/step | share | total ms/step | calls/step |", "|---|---:|---:|---:|---:|"]
    lines += [f"| `{op['name']}` | {op['self_ms_per_step']:.3f} | {op['self_ms_per_step'] / total:.1%} | "
              f"{op['total_ms_per_step']:.3f} | {op['calls_per_step']:g} |" for op in ops]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
