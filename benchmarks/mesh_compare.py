"""FSDP vs HSDP vs 2D (FSDP x tensor parallel) on this machine's GPUs, on the speed benchmark's
0.95B model (`+experiment=bench_llama1b`): tokens/s per GPU, step time, MFU and peak memory per GPU
for each layout, from one lab run each with the memory probe on (it costs no measurable time, see
`benchmarks/probe_overhead.py`), beside the hand-written loop (benchmarks/fsdp2_yardstick.py) on the
same layout.

    python benchmarks/mesh_compare.py [--compile] [extra lab overrides]

Meant for 4 GPUs (hsdp is 2 replicas x 2 shards, tp2d is dp 2 x tp 2). `train.batch_size` is per
data-parallel rank, so tp2d at the same batch size trains half the tokens per step of fsdp; the
`tp2d, same global batch` row doubles it, so every layout trains the same tokens per step."""

from __future__ import annotations

import sys

import torch

from speed import lab_run, peer

# layout: (lab overrides, the yardstick's arguments for the same layout)
LAYOUTS = {
    "fsdp": (["mesh=fsdp"], []),
    "hsdp": (["mesh=hsdp"], ["--dp-replicate", "2"]),
    "tp2d": (["mesh=tp2d"], ["--tp", "2"]),
    "tp2d, same global batch": (["mesh=tp2d", "train.batch_size=8"], ["--tp", "2", "--batch-size", "8"]),
}


def main() -> None:
    compile_ = "--compile" in sys.argv
    extra = [a for a in sys.argv[1:] if a != "--compile"] + (["model.compile=true"] if compile_ else [])
    gpus = torch.cuda.device_count()
    if gpus < 4:
        sys.exit(f"error: this benchmark compares 4-GPU layouts; this machine has {gpus} GPUs")
    print(f"{gpus} GPUs, compile={compile_}")
    print("| layout | mesh | tokens per step | tokens/s per GPU (lab / hand-written) | step time ms | MFU | "
          "peak memory per GPU MiB (lab / hand-written) |")
    print("|---|---|---|---|---|---|---|")
    for name, (overrides, yard_args) in LAYOUTS.items():
        summary = lab_run([*overrides, *extra]).summary
        yard = peer("hand-written", gpus, [*yard_args, *(["--compile"] if compile_ else [])], None)
        mesh, perf, peak = summary["mesh"], summary["perf"], summary["memory"]["peak_mib"]
        shape = " x ".join(f"{k} {v}" for k, v in mesh.items() if k != "engine" and v > 1)
        tokens_per_step = perf["tokens_per_s"] * perf["step_time_s"] * summary["world_size"]
        mfu = f"{perf['mfu']:.2f}" if perf["mfu"] is not None else "n/a"
        print(f"| {name} | {shape} | {tokens_per_step:,.0f} | {perf['tokens_per_s']:,.0f} / {yard['tokens_per_s']:,.0f} "
              f"({perf['tokens_per_s'] / yard['tokens_per_s']:.3f}) | {perf['step_time_s'] * 1e3:.1f} | {mfu} | "
              f"{peak:,.0f} / {yard['peak_mib']:,.0f} ({peak / yard['peak_mib']:.3f}) |", flush=True)


if __name__ == "__main__":
    main()
