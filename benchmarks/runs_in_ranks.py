"""Lab runs one after another in the ranks of one torchrun: each run what `rank_main` does (the
composed, checked config; `build_trainer`; `Trainer.run`; the probes' summary sections), without a
fresh process, CUDA context and NCCL rendezvous per run. The benchmarks that time many short runs
(plan_accuracy.py, calibrate_device.py's host figures) spend their GPU time on steps, not start-up.

Every rank calls `run_all` with the same list; a run that fails raises on every rank alike (a
refused config, an out-of-memory), and its row says so."""

from __future__ import annotations

import gc
import os
import traceback

import torch


def run_once(overrides: list[str], ctx) -> dict:
    """One run of `python -m fsdp_lab OVERRIDES` in this rank: its perf and memory sections."""
    import torch._dynamo

    from fsdp_lab.compose import prepared
    from fsdp_lab.summary import probe_sections
    from fsdp_lab.worker import build_trainer

    torch._dynamo.reset()  # a compiled run starts from no cached graphs, as in a fresh process
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    run, dims = prepared(*overrides)
    trainer = build_trainer(run, dims, ctx, on_step=lambda row: None)
    try:
        trainer.run(0)
        sections = probe_sections(trainer.probes)
    finally:
        del trainer
        gc.collect()
    return {"perf": sections["perf"], "memory": sections["memory"], "world_size": dims.world_size}


def run_all(runs: list[tuple[str, list[str]]], on_row=None) -> list[dict]:
    """[(name, overrides)] -> a row per run: step_time_s, host_step_s, peak_mib, mfu, tokens_per_s, or error."""
    from fsdp_lab.dist import init_distributed, resolve_device_type

    ctx = init_distributed(resolve_device_type("auto"), 300)
    rows = []
    for name, overrides in runs:
        row = {"config": name, "overrides": overrides}
        try:
            s = run_once(overrides, ctx)
            row.update(step_time_s=s["perf"]["step_time_s"], host_step_s=s["perf"]["host_step_s"], peak_mib=s["memory"]["peak_mib"],
                       mfu=s["perf"]["mfu"], tokens_per_s=s["perf"]["tokens_per_s"], world_size=s["world_size"])
        except Exception as e:  # noqa: BLE001 - the row reports it; the next run goes on
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if torch.cuda.is_available():  # what the run left behind: the next run's peak sits on top of it
            row["left_allocated_mib"] = torch.cuda.memory_allocated() / 2**20
        rows.append(row)
        if on_row is not None and ctx.rank == 0:
            on_row(row, rows)
    return rows


def is_rank() -> bool:
    return "RANK" in os.environ
